"""BOPPID baseline (thesis §2.3.1.3, Alg. 4), run side by side with BOFRF (`--baseline boppid`).

Each site boosts decision stumps on its own training rows (local AdaBoost), sends its model and
row count to every other member (as the thesis does: models and counts are shared, rows are not),
scores every received model on its own rows, keeps those whose error is close to its own model's
(|ε_p − ε_p^q| <= τ), weights them by row counts (λ, σ) and reports its own integrated model on its
test part. The arithmetic is in `fedpeer.ml.forest.boppid` (boppid_*; its local AdaBoost in
`fedpeer.ml.forest.stumps`); this module only moves models.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeer.errors import JobError
from fedpeer.runtime.channel import MalformedFrom
from fedpeer.wire import frame as wire

MODEL_RECV_TIMEOUT_HOPS = 4
STUMPS_MAX = 10_000


@dataclass(frozen=True)
class StumpsMsg:
    tag: str
    feature: np.ndarray       # int64
    threshold: np.ndarray     # float64
    polarity: np.ndarray      # int64, -1 or +1
    alpha: np.ndarray         # float64
    rows: int                 # the sender's training rows (the thesis' n^p)
    WAITING_FOR: ClassVar[str] = "BOPPID model"


# registered by the job catalogue as one of bofrf's messages (fedpeer/kinds/catalog.py)
MESSAGE = wire.declare("boppid_model", StumpsMsg, {
    "tag": wire.v_str(256), "feature": wire.v_array(STUMPS_MAX, frozenset({"<i8"})),
    "threshold": wire.v_array(STUMPS_MAX, frozenset({"<f8"})), "polarity": wire.v_array(STUMPS_MAX, frozenset({"<i8"})),
    "alpha": wire.v_array(STUMPS_MAX, frozenset({"<f8"})), "rows": wire.v_int(1, 2**40)},
    to_body=lambda m: {"tag": m.tag, "rows": m.rows, **{k: wire.encode_array(np.asarray(getattr(m, k), dtype=dt))
                       for k, dt in (("feature", "<i8"), ("threshold", "<f8"), ("polarity", "<i8"), ("alpha", "<f8"))}})


async def run_boppid(ch: Any, part: Any, params: Mapping[str, Any], ctx: Any) -> dict:
    from fedpeer.ml.forest import bofrf as mb

    X, y = part.fit.X, part.fit.y
    own = await asyncio.to_thread(mb.boppid_local, X, y, params["boppid_rounds"], seed=params["seed"])
    models, refused = await _exchange(ch, own, int(len(y)), X.shape[1], ctx)
    members = [m for m in ch.members if m in models]
    stumps = [models[m][0] for m in members]
    me = members.index(ch.me)
    errors = mb.boppid_errors(stumps, X, y)
    selected = mb.boppid_select(errors, me)
    coefficients = mb.boppid_coefficients([models[m][1] for m in members], selected, me)
    combined = mb.boppid_combine(stumps, coefficients)
    metrics = mb.binary_metrics(part.test.y, mb.boppid_score(combined, part.test.X))
    return {**metrics, "models_selected": [ctx.names.get(m, m.hex()[:16]) for m, s in zip(members, selected) if s],
            "models_refused": refused}


async def _exchange(ch: Any, own: Any, rows: int, features: int,
                    ctx: Any) -> tuple[dict[bytes, tuple[Any, int]], dict[str, str]]:
    """Send our model to every member, collect theirs. A model that is refused (by our gate, or
    here: stumps on features this site does not have, polarity not ±1, non-finite values) is
    left out of this site's BOPPID and named in `refused` {member: why}; it ends no one's job."""
    msg = StumpsMsg(tag="boppid/model", feature=own.feature, threshold=own.threshold,
                    polarity=own.polarity.astype(np.int64), alpha=own.alpha, rows=rows)
    others = [m for m in ch.members if m != ch.me]
    refused: dict[str, str] = {}

    async def send(peer: bytes) -> None:
        try:
            await ch.send(peer, msg)
        except JobError:
            pass      # that member is then missing from every site's BOPPID

    async def receive(peer: bytes) -> tuple[bytes, Any] | None:
        try:
            _, got = await ch.recv(StumpsMsg, "boppid/model", src=peer,
                                   timeout_ms=MODEL_RECV_TIMEOUT_HOPS * ctx.hop_timeout_ms)
            return peer, (_stumps(got, features), got.rows)
        except MalformedFrom as exc:
            refused[ctx.names.get(peer, peer.hex()[:16])] = exc.reason
        except ValueError as exc:
            refused[ctx.names.get(peer, peer.hex()[:16])] = str(exc)
        except JobError:
            pass      # unreachable or silent: left out like a refused one, but no evidence
        return None
    results = await asyncio.gather(*(send(p) for p in others), *(receive(p) for p in others))
    models = {ch.me: (own, rows)}
    models.update(dict(r for r in results if r is not None))
    return models, refused


def _stumps(got: StumpsMsg, features: int) -> Any:
    """The received arrays as Stumps over this site's `features` columns; ValueError if unusable."""
    from fedpeer.ml.forest.bofrf import Stumps

    if got.polarity.size and not np.isin(got.polarity, (-1, 1)).all():   # before the int8 cast wraps them
        raise ValueError("stump polarity must be -1 or +1")
    stumps = Stumps(got.feature, got.threshold, got.polarity.astype(np.int8), got.alpha)
    if stumps.size and int(stumps.feature.max()) >= features:
        raise ValueError(f"stumps on feature {int(stumps.feature.max())}, this site has {features} features")
    return stumps
