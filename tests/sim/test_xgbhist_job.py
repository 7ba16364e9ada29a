"""The `xgboost` job in histogram mode (fedpeer/kinds/xgboost/hist.py), every member in one process over
the in-memory network in virtual time: the federated model is byte for byte the model the same
pure functions give on the pooled rows, and a member crashed mid-job leaves the survivors with one
model, grown on from the last finished tree."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import xgboost_experiment as exp  # noqa: E402

from fedpeer.errors import JobError  # noqa: E402
from fedpeer.jobs.kind import ImplausibleTotal, JobContext  # noqa: E402
from fedpeer.kinds.xgboost import hist as xgbhist  # noqa: E402
from fedpeer.kinds.xgboost import kind as xj  # noqa: E402
from fedpeer.ml.xgb import (
    boosting,
    histrun,  # noqa: E402
    sketch,
)
from fedpeer.testing.memory import MemoryNetwork  # noqa: E402
from fedpeer.testing.members import TwoFaced, after_step, member_keys, run_members  # noqa: E402

PARAMS = {"mode": "histogram", "rounds": 4, "max_depth": 3, "eta": 0.3, "secure_sum": "ring", "test_fraction": 0.0,
          "max_bin": 32, "nthread": 1}


def breast_cancer_sites(n: int) -> tuple[list, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer

    raw = load_breast_cancer()
    features = tuple(n_.replace(" ", "_") for n_ in raw.feature_names)
    y = (raw.target == 0).astype(np.int8)
    parts = exp.stratified_parts(y, n, seed=1)
    return [exp.dataset(raw.data[p], y[p], features) for p in parts], raw.data, y


def run(sites: list, params: dict, crash_after_trees: int | None = None, victim: int = 1) -> tuple[list, list[bytes]]:
    """Every member's result (or exception); with crash_after_trees, member `victim` (in key order)
    crashes once some member has finished that many trees."""
    keys, names = member_keys("xgbh", len(sites))
    checked = xj.KIND.check_params(params)
    tools = xj.Tools(offload=exp._inline)

    def member(net: MemoryNetwork, i: int, k: bytes):
        return xj.run_job(net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]), tools)

    crash = after_step(crash_after_trees) if crash_after_trees is not None else None
    return run_members(keys, member, crash, victim), keys


SECURE_SUMS = pytest.mark.parametrize("secure_sum", ["ring", "allreduce"])   # allreduce: levels by reduce-map


@SECURE_SUMS
def test_federated_model_is_byte_identical_to_the_pooled_reference(secure_sum: str) -> None:
    sites, _, _ = breast_cancer_sites(3)
    results, _ = run(sites, {**PARAMS, "secure_sum": secure_sum})
    assert all(isinstance(r, dict) for r in results), results
    models = {r["_model"] for r in results}
    assert len(models) == 1 and len({r["model_sha256"] for r in results}) == 1
    model = models.pop()
    reference = histrun.train_reference([s.X for s in sites], [s.y for s in sites],
                                        {"num_round": 4, "max_depth": 3, "eta": 0.3, "max_bin": 32})
    assert model == reference
    r = results[0]
    assert r["mode"] == "histogram" and r["trees"] == 4 and r["rounds"] == 4 and r["lost"] == []
    assert r["secure_sums"] == 1 + sketch.sketch_steps(30, 32) + 4 * 3     # labels, the sketch, one per level
    assert boosting.model_sha256(model) == r["model_sha256"]


def test_default_test_part_gives_a_federated_evaluation() -> None:
    sites, _, _ = breast_cancer_sites(3)
    results, _ = run(sites, {**PARAMS, "test_fraction": 0.2, "rounds": 3})
    assert len({r["model_sha256"] for r in results}) == 1
    fed = results[0]["federated_eval"]
    assert fed is not None and fed["auc"] > 0.9 and results[0]["auc"] == fed["auc"]
    assert results[0]["rows"]["test"] > 0


@pytest.mark.parametrize("mode", ["histogram", "bagging"])
def test_the_training_loss_is_the_models_log_loss_on_the_training_rows(mode: str) -> None:
    """train_loss (the default): each evaluated round's entry holds the federation's training
    log-loss and rows, from the evaluation's own sum. Without a test part the rounds are evaluated
    on the training rows, so it must equal their log-loss (histogram mode reads it from its float64
    margins, xgboost predicts in float32); it falls as trees are added. Off: no training loss."""
    sites, _, _ = breast_cancer_sites(3)
    results, _ = run(sites, {**PARAMS, "mode": mode, "eval_every": 1})
    assert all(isinstance(r, dict) for r in results), results
    history = [h for h in results[0]["history"] if "logloss" in h]
    assert len(history) >= 3
    for h in history:
        assert h["train_rows"] == h["test_rows"] == 569
        assert h["train_logloss"] == pytest.approx(h["logloss"], abs=1e-5)
    losses = [h["train_logloss"] for h in history]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    assert "train_logloss" not in (results[0]["federated_eval"] or {}), "the test part's metrics only"
    assert set(xj.text.history(results[0])) >= {"auc", "logloss", "train_logloss", "train_rows"}
    shown = "\n".join(xj.text.describe({**results[0], "model_file": "model.json"})).splitlines()
    head = next(line for line in shown if line.lstrip().startswith("ROUND"))
    assert head.split()[-3:] == ["ACCURACY", "TRAIN", "LOG-LOSS"], shown     # job show: beside the test metrics
    assert sum(line.lstrip()[:1].isdigit() for line in shown) == len(history)
    results, _ = run(sites, {**PARAMS, "mode": mode, "eval_every": 1, "train_loss": False})
    assert all("logloss" in h for h in results[0]["history"] if "auc" in h)
    assert not any("train_logloss" in h for h in results[0]["history"])
    assert "TRAIN" not in "\n".join(xj.text.describe({**results[0], "model_file": "model.json"}))


def test_owners_take_turns_and_five_members_still_grow_the_pooled_model() -> None:
    """Each tree's blocks of features go to one member in three, in turn: over n trees every member
    owns exactly as many; with 5 members (2 owners a tree) the model is the pooled rows' one."""
    for n in range(1, 12):
        owned = [0] * n
        for t in range(n):
            owners = xgbhist.tree_owners(n, t)
            assert len(owners) == -(-n // xgbhist.MEMBERS_PER_OWNER) and list(owners) == sorted(set(owners))
            for k in owners:
                owned[k] += 1
        assert set(owned) == {len(owners)}
    sites, _, _ = breast_cancer_sites(5)
    results, _ = run(sites, {**PARAMS, "rounds": 5, "secure_sum": "allreduce"})
    assert all(isinstance(r, dict) for r in results), results
    reference = histrun.train_reference([s.X for s in sites], [s.y for s in sites],
                                        {"num_round": 5, "max_depth": 3, "eta": 0.3, "max_bin": 32})
    assert {r["_model"] for r in results} == {reference}


@SECURE_SUMS
def test_a_member_crashed_mid_job_leaves_the_survivors_with_one_model(secure_sum: str) -> None:
    sites, _, _ = breast_cancer_sites(3)
    # member 1 is the ring successor of the sums' initiator (member 0): the initiator sees the
    # crash itself and re-runs the sum over the survivors
    results, keys = run(sites, {**PARAMS, "rounds": 6, "secure_sum": secure_sum}, crash_after_trees=2, victim=1)
    survivors = [r for r in results if isinstance(r, dict)]
    assert len(survivors) == 2, results
    assert len({r["model_sha256"] for r in survivors}) == 1
    assert all(r["lost"] == ["site-2"] and r["members"] == ["site-1", "site-3"] for r in survivors)
    from fedpeer.app.cli import format_job

    shown = format_job({"id": "j", "kind": "xgboost", "state": "done", "proposer": "site-1", "members": [],
                        "phase": "done", "progress": {"step": 6, "total": 6}, "params": {},
                        "result": {k: v for k, v in survivors[0].items() if k != "_model"}})
    assert "members lost: site-2" in shown and "over site-1, site-3" in shown, shown
    assert survivors[0]["trees"] == 6
    # the trees every member finished before the loss are the three members' pooled trees: the
    # first at least (a member that finished the second had every member's part of its levels,
    # but the victim may have crashed before the others had its digest check of the second)
    whole = histrun.train_reference([s.X for s in sites], [s.y for s in sites],
                                    {"num_round": 6, "max_depth": 3, "eta": 0.3, "max_bin": 32})
    got, want = boosting.model_info(survivors[0]["_model"]).trees, boosting.model_info(whole).trees
    assert np.array_equal(got[0].value, want[0].value)
    assert not all(np.array_equal(a.value, b.value) for a, b in zip(got, want))


def test_a_crash_the_secure_sum_gives_up_on_is_lost_once_declared_dead() -> None:
    """Member 2's crash is reported by member 1 against it: with three members the secure sum
    cannot route around that dispute and gives up; the survivors wait for their failure detector,
    which declares member 2 dead, and go on without it."""
    sites, _, _ = breast_cancer_sites(3)
    results, _ = run(sites, {**PARAMS, "rounds": 6}, crash_after_trees=2, victim=2)
    survivors = [r for r in results if isinstance(r, dict)]
    assert len(survivors) == 2, results
    assert len({r["model_sha256"] for r in survivors}) == 1 and survivors[0]["trees"] == 6
    assert all(r["lost"] == ["site-3"] for r in survivors)


def test_histogram_mode_refuses_what_it_cannot_do() -> None:
    with pytest.raises(JobError, match="num_local_round"):
        xgbhist.hist_params(xj.KIND.check_params({**PARAMS, "num_local_round": 2}), 1)
    assert xj.KIND.check_params({})["mode"] == "histogram"


@SECURE_SUMS
def test_subsample_and_colsample_give_the_reference_model_with_the_same_seeds(secure_sum: str) -> None:
    """Item 3: the features of each tree come from the job seed (the same everywhere), each
    member's rows from its own seed (site_seed(job seed, its key)): the federated model equals
    the in-process reference run with those seeds — and differs from the unsampled model."""
    from fedpeer.jobs.kind import site_seed

    sites, _, _ = breast_cancer_sites(3)
    params = {**PARAMS, "subsample": 0.6, "colsample_bytree": 0.5, "seed": 11, "secure_sum": secure_sum}
    results, keys = run(sites, params)
    assert all(isinstance(r, dict) for r in results), results
    model = results[0]["_model"]
    assert {r["_model"] for r in results} == {model}
    ref = {"num_round": 4, "max_depth": 3, "eta": 0.3, "max_bin": 32, "subsample": 0.6, "colsample_bytree": 0.5,
           "seed": 11}
    want = histrun.train_in_process([(s.X, s.y) for s in sites], ref, row_seeds=[site_seed(11, k) for k in keys])
    assert model == want.model
    plain = histrun.train_in_process([(s.X, s.y) for s in sites], {**ref, "subsample": 1.0, "colsample_bytree": 1.0})
    assert model != plain.model
    from fedpeer.ml.xgb.histboost import HistParams, tree_features
    hp = HistParams.from_mapping(ref)
    for t, tree in enumerate(boosting.model_info(model).trees):      # each tree splits on its 15 of 30 only
        allowed = tree_features(hp, t, 30)
        assert allowed.sum() == 15 and allowed[tree.feature[tree.left >= 0]].all()
    assert not np.array_equal(tree_features(hp, 0, 30), tree_features(hp, 1, 30))


def test_bounds_and_impossible_sums_end_the_job_everywhere_naming_what() -> None:
    from fedpeer.errors import DataError
    from fedpeer.jobs.kind import JobFailsEverywhere, checked_total
    from fedpeer.ml.xgb.hist import decode_histograms

    with pytest.raises(ImplausibleTotal, match="secure sum 'xgbh/e0/r1/c0/d2': check 'expected uint64"):
        checked_total("xgbh/e0/r1/c0/d2", decode_histograms, np.zeros(5, dtype=np.uint64), 1, 2, 3)
    assert issubclass(ImplausibleTotal, JobFailsEverywhere)

    sites, _, _ = breast_cancer_sites(2)
    job = xgbhist.HistJob(MemoryNetwork([b"a" * 32, b"b" * 32]).channel(b"a" * 32), xj.KIND.check_params(PARAMS),
                          JobContext("a", {}, 1000), (sites[0].X, sites[0].y), 1, exp._inline)

    def beyond() -> None:
        raise DataError("histogram mode: gradient 3.0 of row 7 is outside the declared bound grad_abs_max=1.0")

    with pytest.raises(JobFailsEverywhere, match="grad_abs_max=1.0"):
        asyncio.run(job.compute(beyond))


def wine_sites(n: int) -> list:
    """scikit-learn's wine data (three classes) over n sites, labels by class name."""
    from sklearn.datasets import load_wine

    from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint

    raw = load_wine()
    names = np.array(["barolo", "grignolino", "barbera"])
    features = tuple(f"f{i}" for i in range(raw.data.shape[1]))
    parts = np.array_split(np.random.default_rng(0).permutation(len(raw.target)), n)
    return [Dataset(features, np.ascontiguousarray(raw.data[rows]), None, names[raw.target[rows]], 0,
                    schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features))) for rows in parts]


