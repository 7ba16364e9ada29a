"""Forests as arrays: exact agreement with scikit-learn, abstention, the wire gate, files."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier
from sklearn.tree import DecisionTreeClassifier

from fedpeer.errors import DataError, LocalProtocolError, RemoteProtocolError
from fedpeer.ml.forest import treepredict, trees
from fedpeer.ml.forest.treepredict import predict_trees
from fedpeer.wire import frame as wire
from fedpeer.testing import frames

ENGINES = ("sklearn", "numpy")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def names(n: int) -> list[str]:
    return [f"f{i}" for i in range(n)]


def per_tree_proba(model: RandomForestClassifier, X: np.ndarray, column: int = 1) -> np.ndarray:
    return np.stack([est.predict_proba(X)[:, column] for est in model.estimators_])


def on_thresholds(forest: trees.Forest, X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """X with many values placed exactly on, and one float32 step around, the trees' thresholds:
    where rounding X to float32 and comparing with a float64 threshold decides the branch."""
    X = X.copy()
    internal = forest.left >= 0
    feats, thrs = forest.feature[internal], forest.threshold[internal]
    for _ in range(X.size // 2):
        k = rng.integers(len(feats))
        t32 = np.float32(thrs[k])
        X[rng.integers(len(X)), feats[k]] = rng.choice([thrs[k], float(t32),
                                                       float(np.nextafter(t32, np.float32(-np.inf))),
                                                       float(np.nextafter(t32, np.float32(np.inf)))])
    return X


def reference_walk(forest: trees.Forest, X: np.ndarray) -> np.ndarray:
    """The semantics, one row and one node at a time: float32(x) <= float64 threshold goes left."""
    with np.errstate(over="ignore"):
        X32 = X.astype(np.float32)
    out = np.empty((forest.n_trees, len(X)))
    for t in range(forest.n_trees):
        base = int(forest.tree_offsets[t])
        for i, row in enumerate(X32):
            node = 0
            while forest.left[base + node] >= 0:
                go_left = float(row[forest.feature[base + node]]) <= forest.threshold[base + node]
                node = int(forest.left[base + node] if go_left else forest.right[base + node])
            out[t, i] = forest.value[base + node]
    return out


def small_forest() -> trees.Forest:
    """Two hand-made trees over features (a, b, c): a 5-node tree of depth 2 and a stump."""
    return trees._forest(
        ("a", "b", "c"), [0, 5, 6],
        left=[1, 2, -1, -1, -1, -1], right=[4, 3, -1, -1, -1, -1], feature=[0, 2, -1, -1, -1, -1],
        threshold=[0.5, -1.0, 0, 0, 0, 0], value=[0.5, 0.4, 0.0, 0.75, 1.0, 0.3])


def chain_forest(depth: int, features: tuple[str, ...] = ("x",)) -> trees.Forest:
    """One tree whose right spine is `depth` levels deep (2 * depth + 1 nodes, depth-first order)."""
    n = 2 * depth + 1
    left, right = np.full(n, -1), np.full(n, -1)
    feature, threshold = np.full(n, -1), np.zeros(n)
    for level in range(depth):      # spine node 2k: left leaf 2k+1, right 2k+2
        node = 2 * level
        left[node], right[node], feature[node], threshold[node] = node + 1, node + 2, 0, float(level)
    return trees._forest(features, [0, n], left, right, feature, threshold, np.full(n, 0.5))


def replaced(forest: trees.Forest, **changes: object) -> trees.Forest:
    fields = {k: getattr(forest, k) for k in ("features", "tree_offsets", "left", "right", "feature", "threshold",
                                              "value")}
    fields.update(changes)
    return trees.Forest(**fields)


def edited(forest: trees.Forest, name: str, index: int, value: float) -> trees.Forest:
    array = getattr(forest, name).copy()
    array[index] = value
    return replaced(forest, **{name: array})


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = make_classification(n_samples=1600, n_features=8, n_informative=5, random_state=3)
    X = np.column_stack([X, np.full(len(X), 2.5)])     # a constant feature: no tree can split on it
    return X[:800], y[:800], X[800:]


@pytest.fixture(scope="module")
def rf(data: tuple) -> RandomForestClassifier:
    X, y, _ = data
    return RandomForestClassifier(n_estimators=24, min_samples_leaf=2, random_state=0).fit(X, y)


# ---------------------------------------------------------------------------------------------
# Exact agreement with scikit-learn
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_predict_proba_of_every_tree(data: tuple, seed: int) -> None:
    X, y, X_test = data
    model = RandomForestClassifier(n_estimators=16, min_samples_leaf=2, max_features=3, random_state=seed).fit(X, y)
    forest = trees.from_sklearn(model, names(X.shape[1]))
    X_test = on_thresholds(forest, X_test, np.random.default_rng(seed))
    expected = per_tree_proba(model, X_test)
    for engine in ENGINES:
        got = predict_trees(forest, X_test, names(X.shape[1]), engine=engine)
        assert got.dtype == np.float64 and got.shape == (16, len(X_test))
        np.testing.assert_array_equal(got, expected)
    # few rows (no row sorting, no threads) and one thread give the same
    for engine in ENGINES:
        np.testing.assert_array_equal(predict_trees(forest, X_test[:7], names(9), engine=engine), expected[:, :7])
        np.testing.assert_array_equal(predict_trees(forest, X_test, names(9), engine=engine, threads=1), expected)


def test_negative_class_and_string_labels(data: tuple) -> None:
    X, y, X_test = data
    labels = np.where(y == 1, "sick", "well")
    model = RandomForestClassifier(n_estimators=6, min_samples_leaf=2, random_state=1).fit(X, labels)
    assert list(model.classes_) == ["sick", "well"]
    for index in (0, 1):
        forest = trees.from_sklearn(model, names(9), positive_index=index)
        np.testing.assert_array_equal(predict_trees(forest, X_test, names(9)),
                                      per_tree_proba(model, X_test, index))


def test_a_tree_whose_bootstrap_held_one_class() -> None:
    rng = np.random.default_rng(0)
    X = rng.random((12, 3))
    y = np.array(["a"] * 11 + ["b"])
    model = RandomForestClassifier(n_estimators=30, min_samples_leaf=2, random_state=0).fit(X, y)
    forest = trees.from_sklearn(model, ["p", "q", "r"])
    stumps = np.diff(forest.tree_offsets) == 1
    assert stumps.any() and (~stumps).any()             # the case under test does occur
    X_test = rng.random((300, 3))
    got = predict_trees(forest, X_test, ["p", "q", "r"])
    np.testing.assert_array_equal(got, per_tree_proba(model, X_test))
    assert (got[stumps] == 0.0).all()


def test_list_of_trees_some_lacking_a_class() -> None:
    rng = np.random.default_rng(1)
    X = rng.random((200, 2))
    y = (X[:, 0] > 0.5).astype(int)
    both = DecisionTreeClassifier(min_samples_leaf=2, random_state=0).fit(X, y)
    negatives_only = DecisionTreeClassifier(random_state=0).fit(X[y == 0], y[y == 0])
    positives_only = DecisionTreeClassifier(random_state=0).fit(X[y == 1], y[y == 1])
    assert list(negatives_only.classes_) == [0] and list(positives_only.classes_) == [1]
    forest = trees.from_sklearn([both, negatives_only, positives_only], ["u", "v"])
    got = predict_trees(forest, X, ["u", "v"])
    np.testing.assert_array_equal(got[0], both.predict_proba(X)[:, 1])
    assert (got[1] == 0.0).all() and (got[2] == 1.0).all()
    got0 = predict_trees(trees.from_sklearn([both, negatives_only], ["u", "v"], positive_index=0), X, ["u", "v"])
    np.testing.assert_array_equal(got0[0], both.predict_proba(X)[:, 0])
    assert (got0[1] == 1.0).all()


def test_from_sklearn_refuses_what_it_cannot_represent(data: tuple) -> None:
    X, y, _ = data
    one_class = RandomForestClassifier(n_estimators=2, random_state=0).fit(X, np.zeros(len(X), dtype=int))
    with pytest.raises(DataError, match="1 class"):
        trees.from_sklearn(one_class, names(9))
    model = RandomForestClassifier(n_estimators=2, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="9 features"):
        trees.from_sklearn(model, names(8))


def test_thresholds_beyond_float32_and_infinite_inputs() -> None:
    forest = trees._forest(("a", "b"), [0, 5], [1, 2, -1, -1, -1], [4, 3, -1, -1, -1], [0, 1, -1, -1, -1],
                           [1e39, -1e39, 0, 0, 0], [0.5, 0.5, 0.1, 0.2, 0.3])
    big = float(np.finfo(np.float32).max)
    X = np.array([[np.inf, 0], [-np.inf, -np.inf], [big, -big], [1e300, 1e300], [3.0, -1e300], [3.0, 0.0]])
    expected = reference_walk(forest, X)
    assert set(expected[0]) == {0.1, 0.2, 0.3}
    for engine in ENGINES:
        np.testing.assert_array_equal(predict_trees(forest, X, ["a", "b"], engine=engine), expected)


def _grow(rng: np.random.Generator, columns: dict[str, list], start: int, n_features: int, depth: int) -> int:
    """Append a random subtree in depth-first order; returns its root's index local to its tree."""
    me = len(columns["left"]) - start
    for k, v in (("left", -1), ("right", -1), ("feature", -1), ("threshold", 0.0),
                 ("value", float(rng.integers(0, 5)) / 4)):
        columns[k].append(v)
    if depth < 6 and rng.random() < 0.7:
        columns["feature"][start + me] = int(rng.integers(n_features))
        columns["threshold"][start + me] = float(rng.normal()) if rng.random() < 0.8 else float(rng.integers(-2, 3))
        columns["left"][start + me] = _grow(rng, columns, start, n_features, depth + 1)
        columns["right"][start + me] = _grow(rng, columns, start, n_features, depth + 1)
    return me


