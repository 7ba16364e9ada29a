"""FedAvg rounds over secure sums, with optional two-level ("edge") aggregation
(Marcelloni's federated-learning lecture; Joy's EdgeFed dissertation): `logreg` mode `fedavg` and the `mlp` job.

Every round each member trains `local_epochs` passes of SGD on its own rows from the current
weights; the new weights are the row-weighted average Σ n_k w_k / Σ n_k, computed through one
secure sum of [n_k w_k, n_k, loss] (fixed point) ++ score-histogram counts, so no site's weights
are ever seen. The same sum carries each site's log-loss, accuracy and score histogram of the
weights the round started from, so the history holds the federated loss / accuracy / AUC of the
model after every round, without an extra sum; one last sum evaluates the final model.

Sequencing: no leader. Every member runs the same deterministic loop of secure sums (tags
lr/e<E>/fa/r<R>/all, lr/e<E>/fa/r<R>/g<G>, lr/e<E>/fa/r<rounds>/final, after the two scaling
sums lr/e<E>/moments and lr/e<E>/spread), as histogram XGBoost does; the rounds are not
sequenced by the elected leader.

A member lost mid-job (killed, cut off: fedpeer/protocols/epochs.py, shared with histogram XGBoost).
A sum that completes without some members of its scope gives every survivor in it the same
`participants`; a sum that fails outright waits up to epochs.DEAD_WAIT_MS (30 s) for the failure
detector and treats the members it declares dead as lost (none declared: the job fails at that
member, which the others then lose in turn). A member left out of a sum fails alone
(`member_failure_aborts=False`). A site cut off from everyone is declared dead by the others'
failure detectors within seconds ([membership] suspect_timeout_ms and probes), so it is lost as a
crashed one; a group's sum the secure sum gives up on (a group of two whose members cannot
reach each other but are never declared dead) fails the group's members after DEAD_WAIT_MS (the
others then lose them).
Then, precisely:
* lost during the two scaling sums (moments, spread): every survivor starts over in epoch E + 1
  (new mean and scale over the survivors' rows, the same seeded initial weights and shuffling):
  the model is the one the survivors alone would have trained.
* lost in round R (the first sum of round R that goes without member x; x's rows counted in every
  average before it): round R's average is over the members of the sum's scope still in it,
  Σ_{k survivors} n_k w_k(R) / Σ_{k survivors} n_k, where w_k(R) is what survivor k trained in
  round R from the weights every survivor of its scope held after round R - 1 (trained once: a
  sum that failed is summed again under a fresh tag with the same vectors, not retrained); every
  later average is over the survivors' rows only. The mean and scale stay those of every
  member's rows at the start. A federation-wide sum's loss starts epoch E + 1 everywhere; a
  group's sum's loss is known to that group's survivors only, who go on without x at once,
  while the rest of the federation finds x missing from the next federation-wide sum (there is
  one in round `rounds` - 1 at the latest) and starts epoch E + 1 then.
* groups: a group left with one member trains alone between federation-wide averages (its
  group sum is its own vector, nothing is sent); a group that loses its last member is gone —
  federation-wide averages are over the other groups' members, which go on as before.
* fewer than two members left in the federation: the job fails ("fewer than two members left").
* lost in the final evaluation sum: the weights are final; the last history entry is over the
  survivors' rows.
`lost` names every member lost (as the federation-wide sums found them, the same at every
survivor); `fedavg.lost_at_round` gives, as this site saw it, the first round averaged without
each (a group's survivors see a member of their group lost earlier than the other groups do).
Not covered (as histogram XGBoost): a sum's initiator (the first member of its scope in key
order) that dies while delivering the total can leave some survivors with the round done and
others without; they then run different sums, which fail: the job fails at them (never two
survivors done with different weights).

Groups: with `groups = "a,b;c,d"` (site names as the job's members are named), the members of
a group average among themselves every round (a secure sum over the group only: its members
learn the group's average, nobody else does) and the whole federation averages every
`global_every` rounds and in the last round (Σ_k n_k w_k over all members equals the row-weighted
average of the groups' averages; a group of one site just keeps its own weights between them).
Every site must be in exactly one group; the members check,
with the first sum, that they all read the groups the same way. The result counts the
federation-wide averaging steps saved (rounds minus global averages).

Errors: weights that are not finite or leave ±WEIGHT_ABS_MAX (fedpeer/ml/linear/averaging.py; a
learning rate too large for the data) end the job everywhere naming `learning_rate`. Every
round's total is checked before its average is taken (`averaging.check_round`: whole rows, all of
the federation's while no member is lost, the average within ±WEIGHT_ABS_MAX, the evaluation
counting the same rows, its histograms and log-loss consistent): one that no honest members can
give ends the job everywhere naming the sum and the check, never a site.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedpeer.errors import DataError
from fedpeer.jobs.kind import JobFailsEverywhere, Param, checked_total, site_seed
from fedpeer.jobs.params import seed
from fedpeer.ml.linear import averaging
from fedpeer.ml.linear import logistic as linear
from fedpeer.ml.moments import whole_counts
from fedpeer.protocols.fixedpoint import encode_counts

FEDAVG_PARAMS = {
    "rounds": Param(int, 20, "fedavg: communication rounds", low=1, high=10_000),
    "local_epochs": Param(int, 1, "fedavg: passes over its own rows each site makes per round", low=1, high=1000),
    "learning_rate": Param(float, 0.05, "fedavg: SGD step size", low=1e-8, high=100.0),
    "batch_size": Param(int, 32, "fedavg: rows per SGD step", low=1, high=1_000_000),
    "groups": Param(str, "", 'fedavg: two-level aggregation, e.g. "a,b;c,d": sites a and b average every round, '
                    "so do c and d, and the groups' averages are averaged every global_every rounds (site names "
                    "as the job's members are named; every site in one group)"),
    "global_every": Param(int, 1, "fedavg with groups: rounds between federation-wide averages", low=1,
                          high=10_000),
    "seed": seed("seed of each site's held-out part (test_fraction) and, fedavg, of the initial weights and each "
                 "site's shuffling"),
}


def parse_groups(spec: str, members: tuple[bytes, ...], me: bytes, my_name: str,
                 names: Mapping[bytes, str]) -> list[tuple[bytes, ...]]:
    """`groups` -> the groups of member keys (ring order), [] without groups; JobFailsEverywhere
    (a misread must not quietly leave a site out) for a name that is no member, a member in two
    groups or in none."""
    if not spec.strip():
        return []
    by_name = {name: key for key, name in names.items()}
    by_name[my_name] = me
    groups, seen = [], set()
    for part in spec.split(";"):
        keys = []
        for name in (n.strip() for n in part.split(",") if n.strip()):
            if name not in by_name or by_name[name] not in members:
                raise JobFailsEverywhere(f"groups: {name!r} is not a member of this job (members: "
                               f"{sorted(names.get(m, my_name if m == me else m.hex()[:16]) for m in members)})")
            if by_name[name] in seen:
                raise JobFailsEverywhere(f"groups: {name!r} is in two groups")
            seen.add(by_name[name])
            keys.append(by_name[name])
        if keys:
            groups.append(tuple(m for m in members if m in keys))
    missing = [m for m in members if m not in seen]
    if missing:
        raise JobFailsEverywhere(f"groups: {len(missing)} member(s) are in no group, e.g. "
                       f"{names.get(missing[0], missing[0].hex()[:16])!r}")
    return groups


def group_view(groups: list[tuple[bytes, ...]], members: tuple[bytes, ...]) -> np.ndarray:
    """Each member's group number + 1, in ring order: summed over members, equal views add up to
    members x this vector."""
    index = {m: g + 1 for g, keys in enumerate(groups) for m in keys}
    return np.array([index.get(m, 0) for m in members], dtype=np.int64)


def sgd_epochs(Z: np.ndarray, y: np.ndarray, W: np.ndarray, C: float, n_total: int, learning_rate: float,
               epochs: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Local mini-batch SGD on the federation's objective (mean log-loss + ||coef||² / (2 C n))."""
    mask = np.ones_like(W)
    mask[:, -1] = 0.0
    W = W.copy()
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for lo in range(0, len(y), batch_size):
            rows = order[lo:lo + batch_size]
            grad = linear.local_terms(Z[rows], y[rows], W, False)[1:].reshape(W.shape) / len(rows)
            W -= learning_rate * (grad + mask * W / (C * n_total))
    return W


