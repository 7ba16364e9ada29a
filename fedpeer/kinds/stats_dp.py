"""`stats` with differential privacy (`--param dp_epsilon=E`): the same two secure sums, each member's
contribution clipped and noised before it is masked (fedpeer/protocols/dp.py; docs/algorithms.md).

What a row can change (add or remove one row; the sensitivities, in each sum's integer units):
- every feature value is clipped to [-dp_clip, dp_clip] (a public per-entry bound the proposer
  declares; a job with DP and no dp_clip is refused) and sent as q = round(x·2^f) with
  dp_clip·2^f <= 2^VALUE_BITS, its square likewise on its own scale, and (x - mean)², at most
  (2·dp_clip)², on a third: each of these three groups has L1 sensitivity d·2^VALUE_BITS and L2
  √d·2^VALUE_BITS;
- the counts [rows, positives]: L1 2, L2 √2; the histograms (one bin per column): L1 d, L2 √d.
The five groups are five releases for the accountant; their noise is calibrated jointly
(`dp.calibrate`: equal noise multipliers), so the whole job is (dp_epsilon, dp_delta)-DP for each
site's rows, and δ defaults to 1/dp_rows_max². A DP sum gets one attempt (attempts_max=1): a ring
mode's re-run over fewer members would hand every member a total without the lost member's noise
share, so a member lost inside a sum fails the job (which stays charged in every site's ledger,
fedpeer/jobs/privacy.py).

Checks: the noised totals are bounded by what honest members' clipped rows could give, widened by
the noise's high-probability range (`dp.noise_bound`, tail dp.NOISE_TAIL per sum) and no more:
rows within [2, dp_rows_max], positives within [0, rows], every Σx within ±rows·2^VALUE_BITS, every Σx² and
Σ(x - mean)² within [0, rows·2^VALUE_BITS], every histogram adding up to the rows. The exact
identities of the non-private checks (Cauchy–Schwarz, the centred sum equal to Σx² - (Σx)²/n)
do not hold of noised totals and are not applied.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedpeer.data.rows import rows_of
from fedpeer.errors import JobError
from fedpeer.jobs.capabilities import DP_SKELLAM
from fedpeer.jobs.kind import JobContext, checked_total
from fedpeer.jobs.params import DP_PARAMS
from fedpeer.jobs.privacy import colluders_of, job_cost
from fedpeer.ml.moments import bin_edges, local_histograms
from fedpeer.protocols import dp
from fedpeer.protocols.fixedpoint import fraction_bits
from fedpeer.protocols.securesum.api import secure_sum

VALUE_BITS = 19            # a clipped value's magnitude in quanta: 2^19 (20 bits a value with its sign)
CAPABILITY = DP_SKELLAM
PARAMS = DP_PARAMS


def budget(params: Mapping[str, Any]) -> tuple[float, float]:
    """The job's (ε, δ), the cost every member's ledger charges; (0, 0) without DP."""
    return job_cost(params)


def plan(d: int, bins: int) -> list[dp.DpSum]:
    """The job's five releases (module docstring), in the order of their entries in the two sums."""
    top = float(2 ** VALUE_BITS)
    return [dp.DpSum("counts", 2, math.sqrt(2), 2), dp.DpSum("sums", d * top, math.sqrt(d) * top, d),
            dp.DpSum("squares", d * top, math.sqrt(d) * top, d),
            dp.DpSum("centred", d * top, math.sqrt(d) * top, d),
            dp.DpSum("histograms", d, math.sqrt(d), d * (bins + 2))]