@SECURE_SUMS
def test_multiclass_model_is_the_pooled_reference(secure_sum: str) -> None:
    from sklearn.datasets import load_wine

    raw = load_wine()
    parts = np.array_split(np.random.default_rng(0).permutation(len(raw.target)), 3)
    params = {**PARAMS, "objective": "multi:softprob", "classes": "barolo,grignolino,barbera", "rounds": 3,
              "secure_sum": secure_sum}
    results, _ = run(wine_sites(3), params)
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["model_sha256"] for r in results}) == 1 and results[0]["trees"] == 3 * 3
    want = histrun.train_reference([raw.data[p] for p in parts], [raw.target[p] for p in parts],
                                   {"objective": "multi:softprob", "num_class": 3, "num_round": 3, "max_depth": 3,
                                    "eta": 0.3, "max_bin": 32})
    assert results[0]["_model"] == want


def diabetes_sites(n: int) -> tuple[list, list[np.ndarray]]:
    """scikit-learn's diabetes regression data over n sites; labels as the CSV reader gives them."""
    from sklearn.datasets import load_diabetes

    from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint

    raw = load_diabetes()
    features = tuple(raw.feature_names)
    parts = np.array_split(np.random.default_rng(3).permutation(len(raw.target)), n)
    fingerprint = schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features))
    sites = [Dataset(features, np.ascontiguousarray(raw.data[p]), None,
                     np.array([repr(float(v)) for v in raw.target[p]]), 0, fingerprint) for p in parts]
    return sites, [raw.target[p] for p in parts]


