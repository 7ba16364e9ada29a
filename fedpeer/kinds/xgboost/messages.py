"""The bagging `xgboost` job's messages, limits and small helpers (the protocol: `xgbsite.py`,
its leader's side: `xgblead.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fedpeer.kinds.xgboost.target import class_names
from fedpeer.ml.xgb import boosting
from fedpeer.wire import frame as wire

PARK_MS = 5_000                  # a directive of a term not yet confirmed by the election waits this long
POLL_MS = 200                    # a member re-checks its election's view this often while waiting
STATE_TIMEOUT_MS = 5_000         # a leader waits this long for a member's commit point
EVAL_HOP_TIMEOUT_MS = 5_000      # hop timeout of the per-round evaluation sum (small vectors)
LEADER_SILENCE_MS = 60_000       # beyond member_timeout_ms: a member without any leader this long fails
DIRECTIVE_TAG = "xgb/leader"
OPS = ("state", "fetch", "round", "commit", "finish", "release", "done")   # done: the job ended, adopt and stop
SYNC_SILENCE_MS = 10_000         # a member without a directive this long asks the leader where the job is
SYNC_TAG = "xgb/sync"
HISTORY_FILE = "xgb-history.json"
STORE_EVERY_MS = 1_000           # a member's files hold its committed model at most this old (and the last round)
HELD_DIRECTIVES_MAX = 16         # directives held while a member evaluates (a leader sends one at a time)
LINGER_MS = 20_000               # a member told "finish" stays this long for sites that did not hear it
                                 # (unless the leader says "release": every live member has finished)
MODEL_BYTES_MAX = 48 * 1024 * 1024        # a model sent in one message (the frame cap is 64 MiB)
TREES_BYTES_MAX = 16 * 1024 * 1024        # one member's trees of one round
HISTORY_BYTES_MAX = 8 * 1024 * 1024       # the history entries that travel with a model
HISTORY_ENTRY_BYTES_MAX = 64 * 1024
MEMBERS_MAX = 128


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Directive:
    """Leader -> member. Every directive carries the leader's term (fencing)."""

    tag: str                 # DIRECTIVE_TAG
    term: int
    op: str                  # OPS
    round: int               # round/commit/finish: the round it is about
    prev_sha: str            # round/commit: the model the round builds on ("" before round 1)
    sha: str                 # commit/finish: the resulting model
    gain_share: float        # round, normalize=gain: this member's share of the last round's gain; -1: none
    model: bytes             # the whole model (at prev_sha for round, at sha for commit/finish) when the
                             # member is not known to hold what it needs; else empty
    commit_term: int         # with model: the term that committed it
    trees: list              # commit: the round's trees documents, in member order
    participants: list       # commit: members whose trees are in the round (they evaluate it)
    history: bytes           # with model: the rounds' history entries (JSON), see Site.history
    WAITING_FOR: ClassVar[str] = "leader's directive"


@dataclass(frozen=True)
class Reply:
    """Member -> leader, tagged with the directive's term, op and round."""

    tag: str
    commit_term: int         # the member's commit point after handling the directive
    commit_round: int
    commit_sha: str
    trees: bytes             # round: the member's new trees document; commit: its trees of the next round
                             # on the committed model, if its head start has them (training.py)
    model: bytes             # fetch: the member's committed model
    history: bytes           # fetch: its history entries (JSON)
    error: str               # "" or why not: "stale_term", "need_model", a training error
    WAITING_FOR: ClassVar[str] = "member's reply"


@dataclass(frozen=True)
class SyncAsk:
    """Member -> the leader its election knows: no directive for SYNC_SILENCE_MS; if the job is
    done at your site, send me its end ("done"). `round` is the member's commit round."""

    tag: str                 # SYNC_TAG
    round: int
    WAITING_FOR: ClassVar[str] = "a member's request for the job's end"


def _reply_tag(term: int, op: str, rnd: int) -> str:
    return f"xgb/reply/{term}/{op}/{rnd}"


_SHA = wire.v_str(64)
# registered by the job catalogue (fedpeer/kinds/catalog.py)
MESSAGES = (wire.declare("xgb_directive", Directive, {
    "tag": wire.v_str(32), "term": wire.v_int(), "op": wire.v_str(16, frozenset(OPS)), "round": wire.v_int(),
    "prev_sha": _SHA, "sha": _SHA, "gain_share": wire.v_float(-1.0, 1.0),
    "model": wire.v_bytes(max_bytes=MODEL_BYTES_MAX), "commit_term": wire.v_int(),
    "trees": wire.v_list(wire.v_bytes(max_bytes=TREES_BYTES_MAX), MEMBERS_MAX),
    "participants": wire.v_list(wire.NODE_ID, MEMBERS_MAX), "history": wire.v_bytes(max_bytes=HISTORY_BYTES_MAX)}),
    wire.declare("xgb_sync_ask", SyncAsk, {"tag": wire.v_str(32), "round": wire.v_int()}),
    wire.declare("xgb_reply", Reply, {
        "tag": wire.v_str(96), "commit_term": wire.v_int(), "commit_round": wire.v_int(), "commit_sha": _SHA,
        "trees": wire.v_bytes(max_bytes=TREES_BYTES_MAX), "model": wire.v_bytes(max_bytes=MODEL_BYTES_MAX),
        "history": wire.v_bytes(max_bytes=HISTORY_BYTES_MAX), "error": wire.v_str(2048)}))


def _directive(term: int, op: str, rnd: int = 0, **kw: Any) -> Directive:
    base = dict(tag=DIRECTIVE_TAG, term=term, op=op, round=rnd, prev_sha="", sha="", gain_share=-1.0,
                model=b"", commit_term=0, trees=[], participants=[], history=b"")
    return Directive(**{**base, **kw})


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------

def train_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """xgboost parameters of the job (eta and seed are set per site and round)."""
    out = {"objective": params["objective"], "max_depth": params["max_depth"],
           "min_child_weight": params["min_child_weight"], "lambda": params["reg_lambda"],
           "subsample": params["subsample"], "colsample_bytree": params["colsample_bytree"],
           "max_delta_step": params["max_delta_step"], "tree_method": params["tree_method"],
           "max_bin": params["max_bin"]}
    if params["objective"] == "multi:softprob":
        out["num_class"] = len(class_names(params))
    if params["nthread"]:
        out["nthread"] = params["nthread"]
    return out


# ---------------------------------------------------------------------------------------------
# A member's state and the protocol
# ---------------------------------------------------------------------------------------------

class _Deposed(Exception):
    """This member no longer leads the term it was leading."""


class _Died(Exception):
    """The peer a wait depended on was reported dead by the failure detector."""


class _NoMajority(Exception):
    """Fewer than a majority of the job's members hold the leader's last round."""


@dataclass
class Tools:
    """What the protocol calls for the heavy lifting; simulations substitute cheap versions."""

    train: Callable[..., bytes] = boosting.train_local_round
    predict: Callable[..., np.ndarray] = boosting.predict_proba
    offload: Callable[..., Any] = asyncio.to_thread


async def _all(*aws: Any) -> list[Any]:
    """Await all; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(a) for a in aws]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


def _with_model(d: Directive, model: bytes, commit_term: int, history: bytes = b"") -> Directive:
    return Directive(**{**d.__dict__, "model": model, "commit_term": commit_term, "history": history})

