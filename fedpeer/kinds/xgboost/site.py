"""`xgboost`: federated XGBoost by tree bagging ("tree" / FLeXGBoost "tree+"), run in rounds by
the federation's elected leader (docs/algorithms.md; the FLeXGBoost tree+ paper). The arithmetic is in
`fedpeer.ml.xgb.boosting`; this module moves its inputs and outputs.

Every member runs the same coroutine:
1. split its rows into a training and a test part (stratified, seeded) and secure-sum the label
   counts of the training parts: every member derives the same global base_score (the
   federation's label prior) and the total row count ("samples" learning-rate normalisation);
2. loop: if its election says it leads term T, it leads (below); otherwise it obeys directives
   only from the member its own election core says leads the directive's term, and refuses
   directives of older terms (fencing: a deposed leader's messages are answered "stale_term" and
   change nothing).

Authority is checked, not assumed. A directive of term T from `src` is obeyed only if
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
  each member trains num_local_round trees per class on its own rows on top of it and returns only
  them (a member that acknowledged the commit of round r - 1 with its trees of round r on that
  model is not asked again: training.py) -> the leader checks every trees document
  (`boosting.validate_trees`: structure, depth, node count, leaf magnitudes, tree count and class
  order), leaves out members whose trees fail or do not come, appends the rest in member order
  (`boosting.append_round`), stores round r and sends "commit r" (the round's trees documents) to
  every member; each member rebuilds the model, checks its SHA-256, holds it and acknowledges (its
  files: below);
- after the commit, the round's participants evaluate the model on their test parts with one
  secure sum (log-loss, accuracy, per-class score histograms -> AUC); a total no honest
  participants can give (target.py `check_eval`) ends the job everywhere naming no site, as does
  such a label-count total at the start (`check_labels`);
- when round `rounds` is committed and a majority holds it, sends "finish" to every live member
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

A member keeps every committed round in memory (a new leader fetches it from there) and stores
it under the job's directory (model, then commit record; both atomic): rounds 0 and 1, then at
most every STORE_EVERY_MS, and the last, fsynced, which `serve_done` reads once the job is done
(a member whose last round or history cannot be written fails its part of the job).
Nothing reads the others after a crash: a daemon restarted mid-job marks the job failed.
Members that fail leave the job; the others go on (`member_failure_aborts=False`). Messages and
every wait are bounded: directives and replies are size-capped wire messages, replies are awaited
in slices that give up when the peer is dead (failure detector), when the leader is deposed, or
after member_timeout_ms. A member may start a round's trees before the directive (training.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedpeer.base.logs import fields as log_fields
from fedpeer.base.store import atomic_write, write_json
from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import ImplausibleTotal, JobContext
from fedpeer.kinds.xgboost.evaluation import Evaluating
from fedpeer.kinds.xgboost.fencing import Fence
from fedpeer.kinds.xgboost.lead import Leading
from fedpeer.kinds.xgboost.messages import (
    DIRECTIVE_TAG,
    HISTORY_ENTRY_BYTES_MAX,
    HISTORY_FILE,
    LEADER_SILENCE_MS,
    PARK_MS,
    POLL_MS,
    STATE_TIMEOUT_MS,
    STORE_EVERY_MS,
    SYNC_SILENCE_MS,
    SYNC_TAG,
    Directive,
    Reply,
    SyncAsk,
    Tools,
    _Deposed,
    _reply_tag,
)
from fedpeer.kinds.xgboost.target import (
    class_names,
    is_regression,
    metric_keys,
    test_csv_score,
)
from fedpeer.kinds.xgboost.training import Training
from fedpeer.ml.xgb import boosting
from fedpeer.ml.xgb.margins import RoundCache
from fedpeer.runtime.channel import RecvTimeout

log = logging.getLogger("fedpeer.jobs.xgboost")
BUILD_OFF_LOOP_BYTES_MIN = 2 << 20     # a model this large is extended in a worker thread (a few ms of work)


@dataclass
class Site(Leading, Training, Evaluating):
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
    fence: Fence = field(default_factory=lambda: Fence(PARK_MS))   # whose directives are obeyed
    led_term: int = 0
    last_gains: dict = field(default_factory=dict)
    silent_since_ms: int = 0
    asked_ms: int | None = None       # when this member last asked the leader for the job's end (SyncAsk)
    finished_ms: int | None = None    # when this site learned the job is over (it then lingers)
    released: bool = False
    held: list = field(default_factory=list)         # (sender, Directive) taken while evaluating, followed after
    round_cache: RoundCache = field(default_factory=RoundCache)   # training rows and margins between rounds
    eval_cache: RoundCache = field(default_factory=RoundCache)    # the same for the test part
    ahead: Any = None                 # the next round's trees, started early (training.py)
    offered: dict = field(default_factory=dict)      # leading: member -> (round, model sha, trees) from commit acks
    scoring: Any = None               # (model sha, task): its score on [data] test_csv (score_ahead)
    stored_ms: int = 0                # when `store` last wrote the committed round
    _writer: Any = None               # the thread that writes the job's files, in order (store)
    _written: Any = None              # the last round's write (stored awaits it)
    _replies: dict = field(default_factory=dict)     # reply tasks in flight (a dict: ordered, deterministic)

    @property
    def seen_term(self) -> int:     # highest leader term obeyed (fencing.py)
        return self.fence.seen_term

    @seen_term.setter
    def seen_term(self, term: int) -> None:
        self.fence.seen_term = term

    @property
    def parked(self) -> dict:       # sender -> (parked at ms, Directive): term not confirmed yet
        return self.fence.parked

    @property
    def refused(self) -> dict:      # sender -> {reason: count}: directives refused for authority
        return self.fence.refused

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
        """Hold a committed round and store it (`store`). `expect`: the SHA-256 the sender
        announced for a model that came over the network."""
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
        if rnd == self.params["rounds"]:
            self.score_ahead()
        self.store()
        self.ch.progress(f"round {min(rnd + 1, self.params['rounds'])} of {self.params['rounds']}", rnd,
                         self.params["rounds"])

    def store(self) -> None:
        """The committed round under the job's directory (module docstring): rounds 0 and 1, the
        last (fsynced), and in between at most every STORE_EVERY_MS (not every round: a growing
        model written each round costs O(rounds²)). Written by one thread of its own, in the
        order of the commits, off the loop (fsyncs took 5-20 ms); `stored` awaits the last."""
        rnd, workdir, now = self.commit[1], self.ctx.workdir, self.ch.now_ms()
        last = rnd == self.params["rounds"]
        if workdir is None or not (last or rnd <= 1 or now - self.stored_ms >= STORE_EVERY_MS):
            return
        self.stored_ms = now
        written = self._write(_write_round, workdir, self.commit, self.model, last)
        if last:
            self._written = written
        else:                     # nothing reads a round in between: a failed write is only logged
            written.add_done_callback(_log_failed_write)

    def _write(self, fn: Callable[..., None], *args: Any) -> concurrent.futures.Future:
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xgb-files")
        return self._writer.submit(fn, *args)

    async def stored(self) -> None:
        """The job's end: its files on disk (the last round's, then the rounds' history, fsynced):
        what serve_done hands a member that missed the end. Either write failing fails this
        site's part of the job (a "done" it could not serve would hold such a member forever)."""
        writes = [self._written]
        if self.ctx.workdir is not None:
            writes.append(self._write(atomic_write, self.ctx.workdir / HISTORY_FILE, self.history_bytes()))
        for written in writes:
            if written is None:
                continue
            try:
                await asyncio.wrap_future(written)
            except OSError as exc:
                raise JobError(f"cannot store the final model in this site's state dir: {exc.strerror or exc}; "
                               "free space there") from None

    def build(self, trees: list) -> bytes:          # trees documents, or the batches check_trees returned
        p = self.params
        return boosting.append_round(self.model, trees, self.base, self.fit[0].shape[1],
                                     self.groups if self.groups > 1 else 0, p["objective"])

    async def built(self, trees: list) -> bytes:
        """`build`: on the loop while the model is small (a worker thread's wake-up, on a busy host,
        costs more than the work), in a worker thread once its bytes would stall the loop."""
        if len(self.model or b"") < BUILD_OFF_LOOP_BYTES_MIN:
            return self.build(trees)
        return await self.tools.offload(self.build, trees)

    def stale(self, term: int) -> bool:
        return self.fence.stale(term, self.ch.leadership())

    def leading(self, term: int) -> bool:
        return self.ch.leadership() == (term, self.me)

    def authority(self, src: bytes, term: int) -> str:
        """The fence's verdict on a directive of `term` from `src` (fencing.py): "obey", "stale",
        "not_leader" or "unconfirmed"."""
        return self.fence.verdict(src, term, self.ch.leadership())

    def refuse(self, src: bytes, msg: Directive, reason: str) -> None:
        """Count (and log once per sender and reason) a directive refused for lack of authority;
        the sender is told, nothing else changes."""
        if self.fence.count_refusal(src, reason):
            log.warning("xgb_directive_refused", extra=log_fields(
                job=self.ch.job_id, sender=self.name(src), reason=reason, op=msg.op, term=msg.term,
                election_term=self.ch.leadership()[0]))
        self.reply(src, msg, error=reason)

    async def unpark(self) -> None:
        """Follow parked directives whose sender the election now confirms; refuse the others once
        they waited PARK_MS or once the election has moved on."""
        for src, (_, msg) in list(self.fence.parked.items()):
            if self.fence.parked.get(src, (0, None))[1] is not msg:
                continue       # replaced meanwhile
            action, reason = self.fence.unpark(src, self.ch.leadership(), self.ch.now_ms())
            if action == "refuse":
                self.refuse(src, msg, reason)
            elif action == "judge":
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
        self.drop_ahead()
        if self.scoring is not None:
            self.scoring[1].cancel()
        if self._writer is not None:
            self._writer.shutdown(wait=False)      # what was submitted still lands, in order
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
        test_csv = await self.test_score()
        await self.stored()
        return self.result(test_csv)

    async def follow(self, src: bytes, msg: Directive) -> None:
        action, error = self.fence.judge(src, msg, self.ch.leadership(), self.ch.now_ms())
        if action == "answer":
            self.reply(src, msg, error=error)
            return
        if action == "refuse":
            self.refuse(src, msg, error)
            return
        if action == "park":
            return
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
        except ImplausibleTotal:
            raise                # a sum every participant got: the job ends everywhere, not just this directive
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

    async def _apply_commit(self, src: bytes, msg: Directive) -> None:
        if not msg.model:
            if self.commit[1:] != (msg.round - 1, msg.prev_sha):
                self.reply(src, msg, error="need_model")
                return
            # the leader's trees pass the policy a member's pass
            model = await self.built([self.check_trees(doc) for doc in msg.trees])
            if boosting.model_sha256(model) != msg.sha:
                self.reply(src, msg, error="need_model")     # cannot happen with honest members
                return
            self.adopt(msg.term, msg.round, model)
        self.train_ahead(None)
        self.ack_commit(src, msg)          # with the next round's trees, once trained (training.py)
        await self.evaluate(msg.term, msg.round, src, msg)

    # -- result ----------------------------------------------------------------------------------

    def score_ahead(self) -> None:
        """Score the last round's model on [data] test_csv in a worker thread, while the job finishes
        (the evaluation's sum, "finish" and "release" are round trips; the loop keeps answering)."""
        if self.ctx.test_data is None or self.model is None or (self.scoring and self.scoring[0] == self.commit[2]):
            return
        task = asyncio.ensure_future(self.tools.offload(test_csv_score, self.model, self.ctx.test_data, self.params))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())    # raised where it is awaited
        self.scoring = (self.commit[2], task)

    async def test_score(self) -> dict | None:
        self.score_ahead()      # (started when the last round was committed, unless the model changed since)
        return None if self.scoring is None else await self.scoring[1]

    def result(self, test_csv: dict | None = None) -> dict:
        p = self.params
        out: dict[str, Any] = {
            "rounds": self.round, "model_sha256": self.commit[2], "history": [self.named(h) for h in self.history],
            "trees": boosting.model_info(self.model).n_trees if self.model else 0,
            "base_score": self.base if self.groups == 1 else list(self.base),
            "features": list(self.ctx.data.features), "objective": p["objective"], "classes": class_names(p),
            "rows": {"train": int(len(self.fit[1])), "test": int(len(self.test[1])) if p["test_fraction"] else 0},
            # directives this site refused because their sender did not lead their term
            "directives_refused": {self.name(k): dict(v) for k, v in self.refused.items()},
        }
        keys = metric_keys(p)
        last = next((h for h in reversed(self.history) if h.get(keys[0]) is not None), None)
        on = "the sites' test parts" if p["test_fraction"] else "the sites' training rows"
        score_result(out, p, {k: last[k] for k in keys} if last else None, on)
        if test_csv is not None:
            score_result(out, p, None, on, test_csv)
        out["_model"] = self.model
        return out


