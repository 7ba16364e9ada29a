"""Federated XGBoost by tree bagging (fedpeer.ml.xgb.boosting): agreement with centralized xgboost,
tree+, multi-class grouping, deterministic models, the gate for members' trees, and the
federated evaluation counts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import load_breast_cancer, load_wine, make_classification
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import train_test_split

from fedpeer.errors import RemoteProtocolError
from fedpeer.ml.xgb import boosting as B
from fedpeer.protocols.fixedpoint import decode_counts, encode_counts

BINARY = "binary:logistic"
MULTI = "multi:softprob"
# One thread: on small data xgboost's OpenMP start-up costs milliseconds per call.
PARAMS = {"objective": BINARY, "max_depth": 3, "tree_method": "hist", "nthread": 1}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def canon(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def partition(rows: int, sites: int, seed: int, unequal: bool = True) -> list[np.ndarray]:
    """Row indices of each site; with `unequal`, site sizes grow linearly from 1x to 3x."""
    perm = np.random.default_rng(seed).permutation(rows)
    weights = np.linspace(1.0, 3.0, sites) if unequal else np.ones(sites)
    cuts = np.round(np.cumsum(weights) / weights.sum() * rows).astype(int)[:-1]
    return np.split(perm, cuts)


def federate(X, y, parts, rounds, eta, n_local, base, params=PARAMS, num_class=0, after_round=None):
    """The leader's loop, in process: every site trains n_local trees on top of the global model
    with its sample-normalised eta; the leader validates and appends. Returns the final model."""
    objective = params["objective"]
    total = sum(len(p) for p in parts)
    model = None
    for r in range(rounds):
        docs = []
        for i, rows in enumerate(parts):
            eta_i = B.normalized_eta(eta, len(rows), total, "samples")
            doc = B.train_local_round(model, X[rows], y[rows], {**params, "base_score": base}, n_local, eta_i,
                                      seed=1000 * r + i)
            B.validate_trees(doc, num_feature=X.shape[1], num_class=num_class, num_local_round=n_local,
                             max_depth=params["max_depth"], max_nodes=2 ** (params["max_depth"] + 1) - 1,
                             leaf_abs_max=10.0, objective=objective)
            docs.append(doc)
        model = B.append_round(model, docs, base, X.shape[1], num_class, objective)
        if after_round is not None and after_round(r + 1, model):
            break
    return model


def centralized(X, y, rounds, eta, base, params=PARAMS) -> xgb.Booster:
    return xgb.train({**params, "eta": eta, "base_score": base, "seed": 0}, xgb.DMatrix(X, label=y, nthread=1), rounds)


def reference_margins(model: bytes, X: np.ndarray) -> np.ndarray:
    """Margins (rows, K) of a model JSON, walked here without xgboost: float32(x) < threshold goes
    left; tree t adds its leaf to class tree_info[t]; plus the intercept (logit of the prior for
    binary, the margin vector for multi-class)."""
    learner = json.loads(model)["learner"]
    groups = max(1, int(learner["learner_model_param"]["num_class"]))
    base = [float(v) for v in learner["learner_model_param"]["base_score"].strip("[]").split(",")]
    if groups == 1:
        base = [math.log(base[0] / (1 - base[0]))]
    X32 = X.astype(np.float32)
    out = np.tile(np.array(base, dtype=np.float64), (len(X), 1))
    booster = learner["gradient_booster"]["model"]
    rows = np.arange(len(X))
    for tree, group in zip(booster["trees"], booster["tree_info"]):
        left, right = np.array(tree["left_children"]), np.array(tree["right_children"])
        feature, value = np.array(tree["split_indices"]), np.array(tree["split_conditions"], dtype=np.float32)
        node = np.zeros(len(X), dtype=np.int64)
        while (left[node] != -1).any():
            inner = left[node] != -1
            go_left = X32[rows, feature[node]] < value[node]
            node = np.where(inner, np.where(go_left, left[node], right[node]), node)
        out[:, group] += value[node]
    return out


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=0)
    base = B.global_base_score(int(ytr.sum()), len(ytr), BINARY, 0)
    return Xtr, Xte, ytr, yte, base


@pytest.fixture(scope="module")
def wine():
    X, y = load_wine(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    base = B.global_base_score(np.bincount(ytr, minlength=3), len(ytr), MULTI, 3)
    return Xtr, Xte, ytr, yte, base


@pytest.fixture(scope="module")
def member_doc(cancer):
    """A real member's trees document: 2 local rounds of depth-3 trees on 200 rows."""
    Xtr, _, ytr, _, base = cancer
    doc = B.train_local_round(None, Xtr[:200], ytr[:200], {**PARAMS, "base_score": base}, 2, 0.3, seed=7)
    raw = json.loads(doc)
    assert raw["trees"][0]["left_children"][:3] == [1, 3, 5], "the mutations below need a full top of tree 0"
    return doc


