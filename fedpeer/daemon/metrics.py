"""Prometheus metrics of one node, in the text format .

Rules:
- One `CollectorRegistry` per node, never prometheus_client's global default: two nodes in one
  process (tests) must not mix their series, and no library registers anything behind our back.
- Nothing on the hot path updates a metric. `NodeCollector` reads the node at scrape time: the
  document `fedpeer status` shows (`node.status()`) and the job records (`node.jobs.list()`), so a
  scrape can never disagree with `status`, and a node that nobody scrapes pays nothing.
- Only what must be seen as it happens is a live metric: how long secure sums and training rounds
  take (Histograms): the secure sum calls its channel's `metrics.secure_sum_done`, and jobs call
  `observe_round` (fedpeer/runtime/channel.py), given their Channel; outside a daemon (unit tests,
  the simulator) the channel has no `metrics` and nothing happens, so protocol code stays free of
  the shell.
  Durations are measured with `ch.now_ms()`, the node's clock, never `time` directly.
- Label values are bounded by this site's own configuration and code: peer names from
  peers.toml, job kinds and states, our own rejection reasons — never words a peer sent. The one
  exception is bounded by count: a job's id (the proposer chose it) and the names of its
  history's metrics label `fedpeer_job_metric` / `fedpeer_job_round`, the gauges of the latest
  history point of the jobs running here (and of those that ended less than JOB_METRICS_LINGER_S
  ago, so that a short job's last values are scraped too): at most JOB_METRICS_JOBS_MAX jobs ×
  JOB_METRICS_PER_JOB_MAX metrics, names matching METRIC_LABEL, values escaped by the text format.
- Served as GET /metrics on the admin API (a unix socket by default) and, when `[node] metrics`
  names one, on a loopback-only TCP listener for a Prometheus that cannot read a unix socket. Both
  answer the 0.0.4 text format, the one every Prometheus version scrapes.

Fields of `node.status()` read here that the node may not fill yet (each peer's `sent_bytes`,
`received_bytes`, `frames_accepted`): their series are left out until it does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from fedpeer.base.logs import fields
from fedpeer.config.load import Address, is_loopback
from fedpeer.core.election.raft import Role
from fedpeer.core.membership.swim import MemberState
from fedpeer.errors import ConfigError
from fedpeer.jobs.records import STATES
from fedpeer.net.bounded import Bounded, close, local_runner, serve
from fedpeer.protocols.securesum.api import MODES as SECURE_SUM_MODES

try:   # prometheus_client >= 0.22 made CONTENT_TYPE_LATEST the 1.0.0 format; we write 0.0.4 text
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE
except ImportError:   # older versions: the latest *is* 0.0.4
    from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE

log = logging.getLogger("fedpeer.metrics")
T = TypeVar("T")

PREFIX = "fedpeer"
PATH = "/metrics"
# A sum of small vectors over loopback takes ms; a ring of slow sites with retries takes minutes
# (each hop is bounded by hop_timeout_ms, 10 s by default, times the members, times the attempts).
SECURE_SUM_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                              60.0, 120.0, 300.0)
# An xgboost round (broadcast, local training, trees back, commit) takes from 0.1 s on small data
# to many minutes on large shares; member_timeout_ms bounds it at 10 min by default.
ROUND_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                         1800.0)
JOB_STATES = STATES
PEER_STATES = tuple(s.value for s in MemberState)
ROLES = tuple(r.value for r in Role)
SENT_CLASSES = ("reliable", "best_effort")   # transport: jobs | membership and election
OUTCOMES = ("ok", "failed")
BROWSER_HEADERS = ("Origin", "Sec-Fetch-Site", "Sec-Fetch-Mode")   # only browsers send these
LOCAL_HOST_NAMES = ("localhost",)
JOB_METRICS_JOBS_MAX = 32          # jobs whose latest history point is exported (running first, newest first)
JOB_METRICS_PER_JOB_MAX = 16       # numbers of one point exported
JOB_METRICS_LINGER_S = 300         # an ended job's last point stays this long (a scrape every 15-60 s sees it)
STEP_KEYS = ("round", "iteration")  # a point's step (fedpeer_job_round), the first of these it has
METRIC_LABEL = re.compile(r"[a-z_][a-z0-9_]{0,63}")


class _JobLister(Protocol):
    def list(self) -> list[dict]: ...


class Observed(Protocol):
    """What the collector needs from a node (fedpeer/daemon/node.py Node has it)."""

    jobs: _JobLister

    def status(self) -> dict[str, Any]: ...


# ---------------------------------------------------------------------------------------------
# Scrape-time collector
# ---------------------------------------------------------------------------------------------

def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def _gauge(suffix: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(_name(suffix), doc, labels=list(labels))


def _counter(suffix: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    """`suffix` without `_total`: the family adds it to its sample."""
    return CounterMetricFamily(_name(suffix), doc, labels=list(labels))


def _by_label(family: Any, counts: Mapping[str, Any]) -> Any:
    for label, value in sorted(counts.items()):
        family.add_metric([str(label)], float(value))
    return family


class NodeCollector:
    """Builds every gauge and counter from one `status()` and one `jobs.list()` per scrape."""

    def __init__(self, node: Observed) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        status = self._node.status()
        yield from _node_families(status)
        yield from _peer_families(status.get("peers", []))
        yield from _traffic_families(status)
        yield from _reach_families(status)
        jobs = self._node.jobs.list()
        yield from _job_families(jobs, getattr(self._node.jobs, "kinds", {}))
        now_ms = getattr(self._node, "now_ms", None)
        yield from _job_metric_families(jobs, now_ms() if now_ms is not None else None)
        yield from _election_families(status)
        yield from _health_families(status)


def _node_families(status: dict[str, Any]) -> Iterator[Metric]:
    node = status.get("node", {})
    info = _gauge("node_info", "This site: always 1; its name and key fingerprint as labels",
                  ["name", "fingerprint"])
    info.add_metric([str(node.get("name", "")), str(node.get("fingerprint", ""))], 1.0)
    yield info
    if "uptime_s" in node:
        yield GaugeMetricFamily(_name("uptime_seconds"), "Seconds since this daemon started",
                                value=float(node["uptime_s"]))
    if "incarnation" in node:
        yield GaugeMetricFamily(_name("membership_incarnation"), "This site's incarnation (raised at "
                                "each start and to refute a suspicion)", value=float(node["incarnation"]))


def _peer_families(peers: list[dict[str, Any]]) -> Iterator[Metric]:
    by_state = {state: 0 for state in PEER_STATES}
    state = _gauge("peer_state", "1 for the state this site holds the peer in, else 0", ["peer", "state"])
    rtt = _gauge("peer_rtt_seconds", "Last measured probe round-trip time to the peer", ["peer"])
    seen = _gauge("peer_last_seen_age_seconds", "Seconds since the peer was last heard from", ["peer"])
    for peer in peers:
        name = str(peer.get("name", "?"))
        by_state[peer["state"]] = by_state.get(peer["state"], 0) + 1
        for s in PEER_STATES:
            state.add_metric([name, s], 1.0 if peer["state"] == s else 0.0)
        if peer.get("rtt_ms") is not None:
            rtt.add_metric([name], peer["rtt_ms"] / 1000)
        if peer.get("last_seen_s") is not None:
            seen.add_metric([name], float(peer["last_seen_s"]))
    yield _by_label(_gauge("peers", "Configured peers by the state this site holds them in", ["state"]),
                    by_state)
    yield from (state, rtt, seen)


def _traffic_families(status: dict[str, Any]) -> Iterator[Metric]:
    yield _by_label(_counter("frames_rejected", "Inbound frames refused, by reason (wire/frame.py's checks, "
                             "the peer port's budgets)", ["reason"]), status.get("rejected", {}))
    yield _by_label(_counter("sent_bytes", "Bytes of frames peers accepted, by class (reliable: jobs; "
                             "best_effort: membership, election)", ["class"]),
                    {c: status.get("sent_bytes", {}).get(c, 0) for c in SENT_CLASSES})
    yield CounterMetricFamily(_name("sends_dropped"), "Best-effort sends dropped: too many in flight",
                              value=float(status.get("dropped_sends", 0)))
    per_peer = (("sent_bytes", "peer_sent_bytes", "Bytes of frames the peer accepted from us", "class"),
                ("received_bytes", "peer_received_bytes",
                 "Bytes of frames from the peer that passed every check, by message kind", "kind"),
                ("frames_accepted", "frames_accepted",
                 "Frames from the peer that passed every check, by message kind", "kind"))
    peers = status.get("peers", [])
    for key, suffix, doc, label in per_peer:
        if not any(key in p for p in peers):
            continue   # the node does not count this yet: no series rather than false zeros
        family = _counter(suffix, doc, ["peer", label])
        for peer in peers:
            for cls, value in sorted(peer.get(key, {}).items()):
                family.add_metric([str(peer.get("name", "?")), str(cls)], float(value))
        yield family


REACH_STATES = ("unknown", "dialable", "outbound-only")
PATHS = ("direct", "proxy", "inbound", "relayed", "not used yet")


def _reach_families(status: dict[str, Any]) -> Iterator[Metric]:
    """Whether peers can dial this site, each peer's path, and what this site relayed for others."""
    reach = status.get("reach")
    if reach is None:
        return
    state = _gauge("reach_state", "1 for what peers' dial-backs say of this site, else 0", ["state"])
    for s in REACH_STATES:
        state.add_metric([s], 1.0 if reach.get("state") == s else 0.0)
    yield state
    yield GaugeMetricFamily(_name("links_dialed_for_peers"), "Links this site keeps open for its peers to send on "
                            "(an outbound-only site's)", value=float(reach.get("links_dialed_for_peers", 0)))
    path = _gauge("peer_path", "1 for the path this site's last request to the peer took, else 0", ["peer", "path"])
    for peer in status.get("peers", []):
        to = str((peer.get("path") or {}).get("to", "not used yet"))
        to = "relayed" if to.startswith("relayed") else to
        for p in PATHS:
            path.add_metric([str(peer.get("name", "?")), p], 1.0 if to == p else 0.0)
    yield path
    yield _by_label(_counter("relayed", "What this site relayed for members that cannot reach each other: "
                             "requests, bytes, and requests refused (busy, unreachable, refused)", ["what"]),
                    status.get("relayed", {}))


