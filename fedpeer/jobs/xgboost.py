"""`xgboost`: federated XGBoost by tree bagging ("tree" / FLeXGBoost "tree+"), run in rounds by
the federation's elected leader (ALGORITHMS.md §2–§3; seeds/002). The arithmetic is in
`fedpeer.ml.boosting`; this module moves its inputs and outputs.

Every member runs the same coroutine:
1. split its rows into a training and a test part (stratified, seeded) and secure-sum the label
   counts of the training parts: every member derives the same global base_score (the
   federation's label prior) and the total row count ("samples" learning-rate normalisation);
2. loop: if its election says it leads term T, it leads (below); otherwise it obeys directives
   only from the member its own election core says leads the directive's term, and refuses
   directives of older terms (fencing: a deposed leader's messages are answered "stale_term" and
   change nothing).

Authority is checked, not assumed (issue 11). A directive of term T from `src` is obeyed only if
this member's election reports (T, src) as (term, leader). A directive of T from another sender
while the election knows T's leader is refused ("not_leader"), counted per sender and logged once;
it changes nothing, and the job goes on under the real leader. A directive of a term the election
has not confirmed yet (T above the election's term, or T's leader unknown) is parked, one per
sender, for at most PARK_MS: an honest new leader's heartbeat normally confirms it within a
heartbeat interval; otherwise it is answered "unconfirmed_leader". Neither refused nor parked
directives raise `seen_term`, so a forged term 2**62 cannot make the honest leader stale.
What a leader sends is checked like what members send: every trees document in a commit passes the
same `boosting.validate_trees` policy the leader applies, a whole model (a sync or a fetch) passes
`boosting.check_model_policy` (every tree within max_depth, node count and leaf_abs_max, at most
the trees the rounds can hold), a commit's model is rebuilt from its trees and its SHA-256 compared,
and commit points are bounded (a commit term above the directive's term, a round above `rounds`,
are refused). Verified by recomputation: the appended model (its bytes and hash, from the trees).
Not verifiable in bagging mode: that each trees document was trained by the participant it is
attributed to on its own rows (only that site holds them; signing trees by their author would
prove authorship, not honesty), and a whole model sent to a lagging member (checked against the
policy, not recomputed: the member lacks the rounds' trees). A member cannot forge these, only
the member its election says leads; a leader elected by real votes is trusted that far.

A leader of term T:
- asks every live member for its commit point (term, round, SHA-256 of the model) and needs
  answers from a majority of the job's members (itself included) before it does anything;
- adopts the most recent commit point, ordered as (term, round) like Raft's logs, fetching that
  model from its holder if it lacks it — so whoever is elected resumes from the last committed
  round;
- runs rounds: "round r" (with the full model only to members not known to hold round r - 1) ->
  each member trains num_local_round trees per class on its own rows on top of it and returns
  only them -> the leader checks every trees document (`boosting.validate_trees`: structure,
  depth, node count, leaf magnitudes, tree count and class order), leaves out members whose
  trees fail or do not come, appends the rest in member order (`boosting.append_round`), stores
  round r and sends "commit r" (the round's trees documents) to every member; each member
  rebuilds the model, checks its SHA-256, stores it and acknowledges;
- after the commit, the round's participants evaluate the model on their test parts with one
  secure sum (log-loss, accuracy, per-class score histograms -> AUC);
- when round `rounds` is committed and a majority stores it, sends "finish" to every live member
  and, once all confirmed, "release". A member told "finish" lingers (LINGER_MS) until released,
  so that if the leader dies half-way, a finished member elected next can still finish the rest.

A member cut off when the job ended (a partition: the leader finished with the majority and
released it) is not left waiting for member_timeout_ms: a member that has had no directive for
SYNC_SILENCE_MS asks the leader its election knows (`SyncAsk`, again every SYNC_SILENCE_MS). A
leader whose job is done answers from what it stored (the registry hands the question to
`serve_done`): "done" with the final model, its commit term and the rounds' history, under the
leader's current term. The member obeys it as any directive (its election must say the sender
leads that term; the model passes `check_model` and its SHA-256), stores it and ends at once. A
leader still running the job ignores the question: its own directives bring the member up to date.

A member stores every committed round (model first, then its commit record; both atomic) under
the job's directory, so any member can lead. Members that fail leave the job; the others go on
(`member_failure_aborts=False`). Messages and every wait are bounded: directives and replies
are size-capped wire messages, replies are awaited in slices that give up when the peer is dead
(failure detector), when the leader is deposed, or after member_timeout_ms.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .. import wire
from ..errors import DataError, JobError
from ..logs import fields as log_fields
from ..metrics import observe_round
from ..ml import boosting
from ..ml import data as mldata
from ..net.channel import PeerDead, PeerUnreachable, RecvTimeout, SubChannel
from ..protocols.securesum import secure_sum
from ..store import atomic_write, write_json
from .base import Finished, JobContext, JobFailsEverywhere, JobKind, Param, site_seed
from .xgbtarget import (base_from_total, class_names, eval_metrics, eval_vector, groups_of,
                        is_regression, label_vector, metric_keys, model_score, site_labels)

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
HELD_DIRECTIVES_MAX = 16         # directives held while a member evaluates (a leader sends one at a time)
LINGER_MS = 20_000               # a member told "finish" stays this long for sites that did not hear it
                                 # (unless the leader says "release": every live member has finished)
MODEL_BYTES_MAX = 48 * 1024 * 1024        # a model sent in one message (the frame cap is 64 MiB)
TREES_BYTES_MAX = 16 * 1024 * 1024        # one member's trees of one round
HISTORY_BYTES_MAX = 8 * 1024 * 1024       # the history entries that travel with a model
HISTORY_ENTRY_BYTES_MAX = 64 * 1024
MEMBERS_MAX = 128

log = logging.getLogger("fedpeer.jobs.xgboost")

PARAMS = {
    "mode": Param(str, "histogram", "histogram (default): exact federated XGBoost, every tree the one xgboost "
                  "hist grows on the pooled rows, from secure sums of gradient histograms (one tree per round and "
                  "class; a site sends up to 24 x features x (max_bin + 1) x "
                  "2^(max_depth - 1) bytes per tree, the sum's initiator about members times that) | bagging: "
                  "each site grows trees on its own rows, the elected leader stacks them (tree / tree+): fewer, "
                  "smaller messages, an approximation of the pooled model",
                  choices=("histogram", "bagging")),
    "rounds": Param(int, 20, "communication rounds", low=1, high=10_000),
    "num_local_round": Param(int, 1, "trees each site trains per round (and class): 1 = tree, >1 = tree+",
                             low=1, high=100),
    "eta": Param(float, 0.3, "learning rate", low=1e-6, high=1.0),
    "normalize": Param(str, "none", "bagging mode's learning rate per site: none (default; every site's trees "
                       "step eta, as Flower's FedXgbBagging) | samples (eta x site rows / all rows: a round's trees "
                       "add up to one step, so R rounds are one R-step model) | gain (eta x the site's share of the "
                       "last round's split gain)",
                       choices=("none", "samples", "gain")),
    "objective": Param(str, "binary:logistic", "binary:logistic, multi:softprob (with classes) or reg:squarederror "
                       "(a numeric label; federated RMSE and MAE instead of AUC)", choices=boosting.MODEL_OBJECTIVES),
    "classes": Param(str, "", "multi:softprob: the label values, comma-separated, in class order"),
    "max_depth": Param(int, 6, "maximum tree depth", low=1, high=16),
    "min_child_weight": Param(float, 1.0, "minimum hessian sum in a child", low=0.0, high=1e9),
    "reg_lambda": Param(float, 1.0, "L2 regularisation of leaf weights (xgboost lambda)", low=0.0, high=1e9),
    "subsample": Param(float, 1.0, "rows sampled per tree (histogram mode: each site draws its own rows from "
                       "the job seed and its key)", low=0.01, high=1.0),
    "colsample_bytree": Param(float, 1.0, "columns sampled per tree (histogram mode: the same columns at every "
                              "site, from the job seed)", low=0.01, high=1.0),
    "max_delta_step": Param(float, 0.0, "clip leaf weights to this (0: off)", low=0.0, high=1e6),
    "grad_abs_max": Param(float, 0.0, "histogram mode: the declared bound on a row's |gradient| (0: the objective's "
                          "own: 1 for classification, 1000 for reg:squarederror, i.e. |prediction - label|); a site "
                          "beyond it ends the job naming the bound; larger bounds cost gradient precision",
                          low=0.0, high=1e12),
    "gamma": Param(float, 0.0, "histogram mode: minimum loss reduction of a split (xgboost gamma)", low=0.0, high=1e9),
    "min_leaf_rows": Param(int, 2, "histogram mode: no split leaves fewer rows than this in a child, federation-wide",
                           low=1, high=2**40),
    "tree_method": Param(str, "hist", "xgboost tree method", choices=("hist", "approx", "exact")),
    "max_bin": Param(int, 256, "histogram bins per feature (hist, approx)", low=2, high=65_536),
    "nthread": Param(int, 0, "xgboost threads per site (0: all cores)", low=0, high=1024),
    "leaf_abs_max": Param(float, 10.0, "bagging mode: the leader refuses trees with a larger |leaf value| (margin "
                          "units, learning rate applied; reg:squarederror: label units)", low=1e-6, high=1e9),
    "test_fraction": Param(float, 0.2, "share of each site's rows kept out of training for the per-round "
                           "evaluation (0: train on every row; the rounds are then evaluated on the training rows)",
                           low=0.0, high=0.9),
    "eval_bins": Param(int, 1000, "score histogram bins of the final model's federated AUC (exact up to ties "
                       "inside a bin); an evaluation secure-sums 2 x bins x classes + 5 numbers per site, ~16 KB at "
                       "1,000 bins (binary), sent once per site and by the sum's initiator once more to every member",
                       low=10, high=100_000),
    "eval_round_bins": Param(int, 100, "bagging mode: score histogram bins of the rounds before the last (at most "
                             "eval_bins). What the default costs (binary): 205 numbers (~1.6 KB) per site and "
                             "round; measured on 5 daemons (breast cancer, 30 rounds) ~19 KB per evaluated round "
                             "over the whole federation against ~148 KB at 1,000 bins: a job's bytes 1.2 MB "
                             "instead of 5.0 MB (evaluation is then about half of them, not 86 in 100). AUC of 100"
                             " bins against the exact AUC, measured: median error <= 0.005, worst 0.056 (the first"
                             " rounds of a set with 3 in 100 rows positive, scores bunched in few bins); the last "
                             "round always uses eval_bins",
                             low=10, high=100_000),
    "eval_every": Param(int, 1, "bagging mode: evaluate the model every this many rounds (the last round always; "
                        "0: the last round only)", low=0, high=10_000),
    "member_timeout_ms": Param(int, 600_000, "the leader waits this long for a site's trees", low=1_000,
                               high=86_400_000),
    "seed": Param(int, 0, "seed of the splits and of xgboost's sampling", low=0, high=2**31 - 1),
    "secure_sum": Param(str, "pairwise", "secure-sum mode", choices=("ring", "pairwise")),
}


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
    trees: bytes             # round: the member's new trees document
    model: bytes             # fetch: the member's committed model
    history: bytes           # fetch: its history entries (JSON)
    error: str               # "" or why not: "stale_term", "need_model", a training error
    WAITING_FOR: ClassVar[str] = "reply"


@dataclass(frozen=True)
class SyncAsk:
    """Member -> the leader its election knows: no directive for SYNC_SILENCE_MS; if the job is
    done at your site, send me its end ("done"). `round` is the member's commit round."""

    tag: str                 # SYNC_TAG
    round: int


