"""A bagging member's own trees of a round (`site.py` runs the protocol, `lead.py` the leader's
side): trained when the leader's "round" directive asks for them, or started ahead of it, as soon
as the member has committed the model the round builds on (round 1: as soon as it knows the
federation's base score, while the leader takes over).

A head start changes none of the trees a member sends. A round's trees follow from the model it
builds on (its SHA-256), the site's learning rate and the round's seed (from the job seed, the
site's key and the round), all known once the previous round is committed — except the rate of a
member under normalize = "gain", which comes with the directive (such a member waits for it). A
directive takes the head start's trees only if it asks for exactly those inputs; otherwise the
head start is dropped and the site trains as asked. The acknowledgement of the commit waits for
the head start and carries its trees (`ack_commit`; the member evaluates the round meanwhile): the
leader takes them for the next round instead of sending that round's directive and waiting for its
reply (lead.py), one round trip a round (two messages of four a member). The leader checks those
trees as any round's and takes them only for the round after the commit they acknowledge, on the
model that commit made.

A dropped head start (another model came, or the job ended) stops only its coroutine: its worker
thread finishes the one round's training it began, holding the site's RoundCache (whose lock makes
the next training wait for it), and its trees are thrown away.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fedpeer.errors import DataError, public_reason
from fedpeer.jobs.kind import site_seed
from fedpeer.kinds.xgboost.messages import train_params
from fedpeer.ml.xgb import boosting


class Training:
    """Mixed into `site.Site`: the site's trees of a round, now or ahead of the directive."""

    ch: Any
    params: Any
    tools: Any
    fit: Any
    base: Any
    groups: int
    total_rows: int
    model: bytes | None
    commit: tuple[int, int, str]
    me: bytes
    round_cache: Any
    reply: Any
    _background: Any
    ahead: tuple[tuple[int, str, float], asyncio.Future] | None    # ((round, model sha, rate), trees)

    def eta_for(self, gain_share: float) -> float:
        """This site's learning rate; `gain_share` < 0: unknown (the "samples" rate under "gain")."""
        p = self.params
        if p["normalize"] == "gain" and gain_share >= 0:
            return boosting.normalized_eta(p["eta"], 0, 0, "gain", gain_share, 1.0)
        if p["normalize"] != "none":
            return boosting.normalized_eta(p["eta"], len(self.fit[1]), self.total_rows, "samples")
        return p["eta"]

    async def local_trees(self, rnd: int, gain_share: float) -> tuple[bytes, str]:
        """This site's trees of round `rnd` on top of its committed model: (document, "") or (b"", why not)."""
        p = self.params
        self.ch.progress(f"round {rnd} of {p['rounds']}: training", rnd - 1, p["rounds"])
        eta_i = self.eta_for(gain_share)
        if eta_i <= 0:           # a site whose trees gained nothing last round sits this one out
            return b"", "no_gain"
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            if ahead[0] == (rnd, self.commit[2], eta_i):
                return await ahead[1]
            ahead[1].cancel()
        return await self.trees(rnd, eta_i, self.model)

    def train_ahead(self, gain_share: float | None) -> None:
        """Start the trees of the round after the one just committed (module docstring);
        `gain_share` None: this site learns its rate from the directive."""
        p, rnd = self.params, self.commit[1] + 1
        self.drop_ahead()
        if rnd > p["rounds"] or (gain_share is None and p["normalize"] == "gain"):
            return
        eta_i = self.eta_for(-1.0 if gain_share is None else gain_share)
        if eta_i > 0:
            task = asyncio.ensure_future(self.trees(rnd, eta_i, self.model))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())    # a dropped one's error: not logged
            self.ahead = ((rnd, self.commit[2], eta_i), task)

    def ack_commit(self, leader: bytes, msg: Any) -> None:
        """Acknowledge the commit `msg` just adopted: at once without a head start; else once it is
        trained, with its trees (none if it failed, was dropped or another model came meanwhile).
        In the background: the member evaluates the round meanwhile."""
        ahead = self.ahead
        if ahead is None:
            self.reply(leader, msg)
            return
        point, task = self.commit, ahead[1]

        async def ack() -> None:
            await asyncio.wait({task})
            fresh = self.commit == point and not task.cancelled() and task.exception() is None
            self.reply(leader, msg, trees=task.result()[0] if fresh else b"")
        self._background(ack())

    def drop_ahead(self) -> None:
        if self.ahead is not None:
            self.ahead[1].cancel()
            self.ahead = None

    async def trees(self, rnd: int, eta_i: float, model: bytes | None) -> tuple[bytes, str]:
        p = self.params
        params = {**train_params(p), "base_score": self.base if self.groups == 1 else list(self.base)}
        seed = (site_seed(p["seed"], self.me) + rnd) % 2**31
        try:
            return await self.tools.offload(self.tools.train, model, self.fit[0], self.fit[1], params,
                                            p["num_local_round"], eta_i, seed, self.round_cache), ""
        except (DataError, ValueError) as exc:
            why = public_reason(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
            return b"", f"training failed: {why}"[:2000]
