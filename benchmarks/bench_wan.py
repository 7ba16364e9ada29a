"""A WAN bench anyone can run: real daemons behind userspace proxies that delay and pace, histogram
XGBoost, bagging, exact logreg, kmeans and stats over 5 and 10 daemons, against the in-process
reference on the same rows, measured side by side in one run (issue "Exact XGBoost at the speed of
the link", item 4).

The network. Every daemon listens on a free loopback port and advertises instead the port of its
own proxy (`Harness(advertise=...)`): every peer reaches site i only through proxy i, an asyncio TCP
forwarder in this process (its own thread and event loop, so the bench's work never stalls it).
A connection through proxy i has two directions, and each is charged to the site that sends it:
  * bytes from the connecting site c to site i go on c's uplink, bytes from i back to c on i's
    uplink. Which site c is, the proxy reads where any network observer can: the first request on
    a connection is a frame or a session hello, and both start with 4 magic bytes and the sender's
    public key in clear (a connection whose sender it cannot read is forwarded unpaced and counted
    as "unattributed", printed with the results). The proxy connects on to site i from c's own
    loopback address (127.0.1.<c+1>), as different sites have different addresses on a real
    network (a daemon budgets unauthenticated connections per address);
  * a site's uplink is one FIFO serial line of `--uplink-mbit` (default 100 Mbit/s) shared by
    everything the site sends — its requests to every peer and its answers to every peer's
    requests: a chunk of n bytes leaves when the line is free and takes n * 8 / rate seconds; a
    reader takes the next chunk from the socket only when the line has less than 10 ms of backlog
    (the sender's socket buffer fills up, as behind a slow link);
  * every chunk arrives `--delay-ms` (default 25 ms, one way) after it left the line; a new
    connection's first bytes leave one round trip after it was accepted (the TCP handshake);
  * `--downlink-mbit R` (default 0: no cap): each site's downlink is a FIFO serial line of R too,
    shared by everything the site receives; a chunk is handed over once it has arrived and the
    downlink has carried it (store and forward per chunk of at most 64 KiB: a lone flow through
    both lines takes one chunk's time more than through one);
  * `--loss P`: each 1448-byte segment of a chunk is lost with probability P; a chunk with a loss
    sends the lost segments again (line time) and arrives one round trip later, holding back what
    follows it on the connection (in order, as TCP). A light model: no congestion-window reaction,
    so real TCP at the same loss is slower.
So site i's uplink carries exactly what site i sends, whoever opened the connection, and every
byte in both directions is delayed by the one-way delay. Nothing else of TCP is modelled (no slow
start, no window limit: at 100 Mbit/s x 50 ms, 625 KB in flight). The check printed first: 1 MiB
on an open connection through the proxy (a raw socket to a sink that answers one byte) takes
8 * 2^20 / rate + one round trip (83.9 + 50 = 133.9 ms by default), a new connection one round trip
more; then `fedpeer ping` of 1 MiB between two daemons (the same, plus sealing and opening).
Everything is on 127.0.0.0/8, on ports the kernel picks; every wait is bounded (--timeout-s per
job, --startup-timeout-s for the daemons) and the bench stops its daemons and proxies itself.

The jobs, per federation size (`--sizes`, default 5 and 10), on one make_classification data set
of `--rows` rows (default 20,000) x `--features` (20) split evenly over the sites (the daemons read
it at every job); every job test_fraction 0 (all rows train), each kind's own default secure_sum
(--secure-sum forces one for all), nthread 1:
  - xgboost hist: `--trees` trees (5), depth 6, max_bin 256, eta 0.3; reference: xgboost.train
    (tree_method hist, 1 thread) on the pooled rows, per tree;
  - xgboost bagging: `--trees` rounds, one tree per site and round, normalize samples (with none,
    the trees of 10 sites overshoot: leaves beyond leaf_abs_max by round 5, refused); reference:
    `--trees` trees on each site's rows, one site after the other, per round;
  - logreg exact: C 1, tol 1e-8 (Newton); reference: scikit-learn LogisticRegression
    (newton-cholesky, same C and tol) on the pooled standardised rows, per iteration;
  - kmeans: k `--k` (5) from the first k rows, `--kmeans-rounds` (6) Lloyd rounds, tol 0;
    reference: scikit-learn KMeans (lloyd, the same initial centres) on the pooled rows, per round;
  - stats: one job (two secure sums); reference: numpy mean, std and the same histograms (10 bins
    between mean -+ 3 sd, one below, one above) on the pooled rows.
References run in this process, one thread (xgboost nthread 1, BLAS limited to 1 thread: with
more, scikit-learn's logreg ran 300 times slower on a busy 2-core machine), best of 3, before
the daemons of that size start.
Reported per kind (a table per size): the unit (tree, round, iteration; stats: the job), units
timed / done, seconds per unit (median; a unit ends when the proposer's progress step goes up in
the kind's own phase, polled every 25 ms, so the job's setup — data load, first imports, cut
points — and its wrap-up are not in it; stats: the job's elapsed_s), bytes sent per site per unit,
max and mean over sites, over the same stretch (frames the peers accepted, from every daemon's
status at the first and the last timed step: what `fedpeer harness --json` reports as
bytes_sent; membership included), the busiest site's link use (its bytes per unit at the uplink's
rate over the seconds per unit: 100 % is a job at the speed of its busiest link), the
reference's seconds per unit and the ratio; then the whole
job: seconds (slowest member, proposal -> done), bytes sent per site (max) from the daemons'
status, and what the proxies put on the busiest uplink (HTTP heads, hellos and answers included).
The last line is the whole output as JSON.

Run: .venv/bin/python benchmarks/bench_wan.py [--sizes 5 10] [--delay-ms 25] [--uplink-mbit 100]
     [--loss 0] [--rows 20000] [--features 20] [--trees 5] [--kinds hist bagging logreg kmeans stats]
--uplink-mbit 0 and --delay-ms 0: the proxies only forward (the same jobs at loopback speed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness, traffic_delta  # noqa: E402
from fedpeer.daemon import admin  # noqa: E402
from fedpeer.identity import PUBLIC_KEY_BYTES, parse_public_key  # noqa: E402
from fedpeer.wire.frame import MAGIC as FRAME_MAGIC  # noqa: E402
from fedpeer.wire.session import HELLO_MAGIC  # noqa: E402

HOST = "127.0.0.1"
CHUNK = 64 * 1024          # bytes a proxy reads from a socket at once
LEAD_S = 0.010             # a reader reads on while its site's line has less backlog than this
MSS = 1448                 # bytes per TCP segment, for --loss
PEEK_BYTES_MAX = 16 * 1024  # a connection's first request must show its sender within this many bytes
SENDER_AT = 4              # where the sender's public key starts in a frame or hello (after the magic)
POLL_S = 0.025             # how often the proposer's progress is read
CLOSE_WAIT_S = 5.0
DATA = {"label": "label", "positive": "1", "ignore": [], "missing": "error"}
KINDS = ("hist", "bagging", "logreg", "kmeans", "stats")


# -- the network ------------------------------------------------------------------------------


class Line:
    """One site's uplink: a FIFO serial line shared by everything the site sends."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s      # 0: no cap
        self.free_at = 0.0
        self.bytes = 0

    def send(self, n: int, now: float) -> float:
        """Put n bytes on the line; when the last of them has left."""
        self.bytes += n
        if not self.rate:
            return now
        self.free_at = max(now, self.free_at) + n / self.rate
        return self.free_at


