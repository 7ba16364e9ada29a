"""ICDTA4FL's arithmetic (Argente-Garrido et al., "An interpretable client decision tree
aggregation process for federated learning", Information Sciences 694, 2025), as pure functions:
every member runs them on the same inputs and derives the same trees, rules and global tree.

1. `local_tree`: a site's own scikit-learn DecisionTreeClassifier as a `Cart`; what travels of it
   (`tree_doc`) is its structure and each leaf's class — not its rows nor its class mix;
   `read_tree` checks a received one strictly (LOCAL_NODES_MAX nodes, depth, features, finite
   thresholds, children in scikit-learn's depth-first order, a class per leaf).
2. `score_vector` / `read_scores`: every tree's confusion matrix on a member's scoring rows (not
   on the owner's: the owner contributes its rows instead), summed over the members; the totals
   are checked (each tree held by every member counts exactly the federation's scoring rows).
3. `select`: the filter. `threshold` 0 keeps the trees whose federated accuracy and macro-F1 are
   both at least the mean over the trees (the reference implementation's default); above 0 keeps
   those whose accuracy is at least `threshold`; when none passes, the trees of the best accuracy.
4. `combine`: each kept tree's leaves as rules (root-to-leaf conjunctions of `x_f <= t` and
   `x_f > t`), aggregated by Cartesian product, one leaf of every kept tree per combination. A
   combination whose leaves cannot hold at once (their boxes do not meet: `x0 <= 32.5` with
   `x0 > 39`) is dropped; in a kept one, where two rules bound the same feature in the same
   direction, the less restrictive bound is selected (`x0 > 32.5` with `x0 > 39` gives
   `x0 > 32.5`). Beyond RULES_MAX rules it refuses (`TooManyRules`).
5. `rule_counts` / `read_rule_counts`: every rule's class counts over the members' training rows
   (a secure sum) — each rule's class is its most frequent one; rules no training row matches
   are dropped.
6. `rules_to_tree`: one global tree from the rules, deterministically: a node's rules are those
   whose box meets the node's region; it splits at a rule's bound (the candidate of least
   weighted impurity of the rules' summed class counts on each side, ties to the lowest feature,
   then the lowest threshold) while its rules' classes differ and some rule does not hold on the
   whole region (and above DEPTH_MAX); its value is the class shares of its rules' summed counts,
   `n_node_samples` the rows they match (a row matched by two overlapping rules counted twice).
   So at every point the tree's class is the class of the summed counts of the rules that hold
   there: their common class where they agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.ml.moments import exact_sum, whole_counts
from fedpeer.ml.tree.model import LEAF, THRESHOLD_DIGITS, UNDEFINED, Cart, check_cart, predict_value

__all__ = ["Rules", "Scores", "TooManyNodes", "TooManyRules", "aggregate_in_process", "combine", "confusion",
           "leaf_boxes", "local_tree", "read_rule_counts", "read_scores", "read_tree", "rule_counts", "rule_lines",
           "rules_to_tree", "score_vector", "select", "tree_doc"]

LOCAL_NODES_MAX = 1 << 14          # nodes of a site's tree a member accepts
RULES_MAX = 4096                   # aggregated rules (Cartesian product after contradictions are dropped)
NODES_MAX = 1 << 14                # nodes of the global tree built from the rules
DEPTH_MAX = 64                     # levels of the global tree: a node this deep is a leaf
PAIR_CELLS_MAX = 1 << 22           # (rule, leaf, feature) cells compared at once: ~32 MiB of float64
MATCH_CELLS_MAX = 1 << 24          # (rule, row, feature) cells compared at once: ~16 MiB of bools
DOC_ARRAYS = ("feature", "threshold", "left", "right", "klass")


class TooManyRules(ValueError):
    """The Cartesian product keeps more than RULES_MAX rules (`count`: how many so far)."""

    def __init__(self, count: int) -> None:
        self.count = count
        super().__init__(f"more than {RULES_MAX} aggregated rules ({count} and counting)")


class TooManyNodes(ValueError):
    """The global tree would have more than NODES_MAX nodes."""

    def __init__(self) -> None:
        super().__init__(f"the global tree would have more than {NODES_MAX} nodes")


# -- 1. local trees ------------------------------------------------------------------------------

def local_tree(X: Any, y: Any, n_classes: int, criterion: str, max_depth: int, min_leaf_rows: int,
               ccp_alpha: float, seed: int) -> Cart:
    """A site's scikit-learn DecisionTreeClassifier on its rows (labels 0..n_classes-1), as a Cart
    whose value holds every class's share (classes absent from the site's rows: 0)."""
    from sklearn.tree import DecisionTreeClassifier

    X, y = np.asarray(X), np.asarray(y, dtype=np.int64)
    fitted = DecisionTreeClassifier(criterion=criterion, max_depth=max_depth, min_samples_leaf=int(min_leaf_rows),
                                    ccp_alpha=ccp_alpha, random_state=seed).fit(X, y)
    t = fitted.tree_
    value = np.zeros((t.node_count, n_classes))
    raw = t.value[:, 0, :]
    value[:, fitted.classes_.astype(np.int64)] = raw / raw.sum(axis=1, keepdims=True)
    leaf = t.children_left == LEAF
    return Cart(criterion=criterion, n_features=X.shape[1],
                feature=np.where(leaf, UNDEFINED, t.feature).astype(np.int64),
                threshold=np.where(leaf, float(UNDEFINED), t.threshold), left=t.children_left.astype(np.int64),
                right=t.children_right.astype(np.int64), value=value,
                n_node_samples=t.n_node_samples.astype(np.int64), impurity=t.impurity.astype(np.float64))


def tree_doc(cart: Cart) -> dict[str, np.ndarray]:
    """What a member sends of its tree: the structure and each leaf's class (-1 at inner nodes)."""
    klass = np.where(cart.left == LEAF, np.argmax(cart.value, axis=1), -1).astype(np.int64)
    return {"feature": cart.feature.astype(np.int64), "threshold": cart.threshold.astype(np.float64),
            "left": cart.left.astype(np.int64), "right": cart.right.astype(np.int64), "klass": klass}