def local_first(X: np.ndarray, y: Any, clip: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    Xc = dp.clip_entries(X, -clip, clip)
    n_pos = int(np.asarray(y).sum()) if y is not None else 0
    sums = dp.summed_quanta(Xc.copy(), clip, VALUE_BITS)
    return np.array([X.shape[0], n_pos], dtype=np.int64), sums, \
        dp.summed_quanta(np.square(Xc, out=Xc), clip * clip, VALUE_BITS)


def local_second(X: np.ndarray, y: Any, clip: float, mean: np.ndarray, edges: np.ndarray) -> tuple:
    Xc = dp.clip_entries(X, -clip, clip)
    hist = local_histograms(Xc, edges).astype(np.int64)
    Xc -= mean
    return dp.summed_quanta(np.square(Xc, out=Xc), 4 * clip * clip, VALUE_BITS), hist


def check_first(total: np.ndarray, d: int, bounds: list[float], rows_max: int) -> tuple[int, int]:
    n, n_pos = int(total[0]), int(total[1])
    top = float(2 ** VALUE_BITS)
    if not 1 - bounds[0] <= n <= rows_max + bounds[0] or n < 2:
        raise ValueError("check 'the rows between 2 and dp_rows_max (within the noise)' failed")
    if not -2 * bounds[0] <= n_pos <= n + 2 * bounds[0]:
        raise ValueError("check 'positives between 0 and the rows (within the noise)' failed")
    rows_hi = n + bounds[0]
    if np.any(np.abs(total[2:2 + d]) > rows_hi * top + bounds[1]):
        raise ValueError("check 'every Σx within the rows times the clip (within the noise)' failed")
    sq = total[2 + d:2 + 2 * d]
    if np.any(sq < -bounds[2]) or np.any(sq > rows_hi * top + bounds[2]):
        raise ValueError("check 'every Σx² within [0, rows times the clip²] (within the noise)' failed")
    return n, n_pos


def check_second(total: np.ndarray, n: int, d: int, bins: int, bounds: list[float]) -> np.ndarray:
    top = float(2 ** VALUE_BITS)
    centred, hist = total[:d], total[d:].reshape(d, bins + 2)
    rows_hi = n + bounds[0]
    if np.any(centred < -bounds[3]) or np.any(centred > rows_hi * top + bounds[3]):
        raise ValueError("check 'every Σ(x - mean)² within [0, rows times (2 clip)²] (within the noise)' failed")
    if np.any(hist < -bounds[4]) or np.any(np.abs(hist.sum(axis=1) - n) > bounds[0] + (bins + 2) * bounds[4]):
        raise ValueError("check 'every histogram holds each row once (within the noise)' failed")
    return hist


async def run_dp(ch: Any, params: Mapping[str, Any], ctx: JobContext, result_of: Callable[..., dict]) -> dict:
    """The stats job with DP; `result_of` (stats' result) plus what the accountant counted."""
    data = ctx.data
    clip = float(params.get("dp_clip", 0.0))
    if clip <= 0:
        raise JobError("stats with dp_epsilon needs dp_clip: the public bound on every feature's |value|")
    eps, delta = budget(params)
    rows, d, bins = rows_of(data), len(data.features), int(params["bins"])
    members = len(ch.members)
    colluders = colluders_of(params, members)
    rng = ctx.noise_rng if ctx.noise_rng is not None else dp.os_rng()
    sums = plan(d, bins)
    mus = await asyncio.to_thread(dp.calibrate, sums, eps, delta)    # a search over dp-accounting's curve: off the loop
    total_mu = dp.spread(members, colluders)      # the total carries μ·n/(n − t)
    bounds = [dp.noise_bound(mu * total_mu, s.entries) for s, mu in zip(sums, mus)]
    mode, hop = params["secure_sum"], ctx.hop_timeout_ms
    f1, f2 = fraction_bits(clip, VALUE_BITS), fraction_bits(clip * clip, VALUE_BITS)
    f3 = fraction_bits(4 * clip * clip, VALUE_BITS)

    ch.progress("moments, noised (secure sum 1 of 2)", 1, 2)
    counts, s1, s2 = await rows.additive(local_first, clip)
    vector = dp.noised_vector([counts, s1, s2], sums[:3], mus[:3], members, rng, colluders)
    first = await secure_sum(ch, "stats/dp-moments", vector, mode=mode, hop_timeout_ms=hop, attempts_max=1)
    _whole(first, ch)
    t1 = dp.signed(first.total)
    n, n_pos = checked_total("stats/dp-moments", check_first, t1, d, bounds,
                             int(params.get("dp_rows_max", 1_000_000)))
    mean = t1[2:2 + d] / 2.0 ** f1 / n
    rough_var = np.maximum(t1[2 + d:] / 2.0 ** f2 / n - mean * mean, 0.0) * n / max(n - 1, 1)
    edges = bin_edges(mean, np.sqrt(rough_var), bins)

    ch.progress("spread and histograms, noised (secure sum 2 of 2)", 2, 2)
    centred, hist = await rows.additive(local_second, clip, mean, edges)
    vector = dp.noised_vector([centred, hist.ravel()], sums[3:], mus[3:], members, rng, colluders)
    second = await secure_sum(ch, "stats/dp-spread", vector, mode=mode, hop_timeout_ms=hop, attempts_max=1)
    _whole(second, ch)
    t2 = dp.signed(second.total)
    counts2 = checked_total("stats/dp-spread", check_second, t2, n, d, bins, bounds)
    std = np.sqrt(np.maximum(t2[:d] / 2.0 ** f3, 0.0) / max(n - 1, 1))
    result = result_of(data, n, min(max(n_pos, 0), n), mean, std, edges, np.maximum(counts2, 0), first.participants,
                     ctx, mode)
    released = list(zip(sums, mus))
    result["privacy"] = {"mechanism": "skellam", "epsilon": dp.epsilon_of(released, delta), "delta": delta,
                         "epsilon_asked": eps, "clip": clip, "colluders": colluders,
                         "noise_variance": dict(zip([s.name for s in sums], mus)),
                         "bits_per_value": VALUE_BITS + 1, "accounting": "RDP (dp-accounting), 5 releases"}
    return result


def _whole(outcome: Any, ch: Any) -> None:
    try:
        dp.whole_total(outcome.participants, ch.members, outcome.total)
    except ValueError as exc:
        raise JobError(str(exc)) from None