# ---------------------------------------------------------------------------------------------
# Agreement with centralized xgboost
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_local, rounds", [(1, 12), (3, 4)])
def test_one_site_equals_centralized_xgboost(cancer, n_local, rounds):
    """Tree bagging over one site is plain boosting: same trees, same predictions."""
    Xtr, Xte, ytr, _, base = cancer
    eta = 0.3
    model = federate(Xtr, ytr, [np.arange(len(ytr))], rounds, eta, n_local, base)
    central = centralized(Xtr, ytr, rounds * n_local, eta, base)
    fed_trees = json.loads(model)["learner"]["gradient_booster"]["model"]["trees"]
    cen_trees = json.loads(bytes(central.save_raw("json")))["learner"]["gradient_booster"]["model"]["trees"]
    assert len(fed_trees) == len(cen_trees) == rounds * n_local
    for f, c in zip(fed_trees, cen_trees):
        for key in ("left_children", "right_children", "split_indices"):
            assert f[key] == c[key]
        np.testing.assert_allclose(f["split_conditions"], c["split_conditions"], rtol=1e-6)
        np.testing.assert_allclose(f["sum_hessian"], c["sum_hessian"], rtol=1e-5)
    dtest = xgb.DMatrix(Xte, nthread=1)
    np.testing.assert_allclose(B.predict_proba(model, Xte, nthread=1), central.predict(dtest), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(B.load_booster(model).predict(dtest, output_margin=True),
                               central.predict(dtest, output_margin=True), atol=1e-5)
    # base_weights are not carried: SHAP values (exact and approximate) do not notice.
    for kwargs in ({"pred_contribs": True}, {"pred_contribs": True, "approx_contribs": True}):
        np.testing.assert_allclose(B.load_booster(model).predict(dtest, **kwargs), central.predict(dtest, **kwargs),
                                   atol=1e-5)


# Acceptance criterion: eta 0.3, 30 rounds of one tree per site, sizes 1x..3x, normalised eta.
@pytest.mark.parametrize("sites", [2, 5, 10])
def test_federated_auc_within_001_of_centralized(cancer, sites):
    Xtr, Xte, ytr, yte, base = cancer
    eta, rounds = 0.3, 30
    model = federate(Xtr, ytr, partition(len(ytr), sites, seed=0), rounds, eta, 1, base)
    fed_auc = roc_auc_score(yte, B.predict_proba(model, Xte, nthread=1))
    cen_auc = roc_auc_score(yte, centralized(Xtr, ytr, rounds, eta, base).predict(xgb.DMatrix(Xte, nthread=1)))
    print(f"\n{sites} sites: federated AUC {fed_auc:.4f}, centralized {cen_auc:.4f}")
    assert B.model_info(model).n_trees == rounds * sites
    assert abs(fed_auc - cen_auc) <= 0.01


def test_tree_plus_reaches_target_auc_in_fewer_rounds():
    """FLeXGBoost: n = 3 local rounds reach the target in fewer communication rounds than n = 1.
    A harder synthetic task (2,400 training rows, 5 equal sites, eta 0.1 as in the paper): its
    test AUC climbs smoothly for tens of rounds, where breast cancer's saturates in one or two."""
    X, y = make_classification(n_samples=3000, n_features=20, n_informative=10, n_redundant=4, flip_y=0.05,
                               class_sep=0.7, random_state=0)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=0)
    base = B.global_base_score(int(ytr.sum()), len(ytr), BINARY, 0)
    parts = partition(len(ytr), 5, seed=0, unequal=False)
    target = 0.82
    reached = {}

    for n_local, cap in ((1, 45), (3, 20)):
        def hit(r, model, n_local=n_local):
            if roc_auc_score(yte, B.predict_proba(model, Xte, nthread=1)) >= target:
                reached[n_local] = r
                return True
            return False
        federate(Xtr, ytr, parts, cap, 0.1, n_local, base, after_round=hit)
    print(f"\nrounds to AUC {target}: n=1: {reached.get(1)}, n=3: {reached.get(3)}")
    assert 1 in reached and 3 in reached
    assert reached[3] < reached[1]
    assert reached[3] <= 0.6 * reached[1]           # each round does 3x the boosting: about 1/3 the rounds