@SECURE_SUMS
def test_regression_histogram_mode_is_the_pooled_model_and_reports_rmse(secure_sum: str) -> None:
    sites, ys = diabetes_sites(3)
    params = {**PARAMS, "objective": "reg:squarederror", "grad_abs_max": 400.0, "test_fraction": 0.0,
              "secure_sum": secure_sum}
    results, _ = run(sites, params)
    assert all(isinstance(r, dict) for r in results), results
    model = results[0]["_model"]
    assert {r["model_sha256"] for r in results} == {boosting.model_sha256(model)}
    reference = histrun.train_reference([s.X for s in sites], ys, {"objective": "reg:squarederror", "num_round": 4,
                                                                   "max_depth": 3, "eta": 0.3, "max_bin": 32,
                                                                   "grad_abs_max": 400.0})
    assert model == reference
    assert results[0]["base_score"] == pytest.approx(np.concatenate(ys).mean(), rel=1e-6)
    results, _ = run(sites, {**params, "test_fraction": 0.2})
    fed = results[0]["federated_eval"]
    assert set(fed) == {"rmse", "mae", "test_rows", "rows"} and 0 < fed["mae"] <= fed["rmse"] < 80
    assert results[0]["rmse"] == fed["rmse"] and results[0]["auc"] is None