@dataclass
class Wan:
    """One proxy per site, in its own thread and event loop; `addresses[i]` is where the others
    reach site i; `connect(ports, keys)` says where site i really listens and its public key."""
    n: int
    delay_s: float
    bytes_per_s: float
    loss: float = 0.0
    down_bytes_per_s: float = 0.0
    seed: int = 0
    addresses: list[str] = field(default_factory=list)
    cut: frozenset[int] = frozenset()         # two sites that cannot connect to each other, either way
    unattributed_bytes: int = 0
    connections: int = 0

    def __post_init__(self) -> None:
        self.lines = [Line(self.bytes_per_s) for _ in range(self.n)]
        self.downlines = [Line(self.down_bytes_per_s) for _ in range(self.n)]
        self.free = Line(0)                       # what no site could be found for: unpaced
        self._ports: list[int | None] = [None] * self.n
        self._sites: dict[bytes, int] = {}        # raw public key -> site
        self._rng = random.Random(self.seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan-proxies", daemon=True)
        self._thread.start()
        self._servers = self._call(self._listen())
        self.addresses = [f"{HOST}:{s.sockets[0].getsockname()[1]}" for s in self._servers]

    def _call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _listen(self) -> list[asyncio.Server]:
        return [await asyncio.start_server(lambda r, w, i=i: self._forward(i, r, w), HOST, 0) for i in range(self.n)]

    def connect(self, ports: list[int | None], keys: list[bytes | None]) -> None:
        async def set_() -> None:
            self._ports = list(ports)
            self._sites = {key: i for i, key in enumerate(keys) if key is not None}
        self._call(set_())

    def uplink_bytes(self) -> list[int]:
        return [line.bytes for line in self.lines]

    def close(self) -> None:
        """Stop listening, end every connection, stop the thread."""
        async def stop() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
        with contextlib.suppress(Exception):
            self._call(stop(), 2 * CLOSE_WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_WAIT_S)
        if not self._thread.is_alive():
            self._loop.close()

    # -- one connection -----------------------------------------------------------------------

    async def _forward(self, i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        accepted = loop.time()
        self.connections += 1
        upstream = None
        try:
            first = await _first_request(reader)
            port = self._ports[i]
            if not first or port is None:
                return
            source = self._sites.get(sender_key(first))
            if source is not None and {source, i} == self.cut:
                # a firewall between the pair: the connection is reset once it shows who opened it
                writer.transport.abort()
                return
            # from the sending site's own address, as on a real network (a daemon's budgets of
            # unauthenticated connections are per IP address: one address for all would shed them)
            up_reader, upstream = await asyncio.open_connection(
                HOST, port, local_addr=(source_address(source), 0) if source is not None else None)
            up_line = self.lines[source] if source is not None else self.free
            back_down = self.downlines[source] if source is not None else self.free
            await asyncio.gather(
                self._pump(reader, upstream, up_line, accepted + 2 * self.delay_s, source is None, first,
                           self.downlines[i]),
                self._pump(up_reader, writer, self.lines[i], 0.0, False, down=back_down))
        except (OSError, asyncio.CancelledError):   # a reset, or the bench's stop: a handler task ends quietly
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: Line,
                    not_before: float, unattributed: bool, first: bytes = b"", down: Line | None = None) -> None:
        """One direction: read, put on the sender's line, deliver after the delay (and through the
        receiver's downlink `down`, if capped), in order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                at, data = item
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                writer.write(data)
                await writer.drain()
            with contextlib.suppress(OSError, RuntimeError):
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()

        delivering = asyncio.ensure_future(deliver())
        try:
            if not_before > loop.time():
                await asyncio.sleep(not_before - loop.time())
            data = first or await reader.read(CHUNK)
            while data:                  # ends at EOF (or a reset, or the bench's stop)
                if unattributed:
                    self.unattributed_bytes += len(data)
                left = line.send(len(data), loop.time())
                arrives = left + self.delay_s
                if self.loss:
                    lost = sum(self._rng.random() < self.loss for _ in range(math.ceil(len(data) / MSS)))
                    if lost:
                        left = line.send(lost * MSS, left)
                        arrives = left + 3 * self.delay_s      # detected a round trip later, sent again
                if down is not None and down.rate:
                    arrives = down.send(len(data), arrives)
                queue.put_nowait((arrives, data))
                if left - LEAD_S > loop.time():
                    await asyncio.sleep(left - LEAD_S - loop.time())
                data = await reader.read(CHUNK)
        except asyncio.CancelledError:
            delivering.cancel()
            raise
        finally:
            queue.put_nowait(None)
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await delivering


async def _first_request(reader: asyncio.StreamReader) -> bytes:
    """A connection's first bytes, read until its first request's head and the start of its body
    (or PEEK_BYTES_MAX, or EOF)."""
    buf = b""
    while len(buf) < PEEK_BYTES_MAX:
        end = buf.find(b"\r\n\r\n")
        if end >= 0 and len(buf) >= end + 4 + SENDER_AT + PUBLIC_KEY_BYTES:
            break
        chunk = await reader.read(CHUNK)
        if not chunk:
            break
        buf += chunk
    return buf


def sender_key(first: bytes) -> bytes | None:
    """The sender's public key of the first request on a connection: a frame and a hello both start
    with 4 magic bytes and the sender's key, in clear (fedpeer/wire/frame.py, fedpeer/wire/session.py)."""
    end = first.find(b"\r\n\r\n")
    body = first[end + 4:] if end >= 0 else b""
    if body[:SENDER_AT] not in (FRAME_MAGIC, HELLO_MAGIC) or len(body) < SENDER_AT + PUBLIC_KEY_BYTES:
        return None
    return body[SENDER_AT:SENDER_AT + PUBLIC_KEY_BYTES]


def source_address(site: int) -> str:
    """The loopback address site `site`'s connections come from, as the proxies forward them."""
    return f"127.0.1.{site + 1}"


def calibrate(delay_s: float, bytes_per_s: float, repeats: int = 5) -> dict:
    """1 MiB through a proxy to a sink that answers one byte once it has it all, on an open
    connection; and a small first request (a frame's magic and a made-up sender key, so the proxy
    paces it as this process's site) and one byte back on a new connection, the handshake's round
    trip included; medians, and what the model says."""
    size = 1 << 20
    sink = socket.socket()
    sink.bind((HOST, 0))
    sink.listen(8)
    sink.settimeout(30)

    def take(conn: socket.socket, want: int) -> None:
        while want > 0:
            chunk = conn.recv(min(1 << 16, want))
            if not chunk:
                raise ConnectionError("the proxy closed the connection")
            want -= len(chunk)

    key = bytes(range(PUBLIC_KEY_BYTES))          # "site 0", this process
    body = FRAME_MAGIC + key + b"w"
    first = b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def serve() -> None:      # per connection: a small first request, then `repeats` messages of 1 MiB, each answered
        with contextlib.suppress(OSError):
            for _ in range(repeats):
                conn, _ = sink.accept()
                with conn:
                    conn.settimeout(30)
                    for want in [len(first)] + [size] * repeats:
                        take(conn, want)
                        conn.sendall(b"k")
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    wan = Wan(2, delay_s, bytes_per_s)
    wan.connect([None, sink.getsockname()[1]], [key, None])
    host, port = wan.addresses[1].split(":")
    payload = os.urandom(size)
    warm, cold = [], []
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            with socket.create_connection((host, int(port)), timeout=30) as c:
                c.sendall(first)
                take(c, 1)
                cold.append(time.perf_counter() - started)
                for _ in range(repeats):
                    started = time.perf_counter()
                    c.sendall(payload)
                    take(c, 1)
                    warm.append(time.perf_counter() - started)
    finally:
        wan.close()
        sink.close()
        server.join(CLOSE_WAIT_S)
    model = (size / bytes_per_s if bytes_per_s else 0.0) + 2 * delay_s
    return {"open_ms": round(statistics.median(warm) * 1000, 1), "model_ms": round(model * 1000, 1),
            "new_connection_small_ms": round(statistics.median(cold) * 1000, 1),
            "new_connection_model_ms": round(4 * delay_s * 1000, 1),
            "unattributed_bytes": wan.unattributed_bytes}


# -- data and references ----------------------------------------------------------------------


def make_data(tmp: Path, rows: int, features: int, sites: int) -> tuple[list[Path], np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification
    X, y = make_classification(n_samples=rows, n_features=features, n_informative=features // 2, random_state=7)
    per = rows // sites
    header = ",".join([f"f{j}" for j in range(features)] + ["label"])
    paths = []
    for k in range(sites):
        path = tmp / f"site{k}.csv"
        np.savetxt(path, np.column_stack([X[k * per:(k + 1) * per], y[k * per:(k + 1) * per]]), delimiter=",",
                   header=header, comments="", fmt=["%.17g"] * features + ["%d"])
        paths.append(path)
    return paths, X[:per * sites], y[:per * sites]


XGB = {"max_depth": 6, "eta": 0.3, "max_bin": 256, "reg_lambda": 1.0, "min_child_weight": 1.0}


def _timed(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    """Best of `repeats` (the first call pays for lazy imports and warm-up)."""
    best, out = math.inf, None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def reference(kind: str, X: np.ndarray, y: np.ndarray, sites: int, args: argparse.Namespace) -> float:
    """The in-process reference's seconds per unit on the same rows."""
    if kind in ("hist", "bagging"):
        import xgboost as xgb
        params = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": XGB["max_depth"],
                  "eta": XGB["eta"], "max_bin": XGB["max_bin"], "lambda": 1.0, "min_child_weight": 1.0,
                  "nthread": 1}
        if kind == "hist":
            seconds, _ = _timed(lambda: xgb.train(params, xgb.DMatrix(X, label=y, nthread=1), args.trees))
            return seconds / args.trees
        per = len(X) // sites
        parts = [(X[k * per:(k + 1) * per], y[k * per:(k + 1) * per]) for k in range(sites)]
        seconds, _ = _timed(lambda: [xgb.train(params, xgb.DMatrix(a, label=b, nthread=1), args.trees)
                                     for a, b in parts])
        return seconds / args.trees
    if kind == "logreg":
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        def fit() -> Any:
            return LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-8, max_iter=100).fit(
                StandardScaler().fit_transform(X), y)
        seconds, model = _timed(fit)
        return seconds / max(1, int(model.n_iter_[0]))
    if kind == "kmeans":
        from sklearn.cluster import KMeans
        init = np.round(X[:args.k], 2)
        seconds, model = _timed(lambda: KMeans(args.k, init=init, n_init=1, max_iter=args.kmeans_rounds, tol=0.0,
                                               algorithm="lloyd").fit(X))
        return seconds / max(1, int(model.n_iter_))
    assert kind == "stats", kind

    def stats() -> None:
        mean, std = X.mean(axis=0), X.std(axis=0, ddof=1)
        for j in range(X.shape[1]):
            edges = np.linspace(mean[j] - 3 * std[j], mean[j] + 3 * std[j], 11)
            np.histogram(X[:, j], bins=np.concatenate([[-np.inf], edges, [np.inf]]))
        (y == 1).mean()
    seconds, _ = _timed(stats)
    return seconds


def job_params(kind: str, X: np.ndarray, args: argparse.Namespace) -> tuple[str, dict, str]:
    """(job kind, parameters, unit)."""
    mode = {"secure_sum": args.secure_sum} if args.secure_sum else {}     # else: each kind's default
    common = {"test_fraction": 0.0, **mode}
    if kind == "hist":
        return "xgboost", {**common, **XGB, "mode": "histogram", "rounds": args.trees, "nthread": 1}, "tree"
    if kind == "bagging":
        return "xgboost", {**common, **XGB, "mode": "bagging", "rounds": args.trees, "nthread": 1,
                           "normalize": "samples"}, "round"
    if kind == "logreg":
        return "logreg", {**mode, "mode": "exact", "C": 1.0, "tol": 1e-8, "test_fraction": 0.0}, "iteration"
    if kind == "kmeans":
        init = ";".join(",".join(f"{v:.2f}" for v in row) for row in X[:args.k])
        return "kmeans", {**mode, "k": args.k, "init": init, "n_init": 1,
                          "max_iter": args.kmeans_rounds, "tol": 0.0}, "round"
    return "stats", dict(mode), "job"


def units_done(kind: str, result: dict) -> int:
    return {"hist": result.get("trees"), "bagging": result.get("rounds"), "logreg": result.get("iterations"),
            "kmeans": result.get("iterations"), "stats": 1}[kind] or 1


# -- one federation -----------------------------------------------------------------------------


UNIT_PHASE = {    # the proposer's progress phase that marks a unit (the secure sums report phases of their own)
    "hist": re.compile(r"histogram mode: round \d+ of \d+"), "bagging": re.compile(r"round \d+ of \d+"),
    "logreg": re.compile(r"logreg: iteration \d+"), "kmeans": re.compile(r"\w+ round \d+"),
}


@dataclass
class Mark:
    t: float
    step: int
    reading: asyncio.Task      # every site's traffic (`Harness.traffic`), read while the poll goes on

    async def sent(self, n_sites: int) -> list[int]:
        """Bytes each site had sent to its peers at this mark (from its status)."""
        traffic = await self.reading
        return [sum(p["sent"] for p in traffic[i]["by_peer"].values()) if traffic[i] else 0 for i in range(n_sites)]


async def watch_progress(h: Harness, job_id: str, kind: str, marks: list[Mark],
                         done: asyncio.Event) -> None:
    """Note each unit's end at the proposer (its progress step goes up in the kind's own phase),
    with every site's bytes sent so far, until `done` is set."""
    pattern = UNIT_PHASE.get(kind)
    while pattern is not None and not done.is_set():
        record = await h.job(0, job_id)
        if (record is not None and record["state"] == "running" and pattern.fullmatch(record["phase"])
                and record["progress"]["step"] >= 1 and (not marks or record["progress"]["step"] > marks[-1].step)):
            marks.append(Mark(time.monotonic(), record["progress"]["step"], asyncio.create_task(h.traffic())))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), POLL_S)


