"""A local federation of real daemon processes on loopback, for demos, tests and benchmarks.

`Harness` creates N sites in a work directory (keys, peers.toml listing each other on free
loopback ports), starts one `fedpeer start` process per site, waits until every node sees every
other alive, and stops every process it started — on success, on errors and on Ctrl-C (it is a
context manager; the CLI wraps it in try/finally). Faults for tests and demos: `kill9`,
`restart`, `pause` (SIGSTOP) and `resume` (SIGCONT). `advertise` puts something in front of a site
(benchmarks/bench_wan.py: a proxy that delays and paces): the others reach site i there, and site i
advertises it. `traffic` reads every site's bytes to and from each peer, `traffic_delta` the
difference between two readings (what `fedpeer harness` reports for the job).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeer.app.harness import colocate
from fedpeer.app.harness.zygote import Forked, Zygote, shared_zygote
from fedpeer.app.sitefiles import add_peers, init_site
from fedpeer.config import load as cfg
from fedpeer.daemon import admin
from fedpeer.daemon.warmup import LOADED_EVENT
from fedpeer.errors import FedpeerError, NoDaemonError
from fedpeer.identity import encode_public_key, parse_public_key
from fedpeer.kinds.catalog import load_config

HOST = "127.0.0.1"
POLL_MS = 100
HARNESS_PORT_MIN = 20_000         # sites listen on ports from here up to the ephemeral range
EPHEMERAL_LOW_DEFAULT = 32_768    # Linux's first ephemeral port, when /proc does not say
# Admin requests a wait sends to the daemons per second at most: a poll of every site's status each
# POLL_MS was 1,000 requests a second at 100 sites, each walking the daemon's 99 peers, on the cores
# the daemons share (a poll interval that grows with the sites polled)
POLL_REQUESTS_PER_S_MAX = 100
STOP_GRACE_S = 5.0
START_TIMEOUT_S = 20.0
TERMINAL = ("done", "failed", "cancelled")
UNHEARD_GRACE_S = 5.0   # how long a site may take to learn of a proposed job
ML_LOADED_EVENT = f"event={LOADED_EVENT}"   # the daemon's log line once its ML preload is done


class HarnessError(FedpeerError):
    pass


@dataclass
class Site:
    name: str
    dir: Path
    port: int
    public_key: str = ""
    process: subprocess.Popen | Forked | None = None
    config: cfg.Config | None = None
    paused: bool = False
    starts: int = 0
    log_start: int = 0               # the daemon log's size when this site last started
    advertise: str | None = None     # the address the others use for this site (default: where it listens)
    # its daemon's environment, if not ours (another build: PYTHONPATH); such a daemon starts in the
    # site's directory, so that `python -m` does not put our working directory's fedpeer first
    env: dict[str, str] | None = None
    host: str = HOST                 # where it listens (another address in a network namespace)
    wrap: list[str] | None = None    # a command its daemon runs under (`ip netns exec NAME`)

    @property
    def config_path(self) -> Path:
        return self.dir / "peers.toml"

    @property
    def log_path(self) -> Path:
        return self.dir / "daemon.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def peer_address(self) -> str:
        return self.advertise or self.address

    def ml_loaded(self) -> bool:
        """The daemon finished its ML preload (libraries and compiled kernels) since its last
        start, or has none to do: its log (appended to by every start) says so after `log_start`."""
        if self.config is not None and not self.config.jobs.preload_ml:
            return True
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_start)
                return ML_LOADED_EVENT.encode() in log.read()
        except FileNotFoundError:
            return False


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports below the kernel's ephemeral range (held open together so they
    differ; a small race remains). Not from the ephemeral range: there the daemons' own outgoing
    connections (up to n - 1 each) take ports, and a site that starts seconds after the pick found
    its port in use as another's source port (70 sites: one in a run)."""
    low = _ephemeral_low()
    rng = random.Random()
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((HOST, rng.randrange(HARNESS_PORT_MIN, low)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_LOW_DEFAULT
    return low if low > HARNESS_PORT_MIN + 1_000 else EPHEMERAL_LOW_DEFAULT


@dataclass
class Harness:
    workdir: Path
    n_sites: int
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)   # {section: {key: value}} for every site
    log_level: str = "info"
    site_data: list[Path] | None = None      # one CSV per site, copied into the site as data.csv
    data_settings: dict[str, Any] = field(default_factory=dict)          # [data] keys other than csv
    test_data: Path | None = None            # a held-out CSV copied into every site as test.csv
    advertise: list[str] | None = None       # per site: the address the others use for it (e.g. a proxy's)
    # site_data[i] goes to the i-th site in ring order (keys sorted), not to site i: a vertical job's
    # joined columns (every member's own, in ring order) are then in site_data's order
    data_in_ring_order: bool = False
    # Site keys derived from this seed (a demo's results then repeat: every member's seeds derive
    # from the job's seed and its key); None: fresh random keys, as real sites have
    key_seed: int | None = None
    # per site: the host it listens on and a command its daemon runs under (network namespaces)
    hosts: list[str] | None = None
    wraps: list[list[str]] | None = None
    # daemons forked from a process that imported them already (zygote.py); None: `python -m fedpeer
    # start` each. The default is the process-wide one a test run sets (tests/conftest.py).
    zygote: Zygote | None = field(default_factory=shared_zygote)
    # [membership] and [election] periods scaled for n daemons sharing this machine's cores
    # (fedpeer/app/harness/colocate.py; 1x up to SITES_PER_CORE_AT_DEFAULTS a core)
    colocated: bool = True
    sites: list[Site] = field(default_factory=list)

    def create(self) -> None:
        if self.advertise is not None and len(self.advertise) != self.n_sites:
            raise HarnessError(f"{len(self.advertise)} advertised addresses for {self.n_sites} sites")
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(self.n_sites)
        width = len(str(self.n_sites))
        for i, port in enumerate(ports):
            site = Site(name=f"site-{i + 1:0{width}d}", dir=self.workdir / f"site-{i + 1:0{width}d}", port=port,
                        advertise=self.advertise[i] if self.advertise is not None else None,
                        host=self.hosts[i] if self.hosts is not None else HOST,
                        wrap=self.wraps[i] if self.wraps is not None else None)
            if site.dir.exists():
                shutil.rmtree(site.dir)
            _, identity = init_site(site.dir, site.name, site.address, advertise=site.advertise,
                                    key_seed=None if self.key_seed is None else demo_key(self.key_seed, i))
            site.public_key = encode_public_key(identity.public_key)
            self.sites.append(site)
        if self.site_data is not None and len(self.site_data) != self.n_sites:
            raise HarnessError(f"{len(self.site_data)} data files for {self.n_sites} sites")
        files = list(self.site_data or [])
        if self.data_in_ring_order and files:
            ring = sorted(range(self.n_sites), key=lambda i: parse_public_key(self.sites[i].public_key))
            files = [files[ring.index(i)] for i in range(self.n_sites)]
        # many daemons on this machine's cores: periods it can carry (colocate.py); the caller's own win
        base = colocate.colocated_settings(self.n_sites, colocate.cores()) if self.colocated else {}
        for section, values in self.settings.items():
            base[section] = {**base.get(section, {}), **values}
        for i, site in enumerate(self.sites):
            others = [(o.name, o.peer_address, o.public_key) for o in self.sites if o is not site]
            settings = dict(base)
            if self.site_data is not None:
                shutil.copyfile(files[i], site.dir / "data.csv")
                settings["data"] = {**self.data_settings, "csv": "data.csv"}
                if self.test_data is not None:
                    shutil.copyfile(self.test_data, site.dir / "test.csv")
                    settings["data"]["test_csv"] = "test.csv"
            add_peers(site.config_path, others, settings)
            site.config = load_config(site.config_path)

    # -- processes --------------------------------------------------------------------------

    def start(self, i: int | None = None) -> None:
        for site in self._select(i):
            assert site.process is None or site.process.poll() is not None, f"{site.name} already running"
            log = open(site.log_path, "ab")
            site.log_start = log.tell()             # this start's lines begin here (the log is appended to)
            argv = ["start", "--config", str(site.config_path), "--log-level", self.log_level]
            if self.zygote is not None and site.wrap is None and site.env is None:
                log.close()
                site.process = self.zygote.spawn(argv, str(site.log_path))
            else:
                site.process = subprocess.Popen(
                    [*(site.wrap or []), sys.executable, "-m", "fedpeer", *argv],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=site.env,
                    cwd=site.dir if site.env is not None else None)
                log.close()
            site.paused, site.starts = False, site.starts + 1

    def stop(self, i: int | None = None) -> None:
        """SIGTERM (after SIGCONT if paused), wait for a clean exit, SIGKILL after the grace."""
        sites = [s for s in self._select(i) if s.process is not None and s.process.poll() is None]
        for site in sites:
            if site.paused:
                site.process.send_signal(signal.SIGCONT)
            site.process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for site in sites:
            try:
                site.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                site.process.kill()
                site.process.wait()
            site.paused = False

    def kill9(self, i: int) -> None:
        site = self.sites[i]
        assert site.process is not None
        site.process.kill()
        site.process.wait()

    def restart(self, i: int) -> None:
        self.stop(i)
        self.start(i)

    def pause(self, i: int) -> None:
        site = self.sites[i]
        assert site.process is not None and not site.paused
        site.process.send_signal(signal.SIGSTOP)
        site.paused = True

    def resume(self, i: int) -> None:
        site = self.sites[i]
        assert site.process is not None and site.paused
        site.process.send_signal(signal.SIGCONT)
        site.paused = False

    def exit_codes(self) -> dict[str, int | None]:
        return {s.name: (s.process.poll() if s.process else None) for s in self.sites}

    def _select(self, i: int | None) -> list[Site]:
        return self.sites if i is None else [self.sites[i]]

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation ------------------------------------------------------------------------

    async def status(self, i: int, timeout_ms: int = 2_000) -> dict:
        site = self.sites[i]
        assert site.config is not None
        return await admin.request(site.config, "GET", "/v1/status", timeout_ms=timeout_ms)

    async def statuses(self, among: list[int] | None = None, timeout_ms: int = 2_000) -> dict[int, dict | None]:
        """Every site's status (of `among`); None for a daemon that does not answer within timeout_ms."""
        among = list(range(self.n_sites)) if among is None else among

        async def one(i: int) -> dict | None:
            try:
                return await self.status(i, timeout_ms)
            except NoDaemonError:
                return None
        results = await asyncio.gather(*(one(i) for i in among))
        return dict(zip(among, results))

    async def traffic(self, among: list[int] | None = None) -> dict[int, dict | None]:
        """Every site's bytes of frames to and from each peer since its daemon started, from its
        status (sent: frames the peer accepted, both classes; received: frames this site accepted
        from the peer); None for a site whose daemon does not answer."""
        def one(doc: dict | None) -> dict | None:
            if doc is None:
                return None
            by_peer = {p["name"]: {"sent": sum(p["sent_bytes"].values()), "received": sum(p["received_bytes"].values())}
                       for p in doc["peers"]}
            return {"pid": doc["node"]["pid"], "by_peer": by_peer}
        return {i: one(doc) for i, doc in (await self.statuses(among)).items()}

    async def wait_until(self, predicate: Any, timeout_s: float, what: str,
                         among: list[int] | None = None) -> float:
        """Poll statuses until predicate(statuses) is true; returns the seconds it took."""
        started = time.monotonic()
        while True:
            self._check_not_crashed()
            if predicate(await self.statuses(among)):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise HarnessError(f"timed out after {timeout_s:.0f} s waiting until {what}; "
                                   f"daemon logs are in {self.workdir}")
            await asyncio.sleep(poll_s(len(among) if among is not None else self.n_sites))

    def _check_not_crashed(self) -> None:
        for site in self.sites:
            code = site.process.poll() if site.process else None
            if code not in (None, -signal.SIGKILL, 0):
                tail = site.log_path.read_text(errors="replace").splitlines()[-5:]
                raise HarnessError(f"{site.name} exited with code {code}: " + " | ".join(tail))

    async def propose(self, i: int, kind: str, params: dict[str, Any]) -> str:
        doc = await admin.request(self.sites[i].config, "POST", "/v1/jobs", {"kind": kind, "params": params})
        return doc["id"]

    async def job(self, i: int, job_id: str) -> dict | None:
        try:
            return await admin.request(self.sites[i].config, "GET", f"/v1/jobs/{job_id}", timeout_ms=5_000)
        except NoDaemonError:
            return None
        except FedpeerError:
            return None    # not (yet) known at that site

    async def wait_step(self, i: int, job_id: str, step: int, timeout_s: float) -> None:
        """Poll site i's record of the job until it runs with progress step >= `step` (to kill a
        member mid-job); HarnessError if the job ends first or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = await self.job(i, job_id)
            if record is not None and record["state"] == "running" and record["progress"]["step"] >= step:
                return
            if record is not None and record["state"] in TERMINAL:
                raise HarnessError(f"job {job_id} ended ({record['state']}) before step {step}: {record.get('error')}")
            if time.monotonic() > deadline:
                raise HarnessError(f"job {job_id} did not reach step {step} at {self.sites[i].name} "
                                   f"in {timeout_s:.0f} s")
            await asyncio.sleep(POLL_MS / 1000)

    async def wait_job(self, job_id: str, timeout_s: float, among: list[int] | None = None) -> dict[int, dict | None]:
        """Poll every site's record of the job until each is terminal (or its daemon is gone)."""
        among = list(range(self.n_sites)) if among is None else among
        started = time.monotonic()
        while True:
            records = dict(zip(among, await asyncio.gather(*(self.job(i, job_id) for i in among))))
            unfinished = [i for i, r in records.items() if r is not None and r["state"] not in TERMINAL]
            # a live site that never heard of the job only counts while some site still runs it
            running = unfinished or [i for i, r in records.items() if r is None and self._running(i)
                                     and time.monotonic() - started < UNHEARD_GRACE_S]
            if not running:
                return records
            if time.monotonic() - started > timeout_s:
                raise HarnessError(f"job {job_id} still running at {[self.sites[i].name for i in running]} "
                                   f"after {timeout_s:.0f} s; logs in {self.workdir}")
            await asyncio.sleep(poll_s(len(among)))

    def _running(self, i: int) -> bool:
        p = self.sites[i].process
        return p is not None and p.poll() is None

    async def wait_all_alive(self, timeout_s: float = START_TIMEOUT_S, among: list[int] | None = None) -> float:
        among = list(range(self.n_sites)) if among is None else among
        names = {self.sites[i].name for i in among}

        def ok(statuses: dict[int, dict | None]) -> bool:
            return all(doc is not None and all(p["state"] == "alive" for p in doc["peers"] if p["name"] in names)
                       for doc in statuses.values())
        return await self.wait_until(ok, timeout_s, f"{len(among)} nodes see each other alive", among)

    async def wait_ml_loaded(self, timeout_s: float = 180, among: list[int] | None = None) -> float:
        """Wait until every daemon (of `among`) finished its ML preload: seconds of CPU per daemon
        in the background after start, which a first job or a measurement would otherwise share."""
        started = time.monotonic()
        among = [i for i in range(self.n_sites) if self._running(i)] if among is None else among
        while not all(self.sites[i].ml_loaded() for i in among):
            self._check_not_crashed()
            if time.monotonic() - started > timeout_s:
                raise HarnessError(f"the daemons did not finish loading their ML libraries within {timeout_s:.0f} s; "
                                   f"daemon logs are in {self.workdir}")
            await asyncio.sleep(POLL_MS / 1000)
        return time.monotonic() - started

    async def wait_peer_state(self, target: int, state: str, timeout_s: float) -> float:
        name = self.sites[target].name
        others = [i for i in range(self.n_sites) if i != target]

        def ok(statuses: dict[int, dict | None]) -> bool:
            return all(doc is not None and any(p["name"] == name and p["state"] == state for p in doc["peers"])
                       for doc in statuses.values())
        return await self.wait_until(ok, timeout_s, f"every other node sees {name} {state}", others)


def poll_s(sites: int) -> float:
    """Seconds between two polls of `sites` daemons: POLL_MS, longer when that would send more
    than POLL_REQUESTS_PER_S_MAX requests a second."""
    return max(POLL_MS / 1000, sites / POLL_REQUESTS_PER_S_MAX)


def traffic_delta(before: dict | None, after: dict | None) -> dict[str, Any]:
    """One site's bytes between two `Harness.traffic` readings: `bytes_sent`, `bytes_received` and
    `bytes_by_peer` ({peer: {"sent", "received"}}); None where a reading is missing or the daemon
    restarted in between (its counters started again from zero)."""
    if before is None or after is None or before["pid"] != after["pid"]:
        return {"bytes_sent": None, "bytes_received": None, "bytes_by_peer": None}
    zero = {"sent": 0, "received": 0}
    by_peer = {name: {k: now[k] - before["by_peer"].get(name, zero)[k] for k in ("sent", "received")}
               for name, now in after["by_peer"].items()}
    return {"bytes_sent": sum(p["sent"] for p in by_peer.values()),
            "bytes_received": sum(p["received"] for p in by_peer.values()), "bytes_by_peer": by_peer}


# -- command line ---------------------------------------------------------------------------


BUILTIN = {"builtin:breast_cancer": ("diagnosis", "malignant"), "builtin:sonar": ("Class", "M")}


def builtin_csv(name: str, path: Path) -> Path:
    """Write a bundled dataset as a CSV (no download): scikit-learn's breast cancer, or the UCI
    Sonar data (208 rows, 60 features; mines vs rocks) shipped in fedpeer/data."""
    import csv

    from sklearn.datasets import load_breast_cancer

    if name == "builtin:sonar":
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(__file__).parent / "data" / "sonar.csv", path)
        return path
    assert name == "builtin:breast_cancer", name
    ds = load_breast_cancer()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([n.replace(" ", "_") for n in ds.feature_names] + ["diagnosis"])
        for row, target in zip(ds.data, ds.target):
            writer.writerow([repr(float(v)) for v in row] + ["malignant" if target == 0 else "benign"])
    return path