class Rounds:
    """The FedAvg loop of one member (module docstring). `train(w, round) -> w'` and
    `proba(w) -> probabilities on this site's rows` are the model's."""

    def __init__(self, member: Any, train: Any, proba: Any, initial: np.ndarray, fed_rows: int) -> None:
        self.m, self.train, self.proba, self.w = member, train, proba, initial
        self.fed_rows = fed_rows            # the federation's training rows (the scaling sums')
        p = member.params
        self.rounds, self.every = p["rounds"], p["global_every"]
        self.groups = current_groups(member)
        self.mine = next((g for g, keys in enumerate(self.groups) if member.ch.me in keys), -1)
        self.history: list[dict] = []
        self.global_sums = 0
        self.lost_at: dict[bytes, int] = {}     # member lost -> the first round this site averaged without it

    def scope(self, r: int) -> tuple[str, tuple[bytes, ...]]:
        if not self.groups or (r + 1) % self.every == 0 or r == self.rounds - 1:
            return "all", self.m.members
        return f"g{self.mine + 1}", self.groups[self.mine]

    async def run(self, n_local: int) -> np.ndarray:
        m = self.m
        for r in range(self.rounds + 1):
            final = r == self.rounds
            local = self.w if final else await m.offload(self.train, self.w, r)
            if not averaging.weights_within_bound(local):
                raise JobFailsEverywhere(
                    f"{m.KIND_NAME} fedavg: this site's weights after round {r + 1} are not finite or beyond "
                    f"WEIGHT_ABS_MAX={averaging.WEIGHT_ABS_MAX:g}: the local SGD diverges; lower learning_rate "
                    "(or local_epochs)", here=True)
            counts, loss = m.eval_counts_of(await m.offload(self.proba, self.w))
            values = np.concatenate([n_local * local.ravel(), [n_local, loss]])
            redo = 0
            while True:      # once, or again over the survivors after a sum that failed for a member declared dead
                name, scope = ("all", m.members) if final else self.scope(r)
                tag = f"fa/r{r}/{'final' if final else name}" + (f"/redo{redo}" if redo else "")
                full = m.epochs.tag(tag)
                total = await self.average(tag, r, name == "all", scope, values, counts)
                if total is not None:
                    break
                redo += 1
            split = (local.size + 2) * m.TERMS.limbs
            sums = m.TERMS.decode(total[:split])
            summed = checked_total(full, whole_counts, total[split:])
            rows = checked_total(full, averaging.check_round, sums[:-2], float(sums[-2]), float(sums[-1]), summed,
                                 m.groups, m.params["eval_bins"], self.fed_rows,
                                 scope == m.members and not self.lost_at,
                                 None if m.held is None else m.fed_held)
            if not final:
                self.w = (sums[:-2] / rows).reshape(self.w.shape)
                self.global_sums += name == "all"
            metrics = m.metrics_of(summed, float(sums[-1]))
            self.history.append({"round": r, "scope": "federation" if name == "all" else f"group {name[1:]}",
                                 **metrics})
            m.ch.progress(f"{m.KIND_NAME} fedavg: round {min(r + 1, self.rounds)} of {self.rounds}",
                          min(r + 1, self.rounds), self.rounds,
                          point={"round": r, **metrics} if name == "all" else None)
        return self.w

    async def average(self, tag: str, r: int, federation: bool, scope: tuple[bytes, ...], values: np.ndarray,
                      counts: np.ndarray) -> np.ndarray | None:
        """One round's sum over `scope`: its total over the members of `scope` still in it, or None
        when it failed for members declared dead (the round is summed again without them)."""
        m = self.m
        try:
            weights = m.TERMS.encode(values, len(scope))
        except DataError:
            raise JobFailsEverywhere(f"{m.KIND_NAME} fedavg: this site's weights after round {r + 1} are not "
                                     "finite or too large for the secure sum: the local SGD diverges; lower "
                                     "learning_rate (or local_epochs)", here=True) from None
        vector = np.concatenate([weights, encode_counts(counts, len(scope), 2**40)])
        if scope == (m.ch.me,):
            return vector        # a group of one: its sum is its own vector, nothing is sent
        out = await m.epochs.sum(tag, vector, scope=scope)
        if out.lost:
            self.lose(out.lost, r, federation)
        return out.total

    def lose(self, lost: tuple[bytes, ...], r: int, federation: bool) -> None:
        """Members a sum of round r went without. A federation-wide sum: every survivor saw the same
        participants, so every survivor starts the next epoch without them. A group's sum: only
        the group's members know; the rest of the federation finds them missing from the next
        federation-wide sum (the federation's member list, hence its epochs, stay the same
        everywhere until then)."""
        for k in lost:
            self.lost_at.setdefault(k, r)
        self.groups = [tuple(k for k in keys if k not in lost) for keys in self.groups]
        if federation:
            self.m.lose(lost)

    def summary(self) -> dict:
        name = self.m.name
        return {"rounds": self.rounds, "global_averages": self.global_sums,
                "global_averages_saved": self.rounds - self.global_sums,
                "groups": [[name(k) for k in keys] for keys in self.groups],
                "lost_at_round": {name(k): r for k, r in sorted(self.lost_at.items(), key=lambda kv: kv[1])}}