async def per_unit(marks: list[Mark], n_sites: int) -> tuple[list[float], list[float]] | None:
    """Seconds of each unit between the first and the last mark (a gap of k steps counts as k
    units of equal length), and each site's bytes sent per unit over that stretch; None with fewer
    than two marks. The job's setup before the first mark and its wrap-up after the last are not
    in them."""
    if len(marks) < 2:
        return None
    seconds = []
    for a, b in zip(marks, marks[1:]):
        seconds.extend([(b.t - a.t) / (b.step - a.step)] * (b.step - a.step))
    units = marks[-1].step - marks[0].step
    sent = [(b - a) / units for a, b in zip(await marks[0].sent(n_sites), await marks[-1].sent(n_sites))]
    return seconds, sent


async def run_one(h: Harness, wan: Wan, kind: str, X: np.ndarray, args: argparse.Namespace) -> dict:
    name, params, unit = job_params(kind, X, args)
    before, wire_before = await h.traffic(), wan.uplink_bytes()
    job_id = await h.propose(0, name, params)
    marks: list[Mark] = []
    done = asyncio.Event()
    watcher = asyncio.create_task(watch_progress(h, job_id, kind, marks, done))
    try:
        records = await h.wait_job(job_id, args.timeout_s)
    finally:
        done.set()
        await watcher
        await asyncio.gather(*(m.reading for m in marks), return_exceptions=True)
    after, wire_after = await h.traffic(), wan.uplink_bytes()
    bad = {h.sites[i].name: (r or {}).get("error") for i, r in records.items() if not r or r["state"] != "done"}
    if bad:
        return {"kind": kind, "unit": unit, "error": str(bad)}
    units = units_done(kind, records[0]["result"])
    job_s = max(r["elapsed_s"] for r in records.values())
    job_sent = [traffic_delta(before[i], after[i])["bytes_sent"] for i in range(h.n_sites)]
    wire = [b - a for a, b in zip(wire_before, wire_after)]
    steady = await per_unit(marks, h.n_sites)
    if steady is None:     # stats, or too few marks: the whole job over its units
        seconds, sent = [job_s / units], [b / units for b in job_sent]
    else:
        seconds, sent = steady
    return {"kind": kind, "unit": unit, "units": units, "units_timed": len(seconds),
            "s_per_unit": round(statistics.median(seconds), 4), "job_s": job_s,
            "sent_per_site_per_unit": {"max": int(max(sent)), "mean": int(statistics.mean(sent))},
            "link_use": (round(max(sent) / wan.bytes_per_s / statistics.median(seconds), 3)
                         if wan.bytes_per_s else None),
            "job_sent_per_site": {"max": max(job_sent), "mean": int(statistics.mean(job_sent))},
            "job_wire_per_site_max": max(wire), "job_wire_per_site": wire}