def _job_families(jobs: list[dict[str, Any]], kinds: Iterable[str]) -> Iterator[Metric]:
    """Job records this site holds (the newest few hundred, as `fedpeer job list` shows), by kind
    and state. Every known kind appears with every state, so an alert sees 0, not an absence."""
    counts = {(kind, state): 0 for kind in kinds for state in JOB_STATES}
    for job in jobs:
        key = (str(job["kind"]), str(job["state"]))
        counts[key] = counts.get(key, 0) + 1
    family = _gauge("jobs", "Job records this site holds, by kind and state", ["kind", "state"])
    for (kind, state), n in sorted(counts.items()):
        family.add_metric([kind, state], float(n))
    yield family


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _job_metric_families(jobs: list[dict[str, Any]], now_ms: int | None) -> Iterator[Metric]:
    """The latest history point of each job running here (and of each that ended less than
    JOB_METRICS_LINGER_S ago), bounded: JOB_METRICS_JOBS_MAX jobs × JOB_METRICS_PER_JOB_MAX numbers."""
    def shown(job: dict[str, Any]) -> bool:
        if not job.get("history"):
            return False
        if job.get("state") == "running":
            return True
        ended = job.get("finished_ms")
        return job.get("state") in JOB_STATES and ended is not None and now_ms is not None \
            and 0 <= now_ms - ended <= JOB_METRICS_LINGER_S * 1000
    chosen = sorted((j for j in jobs if shown(j)), key=lambda j: (j["state"] != "running", -(j.get("created_ms") or 0)))
    metric = _gauge("job_metric", "The latest value a job running here (or ended in the last "
                    f"{JOB_METRICS_LINGER_S} s) reported of each metric it computes per round (AUC, loss, "
                    "inertia, log-likelihood ...; the job's history in `job show`)", ["job", "kind", "metric"])
    step = _gauge("job_round", "The round (or iteration) of that latest point", ["job", "kind"])
    for job in chosen[:JOB_METRICS_JOBS_MAX]:
        point = job["history"][-1]
        if not isinstance(point, Mapping):
            continue
        labels = [str(job.get("id", "?")), str(job.get("kind", "?"))]
        at = next((point[k] for k in STEP_KEYS if _number(point.get(k))), len(job["history"]))
        step.add_metric(labels, float(at))
        numbers = [(str(k), float(v)) for k, v in point.items()
                   if k not in STEP_KEYS and _number(v) and METRIC_LABEL.fullmatch(str(k))]
        for name, value in numbers[:JOB_METRICS_PER_JOB_MAX]:
            metric.add_metric([*labels, name], value)
    yield metric
    yield step


