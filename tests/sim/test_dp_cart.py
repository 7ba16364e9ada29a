"""The exact tree kind with DP in the seeded simulation (memory network, virtual time): every
member ends with the same tree from noised level counts, the released total is the clean counts
plus every member's own noise share, no message any member sees holds an un-noised count, a
poisoned total fails everywhere, and the refusals (no bounds, icdta, an older member)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedpeer.config.bounds import bounds_text, parse_bounds_text
from fedpeer.errors import JobError
from fedpeer.jobs import capabilities as caps
from fedpeer.jobs.kind import ImplausibleTotal, JobContext
from fedpeer.jobs.privacy import with_bounds
from fedpeer.kinds import releases
from fedpeer.kinds.tree import dp as tree_dp
from fedpeer.kinds.tree import kind as tree
from fedpeer.ml import dpbins
from fedpeer.ml.tree import dpcart
from fedpeer.ml.tree.model import load_model, predict_value
from fedpeer.protocols import dp
from fedpeer.testing.members import member_keys, poisoned_sums, run_members
from tests.sim.test_implausible_totals import blobs

BOUNDS = {"x0": (-2.0, 9.0), "x1": (-2.0, 9.0)}
DP = {"max_depth": 2, "max_bin": 8, "test_fraction": 0.0, "min_leaf_rows": 1,
      "dp_epsilon": 8.0, "dp_rows_max": 10_000, "dp_bounds": bounds_text(BOUNDS)}


async def _inline(fn, *args):
    return fn(*args)


def _run(params: dict, sites: list, mode: str = "allreduce", poison=None) -> tuple[list, object]:
    keys, names = member_keys("dpt", len(sites))
    checked = tree.KIND.check_params({**params, "secure_sum": mode})
    nets = []

    def member(net, i, k):
        nets.append(net)
        ctx = JobContext(names[k], names, 2_000, data=sites[i], noise_rng=np.random.default_rng(400 + i))
        return tree.run(net.channel(k), checked, ctx, offload=_inline)
    if poison is None:
        return run_members(keys, member), nets[0]
    with poisoned_sums(tree_dp, keys[0], poison):
        return run_members(keys, member), nets[0]


def _clean_root(sites: list) -> np.ndarray:
    """The root level's class counts summed without noise (what no member may ever see)."""
    cuts = dpbins.uniform_cuts(dpbins.bounds_matrix(BOUNDS, ["x0", "x1"]), DP["max_bin"])
    return sum(dpcart.level_counts(dpbins.bin_rows(s.X, cuts), np.asarray(s.y, dtype=np.int64),
                                   np.zeros(len(s.y), dtype=np.int64), np.array([0]), DP["max_bin"], 2)
               for s in sites).ravel()


def test_a_dp_tree_ends_alike_everywhere_its_total_is_clean_counts_plus_every_share_and_no_message_holds_one(
        monkeypatch):
    sites = blobs(labelled=True)
    real, seen = tree_dp.secure_sum, {}

    async def recording(ch, tag, vector, *args, **kw):
        out = await real(ch, tag, vector, *args, **kw)
        seen.setdefault(tag, dp.signed(out.total).copy())
        return out
    monkeypatch.setattr(tree_dp, "secure_sum", recording)
    results, net = _run(DP, sites)
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["model_sha256"] for r in results}) == 1        # one tree, from the same noised counts
    r = results[0]
    p = r["privacy"]
    assert p["epsilon"] <= 8.0 and p["releases"] == r["secure_sums"] <= DP["max_depth"] and p["bits_per_value"] <= 20
    X = np.vstack([s.X for s in sites])
    y = np.concatenate([s.y for s in sites])
    assert np.mean(np.argmax(predict_value(load_model(r["_model"])[0], X), axis=1) == y) > 0.9
    clean = _clean_root(sites)
    shares = [dp.draw_share(np.random.default_rng(400 + i), p["noise_variance"] / 3, len(clean)) for i in range(3)]
    assert np.array_equal(seen[f"{tree_dp.TAG}/d0"] - clean, shares[0] + shares[1] + shares[2])
    assert all(np.abs(s).max() > 0 for s in shares)
    windows = {tuple(clean.view(np.uint64)[i:i + 3]) for i in range(len(clean) - 2)}
    messages = 0
    for _src, _dst, msg in net.sent:
        for value in vars(msg).values():
            if isinstance(value, np.ndarray) and value.dtype == np.uint64 and len(value) >= 3:
                messages += 1
                assert not ({tuple(value[i:i + 3]) for i in range(len(value) - 2)} & windows), type(msg).__name__
    assert messages
    stored = json.loads(json.dumps({k: v for k, v in r.items() if k != "_model"}, allow_nan=False))
    assert stored["local_test"]["on"] == "this site's own training rows" and stored["federated_eval"] is None
    shown = "\n".join(tree.describe(r))
    assert "differential privacy: ε" in shown and "impurity decrease on the noised class counts" in shown


@pytest.mark.parametrize("entry,amount", [(0, 2 ** 40), (5, -(2 ** 36))])
def test_a_poisoned_dp_level_total_fails_everywhere(entry, amount):
    def poison(tag, vector):
        out = vector.copy()
        out[entry] += np.array([amount], dtype=np.int64).view(np.uint64)[0]
        return out
    results, _ = _run(DP, blobs(labelled=True), poison=poison)
    assert all(isinstance(r, ImplausibleTotal) for r in results), results
    assert all("within the noise" in str(r) for r in results)


def test_refusals_no_bounds_icdta_regression_and_an_older_member():
    sites = blobs(labelled=True)
    results, _ = _run({**DP, "dp_bounds": bounds_text({"x0": (0.0, 1.0)})}, sites)
    assert all("no bounds for column 'x1'" in str(r) for r in results), results
    assert all("needs dp_bounds" in str(r) for r in _run({**DP, "dp_bounds": ""}, sites)[0])
    for change, words in [({"mode": "icdta"}, "mode exact only"), ({"criterion": "squared_error"}, "gini or entropy"),
                          ({"max_bin": 2048}, "max_bin up to 1024")]:
        with pytest.raises(JobError, match=words):        # the CLI, the proposer and every member, before any charge
            tree.KIND.check_params({**DP, **change})
    xgb_dp_only = releases.BASELINE_CAPABILITIES | {caps.DP_SKELLAM, caps.DP_TREES}
    asked = caps.settled(tree.KIND, tree.KIND.check_params(DP), [xgb_dp_only])    # as the proposer does
    assert caps.lacking(tree.KIND, asked, xgb_dp_only) == [caps.DP_CART]
    plain = caps.settled(tree.KIND, tree.KIND.check_params({}), [releases.BASELINE_CAPABILITIES])
    assert caps.lacking(tree.KIND, plain, releases.BASELINE_CAPABILITIES) == []
    filled = with_bounds(tree.KIND.params, {"dp_epsilon": 1.0}, BOUNDS)       # the proposer's [data] bounds
    assert parse_bounds_text(filled["dp_bounds"]) == BOUNDS


def test_honest_counts_under_heavy_noise_pass_every_check():
    results, _ = _run({**DP, "dp_epsilon": 0.1, "max_depth": 4, "criterion": "entropy"}, blobs(labelled=True))
    assert all(isinstance(r, dict) for r in results), results
    assert results[0]["privacy"]["epsilon"] <= 0.1
