"""What one job message costs on the event loop: Python calls and CPU per message, sender and
receiver apart, between two real daemons on loopback.

Each site is a process running the daemon's own `Node` (as `fedpeer start` builds it, `[jobs]
preload_ml = false`) from a config the harness wrote, and a job of two members made by hand (a
running JobRecord at both, so its messages pass the real dispatch into the job's mailbox). The
sender's job sends SumChunks through its `NodeChannel` one after the other, as a protocol does
(`await ch.send`: seal under the session, our HTTP/1.1 client, the peer's whole gate — header tag,
replay window, AEAD, strict decode, typed validation — dispatch to the mailbox, the 204 back); the
receiver's job takes them with `ch.recv`. Two sizes: a 16-entry uint64 chunk (128 B of data, inside
msgpack) and an 8,192-entry one (64 KiB, in the raw tail after the msgpack part).

Per batch of `--count` messages, at each end separately:
  - calls/message: cProfile's total call count over the batch (everything the loop's thread ran:
    the event loop's own Python code included), divided by the count;
  - µs/message: process CPU time (time.process_time) over a batch run without the profiler.
The sender counts from its first send to its last send's return; the receiver from the message
that announces the batch to the batch's last message taken from the mailbox. Membership and the
election keep running meanwhile (their pings and heartbeats: 2-5 calls a message in the profiles).
Batches alternate variants and trees; the report gives the median and the best of `--rounds`.

`--compare TREE` runs a second pair of daemons from another checkout (PYTHONPATH=TREE, e.g. the
main branch's worktree) with batches interleaved with this tree's, for before/after figures from
the same run.

Run: .venv/bin/python benchmarks/bench_message_cost.py [--rounds 7] [--count 400] [--compare DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SIZES = {"16 x u64": 16, "64 KiB": 8192}      # SumChunk entries
JOB_ID = "bench-message-cost"
READY_TIMEOUT_S = 60.0
PSTATS_ENV = "FEDPEER_BENCH_PSTATS"          # set by --pstats: where the sites write their profiles
COUNT_MAX = 1024                             # the mailbox holds this many untaken messages per sender


# -- one site (a child process) ------------------------------------------------------------------

async def _site(config_path: str, role: str) -> None:
    import cProfile
    import pstats

    import numpy as np

    from fedpeer.config.load import load
    from fedpeer.daemon.node import Node
    from fedpeer.daemon.warmup import tune_gc
    from fedpeer.identity import load_key_file
    from fedpeer.jobs.lifecycle.nodechannel import NodeChannel
    from fedpeer.jobs.records import JobRecord
    from fedpeer.protocols.securesum.wire import SumChunk

    config = load(config_path)
    identity = load_key_file(config.node.key_file, config.path)
    tune_gc()
    node = Node(config, identity)
    stop = asyncio.Event()
    running = asyncio.create_task(node.run(stop))
    peer = config.peers[0].public_key
    members = tuple(sorted((node.me, peer)))
    record = JobRecord(id=JOB_ID, kind="stats", params={}, proposer=members[0], members=members,
                       created_ms=node.now_ms(), state="running", stored=False)
    node.jobs.jobs[JOB_ID] = record
    ch = NodeChannel(node.jobs, record)
    started = time.monotonic()
    while not node.alive(peer):
        if time.monotonic() - started > READY_TIMEOUT_S or running.done():
            raise SystemExit(f"{role}: the peer never came alive")
        await asyncio.sleep(0.05)
    print(json.dumps({"ready": role}), flush=True)

    def report(doc: dict) -> None:
        print(json.dumps(doc), flush=True)

    async def sends(count: int, msg: SumChunk) -> None:
        for _ in range(count):
            await ch.send(peer, msg)

    async def recvs(count: int) -> None:
        for _ in range(count):
            await ch.recv(SumChunk, "m", peer, 60_000)

    async def measured(cmd: dict, work) -> dict:
        """Run `work` (a coroutine not started yet): its calls, or its CPU seconds."""
        profile = cmd["profile"]
        prof = cProfile.Profile() if profile else None
        cpu = time.process_time()
        if prof is not None:
            prof.enable()
        await work
        if prof is not None:
            prof.disable()
        cpu = time.process_time() - cpu
        if prof is not None and os.environ.get(PSTATS_ENV):
            prof.dump_stats(f"{os.environ[PSTATS_ENV]}/{role}-{cmd['entries']}-{os.getpid()}.pstats")   # the last
        return {"calls": pstats.Stats(prof).total_calls} if prof is not None else {"cpu_s": cpu}

    loop = asyncio.get_running_loop()
    if role == "sender":
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line.strip():
                break
            cmd = json.loads(line)
            count, entries = cmd["count"], cmd["entries"]
            await ch.send(peer, SumChunk("go", np.array([count], dtype=np.uint64)))
            doc = await measured(cmd, sends(count, SumChunk("m", np.arange(entries, dtype=np.uint64))))
            await ch.recv(SumChunk, "done", peer, 60_000)
            report(doc)
    else:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line.strip():
                break
            cmd = json.loads(line)
            await ch.recv(SumChunk, "go", peer, 60_000)
            doc = await measured(cmd, recvs(cmd["count"]))
            report(doc)
            await ch.send(peer, SumChunk("done", np.zeros(1, dtype=np.uint64)))
    stop.set()
    await running


def site_main(config_path: str, role: str) -> None:
    asyncio.run(_site(config_path, role))


# -- the parent: pairs of sites, interleaved batches ------------------------------------------------

class Pair:
    """Two daemons (sender, receiver) of one source tree."""

    def __init__(self, label: str, tree: Path, workdir: Path) -> None:
        from fedpeer.app.harness.federation import Harness

        self.label = label
        h = Harness(workdir, 2, settings={"jobs": {"preload_ml": False}}, zygote=None)
        h.create()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.procs = {}
        for role, site in (("receiver", h.sites[1]), ("sender", h.sites[0])):
            log = open(site.log_path, "ab")
            self.procs[role] = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--site", str(site.config_path), role],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True, cwd=site.dir)
            log.close()

    def read(self, role: str) -> dict:
        line = self.procs[role].stdout.readline()
        if not line:
            raise SystemExit(f"{self.label} {role} ended (see its site's log)")
        return json.loads(line)

    def ready(self) -> None:
        for role in self.procs:
            assert self.read(role) == {"ready": role}

    def batch(self, entries: int, count: int, profile: bool) -> tuple[dict, dict]:
        cmd = json.dumps({"count": count, "entries": entries, "profile": profile}) + "\n"
        for role in ("receiver", "sender"):
            self.procs[role].stdin.write(cmd)
            self.procs[role].stdin.flush()
        return self.read("sender"), self.read("receiver")

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stdin.close()
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--count", type=int, default=400, help="messages per batch")
    parser.add_argument("--compare", type=Path, action="append", default=[],
                        help="another source tree run beside this one (repeatable)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pstats", type=Path, help="each site writes its last profiled batch here "
                        "(<role>-<entries>-<pid>.pstats: read with python -m pstats)")
    parser.add_argument("--site", nargs=2, metavar=("CONFIG", "ROLE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.site:
        site_main(*args.site)
        return
    if not 1 <= args.count <= COUNT_MAX:
        parser.error(f"--count must be in [1, {COUNT_MAX}]")
    if args.pstats:
        args.pstats.mkdir(parents=True, exist_ok=True)
        os.environ[PSTATS_ENV] = str(args.pstats.resolve())
    sys.path.insert(0, str(HERE))
    trees = [("this tree", HERE), *((str(t), t.resolve()) for t in args.compare)]
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="fedpeer-msgcost-") as tmp:
        pairs = [Pair(label, tree, Path(tmp) / f"pair{i}") for i, (label, tree) in enumerate(trees)]
        try:
            for pair in pairs:
                pair.ready()
            for pair in pairs:                       # warm: sessions open, code paths run once
                for entries in SIZES.values():
                    pair.batch(entries, 50, False)
            for r in range(args.rounds):
                order = pairs if r % 2 == 0 else pairs[::-1]
                for name, entries in SIZES.items():
                    for profile in (False, True):
                        for pair in order:
                            sent, got = pair.batch(entries, args.count, profile)
                            cell = results.setdefault(pair.label, {}).setdefault(name, {})
                            what = "calls" if profile else "cpu_s"
                            for side, doc in (("sender", sent), ("receiver", got)):
                                cell.setdefault(side, {}).setdefault(what, []).append(doc[what] / args.count)
        finally:
            for pair in pairs:
                pair.close()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.rounds} rounds of {args.count} messages per batch; median (best)")
    print(f"{'tree':<28} {'message':<10} {'side':<9} {'calls/msg':>18} {'µs/msg':>18}")
    for label, by_size in results.items():
        for name, by_side in by_size.items():
            for side, m in by_side.items():
                calls, cpu = m["calls"], [c * 1e6 for c in m["cpu_s"]]
                print(f"{label:<28} {name:<10} {side:<9} {statistics.median(calls):>10.0f} ({min(calls):>5.0f})"
                      f" {statistics.median(cpu):>10.1f} ({min(cpu):>5.1f})")


if __name__ == "__main__":
    main()