async def federation(sites: int, tmp: Path, paths: list[Path], X: np.ndarray, args: argparse.Namespace,
                     cut: frozenset[int] = frozenset()) -> dict:
    wan = Wan(sites, args.delay_ms / 1000, args.uplink_mbit * 1e6 / 8, args.loss, args.seed,
              args.downlink_mbit * 1e6 / 8)
    wan.cut = cut
    # with --cut, both variants' sites hold the same keys: the same ring order, the same roles in each job
    h = Harness(tmp / f"fed{sites}{'-cut' if cut else ''}", sites, settings={"jobs": {"preload_ml": False}},
                site_data=paths, data_settings=DATA, advertise=wan.addresses,
                key_seed=KEY_SEED if args.cut else None)
    out: dict[str, Any] = {"sites": sites, "rows": [], "cut": sorted(cut)}
    try:
        h.create()
        wan.connect([s.port for s in h.sites], [parse_public_key(s.public_key) for s in h.sites])
        h.start()
        out["startup_s"] = round(await h.wait_all_alive(args.startup_timeout_s), 2)
        ping = await admin.request(h.sites[0].config, "POST", "/v1/diag/ping",
                                   {"peer": h.sites[1].name, "count": 3, "payload_bytes": 1 << 20},
                                   timeout_ms=60_000)
        out["ping_1mib_ms"] = round(statistics.median(ping["delivery_ms"]), 1)
        for kind in args.kinds:
            row = await run_one(h, wan, kind, X, args)
            print(f"  {sites} sites: {kind} {row.get('s_per_unit', row.get('error'))}", file=sys.stderr)
            out["rows"].append(row)
    finally:
        h.stop()
        wan.close()
    out["unattributed_bytes"] = wan.unattributed_bytes
    out["proxied_connections"] = wan.connections
    return out


