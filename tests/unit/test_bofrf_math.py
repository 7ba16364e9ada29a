"""fedpeer.ml.forest.bofrf: BOFRF's arithmetic (thesis seeds/001 ch. 3–5) and the BOPPID baseline
(§2.3.1.3), checked against scikit-learn and against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import matthews_corrcoef
from sklearn.tree import DecisionTreeClassifier

from fedpeer.ml.forest import bofrf as b

NAN = np.nan


# ---------------------------------------------------------------------------------------------
# Confusion matrices, MCC, weights
# ---------------------------------------------------------------------------------------------

def test_confusion_by_hand_with_abstention_and_tie():
    y = np.array([1, 1, 0, 0, 1], dtype=np.int8)
    proba = np.array([
        [0.9, 0.5, 0.5, 0.1, 0.51],     # 0.5 is a negative vote; 0.51 positive
        [NAN] * 5,                      # abstains on this site: counts nothing
        [0.0, 1.0, 1.0, 0.0, 0.6],
        [0.7, NAN, 0.2, 0.8, 0.4],      # abstains on one row only
    ])
    conf = b.confusion_per_tree(proba, y)
    assert conf.dtype == np.int64
    assert b.CONFUSION_FIELDS == ("tp", "tn", "fp", "fn")
    np.testing.assert_array_equal(conf, [
        [2, 2, 0, 1],
        [0, 0, 0, 0],
        [2, 1, 1, 1],
        [1, 1, 1, 1],
    ])


def test_tie_rule_matches_sklearn_predict():
    # one leaf holding one row of each class: P = (0.5, 0.5); sklearn predicts class 0
    tree = DecisionTreeClassifier(max_depth=1, random_state=0).fit(np.zeros((2, 1)), [0, 1])
    p = tree.predict_proba(np.zeros((1, 1)))[:, 1]
    assert p[0] == 0.5 and tree.predict(np.zeros((1, 1)))[0] == 0
    conf = b.confusion_per_tree(p[None, :], np.array([1], dtype=np.int8))
    np.testing.assert_array_equal(conf, [[0, 0, 0, 1]])     # counted as a (false) negative


@pytest.mark.parametrize("seed", range(6))
def test_mcc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(5, 400))
    y = (rng.random(rows) < rng.uniform(0.1, 0.9)).astype(np.int8)
    preds = (rng.random((8, rows)) < rng.uniform(0.05, 0.95, size=(8, 1))).astype(np.float64)
    preds[:4] = np.where(rng.random((4, rows)) < 0.7, y, preds[:4])     # some informative trees
    got = b.mcc(b.confusion_per_tree(preds, y))
    want = np.array([matthews_corrcoef(y, p.astype(int)) for p in preds])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_mcc_zero_denominator_and_large_counts():
    conf = np.array([
        [5, 0, 3, 0],     # predicts positive everywhere
        [0, 4, 0, 2],     # predicts negative everywhere
        [3, 0, 0, 2],     # rows of one class only
        [0, 0, 0, 0],     # abstained everywhere
        [4, 4, 0, 0],     # perfect
        [0, 0, 4, 4],     # perfectly wrong
    ], dtype=np.int64)
    np.testing.assert_array_equal(b.mcc(conf), [0, 0, 0, 0, 1, -1])
    big = np.array([[3 << 33, 5 << 33, 1 << 33, 2 << 33]], dtype=np.int64)     # the float path
    np.testing.assert_allclose(b.mcc(big), b.mcc(np.array([[3, 5, 1, 2]])), rtol=1e-12)
    assert b.mcc(np.array([[3, 5, 1, 2]]))[0] == pytest.approx((15 - 2) / math.sqrt(4 * 5 * 6 * 7))


def test_tree_weights_cut_at_tau():
    m = np.array([0.5, 0.2, 0.2000001, -0.4, 0.0, NAN])
    np.testing.assert_array_equal(b.tree_weights(m, 0.2), [0.5, 0.0, 0.2000001, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(b.tree_weights(m, -1.0), [0.5, 0.2, 0.2000001, -0.4, 0.0, 0.0])


def test_ensemble_score_sign_and_abstention():
    proba = np.array([[0.9, 0.2, 0.5], [NAN, 0.9, 0.0], [0.0, 0.9, NAN]])
    alpha = np.array([0.5, 0.25, 0.0])
    # row 0: 0.5*0.8 + (abstains) + 0 ; row 1: 0.5*(-0.6) + 0.25*0.8 ; row 2: 0 + 0.25*(-1)
    np.testing.assert_allclose(b.ensemble_score(proba, alpha), [0.4, -0.1, -0.25])
    assert not np.isnan(b.ensemble_score(proba, np.ones(3))).any()
    with pytest.raises(ValueError):
        b.ensemble_score(proba, np.ones(2))


def test_local_rf_score_is_centred_predict_proba():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 5))
    y = (X[:, 0] + rng.normal(scale=0.5, size=120) > 0).astype(np.int8)
    rf = RandomForestClassifier(n_estimators=15, min_samples_leaf=2, random_state=3).fit(X, y)
    Xt = rng.normal(size=(40, 5))
    proba = np.stack([t.predict_proba(Xt)[:, 1] for t in rf.estimators_])
    np.testing.assert_allclose(b.local_rf_score(proba), 2 * rf.predict_proba(Xt)[:, 1] - 1, atol=1e-12)
    proba[2:] = NAN                                   # only the first two trees vote
    np.testing.assert_allclose(b.local_rf_score(proba), proba[:2].mean(axis=0) * 2 - 1)
    assert (b.local_rf_score(np.full((3, 4), NAN)) == 0).all()


# ---------------------------------------------------------------------------------------------
# Metrics, tau, final choice
# ---------------------------------------------------------------------------------------------

def test_binary_metrics_by_hand():
    y = np.array([1, 1, 0, 0, 1], dtype=np.int8)
    score = np.array([2.0, -1.0, -3.0, 0.5, 0.0])      # 0 predicts negative
    m = b.binary_metrics(y, score)                       # tp 1, fn 2, tn 1, fp 1
    assert m["accuracy"] == pytest.approx(2 / 5)
    assert m["sensitivity"] == pytest.approx(1 / 3)
    assert m["specificity"] == pytest.approx(1 / 2)
    assert m["mcc"] == pytest.approx((1 * 1 - 1 * 2) / math.sqrt(2 * 3 * 2 * 3))
    assert m["auc"] == pytest.approx(4 / 6)              # 4 of 6 (pos, neg) pairs ordered right
    assert set(m) == {"auc", "accuracy", "sensitivity", "specificity", "mcc"}


def test_binary_metrics_one_class_does_not_crash():
    m = b.binary_metrics(np.array([1, 1, 1], dtype=np.int8), np.array([0.3, -0.2, 1.0]))
    assert m["auc"] is None and m["specificity"] is None
    assert m["accuracy"] == pytest.approx(2 / 3) and m["sensitivity"] == pytest.approx(2 / 3)
    assert m["mcc"] == 0.0


def test_choose_tau_picks_the_best_on_validation():
    y_val = np.array([1, 1, 0, 0], dtype=np.int8)
    proba_val = np.array([
        [0.6, 0.6, 0.4, 0.4],      # MCC 0.9: weak but perfectly ranked
        [0.0, 1.0, 1.0, 0.0],      # MCC 0.3: confident and half wrong here
    ])
    mcc = np.array([0.9, 0.3])
    # tau < 0.3 keeps both trees: scores (-.12, .48, .12, -.48) -> AUC 3/4; tau in [0.3, 0.9) keeps
    # the first only -> AUC 1; tau >= 0.9 keeps none -> AUC 0.5. Best: the smallest tau with AUC 1.
    grid = (0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.95)
    assert b.choose_tau(proba_val, y_val, mcc, grid=grid) == 0.3
    assert b.choose_tau(proba_val, y_val, mcc, grid=(0.0, 0.1)) == 0.0
    assert b.choose_tau(proba_val[:, :2], y_val[:2], mcc, grid=(0.2, 0.1)) == 0.1    # no AUC: smallest
    assert b.TAU_GRID == (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)


def test_select_final():
    assert b.select_final(0.8, 0.7) == "global"
    assert b.select_final(0.7, 0.7) == "local"
    assert b.select_final(0.6, 0.7) == "local"
    assert b.select_final(None, 0.7) == "local"
    assert b.select_final(0.9, None) == "local"


# ---------------------------------------------------------------------------------------------
# Clustered BOFRF
# ---------------------------------------------------------------------------------------------

def test_characteristic_vector_by_hand():
    X = np.array([[1.0, 5.0, 10.0, 0.0],
                  [2.0, 5.0, 30.0, 1.0],
                  [9.0, 5.0, -7.0, 1.0]])
    low = np.array([0.0, 5.0, 0.0, 0.0])
    high = np.array([10.0, 5.0, 20.0, 1.0])
    v = b.characteristic_vector(X, low, high)
    # col 0: (.1 + .2 + .9)/3; col 1: constant bounds -> 0.5; col 2: (.5 + clip(1.5) + clip(-.35))/3;
    # col 3: a 0/1 column -> the share of ones
    np.testing.assert_allclose(v, [0.4, 0.5, 0.5, 2 / 3])
    # the bounds are federation-wide: a shifted site lands elsewhere, not on the same vector
    assert b.characteristic_vector(X + [1, 0, 0, 0], low, high)[0] == pytest.approx(0.5)


def test_farthest_first_by_hand_both_metrics():
    V = np.array([[0, 0], [3, 3], [5, 0], [4, 2], [1, 0]], dtype=float)
    # Euclidean from A0: A2 (5) is farthest -> A1 nearer A2 (3.61) than A0 (4.24); A3 to A2
    np.testing.assert_array_equal(b.farthest_first_clusters(V, 2, "euclidean"), [0, 1, 1, 1, 0])
    # then A1 (3.61 from its centroid) becomes the third; A3 is nearest A1 (1.41)
    np.testing.assert_array_equal(b.farthest_first_clusters(V, 3, "euclidean"), [0, 2, 1, 2, 0])
    # Manhattan from A0: A1 and A3 tie at 6 -> A1 (lowest index); A2 ties 5/5 -> first centroid
    np.testing.assert_array_equal(b.farthest_first_clusters(V, 2, "manhattan"), [0, 1, 0, 1, 0])
    np.testing.assert_array_equal(b.farthest_first_clusters(V, 3, "manhattan"), [0, 1, 2, 1, 0])
    np.testing.assert_array_equal(b.farthest_first_clusters(V, 2, "euclidean", first=2), [1, 0, 0, 0, 1])


def test_farthest_first_determinism_and_edges():
    rng = np.random.default_rng(5)
    V = rng.random((12, 4))
    runs = {tuple(b.farthest_first_clusters(V, 4, "manhattan")) for _ in range(3)}
    assert len(runs) == 1 and len(set(next(iter(runs)))) == 4
    alone = b.farthest_first_clusters(V[:5], 9)
    assert sorted(alone) == [0, 1, 2, 3, 4] and alone[0] == 0
    dup = np.array([[0.0], [0.0], [1.0]])              # duplicates still end alone when k = N
    assert sorted(b.farthest_first_clusters(dup, 3)) == [0, 1, 2]
    np.testing.assert_array_equal(b.farthest_first_clusters(V, 1), np.zeros(12))
    with pytest.raises(ValueError):
        b.farthest_first_clusters(V, 2, "cosine")


# ---------------------------------------------------------------------------------------------
# The local forest
# ---------------------------------------------------------------------------------------------

def _blobs(seed: int, n: int = 150, d: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] - X[:, 1] + rng.normal(scale=0.7, size=n) > 0).astype(np.int8)
    return X, y


def _min_leaf(rf: RandomForestClassifier) -> int:
    return min(int(t.tree_.n_node_samples[t.tree_.children_left == -1].min()) for t in rf.estimators_)


def test_train_local_forest_enforces_min_samples_leaf():
    X, y = _blobs(2)
    raw = RandomForestClassifier(n_estimators=10, min_samples_leaf=1, random_state=0).fit(X, y)
    assert _min_leaf(raw) == 1                           # the check below can see a 1-row leaf
    rf = b.train_local_forest(X, y, n_estimators=10, min_samples_leaf=1, seed=0)
    assert rf.min_samples_leaf == 2 and _min_leaf(rf) >= 2
    rf = b.train_local_forest(X, y, n_estimators=10, min_samples_leaf=0.001, seed=0)
    assert rf.min_samples_leaf == 2
    rf = b.train_local_forest(X, y, n_estimators=10, seed=0, grid={"min_samples_leaf": [1]})
    assert rf.min_samples_leaf == 2 and _min_leaf(rf) >= 2


def test_train_local_forest_grid_search_is_deterministic():
    X, y = _blobs(3)
    grid = {"max_depth": [None, 2], "min_samples_leaf": [2, 5]}
    a = b.train_local_forest(X, y, n_estimators=12, seed=7, grid=grid)
    again = b.train_local_forest(X, y, n_estimators=12, seed=7, grid=grid)
    assert a.get_params() == again.get_params()
    assert a.max_depth in (None, 2) and a.min_samples_leaf in (2, 5)
    Xt, _ = _blobs(4)
    np.testing.assert_array_equal(a.predict_proba(Xt), again.predict_proba(Xt))
    assert a.n_features_in_ == 5 and len(a.estimators_) == 12


# ---------------------------------------------------------------------------------------------
# Boosting: BOPPID and the per-round federated AdaBoost
# ---------------------------------------------------------------------------------------------

def _additive(seed: int, n: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """y depends on x0 + x1: one axis-parallel stump cannot get it, a boosted sum of them can."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    X[:, 2] += shift
    y = (X[:, 0] + X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(np.int8)
    return X, y


def _auc(model: b.Stumps, X: np.ndarray, y: np.ndarray) -> float:
    return b.binary_metrics(y, b.boppid_score(model, X))["auc"]


def test_boppid_beats_a_single_stump():
    sites = [_additive(10 + i, 150, shift) for i, shift in enumerate((0.0, 0.5, -0.5))]
    Xt, yt = _additive(99, 2000)
    models = b.boppid_reference(sites, rounds=40, seed=0)
    assert len(models) == 3
    for (X, y), model in zip(sites, models):
        stump = b.adaboost(X, y, 1)
        assert stump.size == 1
        assert _auc(model, Xt, yt) > _auc(stump, Xt, yt) + 0.1
        assert _auc(model, Xt, yt) > 0.9


def _local_boost_by_rounds(X: np.ndarray, y: np.ndarray, rounds: int) -> b.Stumps:
    """A site's local AdaBoost written out with the per-round functions."""
    cuts = b.exact_cuts(X)
    w = b.boost_init_weights(len(y))
    feats, thr, pol, alpha = [], [], [], []
    for _ in range(rounds):
        stats = b.boost_local_stats(X, y, w, cuts)
        assert stats.shape == (b.boost_stats_length(cuts),)
        step = b.boost_choose(stats, cuts)
        if step is None:
            break
        if step.keep:
            feats.append(step.feature)
            thr.append(step.threshold)
            pol.append(step.polarity)
            alpha.append(step.alpha)
        if step.stop:
            break
        w = b.boost_update_weights(X, y, w, step)
        assert w.sum() == pytest.approx(len(y))          # total weight kept
    return b.Stumps(np.array(feats, dtype=np.int64), np.array(thr), np.array(pol, dtype=np.int8), np.array(alpha))


def _same(a: b.Stumps, c: b.Stumps) -> None:
    for name in ("feature", "threshold", "polarity", "alpha"):
        np.testing.assert_array_equal(getattr(a, name), getattr(c, name), err_msg=name)


def test_boppid_decentralized_steps_give_the_reference_models():
    sites = [_additive(20, 90), _additive(21, 130, 1.0), _additive(22, 60, -1.0)]
    sites.append((sites[2][0], 1 - sites[2][1]))       # a site whose labels disagree: not selected
    rounds = 12
    reference = b.boppid_reference(sites, rounds, seed=4, tau=0.1)
    # every site boosts alone, round by round (nothing leaves it) ...
    local = [_local_boost_by_rounds(X, y, rounds) for X, y in sites]
    for m, (X, y) in zip(local, sites):
        _same(m, b.boppid_local(X, y, rounds, seed=4))
    # ... models and row counts are exchanged; each site weighs them on its own rows
    n = [len(y) for _, y in sites]
    for p, (X, y) in enumerate(sites):
        errors = b.boppid_errors(local, X, y)
        selected = b.boppid_select(errors, p, 0.1)
        assert selected[p]
        assert not selected[3 if p != 3 else 0]          # the flipped site and the others never mix
        _same(b.boppid_combine(local, b.boppid_coefficients(n, selected, p)), reference[p])
    assert reference[0].size > rounds                    # more than its own stumps were kept


def test_boppid_selection_and_coefficients_by_hand():
    errors = np.array([0.2, 0.25, 0.5, 0.05])
    np.testing.assert_array_equal(b.boppid_select(errors, 0, 0.1), [True, True, False, False])
    np.testing.assert_array_equal(b.boppid_select(errors, 0, 0.1, rule="signed"), [True, True, True, False])
    sel = np.ones(3, dtype=bool)
    # lambda = (1/6, 1/3, 1/2); ceil(lambda_max^2 / lambda_min) = ceil(1.5) = 2
    np.testing.assert_allclose(b.boppid_coefficients([100, 200, 300], sel, 0), [(1 / 6) / 0.25 * 2 / 6, 1 / 3, 1 / 2])
    np.testing.assert_allclose(b.boppid_coefficients([100, 200, 300], sel, 2), [1 / 6, 1 / 3, 0.5 / 0.25 * 2 * 0.5])
    # lambda = (1/4, 1/2, 1/4): the ratio is exactly 1 -> sigma_pp = lambda_p / lambda_max^2
    np.testing.assert_allclose(b.boppid_coefficients([1, 2, 1], sel, 1), [0.25, 2 * 0.5, 0.25])
    # only S counts: lambda = (7/12, -, 5/12); ceil((49/144) / (5/12)) = ceil(49/60) = 1
    np.testing.assert_allclose(b.boppid_coefficients([7, 9, 5], np.array([True, False, True]), 2),
                               [7 / 12, 0, (5 / 12) / (7 / 12) ** 2 * (5 / 12)])
    # lambda_max^2 / lambda_min = 400 / 25 = 16 exactly; in floats 0.8**2 / 0.04 = 16.000000000000004
    # would ceil to 17: sigma_pp * lambda_p = 0.8 / 0.64 * 16 * 0.8 = 16
    assert b.boppid_coefficients([1, 4, 20], sel, 2)[2] == pytest.approx(16.0)


def test_fedboost_rounds_over_three_sites_equal_pooled_adaboost():
    sites = [_additive(30, 80), _additive(31, 120, 0.5), _additive(32, 100, -0.5)]
    X = np.vstack([s[0] for s in sites])
    y = np.concatenate([s[1] for s in sites])
    cuts = b.uniform_cuts(X.min(axis=0) - 0.1, X.max(axis=0) + 0.1, 24)
    fed = b.fedboost_reference(sites, 25, cuts)
    pooled = b.fedboost_reference([(X, y)], 25, cuts)
    assert fed.size == 25
    np.testing.assert_array_equal(fed.feature, pooled.feature)
    np.testing.assert_array_equal(fed.threshold, pooled.threshold)
    np.testing.assert_array_equal(fed.polarity, pooled.polarity)
    np.testing.assert_allclose(fed.alpha, pooled.alpha, rtol=1e-9)
    # the loop a job runs (local stats -> sum -> same choice everywhere -> local update) is the reference
    w = [b.boost_init_weights(len(yy)) for _, yy in sites]
    steps = []
    for _ in range(25):
        total = np.sum(np.stack([b.boost_local_stats(Xs, ys, ws, cuts) for (Xs, ys), ws in zip(sites, w)]), axis=0)
        step = b.boost_choose(total, cuts)
        steps.append(step)
        w = [b.boost_update_weights(Xs, ys, ws, step) for (Xs, ys), ws in zip(sites, w)]
    np.testing.assert_array_equal([s.alpha for s in steps], fed.alpha)
    np.testing.assert_array_equal([s.feature for s in steps], fed.feature)
    # a quantizing sum (as the fixed-point secure sum does) can be injected for bit-exact checks
    q = b.fedboost_reference(sites, 25, cuts, sum_fn=lambda vs: np.round(np.sum(vs, axis=0) * 2**32) / 2**32)
    np.testing.assert_array_equal(q.feature, fed.feature)


def test_boost_choose_by_hand():
    # one column, cuts at 0.5 and 1.5; positives weigh (1, 0, 3) in the three bins, negatives (2, 2, 0)
    cuts = [np.array([0.5, 1.5])]
    X = np.array([[0.0], [0.0], [0.0], [1.0], [1.0], [2.0], [2.0], [2.0]])
    y = np.array([1, 0, 0, 0, 0, 1, 1, 1], dtype=np.int8)
    stats = b.boost_local_stats(X, y, np.ones(8), cuts)
    np.testing.assert_array_equal(stats, [1, 0, 3, 2, 2, 0])
    step = b.boost_choose(stats, cuts)
    # cut 1.5, +1 on the right: misses the positive in bin 0 only -> error 1/8
    assert (step.feature, step.threshold, step.polarity) == (0, 1.5, 1)
    assert step.error == pytest.approx(1 / 8) and step.alpha == pytest.approx(0.5 * math.log(7))
    w = b.boost_update_weights(X, y, np.ones(8), step)
    assert w[0] == pytest.approx(w[1] * 7) and w.sum() == pytest.approx(8)   # the miss now weighs 1/2
    assert b.boost_choose(np.zeros(2), [np.zeros(0)]) is None                  # nothing to split on
    # ties: the same column twice -> the first; an empty bin makes cuts 1.5 and 1.7 tie -> the lower
    cuts2 = [np.array([0.5, 1.5, 1.7])] * 2
    step2 = b.boost_choose(b.boost_local_stats(np.hstack([X, X]), y, np.ones(8), cuts2), cuts2)
    assert (step2.feature, step2.threshold, step2.polarity) == (0, 1.5, 1)