# ---------------------------------------------------------------------------------------------
# Models: sum of parts, multi-class grouping, determinism
# ---------------------------------------------------------------------------------------------

def test_appended_model_predicts_the_sum_of_its_parts(cancer):
    Xtr, Xte, ytr, _, base = cancer
    parts = partition(len(ytr), 3, seed=1)
    g1 = federate(Xtr, ytr, parts, 2, 0.3, 2, base)
    docs = [B.train_local_round(g1, Xtr[p], ytr[p], PARAMS, 2, 0.1, seed=i) for i, p in enumerate(parts)]
    g2 = B.append_round(g1, docs, base, 30, 0, BINARY)
    dtest = xgb.DMatrix(Xte, nthread=1)
    before = B.load_booster(g1).predict(dtest, output_margin=True)
    after = B.load_booster(g2).predict(dtest, output_margin=True)
    # A member's trees alone, on an intercept of 0.5 (margin 0): its contribution.
    parts_margin = sum(B.load_booster(B.append_round(None, [d], 0.5, 30, 0, BINARY)).predict(dtest, output_margin=True)
                       for d in docs)
    np.testing.assert_allclose(after, before + parts_margin, atol=1e-5)
    np.testing.assert_allclose(after, reference_margins(g2, Xte)[:, 0], atol=1e-5)
    info = B.model_info(g2)
    assert info.n_trees == 2 * 3 * 2 + 3 * 2
    assert json.loads(g2)["learner"]["gradient_booster"]["model"]["iteration_indptr"] == list(range(info.n_trees + 1))