# -- output ---------------------------------------------------------------------------------


KEY_SEED = 1


def size(n: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def report(fed: dict, refs: dict[str, float]) -> str:
    from fedpeer.jobs.report import table
    rows = [("KIND", "UNIT", "UNITS", "S/UNIT", "SENT/SITE/UNIT MAX", "MEAN", "LINK USE", "REF S/UNIT", "x REF",
             "JOB S", "JOB SENT/SITE MAX", "WIRE MAX")]
    failed = []
    for r in fed["rows"]:
        if "error" in r:
            rows.append((r["kind"], r["unit"], "-", "failed", *["-"] * 8))
            failed.append(f"  {r['kind']} failed: {r['error'][:300]}")
            continue
        ref, link = refs[r["kind"]], r.get("link_use")
        rows.append((r["kind"], r["unit"], f"{r['units_timed']}/{r['units']}", f"{r['s_per_unit']:.3f}",
                     size(r["sent_per_site_per_unit"]["max"]), size(r["sent_per_site_per_unit"]["mean"]),
                     "-" if link is None else f"{link:.0%}", f"{ref:.4f}", f"{r['s_per_unit'] / ref:.1f}",
                     f"{r['job_s']:.1f}", size(r["job_sent_per_site"]["max"]), size(r["job_wire_per_site_max"])))
    head = (f"{fed['sites']} sites (all alive after {fed.get('startup_s')} s; fedpeer ping of 1 MiB: "
            f"{fed.get('ping_1mib_ms')} ms; unattributed bytes: {fed.get('unattributed_bytes')})")
    if fed.get("unattributed_bytes"):
        failed.append(f"  WARNING: {fed['unattributed_bytes']} bytes went through unpaced: the proxies could not "
                      "read their sender (has the frame or hello header changed? see sender_key)")
    return "\n".join([head, table(rows, "  "), *failed])


async def main(args: argparse.Namespace) -> dict:
    out: dict[str, Any] = {"setup": {k: v for k, v in vars(args).items()}, "cpus": os.cpu_count()}
    out["calibration"] = c = calibrate(args.delay_ms / 1000, args.uplink_mbit * 1e6 / 8)
    print(f"one-way delay {args.delay_ms} ms, uplink {args.uplink_mbit} Mbit/s per site, downlink "
          f"{args.downlink_mbit or 'uncapped'}{' Mbit/s' if args.downlink_mbit else ''}, loss {args.loss}; "
          f"checked without loss: 1 MiB on an open connection through a proxy: {c['open_ms']} ms "
          f"(model {c['model_ms']} ms); "
          f"a small request on a new connection: {c['new_connection_small_ms']} ms "
          f"(model {c['new_connection_model_ms']} ms)")
    out["federations"] = []
    with tempfile.TemporaryDirectory(prefix="fedpeer-wan-") as tmp_name:
        tmp = Path(tmp_name)
        for sites in args.sizes:
            (tmp / f"data{sites}").mkdir()
            paths, X, y = make_data(tmp / f"data{sites}", args.rows, args.features, sites)
            from threadpoolctl import threadpool_limits
            with threadpool_limits(1):     # BLAS threads on a busy 2-core machine: 300x slower logreg
                refs = {kind: reference(kind, X, y, sites, args) for kind in args.kinds}
            if args.cut:
                out["relayed_pair"] = await relayed_pair(sites, tmp, paths, X, args)
                continue
            fed = await federation(sites, tmp, paths, X, args)
            fed["reference_s_per_unit"] = {k: round(v, 5) for k, v in refs.items()}
            out["federations"].append(fed)
            print(report(fed, refs), flush=True)
    return out


async def relayed_pair(sites: int, tmp: Path, paths: list[Path], X: np.ndarray, args: argparse.Namespace) -> dict:
    """The same jobs on the flat WAN and with sites --cut A B unable to connect (members relay their
    frames), alternating `--repeats` times: per kind, the medians' ratios of seconds per unit and of
    the bytes the cut pair put on its uplinks (what relaying adds to the pair's own sends; the relay's
    extra uplink bytes are printed beside)."""
    a, b = (x - 1 for x in args.cut)
    runs: dict[str, list[dict]] = {"flat": [], "relayed": []}
    for _ in range(args.repeats):
        for variant, cut in (("flat", frozenset()), ("relayed", frozenset({a, b}))):
            fed = await federation(sites, tmp, paths, X, args, cut)
            runs[variant].append(fed)
            print(f"  {sites} sites, {variant}: " + ", ".join(
                f"{r['kind']} {r.get('s_per_unit', 'failed: ' + str(r.get('error'))[:300])}" for r in fed["rows"]),
                file=sys.stderr, flush=True)
    out: dict[str, Any] = {"sites": sites, "pair": [a + 1, b + 1], "kinds": {}}
    lines = [("KIND", "S/UNIT FLAT", "S/UNIT RELAYED", "x", "PAIR BYTES FLAT", "RELAYED", "x", "RELAYS' EXTRA BYTES")]
    for kind in args.kinds:
        flat, relayed = ([r for fed in runs[v] for r in fed["rows"] if r["kind"] == kind and "error" not in r]
                         for v in ("flat", "relayed"))
        if not flat or not relayed:
            lines.append((kind, "failed", *["-"] * 6))
            continue
        s_flat = statistics.median(r["s_per_unit"] for r in flat)
        s_rel = statistics.median(r["s_per_unit"] for r in relayed)
        pair_flat = statistics.median(r["job_wire_per_site"][a] + r["job_wire_per_site"][b] for r in flat)
        pair_rel = statistics.median(r["job_wire_per_site"][a] + r["job_wire_per_site"][b] for r in relayed)
        others = [i for i in range(sites) if i not in (a, b)]
        extra = statistics.median(sum(r["job_wire_per_site"][i] for i in others) for r in relayed) - statistics.median(
            sum(r["job_wire_per_site"][i] for i in others) for r in flat)
        out["kinds"][kind] = {"s_per_unit": [s_flat, s_rel], "time_ratio": round(s_rel / s_flat, 3),
                              "pair_wire_bytes": [pair_flat, pair_rel], "bytes_ratio": round(pair_rel / pair_flat, 3),
                              "relays_extra_wire_bytes": extra}
        lines.append((kind, f"{s_flat:.3f}", f"{s_rel:.3f}", f"{s_rel / s_flat:.2f}", size(pair_flat), size(pair_rel),
                      f"{pair_rel / pair_flat:.3f}", size(extra)))
    from fedpeer.jobs.report import table
    print(f"{sites} sites, sites {a + 1} and {b + 1} cut both ways (relayed by members), {args.repeats} runs each "
          "alternating, medians:\n" + table(lines, "  "), flush=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[5, 10], help="federation sizes (daemons)")
    ap.add_argument("--delay-ms", type=float, default=25.0, help="one-way delay of every byte")
    ap.add_argument("--uplink-mbit", type=float, default=100.0, help="each site's uplink (0: no cap)")
    ap.add_argument("--downlink-mbit", type=float, default=0.0, help="each site's downlink (0: no cap)")
    ap.add_argument("--loss", type=float, default=0.0, help="probability a 1448-byte segment is lost")
    ap.add_argument("--rows", type=int, default=20_000, help="rows of the data set, split evenly over the sites")
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--trees", type=int, default=5, help="xgboost: trees (hist) and rounds (bagging); at least 3")
    ap.add_argument("--k", type=int, default=5, help="kmeans: clusters")
    ap.add_argument("--kmeans-rounds", type=int, default=6)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--secure-sum", choices=["ring", "pairwise", "allreduce"],
                    help="every job's secure-sum mode (default: each kind's own: histogram xgboost's is allreduce)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the loss draws")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="one job at most")
    ap.add_argument("--startup-timeout-s", type=float, default=180.0)
    ap.add_argument("--cut", type=int, nargs=2, metavar=("A", "B"),
                    help="compare with sites A and B (1-based) unable to connect to each other, relayed by members")
    ap.add_argument("--repeats", type=int, default=2, help="with --cut: runs of each variant, alternating")
    parsed = ap.parse_args()
    if not (0 <= parsed.loss < 1 and parsed.delay_ms >= 0 and parsed.uplink_mbit >= 0 and parsed.downlink_mbit >= 0
            and parsed.trees >= 3
            and all(2 <= s <= 100 for s in parsed.sizes)
            and (not parsed.cut or (parsed.cut[0] != parsed.cut[1]
                                    and all(1 <= c <= min(parsed.sizes) for c in parsed.cut)))):
        ap.error("need 0 <= --loss < 1, --delay-ms >= 0, --uplink-mbit >= 0, --trees >= 3, sizes in 2..100, "
                 "--cut two different sites of the smallest size")
    print(json.dumps(asyncio.run(main(parsed))))