def _election_families(status: dict[str, Any]) -> Iterator[Metric]:
    if "term" in status:
        yield GaugeMetricFamily(_name("election_term"), "The election's current term",
                                value=float(status["term"]))
    if "role" in status:
        role = _gauge("election_role", "1 for this site's role in the election, else 0", ["role"])
        for r in ROLES:
            role.add_metric([r], 1.0 if status["role"] == r else 0.0)
        yield role
    leader = _gauge("election_leader", "1 for the leader this site knows (no sample: none known)",
                    ["leader"])
    if status.get("leader"):
        leader.add_metric([str(status["leader"])], 1.0)
    yield leader
    yield CounterMetricFamily(_name("election_term_jumps_ignored"), "Election messages ignored for a "
                              "forged or wild term", value=float(status.get("term_jumps_ignored", 0)))


def _health_families(status: dict[str, Any]) -> Iterator[Metric]:
    state_dir = status.get("state_dir", {})
    yield GaugeMetricFamily(_name("state_dir_writable"), "1 while the state dir takes writes, else 0",
                            value=1.0 if state_dir.get("writable", True) else 0.0)
    yield CounterMetricFamily(_name("state_dir_failed_writes"), "Writes to the state dir that failed",
                              value=float(state_dir.get("failed_writes", 0)))
    conns = status.get("connections", {})
    yield _by_label(_gauge("connections", "Peer-port connections held: open (all), unverified (no "
                           "authenticated frame header yet)", ["state"]),
                    {k: conns.get(k, 0) for k in ("open", "unverified")})
    yield _by_label(_counter("connections_shed", "Peer-port connections refused or evicted to keep "
                             "the budgets, by reason", ["reason"]), conns.get("shed", {}))
    if "open_files_limit" in conns:
        yield GaugeMetricFamily(_name("open_files_limit"), "The process's soft open-files limit",
                                value=float(conns["open_files_limit"]))
    yield _by_label(_counter("loop_errors", "Failed steps of the node's own loops, by step", ["step"]),
                    status.get("loop_errors", {}))
    lag = status.get("loop_lag_ms") or {}
    if lag.get("samples"):
        yield _by_label(_gauge("loop_lag_seconds", "How late the event loop ran a periodic wake-up over the last "
                               "60 s, by quantile (0.5, 0.99, 1 = the worst)", ["quantile"]),
                        {q: lag[k] / 1000 for q, k in (("0.5", "p50"), ("0.99", "p99"), ("1", "max"))})


