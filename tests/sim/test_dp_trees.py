"""Histogram XGBoost with DP in the seeded simulation (memory network, virtual time): every member
ends with the same model from noised level sums, no message any member sees holds an un-noised
histogram, poisoned sums still fail everywhere, and a job without the bounds it needs is refused."""

from __future__ import annotations

import numpy as np
import pytest

from fedpeer.config.bounds import bounds_text
from fedpeer.jobs.kind import ImplausibleTotal, JobContext
from fedpeer.kinds.xgboost import hist_dp
from fedpeer.kinds.xgboost import kind as xgb
from fedpeer.ml import dpbins
from fedpeer.ml.xgb import dpboost as dx
from fedpeer.testing.members import member_keys, poisoned_sums, run_members
from tests.sim.test_implausible_totals import blobs

BOUNDS = {"x0": (-2.0, 9.0), "x1": (-2.0, 9.0)}
DP = {"mode": "histogram", "rounds": 2, "max_depth": 2, "max_bin": 4, "test_fraction": 0.0, "eval_every": 0,
      "dp_epsilon": 100.0, "dp_rows_max": 10_000, "dp_bounds": bounds_text(BOUNDS)}


async def _inline(fn, *args):
    return fn(*args)


def _run(params: dict, sites: list, mode: str = "allreduce", poison=None) -> tuple[list, object]:
    keys, names = member_keys("dpx", len(sites))
    checked = xgb.KIND.check_params({**params, "secure_sum": mode})
    nets = []

    def member(net, i, k):
        nets.append(net)
        ctx = JobContext(names[k], names, 2_000, data=sites[i], noise_rng=np.random.default_rng(200 + i))
        return hist_dp.run_dp(net.channel(k), checked, ctx, offload=_inline)
    if poison is None:
        return run_members(keys, member), nets[0]
    with poisoned_sums(hist_dp, keys[0], poison):
        return run_members(keys, member), nets[0]


def _clean_root(sites: list) -> np.ndarray:
    """The first tree's root histograms summed without noise (what no member may ever see)."""
    cuts = dpbins.uniform_cuts(dpbins.bounds_matrix(BOUNDS, ["x0", "x1"]), DP["max_bin"])
    G = H = 0
    for s in sites:
        gq, hq = dx.quantised_derivatives(np.zeros(len(s.y)), s.y)
        g, h = dx.level_sums(dpbins.bin_rows(s.X, cuts), gq, hq, np.zeros(len(s.y), dtype=np.int64),
                             np.array([0]), DP["max_bin"])
        G, H = G + g, H + h
    return np.concatenate([G.ravel(), H.ravel()]).view(np.uint64)


@pytest.mark.parametrize("mode", ["allreduce", "pairwise"])
def test_a_dp_xgboost_job_ends_alike_everywhere_and_no_message_holds_an_unnoised_histogram(mode):
    sites = blobs(labelled=True)
    results, net = _run(DP, sites, mode)
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["model_sha256"] for r in results}) == 1       # one model, from the same noised sums
    r = results[0]
    assert r["privacy"]["epsilon"] <= 100.0 and r["privacy"]["bits_per_value"] <= 20
    assert r["privacy"]["releases"] <= 2 * DP["rounds"] * DP["max_depth"] and r["trees"] == DP["rounds"]
    # the model learned the blobs from noised sums: site 2's rows (owner 1) score above the others
    from fedpeer.ml.xgb import boosting
    X = np.vstack([s.X for s in sites])
    y = np.concatenate([s.y for s in sites])
    p = boosting.predict_proba(results[0]["_model"], X)
    assert np.mean((p > 0.5) == y) > 0.9
    clean = _clean_root(sites)
    windows = {tuple(clean[i:i + 3]) for i in range(len(clean) - 2)}
    seen = 0
    for _src, _dst, msg in net.sent:
        for value in vars(msg).values():
            if isinstance(value, np.ndarray) and value.dtype == np.uint64 and len(value) >= 3:
                seen += 1
                got = {tuple(value[i:i + 3]) for i in range(len(value) - 2)}
                assert not (got & windows), f"an un-noised histogram in {type(msg).__name__}"
    assert seen