def read_tree(doc: Any, n_features: int, n_classes: int, max_depth: int, criterion: str = "gini") -> Cart:
    """A received tree as a Cart (value: its leaves' classes one-hot), or ValueError naming what is
    wrong: not the five arrays, more than LOCAL_NODES_MAX nodes, a split on a feature out of range,
    a threshold not finite, children out of depth-first order, deeper than `max_depth`, a leaf
    without a class in range."""
    if not isinstance(doc, dict) or set(doc) != set(DOC_ARRAYS):
        raise ValueError(f"a tree is the arrays {', '.join(DOC_ARRAYS)}")
    try:
        ints = {k: np.asarray(doc[k]) for k in ("feature", "left", "right", "klass")}
        threshold = np.asarray(doc["threshold"])
    except (TypeError, ValueError):
        raise ValueError("a tree's arrays are not numbers") from None
    if any(a.dtype.kind not in "iu" for a in ints.values()) or threshold.dtype.kind != "f":
        raise ValueError("a tree's arrays are not of integers (threshold: floats)")
    n = threshold.shape[0] if threshold.ndim == 1 else -1
    if not 1 <= n <= LOCAL_NODES_MAX or any(a.shape != (n,) for a in ints.values()):
        raise ValueError(f"a tree holds 1 to {LOCAL_NODES_MAX} nodes, each array one entry per node")
    ints = {k: a.astype(np.int64) for k, a in ints.items()}
    leaf = ints["left"] == LEAF
    klass = ints["klass"]
    if ((klass[leaf] < 0) | (klass[leaf] >= n_classes)).any() or (klass[~leaf] != -1).any():
        raise ValueError(f"a leaf's class is outside 0..{n_classes - 1} (or an inner node has one)")
    value = np.zeros((n, n_classes))
    value[np.flatnonzero(leaf), klass[leaf]] = 1.0
    cart = Cart(criterion=criterion, n_features=n_features, feature=ints["feature"],
                threshold=threshold.astype(np.float64), left=ints["left"], right=ints["right"], value=value,
                n_node_samples=np.ones(n, dtype=np.int64), impurity=np.zeros(n))
    check_cart(cart, n_classes)
    if cart.depth > max_depth:
        raise ValueError(f"a tree of depth {cart.depth}, deeper than the job's max_depth {max_depth}")
    return cart


# -- 2. federated scores, 3. the filter ------------------------------------------------------------

