"""The exact CART core (fedpeer/ml/tree/) against scikit-learn on the pooled rows: with max_bin
above the rows every node is the split scikit-learn's best splitter finds on that node's rows
(the same threshold, or — where two features tie — one of equal impurity decrease), the same
leaves and leaf values; without ties the arrays are scikit-learn's element for element. Also
pruning, predictions through scikit-learn itself, the rules' hidden counts and the model file's
checks."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

from fedpeer.ml.tree.model import Cart, load_model, model_bytes, predict_value, rules, to_sklearn
from fedpeer.kinds.tree.site import train_in_process, train_reference
from fedpeer.ml.tree.cart import TreeParams

EXACT_BIN = 1024          # above breast cancer's 569 and diabetes' 442 rows: one value per bin


@pytest.fixture(scope="module")
def cancer() -> tuple[np.ndarray, np.ndarray]:
    return load_breast_cancer(return_X_y=True)


@pytest.fixture(scope="module")
def diabetes() -> tuple[np.ndarray, np.ndarray]:
    return load_diabetes(return_X_y=True, scaled=False)


def _sklearn(criterion: str, **kw):
    return DecisionTreeRegressor(**kw) if criterion == "squared_error" else DecisionTreeClassifier(
        criterion=criterion, **kw)


def _decrease(imp: np.ndarray, n: np.ndarray, node: int, left: int, right: int) -> float:
    return float(imp[node] - n[right] / n[node] * imp[right] - n[left] / n[node] * imp[left])


def _check_every_node(cart: Cart, X: np.ndarray, y: np.ndarray, criterion: str, depth: int, leaf: int) -> dict:
    """Walk the federated tree with the training rows; at each node fit scikit-learn's stump on
    the node's rows: same value, same leaf decision, same split or an equally good one."""
    X32 = X.astype(np.float32)
    seen = {"nodes": 0, "same_split": 0, "tied_split": 0}
    stack = [(0, np.arange(len(y)), 0)]
    while stack:
        i, rows, d = stack.pop()
        seen["nodes"] += 1
        assert cart.n_node_samples[i] == len(rows)
        fitted = _sklearn(criterion, max_depth=1, min_samples_leaf=leaf, random_state=0).fit(X[rows], y[rows])
        stump, value = fitted.tree_, np.zeros(cart.value.shape[1])
        # a pure node's stump knows one class only
        value[np.asarray(getattr(fitted, "classes_", [0]), dtype=np.int64)] = stump.value[0, 0]
        assert np.allclose(cart.value[i], value, rtol=1e-12, atol=0)
        assert cart.impurity[i] == pytest.approx(stump.impurity[0], rel=1e-12, abs=1e-12)
        if cart.left[i] == -1:
            assert d == depth or stump.node_count == 1, f"node {i}: scikit-learn splits it"
            continue
        assert d < depth and stump.node_count == 3, f"node {i}: scikit-learn does not split it"
        mine = _decrease(cart.impurity, cart.n_node_samples, i, cart.left[i], cart.right[i])
        theirs = _decrease(stump.impurity, stump.n_node_samples, 0, 1, 2)
        assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-12), f"node {i}"
        same = cart.feature[i] == stump.feature[0] and cart.threshold[i] == stump.threshold[0]
        seen["same_split" if same else "tied_split"] += 1
        go_left = X32[rows, cart.feature[i]].astype(np.float64) <= cart.threshold[i]
        stack += [(int(cart.right[i]), rows[~go_left], d + 1), (int(cart.left[i]), rows[go_left], d + 1)]
    return seen


@pytest.mark.parametrize("criterion", ["gini", "entropy"])
@pytest.mark.parametrize("depth,leaf", [(4, 1), (32, 5)])
def test_classification_is_sklearns_tree_on_pooled_breast_cancer(cancer, criterion: str, depth: int, leaf: int) -> None:
    X, y = cancer
    cart = train_reference([X], [y], TreeParams(criterion=criterion, max_depth=depth, min_leaf_rows=leaf,
                                                max_bin=EXACT_BIN))
    seen = _check_every_node(cart, X, y, criterion, depth, leaf)
    assert seen["nodes"] == cart.n_nodes and seen["same_split"] > seen["tied_split"], seen
    assert cart.n_nodes == _sklearn(criterion, max_depth=depth, min_samples_leaf=leaf,
                                    random_state=0).fit(X, y).tree_.node_count


@pytest.mark.parametrize("depth,leaf", [(3, 1), (8, 5), (32, 5)])
def test_regression_equals_sklearns_arrays_on_pooled_diabetes(diabetes, depth: int, leaf: int) -> None:
    """No two splits tie here: scikit-learn's arrays, element for element, in its node order."""
    X, y = diabetes
    cart = train_reference([X], [y], TreeParams(criterion="squared_error", max_depth=depth, min_leaf_rows=leaf,
                                                max_bin=EXACT_BIN))
    for rs in (0, 1):
        t = DecisionTreeRegressor(max_depth=depth, min_samples_leaf=leaf, random_state=rs).fit(X, y).tree_
        np.testing.assert_array_equal(cart.feature, t.feature)
        np.testing.assert_array_equal(cart.threshold, t.threshold)
        np.testing.assert_array_equal(cart.left, t.children_left)
        np.testing.assert_array_equal(cart.right, t.children_right)
        np.testing.assert_array_equal(cart.n_node_samples, t.n_node_samples)
        np.testing.assert_array_equal(cart.value, t.value[:, 0, :])
        np.testing.assert_array_equal(cart.impurity, t.impurity)
    _check_every_node(cart, X, y, "squared_error", depth, leaf)