async def kill_leader_at_round(harness: Harness, job_id: str, rnd: int, timeout_s: float) -> dict:
    """kill -9 the federation's leader while round `rnd` of an xgboost job runs (its record shows
    rnd - 1 rounds committed); then time how long the survivors take to commit the next round."""
    started = time.monotonic()
    leader, term = None, 0
    while True:
        if time.monotonic() - started > timeout_s:
            raise HarnessError(f"round {rnd} never started")
        if leader is None:       # find the leader once; then watch only its record (rounds can be fast)
            statuses = await harness.statuses()
            leader = next((i for i, doc in statuses.items() if doc and doc["role"] == "leader"), None)
            term = statuses[leader]["term"] if leader is not None else 0
        record = await harness.job(leader, job_id) if leader is not None else None
        if record is not None and record["state"] in TERMINAL:
            raise HarnessError(f"the job ended ({record['state']}) before round {rnd}")
        if record is not None and record["state"] == "running" and record["progress"]["step"] >= rnd - 1:
            break
        if record is None or record["state"] != "running":
            leader = None
        await asyncio.sleep(0.01)
    harness.kill9(leader)
    killed_at = time.monotonic()
    committed = record["progress"]["step"]
    survivors = [i for i in range(harness.n_sites) if i != leader]
    new_leader, elected_s = None, None
    while time.monotonic() - killed_at < timeout_s:
        if new_leader is None:
            docs = await harness.statuses(survivors)
            found = next((i for i, d in docs.items() if d and d["role"] == "leader" and d["term"] > term), None)
            if found is not None:
                new_leader, elected_s = found, time.monotonic() - killed_at
        records = await asyncio.gather(*(harness.job(i, job_id) for i in survivors))
        if any(r is not None and (r["progress"]["step"] > committed or r["state"] == "done") for r in records):
            return {"killed": harness.sites[leader].name, "at_round": committed + 1,
                    "new_leader": harness.sites[new_leader].name if new_leader is not None else None,
                    "elected_after_s": None if elected_s is None else round(elected_s, 3),
                    "next_commit_after_s": round(time.monotonic() - killed_at, 3)}
        await asyncio.sleep(0.02)
    raise HarnessError(f"no round committed within {timeout_s:.0f} s after the leader was killed")