def current_groups(member: Any) -> list[tuple[bytes, ...]]:
    """The job's groups (read against every member the job started with, so that a restart over
    the survivors reads them the same way), without the members lost since; a group whose
    members are all lost stays, empty, so that the groups keep their numbers."""
    groups = parse_groups(member.params["groups"], tuple(member.ch.members), member.ch.me, member.ctx.site_name,
                          member.ctx.names)
    return [tuple(k for k in keys if k in member.members) for keys in groups]


async def check_groups(member: Any, extra_total: np.ndarray, view: np.ndarray) -> None:
    if not np.array_equal(extra_total, view * len(member.members)):
        raise JobFailsEverywhere("groups: the members read the groups differently (their peers.toml name the "
                                 "sites differently?); give the sites' names as every member knows them")


async def fit_logreg(member: Any) -> dict:
    """`logreg` mode `fedavg`: FedAvg of the standardised model; the result has the exact mode's
    fields (coef, intercept in original units ...), `iterations` = rounds."""
    p = member.params
    view = group_view(current_groups(member), member.members)
    fed_counts, mean, scale, extra = await member.scaling(view)
    await check_groups(member, extra, view)
    n = int(fed_counts.sum())
    Z = linear.design(member.X, mean, scale)
    shape = (member.groups, member.X.shape[1] + 1)
    rng = np.random.default_rng(site_seed(p["seed"], member.ch.me))

    def train(w: np.ndarray, r: int) -> np.ndarray:
        return sgd_epochs(Z, member.y, w, p["C"], n, p["learning_rate"], p["local_epochs"], p["batch_size"], rng)

    evaluated = member.eval_design(mean, scale, Z)      # the held-out part's rows (test_fraction), else Z
    rounds = Rounds(member, train, lambda w: linear.probabilities(evaluated, w), np.zeros(shape), n)
    W = await rounds.run(len(member.y))
    state = _Final(W)
    out = await member.result(state, mean, scale, fed_counts, rounds.history, Z)
    out.update({"mode": "fedavg", "solver": "sgd", "status": "rounds done", "iterations": p["rounds"],
                "grad_max": None, "fedavg": rounds.summary()})
    return out


class _Final:
    """What Member.result reads of a fit, for a FedAvg model."""

    def __init__(self, W: np.ndarray) -> None:
        self.W, self.g = W, np.zeros(1)
        self.solver, self.status, self.iterations, self.evaluations = "sgd", "rounds done", 0, 0

