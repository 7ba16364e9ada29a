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
  each member trains num_local_round trees per class on its own rows on top of it and returns
  only them -> the leader checks every trees document (`boosting.validate_trees`: structure,
  depth, node count, leaf magnitudes, tree count and class order), leaves out members whose
  trees fail or do not come, appends the rest in member order (`boosting.append_round`), stores
  round r and sends "commit r" (the round's trees documents) to every member; each member
  rebuilds the model, checks its SHA-256, stores it and acknowledges;
- after the commit, the round's participants evaluate the model on their test parts with one
  secure sum (log-loss, accuracy, per-class score histograms -> AUC); a total no honest
  participants can give (target.py `check_eval`) ends the job everywhere naming no site, as does
  such a label-count total at the start (`check_labels`);
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
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedpeer.base.logs import fields as log_fields
from fedpeer.base.store import atomic_write, write_json
from fedpeer.errors import DataError, JobError, public_reason
from fedpeer.jobs.kind import ImplausibleTotal, JobContext, checked_total, site_seed
from fedpeer.kinds.xgboost.fencing import Fence
from fedpeer.kinds.xgboost.lead import Leading
from fedpeer.kinds.xgboost.messages import (
    DIRECTIVE_TAG,
    EVAL_HOP_TIMEOUT_MS,
    HELD_DIRECTIVES_MAX,
    HISTORY_ENTRY_BYTES_MAX,
    HISTORY_FILE,
    LEADER_SILENCE_MS,
    PARK_MS,
    POLL_MS,
    STATE_TIMEOUT_MS,
    SYNC_SILENCE_MS,
    SYNC_TAG,
    Directive,
    Reply,
    SyncAsk,
    Tools,
    _Deposed,
    _Died,
    _reply_tag,
    train_params,
)
from fedpeer.kinds.xgboost.target import (
    check_eval,
    class_names,
    eval_metrics,
    eval_vector,
    is_regression,
    metric_keys,
    model_score,
    site_labels,
)
from fedpeer.ml.xgb import boosting
from fedpeer.protocols.securesum.api import secure_sum
from fedpeer.runtime.channel import RecvTimeout, SubChannel

log = logging.getLogger("fedpeer.jobs.xgboost")


@dataclass
class Site(Leading):
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
            why = public_reason(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            return b"", f"training failed: {why}"[:2000]

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
        checked_total(f"xgb/eval/{term}/{rnd}", check_eval, out.total, p)   # every participant: the job ends
        metrics = eval_metrics(out.total, p)
        entry.update(metrics)
        self.ch.progress(f"round {rnd} of {p['rounds']}", rnd, p["rounds"], point={"round": rnd, **metrics})
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
            # directives this site refused because their sender did not lead their term
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

