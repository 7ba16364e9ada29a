"""ICDTA4FL's pure steps (fedpeer/ml/tree/icdta.py): the rule aggregation (the less restrictive
bound where two rules share a condition, contradictions dropped, deterministic, bounded), the
checks of a received tree, the checked score totals (a poisoned total never passes), the filter,
and the global tree built from the rules (it predicts what the rules say)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpeer.ml.tree import icdta
from fedpeer.ml.tree.model import LEAF, UNDEFINED, Cart, predict_value


def _cart(spec, n_features: int = 4, n_classes: int = 2) -> Cart:
    """A tree from nested ("split", f, t, left, right) / ("leaf", class), in depth-first order."""
    feature, threshold, left, right, klass = [], [], [], [], []

    def add(node) -> int:
        i = len(feature)
        feature.append(UNDEFINED)
        threshold.append(float(UNDEFINED))
        left.append(LEAF)
        right.append(LEAF)
        klass.append(node[1] if node[0] == "leaf" else -1)
        if node[0] == "split":
            feature[i], threshold[i] = node[1], node[2]
            left[i] = add(node[3])
            right[i] = add(node[4])
        return i
    add(spec)
    doc = {"feature": np.array(feature), "threshold": np.array(threshold), "left": np.array(left),
           "right": np.array(right), "klass": np.array(klass)}
    return icdta.read_tree(doc, n_features, n_classes, 8)


# The paper's example: client A's x0 <= 32.5 / x0 > 32.5; client B's x0 <= 39 / (x0 > 39 and x3 <= 22 / > 22).
A = ("split", 0, 32.5, ("leaf", 0), ("leaf", 1))
B = ("split", 0, 39.0, ("leaf", 0), ("split", 3, 22.0, ("leaf", 1), ("leaf", 0)))


def _conditions(rules: icdta.Rules) -> list[dict]:
    return [{f: (None if np.isnan(rules.low[r, f]) else float(rules.low[r, f]),
                 None if np.isnan(rules.high[r, f]) else float(rules.high[r, f]))
             for f in range(rules.low.shape[1]) if not (np.isnan(rules.low[r, f]) and np.isnan(rules.high[r, f]))}
            for r in range(len(rules))]


def test_the_less_restrictive_bound_wins_and_contradictions_are_dropped() -> None:
    rules = icdta.combine([_cart(A), _cart(B)])
    assert _conditions(rules) == [
        {0: (None, 39.0)},                  # x0 <= 32.5 with x0 <= 39: the less restrictive, x0 <= 39
        {0: (32.5, 39.0)},                  # x0 > 32.5 with x0 <= 39
        {0: (32.5, None), 3: (None, 22.0)},  # x0 > 32.5 with x0 > 39 and x3 <= 22: x0 > 32.5 and x3 <= 22
        {0: (32.5, None), 3: (22.0, None)},
    ]                                       # x0 <= 32.5 with x0 > 39 (either leaf): contradictions, dropped
    assert rules.leaves.tolist() == [[1, 1], [2, 1], [2, 3], [2, 4]]
    again = icdta.combine([_cart(A), _cart(B)])
    assert np.array_equal(again.low, rules.low, equal_nan=True) and np.array_equal(again.leaves, rules.leaves)
    reverse = icdta.combine([_cart(B), _cart(A)])
    assert reverse.leaves[:, ::-1].tolist() == rules.leaves.tolist()      # the same rules, B's leaves outermost


def test_the_product_beyond_rules_max_is_refused(monkeypatch) -> None:
    deep = ("split", 0, 1.0, ("split", 1, 1.0, ("leaf", 0), ("leaf", 1)), ("split", 1, 2.0, ("leaf", 0), ("leaf", 1)))
    other = ("split", 2, 1.0, ("split", 3, 1.0, ("leaf", 0), ("leaf", 1)), ("leaf", 1))
    assert len(icdta.combine([_cart(deep), _cart(other)])) == 12
    monkeypatch.setattr(icdta, "RULES_MAX", 11)
    with pytest.raises(icdta.TooManyRules, match="more than 11 aggregated rules"):
        icdta.combine([_cart(deep), _cart(other)])


def _doc(**changes) -> dict:
    doc = icdta.tree_doc(_cart(B))
    doc.update(changes)
    return doc


@pytest.mark.parametrize("doc, problem", [
    ({"feature": np.zeros(1)}, "the arrays"),
    (_doc(threshold=np.array([39.0, np.inf, 22.0, -2.0, -2.0])), "not finite"),
    (_doc(threshold=np.array([39, -2, 22, -2, -2])), "not of integers"),
    (_doc(feature=np.array([0, -2, 7, -2, -2])), "feature out of range"),
    (_doc(left=np.array([1, -1, 5, -1, -1])), "depth-first order"),
    (_doc(right=np.array([3, -1, 4, -1, -1])), "each reached once"),
    (_doc(klass=np.array([-1, 0, -1, 2, 0])), "leaf's class"),
    (_doc(klass=np.array([-1, 0, -1, 1, 0, 1])), "one entry per node"),
    ({k: np.zeros(icdta.LOCAL_NODES_MAX + 1, dtype=np.int64 if k != "threshold" else np.float64)
      for k in icdta.DOC_ARRAYS}, f"1 to {icdta.LOCAL_NODES_MAX} nodes"),
])
def test_a_malformed_tree_is_refused_naming_the_problem(doc: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        icdta.read_tree(doc, 4, 2, 8)


def test_a_tree_deeper_than_the_job_asks_is_refused() -> None:
    with pytest.raises(ValueError, match="deeper than the job's max_depth 1"):
        icdta.read_tree(icdta.tree_doc(_cart(B)), 4, 2, 1)


def _honest_scores(seed: int) -> tuple[np.ndarray, list]:
    rng = np.random.default_rng(seed)
    trees = [_cart(A), _cart(B), _cart(("split", 3, 10.0, ("leaf", 1), ("leaf", 0)))]
    sites = [(rng.uniform(0, 60, (n, 4)), rng.integers(0, 2, n)) for n in (7, 11, 5)]
    total = sum(icdta.score_vector(trees, i, X, y, 2) for i, (X, y) in enumerate(sites)).astype(np.uint64)
    return total, sites


def test_scores_count_every_tree_on_the_others_rows_and_the_filter_keeps_the_good_ones() -> None:
    total, sites = _honest_scores(0)
    scores = icdta.read_scores(total, 3, 2, 3)
    assert scores.agreed.all() and scores.rows.tolist() == [16, 12, 18]
    X, y = np.concatenate([s[0] for s in sites[1:]]), np.concatenate([s[1] for s in sites[1:]])
    assert scores.accuracy[0] == (np.argmax(predict_value(_cart(A), X), axis=1) == y).mean()
    kept, fallback = icdta.select(scores, 0.0)
    assert not fallback and all(scores.accuracy[t] >= np.mean(scores.accuracy) for t in kept)
    best = [t for t in range(3) if scores.accuracy[t] == scores.accuracy.max()]
    assert scores.accuracy.max() < 1.0 and icdta.select(scores, 1.0) == (best, True)
    assert icdta.select(scores, 0.01) == ([0, 1, 2], False)


def test_a_tree_some_member_does_not_hold_is_not_agreed() -> None:
    rng = np.random.default_rng(1)
    trees = [_cart(A), _cart(B)]
    X, y = rng.uniform(0, 60, (9, 4)), rng.integers(0, 2, 9)
    total = (icdta.score_vector(trees, 0, X, y, 2) + icdta.score_vector([None, trees[1]], 1, X, y, 2)).astype(np.uint64)
    scores = icdta.read_scores(total, 2, 2, 2)
    assert scores.agreed.tolist() == [False, True] and icdta.select(scores, 0.0)[0] == [1]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), at=st.integers(0, 3 * 6), delta=st.integers(1, 2**64 - 1))
def test_a_poisoned_scores_total_never_passes(seed: int, at: int, delta: int) -> None:
    total, _ = _honest_scores(seed)
    width = 2 + 4
    if at < 3 * 6 and at % width == 0:      # a tree's "held" count: claiming not to hold a tree is a refusal
        at += 1
    poisoned = total.copy()
    poisoned[at] = np.uint64((int(total[at]) + delta) % 2**64)     # the secure sum's arithmetic
    with pytest.raises(ValueError):
        icdta.read_scores(poisoned, 3, 2, 3)


def test_the_rules_counts_are_checked() -> None:
    rules = icdta.combine([_cart(A), _cart(B)])
    X = np.array([[10.0, 0, 0, 0], [35.0, 0, 0, 30.0], [50.0, 0, 0, 5.0], [50.0, 0, 0, 30.0]])
    y = np.array([0, 1, 1, 0])
    total = icdta.rule_counts(rules, X, y, 2).astype(np.uint64)
    counts, classes = icdta.read_rule_counts(total, len(rules), 2)
    # x0 <= 39: rows 0, 1; 32.5 < x0 <= 39: row 1; x0 > 32.5 and x3 <= 22: row 2; and x3 > 22: rows 1, 3
    assert counts.tolist() == [[1, 1], [0, 1], [0, 1], [1, 1]] and classes.tolist() == [2, 2]
    short = total.copy()
    short[0] -= np.uint64(1)                 # the rules no longer cover a row of class 0
    with pytest.raises(ValueError, match="together at least"):
        icdta.read_rule_counts(short, len(rules), 2)


def test_the_global_tree_predicts_what_the_rules_say_and_is_the_same_every_time() -> None:
    rng = np.random.default_rng(3)
    trees = [_cart(A, n_classes=3), _cart(B, n_classes=3),
             _cart(("split", 1, 5.0, ("split", 0, 20.0, ("leaf", 0), ("leaf", 2)), ("leaf", 0)), n_classes=3)]
    rules = icdta.combine(trees)
    counts = rng.integers(1, 5, (len(rules), 3))       # every rule matches rows: they cover every point
    counts[np.arange(len(rules)), rng.integers(0, 3, len(rules))] += 50     # each rule's one class
    cart = icdta.rules_to_tree(rules, counts, "gini")
    again = icdta.rules_to_tree(rules, counts, "gini")
    assert np.array_equal(cart.threshold, again.threshold) and np.array_equal(cart.value, again.value)
    X = np.column_stack([rng.uniform(0, 60, 2000), rng.uniform(0, 10, 2000), np.zeros(2000),
                         rng.uniform(0, 40, 2000)]).astype(np.float32).astype(np.float64)   # as the tree reads rows
    low, high = np.nan_to_num(rules.low, nan=-np.inf), np.nan_to_num(rules.high, nan=np.inf)
    holds = ((X[:, None, :] > low[None]) & (X[:, None, :] <= high[None])).all(axis=2)
    said = holds.astype(np.int64) @ counts
    assert (np.argmax(predict_value(cart, X), axis=1) == np.argmax(said, axis=1)).all()
    assert cart.n_leaves <= len(np.unique(holds, axis=0))   # no more leaves than sets of rules that hold


def test_a_global_tree_beyond_nodes_max_is_refused(monkeypatch) -> None:
    rules = icdta.combine([_cart(A), _cart(B)])
    monkeypatch.setattr(icdta, "NODES_MAX", 2)
    with pytest.raises(icdta.TooManyNodes):
        icdta.rules_to_tree(rules, np.array([[5, 1], [1, 5], [5, 1], [1, 5]]), "gini")


def test_a_local_tree_has_every_class_column_and_its_rules_read() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 3)), np.repeat([0, 2], 30)        # class 1 absent at this site
    cart = icdta.local_tree(X, y, 3, "entropy", 3, 2, 0.0, 0)
    assert cart.value.shape[1] == 3 and (cart.value[:, 1] == 0).all()
    assert icdta.read_tree(icdta.tree_doc(cart), 3, 3, 3).n_nodes == cart.n_nodes
    rules = icdta.combine([cart])
    lines = icdta.rule_lines(rules, np.ones((len(rules), 3), dtype=np.int64) * 5, ["a", "b", "c"], ["x", "y", "z"], 5)
    assert len(lines) == cart.n_leaves and all(line.startswith("if ") and "15 training rows match" in line
                                               for line in lines)