def _reply_tag(term: int, op: str, rnd: int) -> str:
    return f"xgb/reply/{term}/{op}/{rnd}"


_SHA = wire.v_str(64)
wire.register("xgb_directive", Directive, {
    "tag": wire.v_str(32), "term": wire.v_int(), "op": wire.v_str(16, frozenset(OPS)), "round": wire.v_int(),
    "prev_sha": _SHA, "sha": _SHA, "gain_share": wire.v_float(-1.0, 1.0),
    "model": wire.v_bytes(max_bytes=MODEL_BYTES_MAX), "commit_term": wire.v_int(),
    "trees": wire.v_list(wire.v_bytes(max_bytes=TREES_BYTES_MAX), MEMBERS_MAX),
    "participants": wire.v_list(wire.NODE_ID, MEMBERS_MAX), "history": wire.v_bytes(max_bytes=HISTORY_BYTES_MAX)})
wire.register("xgb_sync_ask", SyncAsk, {"tag": wire.v_str(32), "round": wire.v_int()})
wire.register("xgb_reply", Reply, {
    "tag": wire.v_str(96), "commit_term": wire.v_int(), "commit_round": wire.v_int(), "commit_sha": _SHA,
    "trees": wire.v_bytes(max_bytes=TREES_BYTES_MAX), "model": wire.v_bytes(max_bytes=MODEL_BYTES_MAX),
    "history": wire.v_bytes(max_bytes=HISTORY_BYTES_MAX), "error": wire.v_str(2048)})


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