def test_regression_gradients_beyond_the_declared_bound_end_the_job_naming_it() -> None:
    sites, _ = diabetes_sites(3)
    # labels 25..346 around a mean of ~152: |prediction - label| reaches ~194 on the first tree
    results, _ = run(sites, {**PARAMS, "objective": "reg:squarederror", "grad_abs_max": 50.0})
    assert all(isinstance(r, JobError) and "grad_abs_max" in str(r) for r in results), results


def test_regression_in_bagging_mode() -> None:
    sites, ys = diabetes_sites(3)
    results, _ = run(sites, {**PARAMS, "mode": "bagging", "objective": "reg:squarederror", "test_fraction": 0.2,
                             "leaf_abs_max": 1000.0, "rounds": 3, "eval_every": 1})
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["model_sha256"] for r in results}) == 1
    r = results[0]
    assert r["trees"] == 9 and r["auc"] is None and 0 < r["mae"] <= r["rmse"] < 80, r
    assert all(h.get("rmse") is not None for h in r["history"])
    assert r["base_score"] == pytest.approx(np.mean(np.concatenate([y for y in ys])), rel=0.05)   # train parts' mean


@settings(max_examples=9, deadline=None)
@given(poison=st.integers(2**40, 2**64 - 1), target=st.sampled_from(["label_vector", "sketch_vector", "level_vector"]),
       member=st.integers(0, 2), secure_sum=st.sampled_from(["ring", "allreduce"]))