def _log_failed_write(written: concurrent.futures.Future) -> None:
    if not written.cancelled() and written.exception() is not None:
        log.warning("xgb_round_not_stored", extra=log_fields(error=str(written.exception())[:200]))


def _write_round(workdir: Path, commit: tuple[int, int, str], model: bytes | None, last: bool) -> None:
    """A committed round's model file, then its commit record (both atomic; fsynced if `last`)."""
    term, rnd, sha = commit
    name = f"xgb-round-{rnd}.json"
    if model is not None:
        atomic_write(workdir / name, model, durable=last)
    write_json(workdir / "xgb-commit.json", {"term": term, "round": rnd, "model_sha256": sha,
                                             "model_file": name if model else None}, durable=last)
    for old in workdir.glob("xgb-round-*.json"):
        if old.name != name:
            old.unlink(missing_ok=True)


def score_result(out: dict, params: Mapping[str, Any], federated: dict | None, on: str,
                 test_csv: dict | None = None) -> None:
    """A result's scores (both modes): `federated_eval` (the secure-summed metrics on `on`) and
    `test_csv` (the model on [data] test_csv); `auc` (classification) or `rmse` and `mae`
    (regression) lead with the test_csv figure when there is one, `auc_source` says which."""
    lead = ("rmse", "mae") if is_regression(params) else ("auc",)
    if test_csv is None:
        if federated:         # the test part's metrics (a training loss is the history's, on other rows)
            federated = {k: v for k, v in federated.items() if k in metric_keys(params)}
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

