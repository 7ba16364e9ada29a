"""Survivors never split: a job of sequential secure sums over `Epochs`
(fedpeer/protocols/epochs.py), as the leaderless kinds run them (histogram XGBoost's pattern: on
a loss, a new epoch, then a "resume" sum where every survivor says how far it got and all go on
from the least), with members killed and restarted at seeded random moments, over the in-memory
network in virtual time, each failure detector declaring a crash in its own time.

One run ends in one of three ways at the members never killed:
* "done": every one returned the same members and totals, each total exact;
* "done-without": as done, except survivors the others went on without (left out of a sum
  while they lagged), which failed knowing it;
* "failed": every one raised JobError (a consistent failure: nobody waits on anybody);
* "split": some returned and some failed, or they returned different things: the bug.
A killed member is not judged (its job is gone), except, with rejoins (`rejoin=True`,
epochs.py "Rejoins"), a restarted member that runs its part again, asking to rejoin: it must end
with the survivors' members and totals (it rejoined), or fail with its reason (left out); any
other end of it is "split" too."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedpeer.errors import JobError
from fedpeer.protocols.epochs import Epochs
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.sumsim import SteadyChannel, sim_keys

PREFIX = "esim"
ENDS = ("done", "done-without", "failed", "split")
STEP_S = 0.004        # about the virtual time of one step with no loss: kills land anywhere in the job


@dataclass(frozen=True)
class EpochRun:
    seed: int
    mode: str
    end: str                      # one of ENDS (module docstring)
    killed: int
    restarted: int
    rejoined: int                 # restarted members that ended with the survivors' result
    left_out: tuple[str, ...]     # the reasons of those that did not
    detail: str                   # what each survivor ended with, for a failing seed
    virtual_s: float


def vector_of(index: int, step: int) -> np.ndarray:
    return np.array([1, step + 1, index + 1, (index + 1) * (step + 3)], dtype=np.uint64)


async def _job(ch: Any, index_of: dict[bytes, int], steps: int, mode: str, hop_timeout_ms: int,
               views: bool, rejoin: bool = False, rejoining: bool = False) -> tuple:
    """One member: `steps` sums, through as many epochs as members are lost (or come back, with
    `rejoin`: a boundary is between two steps); `rejoining`, a restarted member asking back in."""
    ep = Epochs(ch, PREFIX, mode, hop_timeout_ms, views=views, rejoin=rejoin)
    done: list[tuple[int, ...]] = []
    resume = needs_state = False
    if rejoining:
        await ep.ask()
        resume = needs_state = True
    while True:
        if resume:                      # hist.py's resume_point: go on from the least progress
            onehot = np.zeros(steps + (2 if rejoin else 1), dtype=np.uint64)
            onehot[steps + 1 if needs_state else len(done)] = 1      # back in: any progress will do
            out = await ep.sum("resume", onehot)
            if out.lost:
                ep.new_epoch(out.lost)
                continue
            assert out.total is not None
            if int(out.total.sum()) != len(ep.members):
                raise JobError("the survivors' progress does not count each survivor once")
            least = int(np.flatnonzero(out.total)[0])
            if needs_state:
                done = [tuple(t) for t in json.loads(await ep.receive_state())]
                if len(done) != least:
                    raise JobError("the state so far is not at the resume point")
                needs_state = False
            else:
                del done[least:]
                await ep.send_state(json.dumps(done).encode())
            resume = False
            continue
        if len(done) == steps:
            lost = await ep.finish()
            if not lost:
                break
            ep.new_epoch(lost)
            resume = True
            continue
        if await ep.admit(None if len(done) < steps - 1 else "the job is too near its end"):
            resume = True
            continue
        step = len(done)
        out = await ep.sum(f"s{step}", vector_of(index_of[ch.me], step))
        if out.lost:
            ep.new_epoch(out.lost)
            resume = True
            continue
        assert out.total is not None
        expected = sum(vector_of(index_of[m], step).astype(object) for m in ep.members)
        if [int(x) for x in out.total] != [int(x) for x in expected]:
            raise AssertionError(f"step {step}: wrong total over {len(ep.members)} members")
        done.append(tuple(int(x) for x in out.total))
    return ep.members, tuple(done), ep.epoch


def simulate_epochs(seed: int, *, views: bool = True, n: int = 4, steps: int = 8, mode: str = "allreduce",
                    kills: int = 1, restart_p: float = 0.5, hop_timeout_ms: int = 1_000, detect_ms: float = 500.0,
                    detect_skew_ms: tuple[float, float] = (0.0, 3_000.0),
                    horizon_s: float | None = None, rejoin: bool = False) -> EpochRun:
    """One seeded run: `kills` members (never so many that fewer than 2 stay) crash at random
    virtual times in [0, horizon_s) (default: steps × STEP_S, the job's length with no loss);
    each comes back with probability restart_p after a random delay of up to
    2 × (detect_ms + the skew's high end), so some detectors saw it dead and some never did."""
    import looptime

    from fedpeer.testing.members import close_loop

    rng = random.Random(seed)
    horizon_s = steps * STEP_S if horizon_s is None else horizon_s
    keys = sim_keys(n)
    index_of = {k: i for i, k in enumerate(keys)}
    victims = rng.sample(keys, min(kills, n - 2))
    plan = {v: (rng.uniform(0, horizon_s),
                rng.uniform(0, (1 if rejoin else 2) * (detect_ms + detect_skew_ms[1]) / 1000)
                if rng.random() < restart_p else None)
            for v in victims}
    ended: dict[bytes, float] = {}
    again: dict[bytes, asyncio.Future] = {}

    async def go() -> dict[bytes, Any]:
        net = MemoryNetwork(keys, seed=seed, detect_ms=detect_ms, detect_skew_ms=detect_skew_ms)
        loop = asyncio.get_running_loop()

        async def one(k: bytes, rejoining: bool = False) -> tuple:
            try:
                return await _job(SteadyChannel(net.channel(k, PREFIX)), index_of, steps, mode, hop_timeout_ms, views,
                                  rejoin, rejoining)
            finally:
                ended[k] = loop.time()

        def back(k: bytes) -> None:
            net.restart(k)
            if rejoin:
                loop.call_later(rng.uniform(0.05, 0.5), start_again, k)

        def start_again(k: bytes) -> None:
            net.rejoin(k, PREFIX)
            again[k] = asyncio.ensure_future(one(k, rejoining=True))
            # its job ended there, however: the daemon's registry refuses the job's messages again
            again[k].add_done_callback(lambda _: net.restarted.add(k))

        tasks = {k: asyncio.ensure_future(one(k)) for k in keys}
        if rejoin:      # a job ended at a daemon: it refuses the job's messages (a member back asks)
            for k, task in tasks.items():
                task.add_done_callback(lambda _, k=k: k in net.crashed_at or net.restarted.add(k))

        def kill(k: bytes) -> None:
            net.crash(k)
            tasks[k].cancel()

        for k, (at, after) in plan.items():
            loop.call_at(at, kill, k)
            if after is not None:
                loop.call_at(at + after, back, k)
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        if rejoin:           # every member back asks, even after the others ended (it is refused)
            last = max((at + after for at, after in plan.values() if after is not None), default=0.0)
            await asyncio.sleep(max(0.0, last + 0.6 - loop.time()))
        while any(not f.done() for f in again.values()):
            await asyncio.gather(*again.values(), return_exceptions=True)
        return {**dict(zip(keys, results)),
                **{(b"again", k): f.exception() or f.result() for k, f in again.items()}}

    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        results = loop.run_until_complete(go())
    finally:
        close_loop(loop)
    survivors = [k for k in keys if k not in plan]
    ends = [results[k] for k in survivors]
    for r in ends:
        if not isinstance(r, (tuple, JobError)):
            raise AssertionError(f"seed {seed}: a survivor ended with {r!r}")
    outcomes = {r[:2] for r in ends if isinstance(r, tuple)}
    if len(outcomes) == 1:
        members = next(iter(outcomes))[0]
        # a survivor the others went on without may fail (alone, knowing it): not a split
        left = all(isinstance(r, tuple) == (k in members) for k, r in zip(survivors, ends))
        end = ("done" if len(ends) == len(set(members) & set(survivors)) else "done-without") if left else "split"
    elif not outcomes:
        end = "failed"
    else:
        end = "split"
    rejoined, left_out = 0, []
    for k in plan:
        r = results.get((b"again", k))
        if r is None:
            continue
        if isinstance(r, tuple) and end in ("done", "done-without") and r[:2] == next(iter(outcomes))[:2]:
            rejoined += 1
        elif isinstance(r, JobError):
            left_out.append(str(r))
        else:
            end = "split"       # back with another result
            left_out.append(f"{index_of[k]} ended with {r!r}")
    detail = "; ".join(f"{index_of[k]}: " + (f"epoch {r[2]}, {len(r[0])} members" if isinstance(r, tuple)
                                             else f"JobError {r}") for k, r in zip(survivors, ends))
    return EpochRun(seed, mode, end, len(plan), sum(back is not None for _, back in plan.values()), rejoined,
                    tuple(left_out), detail, max(ended[k] for k in survivors))


def simulate_random(seed: int, *, views: bool = True, rejoin: bool = False) -> EpochRun:
    """simulate_epochs with a job drawn from the seed: 3 to 6 members, 1 to n - 2 of them killed,
    2 to 5 steps, any secure-sum mode, restarts half the time. With `rejoin`, 4 to 12 steps
    (rejoins need boundaries left) and restarts three times in four."""
    rng = random.Random(seed ^ 0x5EED)
    n = rng.randint(3, 6)
    kills = rng.randint(1, n - 2)
    steps = rng.randint(4, 12) if rejoin else rng.randint(2, 5)
    return simulate_epochs(seed, views=views, n=n, kills=kills, steps=steps,
                           mode=rng.choice(("allreduce", "ring", "pairwise")), rejoin=rejoin,
                           restart_p=0.75 if rejoin else 0.5)