@st.composite
def random_forests(draw: st.DrawFn) -> tuple[trees.Forest, np.ndarray]:
    """Valid forests of random shape (depth-first order, as scikit-learn writes them) and rows
    with many values on the thresholds."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n_features = int(rng.integers(1, 5))
    columns: dict[str, list] = {k: [] for k in ("left", "right", "feature", "threshold", "value")}
    offsets = [0]
    for _ in range(int(rng.integers(1, 6))):
        _grow(rng, columns, offsets[-1], n_features, 0)
        offsets.append(len(columns["left"]))
    forest = trees._forest(tuple(names(n_features)), offsets, **columns)
    X = rng.normal(size=(int(rng.integers(1, 40)), n_features))
    return forest, on_thresholds(forest, X, rng) if (forest.left >= 0).any() else X


@settings(max_examples=60, deadline=None, derandomize=True)
@given(random_forests())
def test_both_engines_follow_the_reference_walk(case: tuple[trees.Forest, np.ndarray]) -> None:
    forest, X = case
    trees.validate(forest)
    expected = reference_walk(forest, X)
    for engine in ENGINES:
        np.testing.assert_array_equal(predict_trees(forest, X, forest.features, engine=engine), expected)


# ---------------------------------------------------------------------------------------------
# Abstention and column mapping
# ---------------------------------------------------------------------------------------------

def test_a_tree_using_a_missing_feature_abstains(data: tuple) -> None:
    X, y, X_test = data
    model = RandomForestClassifier(n_estimators=30, max_depth=2, max_features=1, random_state=0).fit(X, y)
    forest = trees.from_sklearn(model, names(9))
    uses_f4 = np.array([(est.tree_.feature == 4).any() for est in model.estimators_])
    assert uses_f4.any() and (~uses_f4).any()
    keep = [i for i in range(9) if i != 4]
    expected = per_tree_proba(model, X_test)
    for engine in ENGINES:
        got = predict_trees(forest, X_test[:, keep], [f"f{i}" for i in keep], engine=engine)
        assert np.isnan(got[uses_f4]).all()
        np.testing.assert_array_equal(got[~uses_f4], expected[~uses_f4])
    # a site lacking a feature no tree uses (the constant one) scores everything
    keep = list(range(8))
    np.testing.assert_array_equal(predict_trees(forest, X_test[:, keep], names(8)), expected)
    # a site with none of the features: every tree (none is a stump) abstains
    got = predict_trees(forest, np.zeros((3, 1)), ["other"])
    assert np.isnan(got).all()


def test_columns_are_matched_by_name(rf: RandomForestClassifier, data: tuple) -> None:
    _, _, X_test = data
    forest = trees.from_sklearn(rf, names(9))
    expected = predict_trees(forest, X_test, names(9))
    perm = np.random.default_rng(5).permutation(9)
    extra = np.random.default_rng(6).random((len(X_test), 2))
    shuffled = np.column_stack([extra[:, :1], X_test[:, perm], extra[:, 1:]])
    columns = ["zzz"] + [f"f{i}" for i in perm] + ["f9"]
    for engine in ENGINES:
        np.testing.assert_array_equal(predict_trees(forest, shuffled, columns, engine=engine), expected)


def test_bad_inputs_to_predict(rf: RandomForestClassifier, data: tuple) -> None:
    forest = trees.from_sklearn(rf, names(9))
    X = data[2][:5].copy()
    with pytest.raises(ValueError, match="numeric"):
        predict_trees(forest, X, names(8))
    with pytest.raises(ValueError, match="duplicate"):
        predict_trees(forest, X, names(8) + ["f0"])
    X[2, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        predict_trees(forest, X, names(9))


# ---------------------------------------------------------------------------------------------
# Combining, evaluator cache and fallback
# ---------------------------------------------------------------------------------------------

def test_concat_and_take(rf: RandomForestClassifier, data: tuple) -> None:
    X, y, X_test = data
    other = RandomForestClassifier(n_estimators=5, min_samples_leaf=2, random_state=9).fit(X, y)
    a, b = trees.from_sklearn(rf, names(9)), trees.from_sklearn(other, names(9))
    both = trees.concat([a, b])
    assert both.n_trees == 29
    expected = np.concatenate([per_tree_proba(rf, X_test), per_tree_proba(other, X_test)])
    np.testing.assert_array_equal(predict_trees(both, X_test, names(9)), expected)
    picked = trees.take(both, [28, 0, 3, 3])
    np.testing.assert_array_equal(predict_trees(picked, X_test, names(9)), expected[[28, 0, 3, 3]])
    mask = np.zeros(29, dtype=bool)
    mask[[2, 25]] = True
    np.testing.assert_array_equal(predict_trees(trees.take(both, mask), X_test, names(9)), expected[[2, 25]])
    empty = trees.take(both, [])
    trees.validate(empty)
    assert empty.n_trees == 0 and predict_trees(empty, X_test, names(9)).shape == (0, len(X_test))
    with pytest.raises(ValueError):
        trees.take(both, [29])
    with pytest.raises(ValueError):
        trees.concat([a, replaced(b, features=tuple(reversed(b.features)))])


def test_forest_is_read_only_and_built_once(rf: RandomForestClassifier, data: tuple) -> None:
    forest = trees.from_sklearn(rf, names(9))
    with pytest.raises(ValueError):
        forest.threshold[0] = 1.0
    predict_trees(forest, data[2], names(9))
    plan = treepredict._plan(forest)
    built = plan.sklearn_trees()
    assert built is not None and len(built) == forest.n_trees
    predict_trees(forest, data[2][:100], names(9))
    assert treepredict._plan(forest) is plan and plan.sklearn_trees() is built


def test_numpy_takes_over_when_sklearn_trees_cannot_be_built(rf: RandomForestClassifier, data: tuple,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import sklearn.tree._tree as sktree

    expected = per_tree_proba(rf, data[2])

    def broken(*args: object) -> None:
        raise TypeError("Tree() changed")

    assert treepredict.evaluator() == "sklearn"
    monkeypatch.setattr(sktree, "Tree", broken)
    forest = trees.from_sklearn(rf, names(9))
    np.testing.assert_array_equal(predict_trees(forest, data[2], names(9)), expected)
    assert "Tree() changed" in treepredict._plan(forest).sklearn_error
    with pytest.raises(RuntimeError, match="cannot be rebuilt"):
        predict_trees(forest, data[2], names(9), engine="sklearn")
    monkeypatch.setattr(treepredict, "_node_dtype_cache", [None])  # the layout check failed
    assert treepredict.evaluator() == "numpy"


# ---------------------------------------------------------------------------------------------
# validate: the gate for peers' trees
# ---------------------------------------------------------------------------------------------

def test_valid_hand_made_forests_pass() -> None:
    trees.validate(small_forest())
    trees.validate(chain_forest(64))
    trees.validate(trees.take(small_forest(), []))


MALFORMED = {
    "cycle (child points back to the root)": lambda f: edited(f, "right", 1, 0),
    "self loop": lambda f: edited(f, "left", 1, 1),
    # a tree in all but order: node 2's left child is node 1
    "child before its parent": lambda f: replaced(f, left=np.array([2, -1, 1, -1, -1, -1], np.int32),
                                                  right=np.array([4, -1, 3, -1, -1, -1], np.int32),
                                                  feature=np.array([0, -1, 2, -1, -1, -1], np.int32),
                                                  threshold=np.array([0.5, 0, -1.0, 0, 0, 0])),
    "shared child": lambda f: edited(f, "right", 1, 2),
    "left == right": lambda f: edited(edited(f, "left", 0, 4), "right", 0, 4),
    "child out of range": lambda f: edited(f, "right", 0, 99),
    "child in the next tree": lambda f: edited(f, "right", 0, 5),
    "child below -1": lambda f: edited(f, "left", 1, -2),
    "one child only": lambda f: edited(f, "right", 1, -1),
    "NaN threshold": lambda f: edited(f, "threshold", 0, np.nan),
    "infinite threshold": lambda f: edited(f, "threshold", 0, np.inf),
    "value above 1": lambda f: edited(f, "value", 2, 1.0000001),
    "value below 0": lambda f: edited(f, "value", 2, -1e-9),
    "NaN value": lambda f: edited(f, "value", 3, np.nan),
    "feature index out of range": lambda f: edited(f, "feature", 1, 3),
    "negative feature on an internal node": lambda f: edited(f, "feature", 0, -1),
    "leaf with a feature": lambda f: edited(f, "feature", 2, 0),
    "leaf with a threshold": lambda f: edited(f, "threshold", 2, 0.5),
    "offsets not ending at N": lambda f: replaced(f, tree_offsets=np.array([0, 5], np.int64)),
    "offsets past N": lambda f: replaced(f, tree_offsets=np.array([0, 5, 7], np.int64)),
    "offsets not from 0": lambda f: replaced(f, tree_offsets=np.array([1, 5, 6], np.int64)),
    "offsets decreasing": lambda f: replaced(f, tree_offsets=np.array([0, 6, 5, 6], np.int64)),
    "empty tree": lambda f: replaced(f, tree_offsets=np.array([0, 5, 5, 6], np.int64)),
    "no offsets": lambda f: replaced(f, tree_offsets=np.zeros(0, np.int64)),
    "ragged node arrays": lambda f: replaced(f, value=f.value[:5]),
    "int64 children": lambda f: replaced(f, left=f.left.astype(np.int64)),
    "int32 offsets": lambda f: replaced(f, tree_offsets=f.tree_offsets.astype(np.int32)),
    "float32 threshold": lambda f: replaced(f, threshold=f.threshold.astype(np.float32)),
    "big-endian value": lambda f: replaced(f, value=f.value.astype(">f8")),
    "2-D feature": lambda f: replaced(f, feature=f.feature.reshape(2, 3)),
    "list instead of array": lambda f: replaced(f, value=list(f.value)),
    "features as a list": lambda f: replaced(f, features=list(f.features)),
    "duplicate feature names": lambda f: replaced(f, features=("a", "b", "a")),
    "non-string feature name": lambda f: replaced(f, features=("a", "b", 3)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_validate_rejects(case: str) -> None:
    forest = MALFORMED[case](small_forest())
    with pytest.raises(RemoteProtocolError) as info:
        trees.validate(forest)
    assert info.value.reason == "tree"
    with pytest.raises(RemoteProtocolError):      # and the evaluator never walks it
        predict_trees(forest, np.zeros((2, 3)), ["a", "b", "c"])


def test_validate_limits() -> None:
    trees.validate(chain_forest(10), depth_max=10)
    with pytest.raises(RemoteProtocolError, match="deeper than 9"):
        trees.validate(chain_forest(10), depth_max=9)
    with pytest.raises(RemoteProtocolError, match="deeper than 64"):
        trees.validate(chain_forest(65))
    f = small_forest()
    trees.validate(f, trees_max=2, nodes_per_tree_max=5, features_max=3)
    for limits in ({"trees_max": 1}, {"nodes_per_tree_max": 4}, {"features_max": 2}):
        with pytest.raises(RemoteProtocolError):
            trees.validate(f, **limits)


@pytest.mark.timeout(20)
def test_a_huge_adversarial_chain_is_rejected_quickly() -> None:
    """A 1 M-node tree of depth 500 000: pointer jumping needs ~20 passes, not 500 000."""
    with pytest.raises(RemoteProtocolError, match="deeper"):
        trees.validate(chain_forest(499_999))


# ---------------------------------------------------------------------------------------------
# Wire
# ---------------------------------------------------------------------------------------------

def through_msgpack(doc: dict) -> object:
    return wire._decode(frames.plain(msgpack.packb(doc, use_bin_type=True)), 1 << 26)


def test_wire_round_trip(rf: RandomForestClassifier, data: tuple) -> None:
    forest = trees.from_sklearn(rf, names(9))
    back = trees.from_wire(through_msgpack(trees.to_wire(forest)))
    assert back.features == forest.features
    for k in ("tree_offsets", "left", "right", "feature", "threshold", "value"):
        assert getattr(back, k).dtype == getattr(forest, k).dtype
        np.testing.assert_array_equal(getattr(back, k), getattr(forest, k))
    np.testing.assert_array_equal(predict_trees(back, data[2], names(9)), per_tree_proba(rf, data[2]))


def test_to_wire_refuses_an_invalid_forest() -> None:
    with pytest.raises(LocalProtocolError):
        trees.to_wire(edited(small_forest(), "value", 0, 2.0))
    with pytest.raises(LocalProtocolError):
        trees.to_wire(chain_forest(65))     # a peer would refuse it (depth limit)


def test_from_wire_rejects_wrong_types() -> None:
    doc = trees.to_wire(small_forest())
    bad = [
        {**doc, "left": wire.encode_array(small_forest().left.astype(np.int64))},
        {**doc, "threshold": wire.encode_array(small_forest().threshold.astype(np.float32))},
        {**doc, "features": "abc"},
        {**doc, "features": ["a", "b", 3]},
        {**doc, "extra": 1},
        {k: v for k, v in doc.items() if k != "value"},
        {**doc, "value": {**doc["value"], "data": doc["value"]["data"][:-1]}},
        [doc],
    ]
    for b in bad:
        with pytest.raises(RemoteProtocolError):
            trees.from_wire(b)


def _mutations() -> st.SearchStrategy:
    keys = ["features", "tree_offsets", "left", "right", "feature", "threshold", "value"]
    array_keys = keys[1:]
    junk = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5)
                        | st.binary(max_size=16),
                        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                        max_leaves=6)
    element = st.one_of(            # edits that pass the type checks and reach validate()
        st.tuples(st.just("int"), st.sampled_from(["left", "right", "feature"]),
                  st.tuples(st.integers(0, 20), st.integers(-3, 25))),
        st.tuples(st.just("offset"), st.just("tree_offsets"), st.tuples(st.integers(0, 5), st.integers(-2, 30))),
        st.tuples(st.just("float"), st.sampled_from(["threshold", "value"]),
                  st.tuples(st.integers(0, 20), st.floats(-2, 2) | st.floats())),
    )
    return element | element | st.one_of(
        st.tuples(st.just("replace"), st.sampled_from(keys), junk),
        st.tuples(st.just("delete"), st.sampled_from(keys), st.none()),
        st.tuples(st.just("add"), st.text(max_size=8), junk),
        st.tuples(st.just("bytes"), st.sampled_from(array_keys), st.tuples(st.integers(0, 200), st.integers(0, 255))),
        st.tuples(st.just("int"), st.sampled_from(["left", "right", "feature"]),
                  st.tuples(st.integers(0, 20), st.integers(-3, 25))),
        st.tuples(st.just("offset"), st.just("tree_offsets"), st.tuples(st.integers(0, 5), st.integers(-2, 30))),
        st.tuples(st.just("float"), st.sampled_from(["threshold", "value"]),
                  st.tuples(st.integers(0, 20), st.floats(allow_nan=True, allow_infinity=True))),
        st.tuples(st.just("dtype"), st.sampled_from(array_keys),
                  st.sampled_from(sorted(wire.ARRAY_DTYPES) + ["<f2", "O"])),
        st.tuples(st.just("shape"), st.sampled_from(array_keys), st.lists(st.integers(-1, 40), max_size=4)),
        st.tuples(st.just("truncate"), st.sampled_from(array_keys), st.integers(0, 100)),
        st.tuples(st.just("name"), st.just("features"), junk),
    )


def _mutate(doc: dict, mutation: tuple) -> None:
    op, key, arg = mutation
    if op not in ("replace", "delete", "add") and not isinstance(doc.get(key), (dict, list)):
        return                      # an earlier mutation removed what this one edits
    if op == "replace":
        doc[key] = arg
    elif op == "delete":
        doc.pop(key, None)
    elif op == "add":
        doc[arg if isinstance(arg, str) else "x"] = 1
    elif op == "name":
        doc["features"] = list(doc["features"]) + [arg]
    elif isinstance(doc[key], list) or not isinstance(doc[key].get("data"), bytes):
        return
    elif op == "dtype":
        doc[key] = {**doc[key], "dtype": arg}
    elif op == "shape":
        doc[key] = {**doc[key], "shape": arg}
    elif op == "truncate":
        doc[key] = {**doc[key], "data": doc[key]["data"][:arg]}
    elif op == "bytes":
        data = bytearray(doc[key]["data"])
        if data:
            data[arg[0] % len(data)] = arg[1]
        doc[key] = {**doc[key], "data": bytes(data)}
    else:                           # set one element of a typed array
        dtype = np.dtype({"int": "<i4", "offset": "<i8", "float": "<f8"}[op])
        data = doc[key]["data"]
        array = np.frombuffer(data[:len(data) - len(data) % dtype.itemsize], dtype=dtype).copy()
        if len(array):
            array[arg[0] % len(array)] = arg[1]
        doc[key] = {**doc[key], "data": array.tobytes()}


@pytest.mark.timeout(60)            # "never hang": a walk that loops would trip this
@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_mutations(), min_size=1, max_size=4))
def test_mutated_wire_docs_raise_only_remote_protocol_errors(mutations: list) -> None:
    forest = trees.concat([small_forest(), chain_forest(3, ("a", "b", "c"))])
    doc = through_msgpack(trees.to_wire(forest))
    for m in mutations:
        _mutate(doc, m)
    try:
        got = trees.from_wire(doc)
    except RemoteProtocolError as exc:
        event(f"rejected: {exc.reason}")
        return
    event("accepted")
    # Accepted: then it is a valid forest, and scoring it works and matches the reference walk.
    trees.validate(got)
    X = np.random.default_rng(0).normal(size=(6, len(got.features)))
    for engine in ENGINES:
        np.testing.assert_array_equal(predict_trees(got, X, got.features, engine=engine), reference_walk(got, X))


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def test_save_load_round_trip(tmp_path: Path, rf: RandomForestClassifier, data: tuple) -> None:
    forest = trees.from_sklearn(rf, names(9))
    weights = np.linspace(0, 1, forest.n_trees)
    path = tmp_path / "model"        # no .npz suffix: the file is written where asked
    trees.save(path, forest, weights=weights)
    assert path.exists()
    back, arrays = trees.load(path)
    assert back.features == forest.features and set(arrays) == {"weights"}
    np.testing.assert_array_equal(arrays["weights"], weights)
    np.testing.assert_array_equal(predict_trees(back, data[2], names(9)), per_tree_proba(rf, data[2]))
    with pytest.raises(ValueError, match="reserved"):
        trees.save(path, forest, value=weights)


def test_load_refuses_pickles_and_junk(tmp_path: Path) -> None:
    forest = small_forest()
    fields = {k: getattr(forest, k) for k in ("tree_offsets", "left", "right", "feature", "threshold", "value")}
    pickled = tmp_path / "pickled.npz"
    with open(pickled, "wb") as f:     # features as an object array: only loadable with pickle
        np.savez(f, features=np.array([["a", "b", "c"]], dtype=object), **fields)
    with pytest.raises(DataError, match="pickled.npz"):
        trees.load(pickled)
    extra = tmp_path / "extra.npz"
    with open(extra, "wb") as f:
        np.savez(f, features=np.array('["a", "b", "c"]'), evil=np.array([{"x": 1}], dtype=object), **fields)
    with pytest.raises(DataError):
        trees.load(extra)
    raw = tmp_path / "raw.pickle"
    raw.write_bytes(pickle.dumps(forest))
    with pytest.raises(DataError):
        trees.load(raw)
    broken = tmp_path / "broken.npz"
    buffer = io.BytesIO()
    np.savez(buffer, features=np.array('["a", "b", "c"]'), **{**fields, "value": np.full(6, 2.0)})
    broken.write_bytes(buffer.getvalue())
    with pytest.raises(DataError, match="outside"):
        trees.load(broken)
    with pytest.raises(DataError):
        trees.load(tmp_path / "missing.npz")
