"""The bagging `xgboost` job's per-round evaluation (`site.py` runs the protocol): the round's
history entry, then one secure sum of its participants' evaluation counts on their test parts
and, with `train_loss`, their training loss on their training rows (target.py says what is
summed and checked), given up when the sum's initiator dies, a new
leader is elected, or the leader says the job ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fedpeer.errors import JobError
from fedpeer.jobs.kind import checked_total
from fedpeer.kinds.xgboost.messages import (
    DIRECTIVE_TAG,
    EVAL_HOP_TIMEOUT_MS,
    HELD_DIRECTIVES_MAX,
    POLL_MS,
    Directive,
    _Died,
)
from fedpeer.kinds.xgboost.target import (
    check_eval,
    curve_metrics,
    eval_metrics,
    eval_vector,
    train_sums,
    with_train,
)
from fedpeer.protocols.securesum.api import secure_sum
from fedpeer.runtime.channel import RecvTimeout, SubChannel


class Evaluating:
    """Mixed into `site.Site`: a committed round's history entry and evaluation."""

    ch: Any
    ctx: Any
    params: Any
    tools: Any
    me: bytes
    model: bytes | None
    commit: tuple[int, int, str]
    history: list
    held: list
    groups: int
    fit: Any
    test: Any
    round_cache: Any
    eval_cache: Any
    total_rows: int

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
        cache = self.round_cache if self.test[0] is self.fit[0] else self.eval_cache    # (test_fraction 0: one)
        proba = await self.tools.offload(self.tools.predict, self.model, self.test[0], p["nthread"] or None, cache)
        train = None
        if with_train(p):        # the training loss, on this site's training rows, in the same sum
            fit = proba if self.test[0] is self.fit[0] else await self.tools.offload(
                self.tools.predict, self.model, self.fit[0], p["nthread"] or None, self.round_cache)
            train = train_sums(self.fit[1], fit, p)
        vector = eval_vector(self.test[1], proba, p, len(participants), train)
        ring = tuple(sorted(participants))
        # The sum's initiator (first member) dying would hold everyone for many hops, and a new
        # leader's term means the round's leader is gone: its successor must not find us busy.
        try:
            out = await self.while_alive(ring[0], secure_sum(
                SubChannel(self.ch, ring), f"xgb/eval/{term}/{rnd}", vector, mode=p["secure_sum"],
                hop_timeout_ms=min(self.ctx.hop_timeout_ms, EVAL_HOP_TIMEOUT_MS),
                compact=p.get("secure_sum_compact", False)), term=term,
                ended=None if leader == self.me else self.ended_at_leader)
        except (JobError, _Died) as exc:
            entry["eval_error"] = str(exc)[:300]
            return
        # every participant: the job ends
        checked_total(f"xgb/eval/{term}/{rnd}", check_eval, out.total, p, self.total_rows)
        metrics = eval_metrics(out.total, p)
        entry.update(metrics)
        curve = curve_metrics(out.total, p)
        if curve is not None:        # the last round, scored finer: its curve point at the rounds' bins
            entry["curve"] = curve
        self.ch.progress(f"round {rnd} of {p['rounds']}", rnd, p["rounds"],
                         point={"round": rnd, **{k: v for k, v in (curve or metrics).items() if k != "eval_bins"}})
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