def test_multiclass_model_keeps_class_grouping(wine):
    Xtr, Xte, ytr, yte, base = wine
    params = {"objective": MULTI, "num_class": 3, "max_depth": 2, "tree_method": "hist", "nthread": 1}
    parts = partition(len(ytr), 3, seed=2)
    model = federate(Xtr, ytr, parts, 4, 0.3, 2, base, params=params, num_class=3)
    raw = json.loads(model)["learner"]
    booster = raw["gradient_booster"]["model"]
    n_trees = 4 * 3 * 2 * 3                         # rounds x sites x local rounds x classes
    assert len(booster["trees"]) == n_trees
    assert booster["tree_info"] == [t % 3 for t in range(n_trees)]
    assert booster["iteration_indptr"] == list(range(0, n_trees + 1, 3))
    assert [t["id"] for t in booster["trees"]] == list(range(n_trees))
    proba = B.predict_proba(model, Xte, nthread=1)
    assert proba.shape == (len(Xte), 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    # Per-class margins summed here (tree t -> class t % 3) equal xgboost's, and softmax of them its probabilities.
    margins = reference_margins(model, Xte)
    dtest = xgb.DMatrix(Xte, nthread=1)
    np.testing.assert_allclose(B.load_booster(model).predict(dtest, output_margin=True), margins, atol=1e-4)
    soft = np.exp(margins - margins.max(axis=1, keepdims=True))
    np.testing.assert_allclose(proba, soft / soft.sum(axis=1, keepdims=True), atol=1e-5)
    # Moving one class's trees to another class changes the prediction: the grouping matters.
    swapped = json.loads(model)
    trees = swapped["learner"]["gradient_booster"]["model"]["trees"]
    trees[0], trees[1] = trees[1], trees[0]
    assert not np.allclose(reference_margins(canon(swapped), Xte), margins)
    # The model learned something: federated AUC (one-vs-rest) close to 1 on wine.
    auc = B.auc_from_histograms(B.score_histograms(yte, proba))
    assert np.nanmean(auc) > 0.95
    assert B.accuracy_counts(yte, proba)[0] >= 0.9 * len(yte)


def test_global_base_score_is_what_xgboost_estimates_on_pooled_data(cancer, wine):
    Xtr, _, ytr, _, base = cancer
    own = xgb.train({**PARAMS, "eta": 0.0}, xgb.DMatrix(Xtr, label=ytr, nthread=1), 1)
    estimated = json.loads(bytes(own.save_raw("json")))["learner"]["learner_model_param"]["base_score"]
    assert base == pytest.approx(float(estimated.strip("[]")), rel=1e-6)
    Xw, _, yw, _, wbase = wine
    own = xgb.train({"objective": MULTI, "num_class": 3, "eta": 0.0, "nthread": 1},
                    xgb.DMatrix(Xw, label=yw, nthread=1), 1)
    estimated = json.loads(bytes(own.save_raw("json")))["learner"]["learner_model_param"]["base_score"]
    np.testing.assert_allclose(wbase, [float(v) for v in estimated.strip("[]").split(",")], atol=1e-6)
    # softmax of the margins is the class prior
    prior = np.exp(wbase) / np.exp(wbase).sum()
    np.testing.assert_allclose(prior, np.bincount(yw) / len(yw), rtol=1e-6)
    assert B.global_base_score(0, 10, BINARY) == pytest.approx(B.PRIOR_MIN)
    with pytest.raises(ValueError):
        B.global_base_score([3, 3], 7, MULTI, 2)     # counts must sum to the total


def test_append_round_is_byte_identical_and_sha_stable(cancer, member_doc):
    Xtr, _, ytr, _, base = cancer
    second = B.train_local_round(None, Xtr[200:], ytr[200:], {**PARAMS, "base_score": base}, 2, 0.3, seed=8)
    a = B.append_round(None, [member_doc, second], base, 30, 0, BINARY)
    B._MODEL_CACHE.clear()                          # another member: nothing cached
    b = B.append_round(None, [bytes(member_doc), bytes(second)], base, 30, 0, BINARY)
    assert a == b and B.model_sha256(a) == B.model_sha256(b)
    c = B.append_round(a, [second], base, 30, 0, BINARY)
    assert c == B.append_round(b, [second], base, 30, 0, BINARY)
    assert B.append_round(a, [], base, 30, 0, BINARY) == a      # appending nothing is the identity
    assert B.append_round(None, [second, member_doc], base, 30, 0, BINARY) != a   # member order matters
    # A site reads the model, trains, and the trees it returns are canonical (re-encoding is the identity).
    doc = B.train_local_round(c, Xtr[:100], ytr[:100], PARAMS, 1, 0.1, seed=3)
    assert canon(json.loads(doc)) == doc


def test_golden_model_bytes_and_semantics():
    """A hand-written tree pins the format (the SHA-256 must only change with a new format
    version) and xgboost's semantics for it: x < threshold goes left, missing goes default_left."""
    tree = {"default_left": [1, 0, 0], "left_children": [1, -1, -1], "loss_changes": [2.0, 0.0, 0.0],
            "right_children": [2, -1, -1], "split_conditions": [0.5, -0.25, 0.25], "split_indices": [1, 0, 0],
            "sum_hessian": [4.0, 2.0, 2.0]}
    doc = canon({"format": B.TREES_FORMAT, "tree_info": [0], "trees": [tree]})
    model = B.append_round(None, [doc], 0.5, 2, 0, BINARY)
    assert B.model_sha256(model) == GOLDEN_SHA256
    X = np.array([[9.0, 0.3], [9.0, 0.5], [9.0, 0.7], [9.0, np.nan]])
    margins = B.load_booster(model).predict(xgb.DMatrix(X, nthread=1), output_margin=True)
    np.testing.assert_array_equal(margins, np.float32([-0.25, 0.25, 0.25, -0.25]))


GOLDEN_SHA256 = "8471a588241807904ab99d7deac7ab782964d33489044f251504b2f86b61f8fc"


def test_train_local_round_returns_only_new_trees_and_keeps_the_intercept(cancer):
    Xtr, _, ytr, _, base = cancer
    g = B.append_round(None, [], base, 30, 0, BINARY)      # round 0: no trees, the federation's intercept
    doc = B.train_local_round(g, Xtr[:200], ytr[:200], {**PARAMS, "base_score": 0.01}, 3, 0.2, seed=1)
    assert len(json.loads(doc)["trees"]) == 3               # base_score in params is ignored on a warm start
    g = B.append_round(g, [doc], base, 30, 0, BINARY)
    doc2 = B.train_local_round(g, Xtr[200:], ytr[200:], PARAMS, 2, 0.2, seed=2)
    assert len(json.loads(doc2)["trees"]) == 2
    assert B.model_info(B.append_round(g, [doc2], base, 30, 0, BINARY)).base_score == (base,)
    # From no model: the same as from the empty model.
    assert B.train_local_round(None, Xtr[:200], ytr[:200], {**PARAMS, "base_score": base}, 3, 0.2, seed=1) == doc
    with pytest.raises(ValueError, match="base_score"):
        B.train_local_round(None, Xtr, ytr, PARAMS, 1, 0.1, seed=0)
    for bad in ({"booster": "dart"}, {"num_parallel_tree": 2}, {"process_type": "update"},
                {"multi_strategy": "multi_output_tree"}, {"objective": MULTI, "num_class": 2}):
        with pytest.raises(ValueError):
            B.train_local_round(g, Xtr, ytr, {**PARAMS, **bad}, 1, 0.1, seed=0)
    with pytest.raises(ValueError, match="base_score"):
        B.append_round(g, [doc2], 0.3, 30, 0, BINARY)      # the intercept is fixed by the global model


def test_normalized_eta_and_gain():
    rows = [10, 30, 60]
    assert sum(B.normalized_eta(0.3, m, 100, "samples") for m in rows) == pytest.approx(0.3)
    assert B.normalized_eta(0.3, 10, 100) == 0.3
    assert B.normalized_eta(0.3, 10, 100, "gain", my_gain=5.0, total_gain=20.0) == pytest.approx(0.075)
    for kwargs in ({"my_rows": 0, "total_rows": 10, "mode": "samples"},
                   {"my_rows": 11, "total_rows": 10, "mode": "samples"},
                   {"my_rows": 1, "total_rows": 10, "mode": "gain"},
                   {"my_rows": 1, "total_rows": 10, "mode": "what"}):
        with pytest.raises(ValueError):
            B.normalized_eta(0.3, **kwargs)


def test_gain_normalised_round(cancer):
    """The gain variant: round r uses each member's gain of round r-1 (from its trees)."""
    Xtr, Xte, ytr, yte, base = cancer
    parts = partition(len(ytr), 3, seed=3)
    model, gains = None, None
    for _ in range(6):
        docs = []
        for i, p in enumerate(parts):
            eta_i = (B.normalized_eta(0.3, len(p), len(ytr), "samples") if gains is None else
                     B.normalized_eta(0.3, len(p), len(ytr), "gain", my_gain=gains[i], total_gain=sum(gains)))
            docs.append(B.train_local_round(model, Xtr[p], ytr[p], {**PARAMS, "base_score": base}, 1, eta_i, seed=i))
        gains = [B.trees_gain(d, num_feature=30, num_class=0) for d in docs]
        assert all(g > 0 for g in gains)
        assert gains[0] == pytest.approx(B.validate_trees(docs[0], num_feature=30, num_class=0, num_local_round=1,
                                                          max_depth=3, max_nodes=15, leaf_abs_max=10).gain)
        model = B.append_round(model, docs, base, 30, 0, BINARY)
    assert roc_auc_score(yte, B.predict_proba(model, Xte, nthread=1)) > 0.95


# ---------------------------------------------------------------------------------------------
# The gate for members' trees
# ---------------------------------------------------------------------------------------------

def _check(doc, **override):
    policy = {"num_feature": 30, "num_class": 0, "num_local_round": 2, "max_depth": 3, "max_nodes": 15,
              "leaf_abs_max": 1.0, **override}
    return B.validate_trees(doc, **policy)


def _mutated(doc: bytes, mutate) -> bytes:
    raw = json.loads(doc)
    out = mutate(raw)
    return out if isinstance(out, bytes) else canon(raw)


def _set(tree: int, key: str, node: int, value):
    def mutate(raw):
        raw["trees"][tree][key][node] = value
    return mutate


def _text(tree: int, key: str, literal: bytes):
    """Put a literal the JSON encoder cannot write (NaN, Infinity, 1e400) at node 0."""
    def mutate(raw):
        raw["trees"][tree][key][0] = 1234.5
        text = canon(raw)
        assert text.count(b"1234.5") == 1
        return text.replace(b"1234.5", literal)
    return mutate


def _first_leaf(raw, tree=0):
    return raw["trees"][tree]["left_children"].index(-1)


MALFORMED = {
    "child out of range": (_set(0, "left_children", 0, 99), "left child 99 out of range"),
    "cycle to the root": (_set(0, "right_children", 1, 0), "right child 0 out of range"),
    "cycle to an earlier node": (_set(0, "left_children", 2, 1), "not after its parent"),
    "self loop": (_set(0, "left_children", 1, 1), "not after its parent"),
    "shared node": (lambda raw: raw["trees"][0]["left_children"].__setitem__(2, 3) or
                    raw["trees"][0]["right_children"].__setitem__(2, 4), "canonical breadth-first"),
    "one child": (_set(0, "right_children", 0, -1), "exactly one child"),
    "unreachable node": (lambda raw: [raw["trees"][0][k].append(v) for k, v in
                                      (("left_children", -1), ("right_children", -1), ("split_indices", 0),
                                       ("split_conditions", 0.0), ("default_left", 0), ("loss_changes", 0.0),
                                       ("sum_hessian", 1.0))], "unreachable"),
    "too few trees": (lambda raw: (raw["trees"].pop(), raw["tree_info"].pop()), "expected exactly 2 trees"),
    "too many trees": (lambda raw: (raw["trees"].append(raw["trees"][0]), raw["tree_info"].append(0)),
                       "expected exactly 2 trees"),
    "wrong class of a tree": (lambda raw: raw["tree_info"].__setitem__(1, 1), "tree_info\\[1\\]"),
    "huge leaf": (lambda raw: raw["trees"][1]["split_conditions"].__setitem__(_first_leaf(raw, 1), 1.0e6),
                  "exceeds leaf_abs_max"),
    "NaN": (_text(0, "split_conditions", b"NaN"), "not valid JSON"),
    "Infinity": (_text(0, "sum_hessian", b"Infinity"), "not valid JSON"),
    "overflow to inf": (_text(0, "split_conditions", b"1e400"), "split_conditions\\[0\\] is not finite"),
    "feature out of range": (_set(0, "split_indices", 0, 30), "split feature 30 out of range"),
    "negative feature": (_set(0, "split_indices", 1, -1), "split feature -1 out of range"),
    "not a float32": (_set(0, "split_conditions", 0, 0.1), "not a float32 value"),
    "integer for a float": (_set(0, "split_conditions", 0, 1), "floats only"),
    "boolean for an integer": (_set(0, "default_left", 0, True), "integers only"),
    "default_left 2": (_set(0, "default_left", 0, 2), "default_left must be 0 or 1"),
    "split index at a leaf": (lambda raw: raw["trees"][0]["split_indices"].__setitem__(_first_leaf(raw), 4),
                              "must be 0 at a leaf"),
    "negative cover": (_set(0, "sum_hessian", 0, -1.0), "negative"),
    "negative gain": (_set(0, "loss_changes", 0, -1.0), "negative"),
    "unknown key": (lambda raw: raw["trees"][0].__setitem__("base_weights", [0.0]), "unexpected keys"),
    "missing key": (lambda raw: raw["trees"][0].pop("sum_hessian"), "lacks keys"),
    "wrong format": (lambda raw: raw.__setitem__("format", "xgboost"), "format must be"),
    "not canonical": (lambda raw: json.dumps(raw, indent=1).encode(), "canonical encoding"),
    "duplicate key": (lambda raw: canon(raw).replace(b'{"format":', b'{"format":"x","format":', 1), "duplicate key"),
    "not JSON": (lambda raw: b"\x80\x81", "not valid JSON"),
    "not an object": (lambda raw: b"[]", "must be an object"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_validate_trees_rejects(member_doc, name):
    mutate, match = MALFORMED[name]
    _check(member_doc)                              # the original passes
    bad = _mutated(member_doc, mutate)
    assert bad != member_doc
    with pytest.raises(B.TreesError, match=match) as info:
        _check(bad)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RemoteProtocolError)
    assert info.value.reason == "xgb_trees"
    if name not in POLICY_ONLY:                     # append_round re-checks the structure itself
        with pytest.raises(B.TreesError, match=match):
            B.append_round(None, [bad], 0.5, 30, 0, BINARY)


POLICY_ONLY = {"too few trees", "too many trees", "huge leaf"}     # only validate_trees knows the round's policy


def test_validate_trees_policy_limits(member_doc):
    with pytest.raises(B.TreesError, match="depth 3 exceeds max_depth 2"):
        _check(member_doc, max_depth=2)
    with pytest.raises(B.TreesError, match="1 to 3 node"):
        _check(member_doc, max_nodes=3)
    with pytest.raises(B.TreesError, match="out of range \\[0, 5\\)"):
        _check(member_doc, num_feature=5)
    with pytest.raises(B.TreesError, match="more than"):
        _check(member_doc + b" " * 20_000)
    with pytest.raises(B.TreesError, match="must be bytes"):
        _check(member_doc.decode())
    with pytest.raises(B.TreesError, match="expected exactly 6 trees"):
        _check(member_doc, num_class=3)             # 2 rounds x 3 classes
    batch = _check(member_doc)
    assert (batch.n_trees, batch.num_local_round, batch.max_depth) == (2, 2, 3)


def test_global_model_from_a_leader_is_checked_before_xgboost(cancer, member_doc):
    """xgboost trusts `parents` and can crash on bad ones: a tampered model never reaches it."""
    _, Xte, _, _, base = cancer
    model = B.append_round(None, [member_doc], base, 30, 0, BINARY)
    raw = json.loads(model)
    raw["learner"]["gradient_booster"]["model"]["trees"][0]["parents"][1] = 5
    with pytest.raises(B.TreesError, match="canonical") as info:
        B.load_booster(canon(raw))
    assert info.value.reason == "xgb_model"
    raw = json.loads(model)
    raw["learner"]["gradient_booster"]["model"]["trees"][0]["left_children"][0] = 0
    with pytest.raises(B.TreesError, match="out of range"):
        B.train_local_round(canon(raw), Xte, np.zeros(len(Xte), int), PARAMS, 1, 0.1, seed=0)
    raw = json.loads(model)
    raw["learner"]["learner_model_param"]["base_score"] = "nan"
    with pytest.raises(B.TreesError):
        B.predict_proba(canon(raw), Xte)


def test_a_leaders_model_passes_the_members_tree_policy(cancer, member_doc):
    """issue 11: model_info reads leaves with no bound (leaf_abs_max = inf); a model a leader sends
    must hold only trees a member's validate_trees would accept, and no more than the rounds allow."""
    _, _, _, _, base = cancer
    model = B.append_round(None, [member_doc, member_doc], base, 30, 0, BINARY)
    policy = dict(max_depth=3, max_nodes=15, leaf_abs_max=10.0, trees_max=4, trees_multiple=2)
    assert B.check_model_policy(model, **policy).n_trees == 4
    raw = json.loads(model)
    tree = raw["learner"]["gradient_booster"]["model"]["trees"][3]
    leaf = tree["left_children"].index(-1)
    tree["split_conditions"][leaf] = tree["base_weights"][leaf] = -1000.0    # still canonical
    poisoned = canon(raw)
    assert B.model_info(poisoned).n_trees == 4                  # structurally fine: only the policy refuses it
    with pytest.raises(B.TreesError, match="tree 3: \\|leaf value\\| 1000.0 exceeds leaf_abs_max 10.0"):
        B.check_model_policy(poisoned, **policy)
    with pytest.raises(B.TreesError, match="depth 3 exceeds max_depth 2"):
        B.check_model_policy(model, **{**policy, "max_depth": 2})
    with pytest.raises(B.TreesError, match="nodes exceed 7"):
        B.check_model_policy(model, **{**policy, "max_nodes": 7})
    with pytest.raises(B.TreesError, match="at most 2"):
        B.check_model_policy(model, **{**policy, "trees_max": 2})
    with pytest.raises(B.TreesError, match="whole rounds of 3"):
        B.check_model_policy(model, **{**policy, "trees_multiple": 3})


# ---------------------------------------------------------------------------------------------
# Federated evaluation
# ---------------------------------------------------------------------------------------------

def test_histogram_auc_matches_sklearn_and_is_additive(cancer):
    Xtr, Xte, ytr, yte, base = cancer
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(50, 3000))
        y = (rng.random(n) < rng.uniform(0.1, 0.9)).astype(int)
        p = 1 / (1 + np.exp(-(rng.normal(size=n) + rng.uniform(0, 3) * (2 * y - 1))))
        assert abs(B.auc_from_histograms(B.score_histograms(y, p)) - roc_auc_score(y, p)) < 0.002
    # Scores that all fall in few bins: ties inside a bin count 1/2, exactly as sklearn counts real ties.
    y = rng.integers(0, 2, 500)
    p = rng.integers(0, 10, 500) / 10.0
    assert B.auc_from_histograms(B.score_histograms(y, p, bins=10)) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    # A model's scores, split over 4 sites: the summed histograms are the pooled one, and survive the secure sum.
    model = federate(Xtr, ytr, partition(len(ytr), 2, seed=0), 5, 0.3, 1, base)
    p = B.predict_proba(model, Xte, nthread=1)
    sites = partition(len(yte), 4, seed=5)
    per_site = [B.score_histograms(yte[s], p[s]) for s in sites]
    pooled = B.score_histograms(yte, p)
    assert pooled.shape == (2, 1000) and pooled.dtype == np.int64
    np.testing.assert_array_equal(sum(per_site), pooled)
    secure = decode_counts(sum(encode_counts(h.ravel(), 4, count_max=len(yte)) for h in per_site)).reshape(2, 1000)
    np.testing.assert_array_equal(secure, pooled)
    assert abs(B.auc_from_histograms(secure) - roc_auc_score(yte, p)) < 0.002
    # log-loss and accuracy counts add up too
    sums = [B.logloss_sums(yte[s], p[s]) for s in sites]
    assert sum(c for _, c in sums) == len(yte)
    assert sum(s for s, _ in sums) / len(yte) == pytest.approx(log_loss(yte, p.astype(np.float64)), rel=1e-9)
    correct = sum(B.accuracy_counts(yte[s], p[s])[0] for s in sites)
    assert correct == int(((p > 0.5) == yte).sum())
    assert math.isnan(B.auc_from_histograms(B.score_histograms(np.ones(5, int), np.full(5, 0.3))))


def test_multiclass_histograms_are_one_vs_rest():
    rng = np.random.default_rng(1)
    n, k = 2000, 4
    y = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y]
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    hist = B.score_histograms(y, p)
    assert hist.shape == (k, 2, 1000)
    aucs = B.auc_from_histograms(hist)
    for c in range(k):
        assert abs(aucs[c] - roc_auc_score(y == c, p[:, c])) < 0.002
    assert abs(aucs.mean() - roc_auc_score(y, p, multi_class="ovr", average="macro")) < 0.002
    halves = [B.score_histograms(y[:700], p[:700]), B.score_histograms(y[700:], p[700:])]
    np.testing.assert_array_equal(halves[0] + halves[1], hist)
    s, c = B.logloss_sums(y, p)
    assert s / c == pytest.approx(log_loss(y, p), rel=1e-9)
    assert B.accuracy_counts(y, p) == (int((p.argmax(axis=1) == y).sum()), n)
    with pytest.raises(ValueError):
        B.score_histograms(y, p[:, :3])             # label 3 with 3 columns