@dataclass
class Site:
    ch: Any
    params: Mapping[str, Any]
    ctx: JobContext
    tools: Tools
    fit: Any = None                   # (X, y) training rows
    test: Any = None                  # (X, y) evaluation rows
    groups: int = 1
    base: Any = None
    total_rows: int = 0
    model: bytes | None = None
    commit: tuple[int, int, str] = (0, 0, "")      # (term, round, sha) of `model`
    history: list = field(default_factory=list)
    seen_term: int = 0                # highest leader term heard from (fencing)
    led_term: int = 0
    last_gains: dict = field(default_factory=dict)
    silent_since_ms: int = 0
    asked_ms: int | None = None       # when this member last asked the leader for the job's end (SyncAsk)
    finished_ms: int | None = None    # when this site learned the job is over (it then lingers)
    released: bool = False
    parked: dict = field(default_factory=dict)       # sender -> (parked at ms, Directive): term not confirmed yet
    held: list = field(default_factory=list)         # (sender, Directive) taken while evaluating, followed after
    refused: dict = field(default_factory=dict)      # sender -> {reason: count}: directives refused for authority
    _replies: dict = field(default_factory=dict)     # reply tasks in flight (a dict: ordered, deterministic)

    @property
    def me(self) -> bytes:
        return self.ch.me

    @property
    def round(self) -> int:
        return self.commit[1]

    def name(self, key: bytes) -> str:
        return self.ctx.names.get(key, key.hex()[:16])

    def named(self, entry: dict) -> dict:
        """A history entry with this site's names for the members (entries hold their keys)."""
        def name(h: Any) -> str:
            try:
                return self.name(bytes.fromhex(h))
            except (TypeError, ValueError):
                return str(h)[:64]
        out = dict(entry)
        for key in ("participants", "evaluated_by"):
            if isinstance(out.get(key), list):
                out[key] = [name(h) for h in out[key]]
        if "leader" in out:
            out["leader"] = name(out["leader"])
        if isinstance(out.get("excluded"), dict):
            out["excluded"] = {name(h): why for h, why in out["excluded"].items()}
        return out

    def history_bytes(self) -> bytes:
        return json.dumps(self.history, sort_keys=True, separators=(",", ":")).encode()

    def take_history(self, raw: bytes) -> None:
        """Adopt the history that came with a model: its entries up to our round replace ours (they
        describe the rounds of that model). Entries are checked: JSON objects with an int round,
        bounded in size; anything else is dropped."""
        try:
            doc = json.loads(raw) if raw else []
        except (ValueError, UnicodeDecodeError):
            doc = []
        theirs = {}
        for entry in doc if isinstance(doc, list) else []:
            if (isinstance(entry, dict) and type(entry.get("round")) is int and 1 <= entry["round"] <= self.round
                    and len(json.dumps(entry)) <= HISTORY_ENTRY_BYTES_MAX):
                theirs[entry["round"]] = entry
        mine = {h["round"]: h for h in self.history if (h["round"], h.get("model_sha256")) == self.commit[1:]}
        merged = {**mine, **theirs}
        self.history = [merged[r] for r in sorted(merged)]

    # -- state ---------------------------------------------------------------------------------

    def adopt(self, term: int, rnd: int, model: bytes | None, expect: str | None = None) -> None:
        """Store a committed round: the model file first, then the commit record (both atomic).
        `expect`: the SHA-256 the sender announced for a model that came over the network."""
        sha = boosting.model_sha256(model) if model is not None else ""
        if expect is not None and sha != expect:
            raise JobError(f"received a model whose SHA-256 is not the announced {expect[:12]}")
        if model is not None:
            info = boosting.model_info(model)      # canonical, parseable: never trust a peer's bytes
            if not np.array_equal(np.array(info.base_score), np.atleast_1d(np.array(self.base, dtype=np.float64))):
                raise JobError("a model with another base_score than this federation's")
            if info.num_feature != self.fit[0].shape[1] or info.groups != self.groups:
                raise JobError("a model of another shape than this job's")
            if expect is not None:
                self.check_model(model, rnd)
        self.model, self.commit = model, (term, rnd, sha)
        workdir = self.ctx.workdir
        if workdir is not None:
            if model is not None:
                atomic_write(workdir / f"xgb-round-{rnd}.json", model)
            write_json(workdir / "xgb-commit.json", {"term": term, "round": rnd, "model_sha256": sha,
                                                     "model_file": f"xgb-round-{rnd}.json" if model else None})
            for old in workdir.glob("xgb-round-*.json"):
                if old.name != f"xgb-round-{rnd}.json":
                    old.unlink(missing_ok=True)
        self.ch.progress(f"round {min(rnd + 1, self.params['rounds'])} of {self.params['rounds']}", rnd,
                         self.params["rounds"])

    def build(self, trees: list[bytes]) -> bytes:
        p = self.params
        return boosting.append_round(self.model, trees, self.base, self.fit[0].shape[1],
                                     self.groups if self.groups > 1 else 0, p["objective"])

    def stale(self, term: int) -> bool:
        return term < self.seen_term or term < self.ch.leadership()[0]

    def leading(self, term: int) -> bool:
        return self.ch.leadership() == (term, self.me)

    def authority(self, src: bytes, term: int) -> str:
        """Whether a directive of `term` from `src` is to be obeyed: "obey" (the election says src
        leads term), "stale" (an older term), "not_leader" (the election knows term's leader, and it
        is someone else), "unconfirmed" (the election has not seen term's leader yet)."""
        el_term, el_leader = self.ch.leadership()
        if term < self.seen_term or term < el_term:
            return "stale"
        if term == el_term and el_leader == src:
            return "obey"
        return "not_leader" if term == el_term and el_leader is not None else "unconfirmed"

    def refuse(self, src: bytes, msg: Directive, reason: str) -> None:
        """Count (and log once per sender and reason) a directive refused for lack of authority;
        the sender is told, nothing else changes."""
        counts = self.refused.setdefault(src, {})
        if reason not in counts:
            log.warning("xgb_directive_refused", extra=log_fields(
                job=self.ch.job_id, sender=self.name(src), reason=reason, op=msg.op, term=msg.term,
                election_term=self.ch.leadership()[0]))
        counts[reason] = counts.get(reason, 0) + 1
        self.reply(src, msg, error=reason)

    def park(self, src: bytes, msg: Directive) -> None:
        """Hold a directive of a term this member's election has not confirmed (one per sender:
        a leader has one directive in flight per member, so a newer one replaces the older)."""
        self.parked[src] = (self.ch.now_ms(), msg)

    async def unpark(self) -> None:
        """Follow parked directives whose sender the election now confirms; refuse the others once
        they waited PARK_MS or once the election has moved on."""
        for src, (at_ms, msg) in list(self.parked.items()):
            if self.parked.get(src, (0, None))[1] is not msg:
                continue       # replaced meanwhile
            verdict = self.authority(src, msg.term)
            if verdict == "unconfirmed" and self.ch.now_ms() - at_ms < PARK_MS:
                continue
            del self.parked[src]
            if verdict == "unconfirmed":
                self.refuse(src, msg, "unconfirmed_leader")
            else:
                await self.follow(src, msg)

    # -- replies run in the background so a dead leader never holds a member up ----------------

    def reply(self, leader: bytes, msg: Directive, **kw: Any) -> None:
        term, rnd, sha = self.commit
        out = Reply(tag=_reply_tag(msg.term, msg.op, msg.round), commit_term=term, commit_round=rnd, commit_sha=sha,
                    trees=kw.get("trees", b""), model=kw.get("model", b""), history=kw.get("history", b""),
                    error=kw.get("error", ""))

        async def send() -> None:
            try:
                await self.ch.send(leader, out)
            except JobError:
                pass     # the leader is gone: its successor asks again
        self._background(send())

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._replies[task] = None
        task.add_done_callback(lambda t: self._replies.pop(t, None))

    def ask_for_sync(self, leader: bytes | None) -> None:
        """No directive for SYNC_SILENCE_MS: ask the leader our election knows whether the job
        ended without us (module docstring); again every SYNC_SILENCE_MS."""
        now = self.ch.now_ms()
        if (self.finished_ms is not None or leader is None or leader == self.me or leader not in self.ch.members
                or now - self.silent_since_ms < SYNC_SILENCE_MS
                or self.asked_ms is not None and now - self.asked_ms < SYNC_SILENCE_MS):
            return
        self.asked_ms = now

        async def send() -> None:
            try:
                await self.ch.send(leader, SyncAsk(tag=SYNC_TAG, round=self.round))
            except JobError:
                pass     # unreachable still: the next silence asks again
        self._background(send())

    async def close(self) -> None:
        if self._replies:     # the last acknowledgements; a dead leader's are not worth a long wait
            await asyncio.wait(list(self._replies), timeout=min(self.ctx.hop_timeout_ms, STATE_TIMEOUT_MS) / 1000)
        for task in list(self._replies):
            task.cancel()

    # -- the loop --------------------------------------------------------------------------------

    async def run(self) -> dict:
        self.silent_since_ms = self.ch.now_ms()
        silence_ms = self.params["member_timeout_ms"] + LEADER_SILENCE_MS
        while not self.released:
            if self.lingered():
                break        # lingered long enough: whoever still needed us has had time to ask
            term, leader = self.ch.leadership()
            if leader == self.me and term > self.led_term and not self.stale(term):
                self.led_term = term
                try:
                    await self.lead(term)
                except _Deposed:
                    pass
                self.silent_since_ms = self.ch.now_ms()
                continue
            await self.unpark()
            if self.held:
                await self.follow(*self.held.pop(0))
                continue
            try:
                src, msg = await self.ch.recv(Directive, DIRECTIVE_TAG, timeout_ms=POLL_MS)
            except RecvTimeout:
                if self.finished_ms is None and self.ch.now_ms() - self.silent_since_ms > silence_ms:
                    who = f"leader {self.name(leader)} (term {term})" if leader else "no leader"
                    raise JobError(f"no directive from a leader for {silence_ms // 1000} s ({who})") from None
                self.ask_for_sync(leader)
                continue
            await self.follow(src, msg)
        return self.result()

    async def follow(self, src: bytes, msg: Directive) -> None:
        verdict = self.authority(src, msg.term)
        if verdict == "stale":
            self.reply(src, msg, error="stale_term")
            return
        if verdict == "not_leader":
            self.refuse(src, msg, "not_leader")
            return
        if verdict == "unconfirmed":
            self.park(src, msg)
            return
        self.seen_term = msg.term
        self.silent_since_ms = self.ch.now_ms()
        try:
            self.check_bounds(msg)
            if msg.model and msg.op in ("round", "commit", "finish", "done"):
                rnd = msg.round - 1 if msg.op == "round" else msg.round
                self.adopt(msg.commit_term, rnd, msg.model, expect=msg.prev_sha if msg.op == "round" else msg.sha)
                self.take_history(msg.history)
            if msg.op == "state":
                self.reply(src, msg)
            elif msg.op == "fetch":
                self.reply(src, msg, model=self.model or b"", history=self.history_bytes())
            elif msg.op == "round":
                await self._train(src, msg)
            elif msg.op == "commit":
                await self._apply_commit(src, msg)
            elif msg.op == "finish":
                if self.commit[1:] != (msg.round, msg.sha):
                    self.reply(src, msg, error="need_model")
                    return
                self.reply(src, msg)
                self.finish_now()
            elif msg.op == "release":
                self.reply(src, msg)
                if self.finished_ms is not None:
                    self.released = True
            elif msg.op == "done" and self.commit[1:] == (msg.round, msg.sha):
                self.finish_now()     # the job ended while we were cut off: nobody waits for us
                self.released = True
        except (boosting.TreesError, JobError, DataError, ValueError) as exc:
            self.reply(src, msg, error=f"{type(exc).__name__}: {exc}"[:2000])

    def check_bounds(self, msg: Directive) -> None:
        """What even the real leader cannot mean: a round outside 1..rounds, a model committed in a
        term after the directive's own, "finish" before the last round, a commit whose trees and
        participants do not pair up with distinct job members."""
        rounds = self.params["rounds"]
        if msg.op in ("round", "commit", "finish", "done") and not 1 <= msg.round <= rounds:
            raise JobError(f"{msg.op} of round {msg.round}: the job has rounds 1..{rounds}")
        if msg.model and not 0 <= msg.commit_term <= msg.term:
            raise JobError(f"a model committed in term {msg.commit_term}, sent in term {msg.term}")
        if msg.op in ("finish", "done") and msg.round != rounds:
            raise JobError(f"finish at round {msg.round}, before the last round {rounds}")
        parts = list(msg.participants)
        if len(parts) != len(set(parts)) or not set(parts) <= set(self.ch.members) \
                or (msg.trees and len(msg.trees) != len(parts)):
            raise JobError("a commit whose participants are not distinct job members, one per trees document")

    def check_trees(self, doc: bytes) -> boosting.TreeBatch:
        """One trees document against the job's policy: the same check for every sender."""
        p = self.params
        return boosting.validate_trees(
            doc, num_feature=self.fit[0].shape[1], num_class=self.groups if self.groups > 1 else 0,
            num_local_round=p["num_local_round"], max_depth=p["max_depth"],
            max_nodes=2 ** (p["max_depth"] + 1) - 1, leaf_abs_max=p["leaf_abs_max"], objective=p["objective"])

    def check_model(self, model: bytes, rnd: int) -> None:
        """A whole model from a peer (a sync or a fetch) against the job's policy: the checks every
        member's trees get, and no more trees than `rnd` rounds of every member can hold."""
        p = self.params
        per_doc = p["num_local_round"] * self.groups
        boosting.check_model_policy(model, max_depth=p["max_depth"], max_nodes=2 ** (p["max_depth"] + 1) - 1,
                                    leaf_abs_max=p["leaf_abs_max"], trees_max=rnd * len(self.ch.members) * per_doc,
                                    trees_multiple=per_doc)

    async def _train(self, src: bytes, msg: Directive) -> None:
        if self.commit[1:] != (msg.round - 1, msg.prev_sha):
            self.reply(src, msg, error="need_model")
            return
        trees, error = await self.local_trees(msg.round, msg.gain_share)
        self.reply(src, msg, trees=trees, error=error)

    async def local_trees(self, rnd: int, gain_share: float) -> tuple[bytes, str]:
        """This site's trees of round `rnd` on top of its committed model: (document, "") or (b"", why not)."""
        p = self.params
        self.ch.progress(f"round {rnd} of {p['rounds']}: training", rnd - 1, p["rounds"])
        if p["normalize"] == "gain" and gain_share >= 0:
            eta_i = boosting.normalized_eta(p["eta"], 0, 0, "gain", gain_share, 1.0)
        elif p["normalize"] != "none":
            eta_i = boosting.normalized_eta(p["eta"], len(self.fit[1]), self.total_rows, "samples")
        else:
            eta_i = p["eta"]
        if eta_i <= 0:           # a site whose trees gained nothing last round sits this one out
            return b"", "no_gain"
        params = {**train_params(p), "base_score": self.base if self.groups == 1 else list(self.base)}
        seed = (site_seed(p["seed"], self.me) + rnd) % 2**31
        try:
            return await self.tools.offload(self.tools.train, self.model, self.fit[0], self.fit[1], params,
                                            p["num_local_round"], eta_i, seed), ""
        except (DataError, ValueError) as exc:
            return b"", f"training failed: {type(exc).__name__}: {exc}"[:2000]

    async def _apply_commit(self, src: bytes, msg: Directive) -> None:
        if not msg.model:
            if self.commit[1:] != (msg.round - 1, msg.prev_sha):
                self.reply(src, msg, error="need_model")
                return
            for doc in msg.trees:        # the leader's trees pass the policy a member's pass
                self.check_trees(doc)
            model = await self.tools.offload(self.build, list(msg.trees))
            if boosting.model_sha256(model) != msg.sha:
                self.reply(src, msg, error="need_model")     # cannot happen with honest members
                return
            self.adopt(msg.term, msg.round, model)
        self.reply(src, msg)
        await self.evaluate(msg.term, msg.round, src, msg)

    # -- evaluation ------------------------------------------------------------------------------

    async def evaluate(self, term: int, rnd: int, leader: bytes, commit: Directive) -> None:
        """The round's history entry (first, so that it stays even if the evaluation is cut short);
        then its participants evaluate the model with one secure sum."""
        participants = tuple(commit.participants)
        if not participants:
            return       # a model sent to bring us up to date: its history came with it
        entry = {"round": rnd, "term": term, "leader": leader.hex(), "model_sha256": self.commit[2],
                 "participants": [m.hex() for m in participants],
                 "trees_added": len(participants) * self.params["num_local_round"] * self.groups,
                 "committed_ms": self.ch.now_ms()}      # when this site stored the round (its clock)
        self.history = [h for h in self.history if h["round"] < rnd] + [entry]
        p = self.params
        every = p["eval_every"]
        if rnd != p["rounds"] and (every == 0 or rnd % every):
            return       # not an evaluation round (eval_every)
        if self.me not in participants or len(participants) < 2:
            return
        # The rounds' curve with few bins, the final model's AUC with eval_bins (the same bins at
        # every participant: they follow from the round and the job's parameters)
        p = {**p, "eval_bins": p["eval_bins"] if rnd == p["rounds"] else min(p["eval_round_bins"], p["eval_bins"])}
        entry["eval_bins"] = p["eval_bins"]
        proba = await self.tools.offload(self.tools.predict, self.model, self.test[0], p["nthread"] or None)
        vector = eval_vector(self.test[1], proba, p, len(participants))
        ring = tuple(sorted(participants))
        # The sum's initiator (first member) dying would hold everyone for many hops, and a new
        # leader's term means the round's leader is gone: its successor must not find us busy.
        try:
            out = await self.while_alive(ring[0], secure_sum(
                SubChannel(self.ch, ring), f"xgb/eval/{term}/{rnd}", vector, mode=p["secure_sum"],
                hop_timeout_ms=min(self.ctx.hop_timeout_ms, EVAL_HOP_TIMEOUT_MS)), term=term,
                ended=None if leader == self.me else self.ended_at_leader)
        except (JobError, _Died) as exc:
            entry["eval_error"] = str(exc)[:300]
            return
        entry.update(eval_metrics(out.total, p))
        entry["evaluated_by"] = [m.hex() for m in out.participants]

    async def while_alive(self, peer: bytes, work: Any, term: int | None = None,
                          ended: Callable[[], Any] | None = None) -> Any:
        """Await `work`, but give up (raise _Died) once the failure detector reports `peer` dead
        (a send to a dead peer would retry for a whole hop timeout, a sum led by it for many),
        with `term`, once the election has moved past that term, and with `ended`, once that
        check says the job ended without us."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=POLL_MS / 1000)
                if done:
                    return task.result()
                if peer != self.me and not self.ch.alive(peer):
                    raise _Died(f"{self.name(peer)} is no longer alive")
                if term is not None and self.ch.leadership()[0] > term:
                    raise _Died(f"a new leader was elected (term {self.ch.leadership()[0]})")
                if ended is not None and await ended():
                    raise _Died("the job ended at the leader")
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def ended_at_leader(self) -> bool:
        """While a member evaluates a round, whether the leader has told it the job ended ("done").
        A member cut off (or frozen) around a commit evaluates it once it runs again, with sites
        that may have finished the job meanwhile: they are alive but never send their part, so the
        sum would wait out a member's whole patience (2 (n + 1) + 5 hops, over a minute). So it
        asks the leader too, as in its main loop (`ask_for_sync`, after SYNC_SILENCE_MS without a
        directive), and holds every directive that arrives meanwhile, to follow once the sum is over."""
        self.ask_for_sync(self.ch.leadership()[1])
        while len(self.held) < HELD_DIRECTIVES_MAX:
            try:
                self.held.append(await self.ch.recv(Directive, DIRECTIVE_TAG, timeout_ms=0))
            except RecvTimeout:
                break
        return any(msg.op == "done" and self.authority(src, msg.term) == "obey" for src, msg in self.held)

    # -- leading -------------------------------------------------------------------------------

    async def ask(self, term: int, peer: bytes, directive: Directive, timeout_ms: int,
                  retry_with: bytes | None = None) -> Reply | None:
        """Send a directive and wait for its reply (None: unreachable, dead, timed out). A
        "need_model" answer is retried once with `retry_with` attached."""
        for attempt in (0, 1):
            try:
                await self.while_alive(peer, self.ch.send(peer, directive))
            except (PeerUnreachable, _Died):
                return None
            deadline = self.ch.now_ms() + timeout_ms
            tag = _reply_tag(term, directive.op, directive.round)
            while True:
                if not self.leading(term):
                    raise _Deposed()
                try:
                    _, reply = await self.ch.recv(Reply, tag, src=peer, timeout_ms=POLL_MS)
                    break
                except PeerDead:     # membership declared it dead: its reply will not come
                    return None
                except RecvTimeout:
                    if not self.ch.alive(peer) or self.ch.now_ms() > deadline:
                        return None
            if reply.error == "need_model" and attempt == 0 and retry_with is not None:
                directive = _with_model(directive, retry_with, self.commit[0], self.history_bytes())
                continue
            return reply
        return reply

    async def lead(self, term: int) -> None:
        """Lead term `term` to the end of the job. A round counts as committed only once a majority
        of the job's members (me included) store it; without one, start over from take_over."""
        self.seen_term = term
        while True:
            known = await self.take_over(term)
            try:
                while self.round < self.params["rounds"]:
                    started_ms = self.ch.now_ms()
                    known = self.majority(await self.lead_round(term, known), f"round {self.round}")
                    observe_round(self.ch, "xgboost", started_ms)   # committed: stored by a majority
                await self.finish(term, known)
                return
            except _NoMajority:
                await self.ch.sleep_ms(POLL_MS)

    def majority(self, known: dict[bytes, tuple[int, str]], what: str) -> dict[bytes, tuple[int, str]]:
        holders = 1 + sum(point == self.commit[1:] for point in known.values())
        if holders <= len(self.ch.members) // 2:
            raise _NoMajority(what)
        return known

    async def take_over(self, term: int) -> dict[bytes, tuple[int, str]]:
        """Learn the members' commit points (a majority of the job's members must answer) and adopt
        the most recent one, ordered (term, round). Returns what each member holds."""
        ch = self.ch
        deadline = ch.now_ms() + self.params["member_timeout_ms"] + LEADER_SILENCE_MS
        while True:
            if not self.leading(term) or self.lingered():
                raise _Deposed()     # (a finished member whose linger is over just ends)
            if ch.now_ms() > deadline:
                raise JobError(f"as leader of term {term}: fewer than a majority of the job's members answered")
            live = [m for m in ch.members if m != self.me and ch.alive(m)]
            replies = await _all(*(self.ask(term, m, _directive(term, "state"), STATE_TIMEOUT_MS) for m in live))
            # A commit point from a term after this one, or beyond the job's rounds, is a lie: unheard.
            points = {m: r for m, r in zip(live, replies) if r is not None and not r.error
                      and 0 <= r.commit_term <= term and 0 <= r.commit_round <= self.params["rounds"]}
            if 1 + len(points) <= len(ch.members) // 2:
                await self.ch.sleep_ms(POLL_MS)
                continue
            holder, best = max(points.items(), key=lambda kv: (kv[1].commit_term, kv[1].commit_round))
            if (best.commit_term, best.commit_round) > self.commit[:2]:
                got = await self.ask(term, holder, _directive(term, "fetch"), self.params["member_timeout_ms"])
                try:
                    if got is None or got.error:
                        raise JobError("the holder went away")
                    self.adopt(best.commit_term, best.commit_round, got.model, expect=best.commit_sha)
                except (JobError, ValueError):
                    await self.ch.sleep_ms(POLL_MS)
                    continue     # ask everyone again
                self.take_history(got.history)
            return {m: (r.commit_round, r.commit_sha) for m, r in points.items()}

    def gain_share(self, member: bytes) -> float:
        """`member`'s share of the last round's split gain ("gain" normalisation); -1: unknown."""
        total = sum(self.last_gains.values())
        if total <= 0 or member not in self.last_gains:
            return -1.0
        return min(max(self.last_gains[member] / total, 0.0), 1.0)

    async def lead_round(self, term: int, known: dict[bytes, tuple[int, str]]) -> dict[bytes, tuple[int, str]]:
        ch, p = self.ch, self.params
        rnd, (_, _, prev_sha) = self.round + 1, self.commit
        targets = [m for m in ch.members if m != self.me and ch.alive(m)]
        asks = []
        for m in targets:
            d = _directive(term, "round", rnd, prev_sha=prev_sha, gain_share=self.gain_share(m))
            if known.get(m) != (self.round, prev_sha) and self.model is not None:
                d = _with_model(d, self.model, self.commit[0], self.history_bytes())
            asks.append(self.ask(term, m, d, p["member_timeout_ms"], retry_with=self.model))
        *replies, own = await _all(*asks, self.local_trees(rnd, self.gain_share(self.me)))
        own_reply = Reply(tag="", commit_term=0, commit_round=0, commit_sha="", trees=own[0], model=b"",
                          history=b"", error=own[1])
        answered = {m: r for m, r in zip(targets, replies) if r is not None}
        docs, gains, excluded = {}, {}, {}
        for m in ch.members:
            reply = own_reply if m == self.me else answered.get(m)
            if reply is None:
                if m != self.me and m in targets:
                    excluded[m.hex()] = "no answer"
                continue
            if reply.error:
                excluded[m.hex()] = reply.error[:200]
                continue
            try:
                batch = self.check_trees(reply.trees)
            except boosting.TreesError as exc:
                excluded[m.hex()] = f"trees refused: {exc}"[:200]
                continue
            docs[m], gains[m] = reply.trees, batch.gain
        if not docs:     # nobody can train (bad parameters, data every site refuses): stop everyone
            reasons = "; ".join(f"{self.name(bytes.fromhex(k))}: {why}" for k, why in excluded.items())
            raise JobFailsEverywhere(f"round {rnd}: no site delivered valid trees ({reasons})")
        if not self.leading(term):
            raise _Deposed()
        order = [m for m in ch.members if m in docs]
        model = await self.tools.offload(self.build, [docs[m] for m in order])
        self.adopt(term, rnd, model)
        self.last_gains = gains
        sha = self.commit[2]
        commit = _directive(term, "commit", rnd, prev_sha=prev_sha, sha=sha, trees=[docs[m] for m in order],
                            participants=order)
        *acks, _ = await _all(*(self.ask(term, m, commit, p["member_timeout_ms"], retry_with=model)
                                for m in answered), self.evaluate(term, rnd, self.me, commit))
        if excluded:
            self.history[-1]["excluded"] = excluded
        return {m: (r.commit_round, r.commit_sha) for m, r in zip(answered, acks)
                if r is not None and not r.error}

    def lingered(self) -> bool:
        return self.finished_ms is not None and self.ch.now_ms() - self.finished_ms > LINGER_MS

    def finish_now(self) -> None:
        if self.finished_ms is None:
            self.finished_ms = self.ch.now_ms()
            self.ch.progress(f"finished; waiting up to {LINGER_MS // 1000} s for sites that may not have heard it",
                             self.round, self.params["rounds"])

    async def finish(self, term: int, known: dict[bytes, tuple[int, str]]) -> None:
        """Bring every live member to the last round (the whole model to those lagging), make sure a
        majority holds it, tell every live member "finish", and once they all confirmed, "release".

        Members told "finish" linger (LINGER_MS) until released: if this leader dies half-way
        through, one of them may be elected next, and it must still be there to finish the rest."""
        ch, (commit_term, rnd, sha) = self.ch, self.commit
        live = [m for m in ch.members if m != self.me and ch.alive(m)]
        sync = _with_model(_directive(term, "commit", rnd, sha=sha), self.model or b"", commit_term,
                           self.history_bytes())
        lagging = [m for m in live if known.get(m) != (rnd, sha)]
        for m, r in zip(lagging, await _all(*(self.ask(term, m, sync, STATE_TIMEOUT_MS) for m in lagging))):
            if r is not None and not r.error:
                known[m] = (r.commit_round, r.commit_sha)
        self.majority(known, "the last round")    # so whoever leads next finishes with this very model
        self.finish_now()
        told: set[bytes] = set()
        while True:
            pending = [m for m in ch.members if m != self.me and m not in told and ch.alive(m)]
            if not pending or self.lingered():
                break
            answers = await _all(*(self.ask(term, m, _directive(term, "finish", rnd, sha=sha), STATE_TIMEOUT_MS,
                                            retry_with=self.model) for m in pending))
            told |= {m for m, r in zip(pending, answers) if r is not None and not r.error}
            if not told.issuperset(pending):
                await self.ch.sleep_ms(POLL_MS)
        await _all(*(self.ask(term, m, _directive(term, "release", rnd, sha=sha), STATE_TIMEOUT_MS)
                     for m in sorted(told)))
        self.released = True

    # -- result ----------------------------------------------------------------------------------

    def result(self) -> dict:
        p = self.params
        if self.ctx.workdir is not None:    # what serve_done hands a member that missed the end
            atomic_write(self.ctx.workdir / HISTORY_FILE, self.history_bytes())
        out: dict[str, Any] = {
            "rounds": self.round, "model_sha256": self.commit[2], "history": [self.named(h) for h in self.history],
            "trees": boosting.model_info(self.model).n_trees if self.model else 0,
            "base_score": self.base if self.groups == 1 else list(self.base),
            "features": list(self.ctx.data.features), "objective": p["objective"], "classes": class_names(p),
            "rows": {"train": int(len(self.fit[1])), "test": int(len(self.test[1])) if p["test_fraction"] else 0},
            # directives this site refused because their sender did not lead their term (issue 11)
            "directives_refused": {self.name(k): dict(v) for k, v in self.refused.items()},
        }
        keys = metric_keys(p)
        last = next((h for h in reversed(self.history) if h.get(keys[0]) is not None), None)
        on = "the sites' test parts" if p["test_fraction"] else "the sites' training rows"
        score_result(out, p, {k: last[k] for k in keys} if last else None, on)
        if self.ctx.test_data is not None and self.model is not None:
            X, y = self.ctx.test_data.X, site_labels(self.ctx.test_data, p)
            score_result(out, p, None, on, model_score(self.model, X, y, p, p["nthread"] or None))
        out["_model"] = self.model
        return out