def confusion(cart: Cart, X: Any, y: Any, n_classes: int) -> np.ndarray:
    """(K, K) counts of (true class, predicted class) of `cart` on rows X, y."""
    predicted = np.argmax(predict_value(cart, X), axis=1)
    cells = np.asarray(y, dtype=np.int64) * n_classes + predicted
    return np.bincount(cells, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def score_vector(trees: Sequence[Cart | None], mine: int, X: Any, y: Any, n_classes: int) -> np.ndarray:
    """A member's contribution (int64) to the scores sum, for the members' trees in member order
    (None: a tree it does not hold): per tree [held, own rows, K x K confusion], then its rows.
    Its own tree (index `mine`) it holds but does not score: it gives its rows instead."""
    rows = len(np.asarray(y))
    width = 2 + n_classes * n_classes
    out = np.zeros(len(trees) * width + 1, dtype=np.int64)
    for j, cart in enumerate(trees):
        if cart is None:
            continue
        out[j * width] = 1
        if j == mine:
            out[j * width + 1] = rows
        else:
            out[j * width + 2:(j + 1) * width] = confusion(cart, X, y, n_classes).ravel()
    out[-1] = rows
    return out


@dataclass(frozen=True)
class Scores:
    agreed: np.ndarray       # bool (T,): held by every member, and scored on at least one row
    accuracy: np.ndarray     # float64 (T,), NaN where not agreed
    f1: np.ndarray           # macro-F1 over the classes present in the truth or the predictions
    rows: np.ndarray         # int64 (T,): rows each tree was scored on


def read_scores(total: Any, n_trees: int, n_classes: int, members: int) -> Scores:
    """The federation's scores from the summed `score_vector`s of `members` members; ValueError
    (naming the check) for a total no honest members can give: a count at or above 2^63, a tree
    held by more members than there are, or a tree whose confusion and owner's rows do not add up
    to the federation's rows (exactly, where every member holds it; at most, elsewhere)."""
    counts = whole_counts(np.asarray(total))
    width = 2 + n_classes * n_classes
    if counts.shape != (n_trees * width + 1,):
        raise ValueError("the scores have the length every member sends")
    n = int(counts[-1])
    per = counts[:-1].reshape(n_trees, width)
    held, own, conf = per[:, 0], per[:, 1], per[:, 2:].reshape(n_trees, n_classes, n_classes)
    if n < 1 or (held > members).any() or (own > n).any() or (conf > n).any():
        raise ValueError("the scoring rows are at least one, a tree is held by at most every member and no count "
                         "exceeds the scoring rows")
    seen = exact_sum(conf, axis=(1, 2)) + own       # Python integers: entries near 2^63 cannot wrap
    agreed = held == members
    if (seen > n).any() or (seen[agreed] != n).any():
        raise ValueError("every tree's confusion and its owner's rows add up to the federation's scoring rows")
    rows = conf.sum(axis=(1, 2))
    agreed &= rows > 0
    accuracy, f1 = np.full(n_trees, np.nan), np.full(n_trees, np.nan)
    for t in np.flatnonzero(agreed):
        c = conf[t]
        tp = np.diag(c)
        denominator = c.sum(axis=0) + c.sum(axis=1)     # 2 tp + fp + fn
        present = denominator > 0
        accuracy[t] = int(tp.sum()) / int(rows[t])
        f1[t] = math.fsum(2 * int(a) / int(b) for a, b in zip(tp[present], denominator[present])) / int(present.sum())
    return Scores(agreed=agreed, accuracy=accuracy, f1=f1, rows=rows)


def select(scores: Scores, threshold: float) -> tuple[list[int], bool]:
    """The kept trees (module docstring, 3.) and whether the fallback to the best accuracy kept them."""
    agreed = [int(t) for t in np.flatnonzero(scores.agreed)]
    if not agreed:
        return [], False
    acc, f1 = scores.accuracy, scores.f1
    if threshold > 0:
        kept = [t for t in agreed if acc[t] >= threshold]
    else:
        acc_mean = math.fsum(acc[t] for t in agreed) / len(agreed)
        f1_mean = math.fsum(f1[t] for t in agreed) / len(agreed)
        kept = [t for t in agreed if acc[t] >= acc_mean and f1[t] >= f1_mean]
    if kept:
        return kept, False
    best = max(acc[t] for t in agreed)
    return [t for t in agreed if acc[t] == best], True


# -- 4. rules and their Cartesian product ---------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Rules:
    """Aggregated rules: rule r holds where x_f > low[r, f] and x_f <= high[r, f] for every f whose
    bound is not NaN (NaN: no condition); `leaves[r, k]` is the leaf of kept tree k it joins."""

    low: np.ndarray       # float64 (R, F)
    high: np.ndarray      # float64 (R, F)
    leaves: np.ndarray    # int64 (R, T)

    def __len__(self) -> int:
        return len(self.low)

    def take(self, keep: np.ndarray) -> Rules:
        return Rules(self.low[keep], self.high[keep], self.leaves[keep])


def leaf_boxes(cart: Cart) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every leaf's rule, in node order: (low, high) as in `Rules` (NaN: no condition), leaf ids."""
    lows, highs, ids = [], [], []
    stack = [(0, np.full(cart.n_features, np.nan), np.full(cart.n_features, np.nan))]
    while stack:
        i, low, high = stack.pop()
        if cart.left[i] == LEAF:
            lows.append(low)
            highs.append(high)
            ids.append(i)
            continue
        f, t = int(cart.feature[i]), float(cart.threshold[i])
        left_high, right_low = high.copy(), low.copy()
        left_high[f] = np.fmin(high[f], t)
        right_low[f] = np.fmax(low[f], t)
        stack += [(int(cart.right[i]), right_low, high), (int(cart.left[i]), low, left_high)]
    return np.array(lows), np.array(highs), np.array(ids, dtype=np.int64)


def combine(trees: Sequence[Cart]) -> Rules:
    """The Cartesian product of the trees' leaf rules (module docstring, 4.), in order: the first
    tree's leaves outermost. TooManyRules beyond RULES_MAX rules."""
    low, high, ids = leaf_boxes(trees[0])
    # the boxes' intersection (what decides a contradiction) beside the combined bounds
    meet_low, meet_high = np.nan_to_num(low, nan=-np.inf), np.nan_to_num(high, nan=np.inf)
    rules = Rules(low, high, ids[:, None])
    for cart in trees[1:]:
        b_low, b_high, b_ids = leaf_boxes(cart)
        b_meet_low, b_meet_high = np.nan_to_num(b_low, nan=-np.inf), np.nan_to_num(b_high, nan=np.inf)
        n_features = low.shape[1]
        step = max(1, PAIR_CELLS_MAX // max(1, len(b_ids) * n_features))
        parts: list[tuple[np.ndarray, ...]] = []
        kept = 0
        for start in range(0, len(rules), step):
            a = slice(start, start + step)
            lo = np.maximum(meet_low[a, None, :], b_meet_low[None, :, :])
            hi = np.minimum(meet_high[a, None, :], b_meet_high[None, :, :])
            ra, rb = np.nonzero((lo < hi).all(axis=2))          # row-major: a outer, b inner
            kept += len(ra)
            if kept > RULES_MAX:
                raise TooManyRules(kept)
            parts.append((lo[ra, rb], hi[ra, rb], np.fmin(rules.low[a][ra], b_low[rb]),
                          np.fmax(rules.high[a][ra], b_high[rb]),
                          np.concatenate([rules.leaves[a][ra], b_ids[rb, None]], axis=1)))
        meet_low, meet_high, low, high, leaves = (np.concatenate([p[k] for p in parts]) for k in range(5))
        rules = Rules(low, high, leaves)
    if len(rules) > RULES_MAX:
        raise TooManyRules(len(rules))
    return rules


# -- 5. the rules' class counts -------------------------------------------------------------------

def rule_counts(rules: Rules, X: Any, y: Any, n_classes: int) -> np.ndarray:
    """A member's contribution (int64) to the rule counts sum: per rule the rows of each class it
    matches (R x K), then its rows of each class (K). X is read as float32, compared in float64."""
    X64 = np.asarray(X, dtype=np.float32).astype(np.float64)
    y = np.asarray(y, dtype=np.int64)
    used = np.flatnonzero(~(np.isnan(rules.low) & np.isnan(rules.high)).all(axis=0))
    low = np.nan_to_num(rules.low[:, used], nan=-np.inf)
    high = np.nan_to_num(rules.high[:, used], nan=np.inf)
    Xu = X64[:, used]
    out = np.zeros((len(rules), n_classes), dtype=np.int64)
    step = max(1, MATCH_CELLS_MAX // max(1, len(y) * max(1, len(used))))
    for start in range(0, len(rules), step):
        r = slice(start, start + step)
        match = ((Xu[None, :, :] > low[r, None, :]) & (Xu[None, :, :] <= high[r, None, :])).all(axis=2)
        out[r] = np.stack([match[:, y == c].sum(axis=1) for c in range(n_classes)], axis=1)
    return np.concatenate([out.ravel(), np.bincount(y, minlength=n_classes)])


def read_rule_counts(total: Any, n_rules: int, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(R, K) counts and the federation's training rows of each class from the summed
    `rule_counts`; ValueError (naming the check) unless every rule's count of a class is at most
    the federation's rows of that class and, the rules covering every point, the rules' counts of
    each class together at least those rows."""
    counts = whole_counts(np.asarray(total))
    if counts.shape != (n_rules * n_classes + n_classes,):
        raise ValueError("the rule counts have the length every member sends")
    per, classes = counts[:-n_classes].reshape(n_rules, n_classes), counts[-n_classes:]
    if exact_sum(classes) < 1 or (per > classes).any() or (exact_sum(per, axis=0) < classes).any():
        raise ValueError("each rule matches at most, and the rules together at least, the federation's rows of "
                         "each class")
    return per, classes


# -- 6. the global tree -----------------------------------------------------------------------------

def _impurity(counts: np.ndarray, criterion: str) -> np.ndarray:
    """Per row of (.., K) counts: gini or entropy (log2) of its shares; 0 for an empty row."""
    n = counts.sum(axis=-1, keepdims=True).astype(np.float64)
    p = np.divide(counts, n, out=np.zeros(counts.shape), where=n > 0)
    if criterion == "entropy":
        logs = np.log2(p, out=np.zeros(p.shape), where=p > 0)
        return -(p * logs).sum(axis=-1)
    return 1.0 - (p * p).sum(axis=-1)


def _best_split(low: np.ndarray, high: np.ndarray, counts: np.ndarray, region: tuple[np.ndarray, np.ndarray],
                criterion: str) -> tuple[int, float] | None:
    """The split of least weighted impurity at a rule's bound strictly inside the region whose both
    sides keep a rule (left: low < t; right: high > t); ties to the lowest feature, then threshold."""
    lo_r, hi_r = region
    best: tuple[float, int, float] | None = None
    total = counts.sum(axis=0)
    for f in np.flatnonzero((np.isfinite(low) | np.isfinite(high)).any(axis=0)):
        f = int(f)
        bounds = np.concatenate([low[:, f], high[:, f]])
        t = np.unique(bounds[np.isfinite(bounds) & (bounds > lo_r[f]) & (bounds < hi_r[f])])
        if len(t) == 0:
            continue
        by_low, by_high = np.argsort(low[:, f], kind="stable"), np.argsort(high[:, f], kind="stable")
        cum_low = np.vstack([np.zeros(counts.shape[1], np.int64), np.cumsum(counts[by_low], axis=0)])
        cum_high = np.vstack([np.zeros(counts.shape[1], np.int64), np.cumsum(counts[by_high], axis=0)])
        left = cum_low[np.searchsorted(low[by_low, f], t, side="left")]       # rules with low < t
        right = total - cum_high[np.searchsorted(high[by_high, f], t, side="right")]   # high > t
        n_left, n_right = left.sum(axis=1), right.sum(axis=1)
        ok = (n_left > 0) & (n_right > 0)
        if not ok.any():
            continue
        score = n_left * _impurity(left, criterion) + n_right * _impurity(right, criterion)
        k = int(np.argmin(np.where(ok, score, np.inf)))
        if best is None or score[k] < best[0]:
            best = (float(score[k]), f, float(t[k]))
    return None if best is None else (best[1], best[2])


def rules_to_tree(rules: Rules, counts: np.ndarray, criterion: str) -> Cart:
    """The global tree of rules whose every count row holds a row (module docstring, 6.), in
    scikit-learn's arrays and node order. TooManyNodes beyond NODES_MAX nodes."""
    n_features = rules.low.shape[1]
    low, high = np.nan_to_num(rules.low, nan=-np.inf), np.nan_to_num(rules.high, nan=np.inf)
    klass = np.argmax(counts, axis=1)
    feature, threshold, left, right, value, rows, impurity = [], [], [], [], [], [], []
    # (rules meeting the node's region, region low, region high, depth, parent, is the right child)
    stack: list[tuple[np.ndarray, np.ndarray, np.ndarray, int, int, bool]] = [
        (np.arange(len(rules)), np.full(n_features, -np.inf), np.full(n_features, np.inf), 0, -1, False)]
    while stack:
        at, lo, hi, depth, parent, is_right = stack.pop()
        node = len(feature)
        if node >= NODES_MAX:
            raise TooManyNodes()
        if parent >= 0 and is_right:
            right[parent] = node
        summed = counts[at].sum(axis=0)
        value.append(summed / summed.sum())
        rows.append(int(summed.sum()))
        impurity.append(float(_impurity(summed, criterion)))
        unanimous = (klass[at] == klass[at[0]]).all()
        split = None if unanimous or depth >= DEPTH_MAX else _best_split(low[at], high[at], counts[at], (lo, hi),
                                                                          criterion)
        if split is None:
            feature.append(UNDEFINED)
            threshold.append(float(UNDEFINED))
            left.append(LEAF)
            right.append(LEAF)
            continue
        f, t = split
        feature.append(f)
        threshold.append(t)
        left.append(node + 1)
        right.append(LEAF)            # set when the right child is reached
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[f], right_lo[f] = t, t
        stack.append((at[high[at, f] > t], right_lo, hi, depth + 1, node, True))
        stack.append((at[low[at, f] < t], lo, left_hi, depth + 1, node, False))
    return Cart(criterion=criterion, n_features=n_features, feature=np.array(feature, dtype=np.int64),
                threshold=np.array(threshold), left=np.array(left, dtype=np.int64),
                right=np.array(right, dtype=np.int64), value=np.array(value), n_node_samples=np.array(rows, np.int64),
                impurity=np.array(impurity))


# -- what people read ------------------------------------------------------------------------------

def rule_lines(rules: Rules, counts: np.ndarray, features: Sequence[str], classes: Sequence[str],
               min_leaf_rows: int) -> list[str]:
    """One line per aggregated rule: its conditions, its class, the federation's training rows it
    matches and its class mix — not shown where some class has 1 to min_leaf_rows - 1 rows."""
    def num(v: float) -> str:
        return f"{v:.{THRESHOLD_DIGITS}g}"
    out = []
    for r in range(len(rules)):
        conditions = []
        for f in range(rules.low.shape[1]):
            low, high = rules.low[r, f], rules.high[r, f]
            if not np.isnan(low) and not np.isnan(high):
                conditions.append(f"{num(low)} < {features[f]} <= {num(high)}")
            elif not np.isnan(low):
                conditions.append(f"{features[f]} > {num(low)}")
            elif not np.isnan(high):
                conditions.append(f"{features[f]} <= {num(high)}")
        c = counts[r]
        mix = (f"class mix not shown: a class has fewer than {min_leaf_rows} rows here"
               if ((c > 0) & (c < min_leaf_rows)).any() else ", ".join(f"{k} {int(n)}" for k, n in zip(classes, c)))
        rows = int(c.sum())
        then = f"{classes[int(np.argmax(c))]} ({rows} training row{'s match' if rows != 1 else ' matches'}; {mix})"
        out.append(f"if {' and '.join(conditions)} then {then}" if conditions else f"always {then}")
    return out


# -- the whole process in one place ----------------------------------------------------------------

def aggregate_in_process(trees: Sequence[Cart], scoring: Sequence[tuple[Any, Any]],
                         training: Sequence[tuple[Any, Any]], n_classes: int, criterion: str = "gini",
                         threshold: float = 0.0) -> tuple[Cart, Rules, np.ndarray, list[int]]:
    """Steps 2 to 6 for members held in one process (member i: its tree, scoring rows, training
    rows), summing with plain integer sums: (global tree, its rules, their counts, kept trees)."""
    every = [read_tree(tree_doc(t), t.n_features, n_classes, t.depth, criterion) for t in trees]
    summed = sum(score_vector(every, i, X, y, n_classes) for i, (X, y) in enumerate(scoring))
    kept, _ = select(read_scores(np.asarray(summed).astype(np.uint64), len(every), n_classes, len(every)), threshold)
    rules = combine([every[t] for t in kept])
    total = sum(rule_counts(rules, X, y, n_classes) for X, y in training)
    counts, _ = read_rule_counts(np.asarray(total).astype(np.uint64), len(rules), n_classes)
    matched = counts.sum(axis=1) > 0
    rules, counts = rules.take(matched), counts[matched]
    return rules_to_tree(rules, counts, criterion), rules, counts, kept
