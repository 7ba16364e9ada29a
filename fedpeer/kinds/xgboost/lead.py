"""The leader's side of the bagging `xgboost` job (`xgbsite.py` says what a leader of term T
does): learn the members' commit points, run rounds, commit them, finish and release."""

from __future__ import annotations

from typing import Any

from fedpeer.errors import JobError
from fedpeer.jobs.kind import JobFailsEverywhere
from fedpeer.kinds.xgboost.messages import (
    LEADER_SILENCE_MS,
    LINGER_MS,
    POLL_MS,
    STATE_TIMEOUT_MS,
    Directive,
    Reply,
    _all,
    _Deposed,
    _Died,
    _directive,
    _NoMajority,
    _reply_tag,
    _with_model,
)
from fedpeer.ml.xgb import boosting
from fedpeer.runtime.channel import PeerDead, PeerUnreachable, RecvTimeout, observe_round


async def _offered(trees: bytes) -> Reply:
    """A round's trees a member sent with its acknowledgement of the last commit, as its reply."""
    return Reply(tag="", commit_term=0, commit_round=0, commit_sha="", trees=trees, model=b"", history=b"", error="")


def offers_in(members: list[bytes], acks: list[Reply | None], rnd: int,
              sha: str) -> dict[bytes, tuple[int, str, bytes]]:
    """The next round's trees that came with the acknowledgements of commit `rnd` (model `sha`):
    member -> (rnd + 1, sha, trees), from an acknowledgement of that very commit point only."""
    return {m: (rnd + 1, sha, r.trees) for m, r in zip(members, acks)
            if r is not None and not r.error and r.trees and (r.commit_round, r.commit_sha) == (rnd, sha)}


class Leading:
    """Mixed into `xgbsite.Site`: what a member does while its election says it leads a term."""

    ch: Any
    params: Any
    offered: dict[bytes, tuple[int, str, bytes]]     # member -> (round, model sha it builds on, trees)

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
        of the job's members (me included) hold it; without one, start over from take_over."""
        self.seen_term = term
        while True:
            known = await self.take_over(term)
            try:
                while self.round < self.params["rounds"]:
                    started_ms = self.ch.now_ms()
                    known = self.majority(await self.lead_round(term, known), f"round {self.round}")
                    observe_round(self.ch, "xgboost", started_ms)   # committed: held by a majority
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
        self.offered = {}       # trees offered to an earlier term's leader: asked for again
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
        offered, self.offered = self.offered, {}
        for m in targets:
            trees = self.offer_for(offered, m, rnd, prev_sha)
            if trees is not None:
                asks.append(_offered(trees))     # trees of this round on this model, with the last ack
                continue
            d = _directive(term, "round", rnd, prev_sha=prev_sha, gain_share=self.gain_share(m))
            if known.get(m) != (self.round, prev_sha) and self.model is not None:
                d = _with_model(d, self.model, self.commit[0], self.history_bytes())
            asks.append(self.ask(term, m, d, p["member_timeout_ms"], retry_with=self.model))
        *replies, own = await _all(*asks, self.local_trees(rnd, self.gain_share(self.me)))
        own_reply = Reply(tag="", commit_term=0, commit_round=0, commit_sha="", trees=own[0], model=b"",
                          history=b"", error=own[1])
        answered = {m: r for m, r in zip(targets, replies) if r is not None}
        docs, batches, gains, excluded = {}, {}, {}, {}
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
            docs[m], batches[m], gains[m] = reply.trees, batch, batch.gain
        if not docs:     # nobody can train (bad parameters, data every site refuses): stop everyone
            reasons = "; ".join(f"{self.name(bytes.fromhex(k))}: {why}" for k, why in excluded.items())
            raise JobFailsEverywhere(f"round {rnd}: no site delivered valid trees ({reasons})")
        if not self.leading(term):
            raise _Deposed()
        order = [m for m in ch.members if m in docs]
        model = await self.built([batches[m] for m in order])
        self.adopt(term, rnd, model)
        self.last_gains = gains
        self.train_ahead(self.gain_share(self.me))      # my next trees while the members store this round
        sha = self.commit[2]
        commit = _directive(term, "commit", rnd, prev_sha=prev_sha, sha=sha, trees=[docs[m] for m in order],
                            participants=order)
        *acks, _ = await _all(*(self.ask(term, m, commit, p["member_timeout_ms"], retry_with=model)
                                for m in answered), self.evaluate(term, rnd, self.me, commit))
        if excluded:
            self.history[-1]["excluded"] = excluded
        self.offered = offers_in(answered, acks, rnd, sha)
        return {m: (r.commit_round, r.commit_sha) for m, r in zip(answered, acks)
                if r is not None and not r.error}

    def offer_for(self, offered: dict[bytes, tuple[int, str, bytes]], member: bytes, rnd: int,
                  prev_sha: str) -> bytes | None:
        """The trees `member` offered for round `rnd` on the model `prev_sha`, or None (none, for
        another round or model, or under normalize = "gain", where the directive sets its rate)."""
        offer = offered.get(member)
        if offer is None or self.params["normalize"] == "gain" or offer[:2] != (rnd, prev_sha):
            return None
        return offer[2]

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