def score_result(out: dict, params: Mapping[str, Any], federated: dict | None, on: str,
                 test_csv: dict | None = None) -> None:
    """A result's scores (both modes): `federated_eval` (the secure-summed metrics on `on`) and
    `test_csv` (the model on [data] test_csv); `auc` (classification) or `rmse` and `mae`
    (regression) lead with the test_csv figure when there is one, `auc_source` says which."""
    lead = ("rmse", "mae") if is_regression(params) else ("auc",)
    if test_csv is None:
        out["federated_eval"] = {**federated, "rows": on} if federated else None
        for k in lead:
            out[k] = federated[k] if federated else None
        out["auc_source"] = f"federated, on {on}" if federated else None
        if is_regression(params):
            out["auc"] = None
        return
    out["test_csv"] = test_csv
    for k in lead:
        out[k] = test_csv[k]
    out["auc_source"] = "[data] test_csv"


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


# ---------------------------------------------------------------------------------------------
# The job
# ---------------------------------------------------------------------------------------------

def prepare(site: Site) -> None:
    """Split this site's rows (stratified, seeded by the job seed and the site's key)."""
    p, data = site.params, site.ctx.data
    y = site_labels(data, p)
    labelled = mldata.Dataset(data.features, data.X, y, data.labels, data.rows_dropped, data.fingerprint)
    if p["test_fraction"] > 0:
        train, test = mldata.split_train_test(labelled, p["test_fraction"], seed=site_seed(p["seed"], site.me),
                                              stratify=not is_regression(p))
    else:
        train = test = labelled
    site.fit, site.test = (train.X, train.y), (test.X, test.y)
    site.groups = groups_of(p)