def test_a_poisoned_contribution_ends_the_job_everywhere_and_no_model_is_adopted(poison: int, target: str,
                                                                                 member: int, secure_sum: str) -> None:
    """One member adds `poison` (mod 2^64) to every entry of its label counts, its sketch counts or
    its level histograms: every member fails the job naming the sum and the check; none returns
    a model."""
    sites, _, _ = breast_cancer_sites(3)
    keys, names = member_keys("xgbh", 3)
    checked = xj.KIND.check_params({**PARAMS, "secure_sum": secure_sum})

    def tools_for(i: int) -> xj.Tools:
        async def offload(fn, *args):
            out = await exp._inline(fn, *args)
            if i == member and getattr(fn, "__name__", "") == target:
                out = out + np.uint64(poison)          # uint64: wraps mod 2^64 as a secure sum's entries do
            return out
        return xj.Tools(offload=offload)

    results = run_members(keys, lambda net, i, k: xj.run_job(
        net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]), tools_for(i)))
    assert not any(isinstance(r, dict) for r in results), "a poisoned total was adopted"
    for r in results:
        assert isinstance(r, ImplausibleTotal), r
        assert "a member's contribution is implausible" in str(r) and "traceback" not in str(r).lower(), r


def test_rounds_are_evaluated_every_eval_every_and_reported_live() -> None:
    """The history: the model so far on the sites' test parts every `eval_every` rounds and the
    final model, the same at every member, each point also reported as the job runs."""
    sites, _, _ = breast_cancer_sites(3)
    keys, names = member_keys("xgbh", 3)
    checked = xj.KIND.check_params({**PARAMS, "rounds": 5, "eval_every": 2, "test_fraction": 0.2})
    nets: list[MemoryNetwork] = []

    def member(net: MemoryNetwork, i: int, k: bytes):
        nets.append(net)
        return xj.run_job(net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]),
                          xj.Tools(offload=exp._inline))
    results = run_members(keys, member)
    assert all(isinstance(r, dict) for r in results), results
    history = results[0]["history"]
    assert [h["round"] for h in history] == [2, 4, 5] and all(r["history"] == history for r in results)
    assert all(0.5 < h["auc"] <= 1 and h["test_rows"] > 0 for h in history)
    assert history[-1]["auc"] == results[0]["auc"]
    live = sorted((member, point["round"]) for member, point in nets[0].points)
    assert live == sorted((k, rnd) for k in keys for rnd in (2, 4, 5))