# ---------------------------------------------------------------------------------------------
# The node's metrics: registry, histograms, exposition
# ---------------------------------------------------------------------------------------------

class NodeMetrics:
    """One node's registry. `node.metrics = NodeMetrics(node)`; jobs reach it through their
    channel (`ch.metrics`), the admin API through `handle`."""

    def __init__(self, node: Observed, *, process: bool = True, round_kinds: Sequence[str] = ()) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(node))
        if process:   # CPU, RSS, open descriptors (against open_files_limit), start time: /proc
            ProcessCollector(registry=self.registry)
        self._sum_seconds = Histogram(
            _name("secure_sum_duration_seconds"), "Secure sums this site took part in, from its call "
            "to its result, by mode and outcome", ["mode", "outcome"],
            buckets=SECURE_SUM_BUCKETS_SECONDS, registry=self.registry)
        self._sum_retries = Counter(
            _name("secure_sum_retries"), "Secure-sum attempts beyond the first (a ring re-run over the "
            "survivors with fresh masks)", ["mode"], registry=self.registry)
        self._round_seconds = Histogram(
            _name("round_duration_seconds"), "Training rounds, from the round's directive to its "
            "commit, by job kind", ["kind"], buckets=ROUND_BUCKETS_SECONDS, registry=self.registry)
        for mode in SECURE_SUM_MODES:   # a series at 0 from the start: rate() and alerts see no gap
            self._sum_retries.labels(mode)
            for outcome in OUTCOMES:
                self._sum_seconds.labels(mode, outcome)
        for kind in round_kinds:   # the kinds that run rounds: their series exist (at 0) from the start
            self._round_seconds.labels(kind)

    def secure_sum_done(self, mode: str, seconds: float, *, ok: bool, attempts: int = 1) -> None:
        self._sum_seconds.labels(mode, OUTCOMES[0] if ok else OUTCOMES[1]).observe(max(0.0, seconds))
        if attempts > 1:
            self._sum_retries.labels(mode).inc(attempts - 1)

    def round_done(self, kind: str, seconds: float) -> None:
        self._round_seconds.labels(kind).observe(max(0.0, seconds))   # a wall-clock step back: 0

    def exposition(self) -> bytes:
        """The 0.0.4 text format of every series (reads the node: call on the event loop)."""
        return generate_latest(self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        """GET /metrics (admin route and TCP listener)."""
        return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE})