async def run_job(ch: Any, params: Mapping[str, Any], ctx: JobContext, tools: Tools | None = None) -> dict:
    if params.get("mode") == "histogram":
        from .xgbhist import run_hist
        return await run_hist(ch, params, ctx, offload=tools.offload if tools is not None else None)
    site = Site(ch=ch, params=params, ctx=ctx, tools=tools or Tools())
    prepare(site)
    ch.progress("secure sum of label counts", 0, params["rounds"])
    out = await secure_sum(ch, "xgb/labels", label_vector(site.fit[1], params, len(ch.members)),
                           mode=params["secure_sum"], hop_timeout_ms=ctx.hop_timeout_ms)
    if ch.me not in out.participants:
        raise JobError("this site was left out of the label-count sum")
    site.base, site.total_rows = base_from_total(out.total, params)
    site.adopt(0, 0, None)
    try:
        return await site.run()
    finally:
        await site.close()


def serve_done(finished: Finished, src: bytes, msg: Any) -> Directive | None:
    """This site's job is done and a member asks where the job is (SyncAsk, module docstring):
    if this site leads now, the job's end ("done") with the final model and history, read from
    what it stored, under its current term; else None (the member asks the leader it knows)."""
    term, leader = finished.leadership
    if not isinstance(msg, SyncAsk) or leader != finished.me or term <= 0:
        return None
    with open(finished.workdir / "xgb-commit.json", "rb") as f:
        commit = json.loads(f.read(64 * 1024))
    model_file = commit.get("model_file")
    if not model_file or not isinstance(commit.get("round"), int) or not isinstance(commit.get("term"), int):
        return None
    with open(finished.workdir / str(model_file), "rb") as f:
        model = f.read(MODEL_BYTES_MAX + 1)
    if len(model) > MODEL_BYTES_MAX or boosting.model_sha256(model) != commit.get("model_sha256"):
        return None      # changed since it was stored: offer nothing rather than something else
    try:
        with open(finished.workdir / HISTORY_FILE, "rb") as f:
            history = f.read(HISTORY_BYTES_MAX + 1)
    except FileNotFoundError:
        history = b""
    history = history if len(history) <= HISTORY_BYTES_MAX else b""
    return _directive(term, "done", commit["round"], sha=commit["model_sha256"], model=model,
                      commit_term=commit["term"], history=history)