@pytest.mark.parametrize("entry,amount", [(0, 2 ** 40), (-1, 2 ** 40), (3, -(2 ** 36))])
@pytest.mark.parametrize("which", [0, 1])
def test_poisoned_dp_level_sums_still_fail_everywhere(which, entry, amount):
    seen = []

    def poison(tag, vector):
        seen.append(tag)
        if len(seen) - 1 != which:
            return None
        out = vector.copy()
        out[entry:entry + 1 or None] += np.array([amount], dtype=np.int64).view(np.uint64)   # mod 2^64
        return out
    results, _ = _run(DP, blobs(labelled=True), poison=poison)
    assert all(isinstance(r, ImplausibleTotal) for r in results), results
    assert all("within the noise" in str(r) for r in results)


def test_a_dp_job_without_bounds_or_beyond_what_it_can_bound_is_refused_in_one_line():
    sites = blobs(labelled=True)
    results, _ = _run({**DP, "dp_bounds": bounds_text({"x0": (0.0, 1.0)})}, sites)
    assert all("no bounds for column 'x1'" in str(r) and str(r).startswith("site-") for r in results), results
    assert all("needs dp_bounds" in str(r) for r in _run({**DP, "dp_bounds": ""}, sites)[0])
    from fedpeer.errors import JobError
    for change, words in [({"objective": "reg:squarederror"}, "binary:logistic only"),
                          ({"mode": "bagging"}, "histogram mode only"), ({"max_bin": 2048}, "max_bin up to 1024")]:
        with pytest.raises(JobError, match=words):      # the CLI, the proposer and every member, before any charge
            xgb.KIND.check_params({**DP, **change})
    assert all("leaves no member's noise" in str(r) for r in _run({**DP, "dp_colluders": 3}, sites)[0])


def test_a_dp_result_says_what_it_spent_and_scores_only_its_own_test_part():
    from fedpeer.kinds.xgboost import text

    results, _ = _run({**DP, "test_fraction": 0.2}, blobs(labelled=True))
    r = results[0]
    assert r["federated_eval"] is None and r["history"] == [] and r["local_test"]["rows"] > 0
    shown = "\n".join(text.describe(r))
    assert "differential privacy: ε" in shown and "split rule: xgboost's gain on the noised G, H" in shown
    assert "this site's own test part (not released)" in shown


def test_honest_totals_under_heavy_noise_pass_every_check():
    results, _ = _run({**DP, "dp_epsilon": 0.2, "rounds": 3, "max_depth": 3}, blobs(labelled=True))
    assert all(isinstance(r, dict) for r in results), results
    assert results[0]["privacy"]["epsilon"] <= 0.2


def test_the_first_level_total_is_the_clean_histograms_plus_every_members_own_noise_share(monkeypatch):
    """Each member's seeded share, drawn as it draws it, is in the released total: the total minus
    the clean histograms is exactly the sum of all three members' shares (no member's is missing)."""
    from fedpeer.protocols import dp

    sites = blobs(labelled=True)
    real, seen = hist_dp.secure_sum, {}

    async def recording(ch, tag, vector, *args, **kw):
        out = await real(ch, tag, vector, *args, **kw)
        seen.setdefault(tag, dp.signed(out.total).copy())
        return out
    monkeypatch.setattr(hist_dp, "secure_sum", recording)
    results, _ = _run(DP, sites)
    mu = results[0]["privacy"]["noise_variance"]
    clean = _clean_root(sites).view(np.int64)
    half = len(clean) // 2
    shares = [np.concatenate([dp.draw_share(rng, mu["g"] / 3, half), dp.draw_share(rng, mu["h"] / 3, half)])
              for rng in (np.random.default_rng(200 + i) for i in range(3))]
    total = seen[f"{hist_dp.TAG}/t0/d0"]
    assert np.array_equal(total - clean, shares[0] + shares[1] + shares[2])
    assert all(np.abs(s).max() > 0 for s in shares)