def test_the_tree_predicts_as_sklearn_does_and_through_sklearn(cancer, diabetes) -> None:
    X, y = diabetes
    params = TreeParams(criterion="squared_error", max_depth=8, min_leaf_rows=5, max_bin=EXACT_BIN)
    cart = train_reference([X[:400]], [y[:400]], params)
    fitted = DecisionTreeRegressor(max_depth=8, min_samples_leaf=5, random_state=0).fit(X[:400], y[:400])
    np.testing.assert_array_equal(predict_value(cart, X[400:]), fitted.predict(X[400:]))   # unseen rows
    Xc, yc = cancer
    tree = train_reference([Xc], [yc], TreeParams(max_depth=5, max_bin=EXACT_BIN))
    np.testing.assert_array_equal(to_sklearn(tree, ["0", "1"]).predict_proba(Xc), predict_value(tree, Xc))
    np.testing.assert_array_equal(to_sklearn(cart).predict(X), predict_value(cart, X))


@pytest.mark.parametrize("alpha_at", [0.3, 0.7])
def test_pruning_is_sklearns_cost_complexity_pruning(diabetes, alpha_at: float) -> None:
    X, y = diabetes
    path = DecisionTreeRegressor(max_depth=8, min_samples_leaf=5).cost_complexity_pruning_path(X, y)
    i = int(alpha_at * len(path.ccp_alphas))
    alpha = float(path.ccp_alphas[i] + path.ccp_alphas[i + 1]) / 2
    cart = train_reference([X], [y], TreeParams(criterion="squared_error", max_depth=8, min_leaf_rows=5,
                                                max_bin=EXACT_BIN, ccp_alpha=alpha))
    t = DecisionTreeRegressor(max_depth=8, min_samples_leaf=5, ccp_alpha=alpha, random_state=0).fit(X, y).tree_
    assert cart.n_nodes == t.node_count < 137
    np.testing.assert_array_equal(cart.left, t.children_left)
    np.testing.assert_array_equal(cart.threshold, t.threshold)
    np.testing.assert_array_equal(cart.value, t.value[:, 0, :])


def test_sites_give_the_pooled_tree_and_coarse_bins_route_rows_as_grown(cancer) -> None:
    X, y = cancer
    params = TreeParams(criterion="entropy", max_depth=4, min_leaf_rows=3, max_bin=16)
    parts = [np.arange(i, len(y), 3) for i in range(3)]
    federated = train_in_process([(X[p], y[p]) for p in parts], params)
    pooled = train_reference([X[p] for p in parts], [y[p] for p in parts], params)
    assert model_bytes(federated, [], ["0", "1"]) == model_bytes(pooled, [], ["0", "1"])
    # thresholds just below each cut: every training row lands in the leaf whose counts it made
    leaf_share = predict_value(federated, X)
    for leaf in np.flatnonzero(federated.left == -1):
        at = np.flatnonzero((leaf_share == federated.value[leaf]).all(axis=1))
        assert len(at) >= federated.n_node_samples[leaf]


def test_rules_read_as_if_then_and_hide_small_class_counts(cancer) -> None:
    X, y = cancer
    cart = train_reference([X], [y], TreeParams(max_depth=3, min_leaf_rows=5, max_bin=EXACT_BIN))
    names = [f"f{j}" for j in range(X.shape[1])]
    text = rules(cart, names, ["malignant", "benign"], 5)
    assert len(text) == cart.n_leaves and all(r.startswith("if ") and " then " in r for r in text)
    assert any("not shown" in r for r in text) and any("malignant 0" in r or "benign 0" in r for r in text)
    for r in text:
        counts = [int(w) for w in r.split("; ")[-1].rstrip(")").replace(",", "").split() if w.isdigit()]
        assert all(c == 0 or c >= 5 for c in counts), r
    assert rules(train_reference([X[:3]], [y[:3]], TreeParams(min_leaf_rows=5)), names, ["a", "b"], 5)[0] \
        .startswith("always ")


def test_the_model_file_round_trips_and_its_checks_refuse_a_broken_tree(cancer) -> None:
    X, y = cancer
    cart = train_reference([X], [y], TreeParams(max_depth=3, max_bin=EXACT_BIN))
    names = [f"f{j}" for j in range(X.shape[1])]
    data = model_bytes(cart, names, ["0", "1"])
    back, features, classes = load_model(data)
    assert model_bytes(back, features, classes) == data
    for broken in (data.replace(b'"left":[1,', b'"left":[0,'), data.replace(b'"feature":[', b'"feature":[99,', 1),
                   data.replace(b'"format":"fedpeer.tree"', b'"format":"x"'), b"[1]", b"\xff"):
        with pytest.raises(ValueError):
            load_model(broken)


def test_the_split_search_in_chunks_finds_the_same_tree(cancer, monkeypatch) -> None:
    from fedpeer.ml.tree import cart as core

    X, y = cancer
    params = TreeParams(criterion="entropy", max_depth=4, max_bin=EXACT_BIN)
    whole = model_bytes(train_reference([X], [y], params), [], ["0", "1"])
    monkeypatch.setattr(core, "SCORED_CELLS_MAX", 7)
    assert model_bytes(train_reference([X], [y], params), [], ["0", "1"]) == whole


def test_labels_beyond_their_bound_and_missing_values_are_refused_by_name(diabetes) -> None:
    from fedpeer.errors import DataError

    X, y = diabetes
    with pytest.raises(DataError, match="label_abs_max=100.0"):
        train_reference([X], [y], TreeParams(criterion="squared_error", label_abs_max=100.0))
    X = X.copy()
    X[3, 2] = np.nan
    with pytest.raises(DataError, match="missing"):
        train_reference([X], [y], TreeParams(criterion="squared_error"))