def test_local_auc_is_sklearns_with_ties_and_classes_that_are_missing():
    from fedpeer.ml.evaluation import local_auc
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(2, 400))
        y = rng.integers(0, 2, n)
        p = np.round(rng.random(n), int(rng.integers(1, 4)))       # many ties at 1 decimal
        want = roc_auc_score(y, p) if len(np.unique(y)) == 2 else None
        assert local_auc(y, p) == (want if want is None else pytest.approx(want, abs=1e-12))
        k = int(rng.integers(3, 6))
        y = rng.integers(0, k, n)
        p = rng.dirichlet(np.ones(k), 7)[rng.integers(0, 7, n)]    # whole rows repeat: ties in every class
        if len(np.unique(y)) == k:
            want = roc_auc_score(y, p, multi_class="ovr", labels=list(range(k)))
            assert local_auc(y, p) == pytest.approx(want, abs=1e-12)
    assert local_auc(np.ones(5, int), np.full(5, 0.3)) is None
    # a class absent from the rows: the mean over the classes that occur (scikit-learn warns, NaN)
    y, p = np.array([0, 1, 0, 1]), np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.1, 0.4], [0.4, 0.5, 0.1]])
    assert local_auc(y, p) == pytest.approx((roc_auc_score(y == 0, p[:, 0]) + roc_auc_score(y == 1, p[:, 1])) / 2)