def test_an_owner_sending_members_different_splits_is_named_and_no_model_is_adopted() -> None:
    """Under allreduce each member sends everyone its block's best splits (reduce-map). One that
    sends one member a loss change a hair off (the same split wins) leaves the trees alike: the
    once-per-tree check of the owners' results catches it and names that owner."""
    from fedpeer.protocols.securesum.wire import ArResult

    sites, _, _ = breast_cancer_sites(3)
    keys, names = member_keys("xgbh", 3)
    checked = xj.KIND.check_params({**PARAMS, "secure_sum": "allreduce"})
    cheat, victim = keys[1], keys[0]

    def member(net: MemoryNetwork, i: int, k: bytes):
        ch = net.channel(k)
        return xj.run_job(TwoFaced(ch, victim, lambda m: isinstance(m, ArResult)) if k == cheat else ch, checked,
                          JobContext(names[k], names, 2_000, data=sites[i]), xj.Tools(offload=exp._inline))

    results = run_members(keys, member)
    assert not any(isinstance(r, dict) for k, r in zip(keys, results) if k != cheat), results
    for k, r in zip(keys, results):
        if k != cheat:
            assert isinstance(r, JobError) and f"owner {cheat.hex()[:16]}" in str(r), r


@pytest.mark.parametrize("secure_sum", ["ring", "allreduce"])
@pytest.mark.parametrize("objective", ["binary", "multiclass", "regression"])
def test_a_member_flipping_its_gradient_signs_fails_the_first_trees_root_check(secure_sum: str,
                                                                               objective: str) -> None:
    """Issue 38, finding 10, from the attacker's side: one member sends -g instead of g for every
    row (a plausible lie: every histogram cell stays within its bounds, and the held-out AUC fell
    from 0.999 to 0.884). The first round's root gradient sum must be what the summed labels
    imply (N·base − P; softmax N·p_k − N_k; squared error N·base − Σy), so every member fails the
    job naming the sum and the check, and no model is adopted."""
    params = {**PARAMS, "secure_sum": secure_sum}
    if objective == "binary":
        sites, _, _ = breast_cancer_sites(3)
    elif objective == "multiclass":
        sites = wine_sites(3)
        params.update(objective="multi:softprob", classes="barolo,grignolino,barbera")
    else:
        sites, _ = diabetes_sites(3)
        params.update(objective="reg:squarederror", grad_abs_max=400.0)
    keys, names = member_keys("xgbh", 3)
    checked = xj.KIND.check_params(params)

    def tools_for(i: int) -> xj.Tools:
        async def offload(fn, *args):
            out = await exp._inline(fn, *args)
            if i == 1 and getattr(fn, "__name__", "") == "start_round":
                site = fn.__self__
                g, h = site._derivs
                site._derivs = (-g, h)
            return out
        return xj.Tools(offload=offload)

    results = run_members(keys, lambda net, i, k: xj.run_job(
        net.channel(k), checked, JobContext(names[k], names, 2_000, data=sites[i]), tools_for(i)))
    assert not any(isinstance(r, dict) for r in results), "the flipped gradients were adopted"
    for r in results:
        assert isinstance(r, ImplausibleTotal), r
        assert "root gradient sum" in str(r) and "/r0/c0/d0" in str(r), r