# ---------------------------------------------------------------------------------------------
# What jobs call (with their Channel; nothing happens outside a daemon)
# ---------------------------------------------------------------------------------------------


class MetricsListener:
    """GET /metrics on a loopback address, for a Prometheus that cannot read a unix socket.

    No token (Prometheus scrapes plain HTTP), so what protects it is: loopback only (config/load.py
    refuses anything else, and so does `start`); a Host header naming a loopback host at our port
    (a DNS-rebinding web page sends its own host name); no browser headers; one read-only path."""

    def __init__(self, metrics: NodeMetrics, address: Address, config_path: Any = "") -> None:
        self._metrics, self._address, self._config_path = metrics, address, config_path
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self.bounded: Bounded | None = None   # its connection bounds (fedpeer/net/bounded.py)
        self.port: int | None = None    # the bound port (the configured one, or the kernel's for 0)

    async def start(self) -> None:
        """Listen; raises ConfigError (one line) if the address is not loopback or is unusable."""
        if not is_loopback(self._address.host):
            raise ConfigError(self._config_path, "node.metrics", f"{self._address} is not a loopback "
                              "address; metrics must never be reachable from the network")
        app = web.Application(middlewares=[self._guard])
        app.router.add_get(PATH, self._metrics.handle)
        self._runner = local_runner(app)
        await self._runner.setup()
        try:
            self._server, self.bounded = await serve(self._runner, host=self._address.host, port=self._address.port)
        except OSError as exc:
            await self.stop()
            raise ConfigError(self._config_path, "node.metrics",
                              f"cannot listen on {self._address}: {exc.strerror or exc}") from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics_listening", extra=fields(address=f"{self._address.host}:{self.port}"))

    async def stop(self) -> None:
        await close(self._server, self._runner)
        self._server = self._runner = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        for name in BROWSER_HEADERS:
            if name in request.headers:
                return web.Response(status=403, text=f"browser requests are refused ({name} header)\n")
        if not self._host_allowed(request.headers.get("Host", "")):
            return web.Response(status=403, text="Host must name this loopback listener (DNS rebinding "
                                f"guard): scrape http://{self._address.host}:{self.port}{PATH}\n")
        try:
            return await handler(request)
        except web.HTTPException:
            raise     # 404/405 for anything but GET /metrics
        except Exception as exc:   # a failing scrape fails alone (Prometheus records up=0)
            log.error("metrics_scrape_failed", exc_info=True, extra=fields(error=f"{type(exc).__name__}: {exc}"))
            return web.Response(status=500, text=f"scrape failed: {type(exc).__name__}; see the daemon's log\n")

    def _host_allowed(self, host: str) -> bool:
        name, _, port = host.strip().lower().rpartition(":")
        if not name or port != str(self.port):
            return False
        name = name.strip("[]")
        return name in LOCAL_HOST_NAMES or is_loopback(name)