def save_model(path: Any, model: bytes) -> None:
    """The global model: a normal XGBoost JSON model file (`xgboost.Booster().load_model(path)`)."""
    atomic_write(path, model)


def load_model(path: Any, expect_sha256: str) -> bytes:
    """A stored model, refused unless its bytes hash to `expect_sha256` (the SHA-256 the job or
    commit record holds): a file modified or corrupted after it was stored is never used, even
    when it is still a well-formed model (issue 10). JobError in one line naming the file."""
    try:
        with open(path, "rb") as f:
            model = f.read(boosting.MODEL_BYTES_MAX + 1)
    except OSError as exc:
        raise JobError(f"{path}: cannot read the stored model: {exc.strerror or exc}") from None
    sha = boosting.model_sha256(model)
    if sha != expect_sha256:
        raise JobError(f"{path}: the model file was modified or corrupted after it was stored (SHA-256 "
                       f"{sha[:16]}..., the job record says {str(expect_sha256)[:16]}...); "
                       "restore it from a backup or run the job again")
    boosting.model_info(model)      # canonical and well-formed, or TreesError
    return model


def predict(model: bytes, X: np.ndarray, nthread: int | None = None) -> np.ndarray:
    return boosting.predict_proba(model, X, nthread=nthread)


KIND = JobKind(name="xgboost", help="federated XGBoost: tree bagging / tree+ in rounds run by the elected leader "
               "(--mode bagging), or exact histogram mode over secure sums (--mode histogram)",
               params=PARAMS, run=functools.partial(run_job, tools=None), needs_data=True, binary_label=False,
               save_model=save_model, model_file="model.json", member_failure_aborts=False,
               serve_done=serve_done, serve_done_kinds=(SyncAsk,),
               limited={"rounds_max": "rounds", "trees_per_round_max": "num_local_round", "depth_max": "max_depth",
                        "bins_max": "max_bin"})
