"""`logreg` with DP (fedpeer/kinds/linear/logreg_dp.py) in the seeded simulation: every member ends
with the same noised model, close to the non-private one at a large ε; no message holds an
un-noised gradient sum; poisoned sums still fail everywhere; a member lost inside a DP sum stops
the job with no second attempt; fedavg and mlp refuse dp_*."""

from __future__ import annotations

import math
from collections import Counter
from unittest import mock

import numpy as np
import pytest

from fedpeer.jobs.kind import ImplausibleTotal, JobContext
from fedpeer.kinds.linear import logreg, logreg_dp, mlp
from fedpeer.ml.linear import logistic as linear
from fedpeer.protocols import dp
from fedpeer.testing.members import after_step, member_keys, poisoned_sums, run_members
from tests.sim.test_logreg_job import _inline, dataset

DP = {"dp_epsilon": 8.0, "dp_iterations": 12, "dp_rows_max": 10_000, "test_fraction": 0.0}


def sites(n: int = 3, rows: int = 300, d: int = 4, seed: int = 3) -> list:
    rng = np.random.default_rng(seed)
    beta = np.array([1.5, -1.0, 0.5, 0.0][:d])
    out = []
    for _ in range(n):
        X = rng.normal(size=(rows, d))
        y = (rng.random(rows) < 1 / (1 + np.exp(-(X @ beta - 0.3)))).astype(int)
        out.append(dataset(X, y))
    return out


def run(params: dict, data: list, crash=None, victim: int = 1, module=logreg) -> tuple[list, object]:
    keys, names = member_keys("lrdp", len(data))
    checked = module.KIND.check_params(params)
    nets = []

    def member(net, i, k):
        nets.append(net)
        ctx = JobContext(names[k], names, 2_000, data=data[i], noise_rng=np.random.default_rng(300 + i))
        return module.run_job(net.channel(k), checked, ctx, offload=_inline)
    return run_members(keys, member, crash, victim), (nets[0] if nets else None)


def test_a_dp_logreg_job_ends_alike_everywhere_near_the_plain_gradient_descent_and_sends_no_clean_sum():
    data = sites()
    results, net = run(DP, data)
    assert all(isinstance(r, dict) for r in results), results
    assert all(r["coef"] == results[0]["coef"] and r["intercept"] == results[0]["intercept"] for r in results)
    r = results[0]
    p = r["privacy"]
    assert p["epsilon"] <= 8.0 and p["delta"] == 1e-8 and "equal noise multipliers over 13 releases" in p["split"]
    assert r["secure_sums"] == 12 and r["federated_eval"] is None and abs(r["rows"] - 900) < 40
    # the same 12 steps without noise, from the same clipped, rounded sums
    X = np.vstack([s.X for s in data])
    y = np.concatenate([s.y for s in data]).astype(np.int64)
    Z = linear.design(X, np.zeros(4), np.ones(4))
    W = np.zeros((1, 5))
    quantum = 2.0 ** -logreg_dp.fraction_bits(1.0, logreg_dp.VALUE_BITS)
    clean = []
    for _ in range(12):
        g = sum(logreg_dp.local_gradient(linear.design(s.X, np.zeros(4), np.ones(4)), s.y.astype(np.int64), W, 1.0)
                for s in data)
        clean.append(g)
        W = W - 2.0 * (g.reshape(W.shape) * quantum + logreg_dp._penalised(W) * W) / len(y)
    assert np.abs(np.array(r["coef"][0] + r["intercept"]) - W[0]).max() < 0.15
    noised = linear.probabilities(Z, np.array([r["coef"][0] + r["intercept"]]))
    assert ((noised > 0.5) == y).mean() > 0.7
    windows = {tuple(c.view(np.uint64)[i:i + 2]) for c in clean for i in range(len(c) - 1)}
    seen = 0
    for _src, _dst, msg in net.sent:
        for value in vars(msg).values():
            if isinstance(value, np.ndarray) and value.dtype == np.uint64:
                seen += 1
                assert not ({tuple(value[i:i + 2]) for i in range(len(value) - 1)} & windows)
    assert seen


def test_a_rows_rounded_clipped_gradient_is_within_the_declared_sensitivities():
    rng = np.random.default_rng(0)
    for groups, d, labels in ((1, 6, 2), (3, 5, 3)):
        W = rng.normal(scale=3, size=(groups, d + 1))
        Z = linear.design(rng.normal(scale=50, size=(200, d)), np.zeros(d), np.ones(d))
        y = rng.integers(0, labels, 200)
        release = logreg_dp.plan(W.size, 1, 0.7)[1]
        norms = []
        for i in range(200):
            one = logreg_dp.local_gradient(Z[i:i + 1], y[i:i + 1], W, 0.7).astype(float)
            assert np.linalg.norm(one) <= release.l2 and np.abs(one).sum() <= release.l1
            norms.append(np.linalg.norm(one))
        # most rows are clipped (their raw gradients are large), to within rounding of the bound
        assert sum(n > release.l2 - np.sqrt(W.size) for n in norms) > 50