def split_fractions(split: str, parts: int) -> list[float]:
    """--split as one fraction per part: "stratified" (equal parts) or "0.5,0.3,0.2"."""
    try:
        fractions = [1 / parts] * parts if split == "stratified" else [float(x) for x in split.split(",")]
    except ValueError:
        fractions = []
    if len(fractions) != parts or any(not x > 0 for x in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise HarnessError(f"--split {split!r}: need {parts} positive fractions that add up to 1")
    return fractions


def demo_key(seed: int, index: int) -> bytes:
    """Site `index`'s key material in a reproducible local federation: SHA-256 of the seed and the
    index. Public knowledge — never a real site's key."""
    return hashlib.sha256(f"fedpeer/harness/demo-key/v1\x00{seed}\x00{index}".encode()).digest()


def split_csv(path: Path, label: str | None, parts: int, split: str, seed: int, out_dir: Path) -> list[Path]:
    """Split one CSV into `parts` files, stratified by `label` (None: shuffled only), seeded; returns the paths.

    split: "stratified" (equal parts) or comma-separated fractions (one per part)."""
    import csv
    import random

    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise HarnessError(f"{path}: no data rows")
    header, body = rows[0], rows[1:]
    if label is not None and label not in header:
        raise HarnessError(f"{path}: no column {label!r}; columns: {header}")
    fractions = split_fractions(split, parts)
    rng = random.Random(seed)
    col = header.index(label) if label is not None else -1
    by_class: dict[str, list[list[str]]] = {}
    for row in body:
        by_class.setdefault(row[col] if 0 <= col < len(row) else "", []).append(row)
    out: list[list[list[str]]] = [[] for _ in range(parts)]
    for cls in sorted(by_class):
        members = by_class[cls]
        rng.shuffle(members)
        bounds = [round(sum(fractions[:k]) * len(members)) for k in range(parts + 1)]
        for k in range(parts):
            out[k].extend(members[bounds[k]:bounds[k + 1]])
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, part in enumerate(out):
        rng.shuffle(part)
        target = out_dir / f"part-{k + 1}.csv"
        with open(target, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([header, *part])
        paths.append(target)
    return paths