@pytest.mark.parametrize("which,entry", [(0, 0), (0, 2), (3, -1)])
def test_poisoned_dp_logreg_sums_still_fail_everywhere(which, entry):
    seen = []

    def poison(tag, vector):
        seen.append(tag)
        if len(seen) - 1 != which:
            return None
        out = vector.copy()
        out[entry:entry + 1 or None] += np.uint64(2 ** 45)
        return out
    keys, _ = member_keys("lrdp", 3)
    with poisoned_sums(logreg_dp, keys[1], poison):
        results, _ = run(DP, sites())
    assert all(isinstance(r, ImplausibleTotal) for r in results), results
    assert all("within the noise" in str(r) for r in results)


def test_a_member_lost_inside_a_dp_sum_gets_no_second_attempt_and_no_new_epoch():
    """docs/security.md, a DP sum's retry: one attempt; the survivors stop, no total short of a
    member's noise share is used, no sum is re-run over the survivors."""
    calls = []
    real = logreg_dp.secure_sum

    async def watched(ch, tag, vector, **kw):
        calls.append((tag, kw["attempts_max"]))
        outcome = await real(ch, tag, vector, **kw)
        calls.append((tag, "delivered", len(outcome.participants)))
        return outcome
    data = sites()
    for mode in ("allreduce", "pairwise"):
        calls.clear()
        with mock.patch.object(logreg_dp, "secure_sum", watched):
            results, _ = run({**DP, "secure_sum": mode}, data, crash=after_step(3))
        assert not any(isinstance(r, dict) for r in results), results
        assert {a for _, a, *_ in calls if not isinstance(a, str)} == {1}
        assert all(c[2] == 3 for c in calls if c[1] == "delivered"), "a total short of a member's noise was used"
        started = [t for t, a, *_ in calls if not isinstance(a, str)]
        assert max(Counter(started).values()) <= len(data) and len(set(started)) < 12   # once per member, then stop
        assert not any("/e1/" in t for t in started)


def test_the_calibration_covers_every_release_and_the_cost_is_the_proposals():
    sums = logreg_dp.plan(5, 12, 1.0)
    mus = dp.calibrate(sums, 1.0, 1e-8)
    assert len(sums) == 13 and dp.epsilon_of(list(zip(sums, mus)), 1e-8) <= 1.0
    # one release more than paid for (a retried step) would overspend
    assert dp.epsilon_of(list(zip(sums, mus)) + [(sums[1], mus[1])], 1e-8) > 1.0
    assert math.isclose(mus[1] / sums[1].l2 ** 2, mus[0] / sums[0].l2 ** 2)          # equal noise multipliers


def test_fedavg_and_mlp_refuse_dp_with_one_line():
    results, _ = run({**DP, "mode": "fedavg"}, sites())
    assert all("fedavg does not take dp_epsilon" in str(r) for r in results)
    with pytest.raises(Exception, match=r"mlp does not take differential privacy \(dp_epsilon\)") as exc:
        mlp.KIND.check_params({"dp_epsilon": 1.0})
    assert "\n" not in str(exc.value)


def test_dp_logreg_needs_its_own_capability():
    from fedpeer.jobs import capabilities as caps
    from fedpeer.kinds import releases

    asked = logreg.KIND.check_params(DP)
    assert "dp-logreg-1" in caps.lacking(logreg.KIND, asked, releases.BASELINE_CAPABILITIES | {"dp-skellam-1"})
    plain = logreg.KIND.check_params({})
    sent = caps.for_members(logreg.KIND, plain, [releases.BASELINE_CAPABILITIES])
    assert not any(name.startswith("dp_") for name in sent)


def test_a_dp_logreg_result_describes_itself():
    from fedpeer.kinds.linear import text

    r = run({**DP, "test_fraction": 0.2}, sites())[0][0]
    assert r["held_out_here"]["rows"] == 60 and 0.5 < r["auc"] <= 1.0 and "not released" in r["auc_source"]
    shown = "\n".join(text.describe("logreg", r))
    assert "differential privacy: ε" in shown and "not released: class counts" in shown and "f0" in shown
    assert "site-1" in text.site_table([{"name": "site-1", "state": "done", "rows": 300, "result": r}])
    assert set(text.history(r)) == {"grad_max"}


def test_a_multinomial_dp_fit_ends_alike_everywhere_with_a_row_per_class():
    rng = np.random.default_rng(8)
    data = []
    for _ in range(3):
        X = rng.normal(size=(200, 3))
        y = np.argmax(X @ np.array([[2.0, 0, -2], [0, 2, 0], [-2, 0, 2]]).T + rng.gumbel(size=(200, 3)), axis=1)
        data.append(dataset(X, np.array(["a", "b", "c"])[y], positive=None))
    results, _ = run({**DP, "classes": "a,b,c"}, data)
    assert all(isinstance(r, dict) for r in results), results
    assert np.array(results[0]["coef"]).shape == (3, 3) and all(r["coef"] == results[0]["coef"] for r in results)
    X = np.vstack([s.X for s in data])
    labels = np.concatenate([s.labels for s in data])
    got = np.argmax(X @ np.array(results[0]["coef"]).T + results[0]["intercept"], axis=1)
    assert (np.array(["a", "b", "c"])[got] == labels).mean() > 0.6
