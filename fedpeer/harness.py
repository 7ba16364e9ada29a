"""A local federation of real daemon processes on loopback, for demos, tests and benchmarks.

`Harness` creates N sites in a work directory (keys, peers.toml listing each other on free
loopback ports), starts one `fedpeer start` process per site, waits until every node sees every
other alive, and stops every process it started — on success, on errors and on Ctrl-C (it is a
context manager; the CLI wraps it in try/finally). Faults for tests and demos: `kill9`,
`restart`, `pause` (SIGSTOP) and `resume` (SIGCONT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import config as cfg
from .errors import FedpeerError, NoDaemonError
from .identity import encode_public_key
from .net import admin
from .sitefiles import add_peers, init_site

HOST = "127.0.0.1"
POLL_MS = 100
STOP_GRACE_S = 5.0
START_TIMEOUT_S = 20.0
HARNESS_JOBS = ("membership",)


class HarnessError(FedpeerError):
    pass


@dataclass
class Site:
    name: str
    dir: Path
    port: int
    public_key: str = ""
    process: subprocess.Popen | None = None
    config: cfg.Config | None = None
    paused: bool = False
    starts: int = 0

    @property
    def config_path(self) -> Path:
        return self.dir / "peers.toml"

    @property
    def log_path(self) -> Path:
        return self.dir / "daemon.log"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so they differ; a small race remains)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Harness:
    workdir: Path
    n_sites: int
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)   # {section: {key: value}} for every site
    log_level: str = "info"
    sites: list[Site] = field(default_factory=list)

    def create(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(self.n_sites)
        width = len(str(self.n_sites))
        for i, port in enumerate(ports):
            site = Site(name=f"site-{i + 1:0{width}d}", dir=self.workdir / f"site-{i + 1:0{width}d}", port=port)
            if site.dir.exists():
                shutil.rmtree(site.dir)
            _, identity = init_site(site.dir, site.name, site.address)
            site.public_key = encode_public_key(identity.public_key)
            self.sites.append(site)
        for site in self.sites:
            others = [(o.name, o.address, o.public_key) for o in self.sites if o is not site]
            add_peers(site.config_path, others, self.settings)
            site.config = cfg.load(site.config_path)

    # -- processes --------------------------------------------------------------------------

    def start(self, i: int | None = None) -> None:
        for site in self._select(i):
            assert site.process is None or site.process.poll() is not None, f"{site.name} already running"
            log = open(site.log_path, "ab")
            site.process = subprocess.Popen(
                [sys.executable, "-m", "fedpeer", "start", "--config", str(site.config_path),
                 "--log-level", self.log_level],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
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

    async def statuses(self, among: list[int] | None = None) -> dict[int, dict | None]:
        among = list(range(self.n_sites)) if among is None else among

        async def one(i: int) -> dict | None:
            try:
                return await self.status(i)
            except NoDaemonError:
                return None
        results = await asyncio.gather(*(one(i) for i in among))
        return dict(zip(among, results))

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
            await asyncio.sleep(POLL_MS / 1000)

    def _check_not_crashed(self) -> None:
        for site in self.sites:
            code = site.process.poll() if site.process else None
            if code not in (None, -signal.SIGKILL, 0):
                tail = site.log_path.read_text(errors="replace").splitlines()[-5:]
                raise HarnessError(f"{site.name} exited with code {code}: " + " | ".join(tail))

    async def wait_all_alive(self, timeout_s: float = START_TIMEOUT_S, among: list[int] | None = None) -> float:
        among = list(range(self.n_sites)) if among is None else among
        names = {self.sites[i].name for i in among}

        def ok(statuses: dict[int, dict | None]) -> bool:
            return all(doc is not None and all(p["state"] == "alive" for p in doc["peers"] if p["name"] in names)
                       for doc in statuses.values())
        return await self.wait_until(ok, timeout_s, f"{len(among)} nodes see each other alive", among)

    async def wait_peer_state(self, target: int, state: str, timeout_s: float) -> float:
        name = self.sites[target].name
        others = [i for i in range(self.n_sites) if i != target]

        def ok(statuses: dict[int, dict | None]) -> bool:
            return all(doc is not None and any(p["name"] == name and p["state"] == state for p in doc["peers"])
                       for doc in statuses.values())
        return await self.wait_until(ok, timeout_s, f"every other node sees {name} {state}", others)


# -- command line ---------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sites", type=int, default=5, help="number of sites (daemons) to start")
    p.add_argument("--workdir", type=Path, help="where sites live (default: a temporary directory, removed after)")
    p.add_argument("--job", default="membership", choices=HARNESS_JOBS,
                   help="what to run once all sites see each other")
    p.add_argument("--chaos", action="store_true",
                   help="also kill -9 one site, wait until the others see it dead, restart it, wait until alive")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--timeout-s", type=float, default=60.0, help="give up after this many seconds")


def main(args: argparse.Namespace) -> int:
    if not 2 <= args.sites <= 100:
        print("fedpeer harness: --sites must be between 2 and 100", file=sys.stderr)
        return 2
    temp = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="fedpeer-harness-")) if temp else args.workdir.resolve()
    report = {"job": {"id": None, "kind": args.job, "state": "failed", "elapsed_s": None, "error": None},
              "sites": []}
    harness = Harness(workdir, args.sites)
    started = time.monotonic()
    try:
        harness.create()
        harness.start()
        report["job"]["startup_s"] = round(asyncio.run(harness.wait_all_alive(args.timeout_s)), 3)
        if args.chaos:
            report["job"]["chaos"] = asyncio.run(_chaos(harness, args.timeout_s))
        statuses = asyncio.run(harness.statuses())
        report["sites"] = [_site_report(harness.sites[i], doc) for i, doc in statuses.items()]
        report["job"]["state"] = "done"
    except (FedpeerError, OSError) as exc:
        report["job"]["error"] = str(exc)
    except KeyboardInterrupt:
        report["job"]["error"] = "interrupted"
    finally:
        harness.stop()
        report["job"]["elapsed_s"] = round(time.monotonic() - started, 3)
        if temp:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else format_report(report, workdir, temp))
    return 0 if report["job"]["state"] == "done" else 1


async def _chaos(harness: Harness, timeout_s: float) -> dict:
    victim = harness.n_sites - 1
    harness.kill9(victim)
    dead_s = await harness.wait_peer_state(victim, "dead", timeout_s)
    harness.start(victim)
    alive_s = await harness.wait_peer_state(victim, "alive", timeout_s)
    return {"killed": harness.sites[victim].name, "seen_dead_after_s": round(dead_s, 3),
            "alive_after_restart_s": round(alive_s, 3)}


def _site_report(site: Site, doc: dict | None) -> dict:
    if doc is None:
        return {"name": site.name, "rows": None, "result": {"error": "no status"}}
    peers = {p["name"]: {"state": p["state"], "rtt_ms": p["rtt_ms"]} for p in doc["peers"]}
    return {"name": site.name, "rows": None, "result": {
        "address": doc["node"]["address"], "fingerprint": doc["node"]["fingerprint"],
        "alive_peers": sum(p["state"] == "alive" for p in doc["peers"]), "peers": peers,
        "rejected": doc["rejected"]}}


def format_report(report: dict, workdir: Path, temp: bool) -> str:
    job = report["job"]
    lines = [f"job {job['kind']}: {job['state']} in {job['elapsed_s']} s"
             + (f" — error: {job['error']}" if job["error"] else "")]
    if job.get("startup_s") is not None:
        lines.append(f"all sites saw each other alive after {job['startup_s']} s")
    if job.get("chaos"):
        c = job["chaos"]
        lines.append(f"chaos: killed {c['killed']} (kill -9); others saw it dead after {c['seen_dead_after_s']} s; "
                     f"restarted, alive again after {c['alive_after_restart_s']} s")
    rows = [("SITE", "ADDRESS", "FINGERPRINT", "ALIVE PEERS", "MEDIAN RTT")]
    for s in report["sites"]:
        r = s["result"]
        if "error" in r:
            rows.append((s["name"], "-", "-", r["error"], "-"))
            continue
        rtts = sorted(p["rtt_ms"] for p in r["peers"].values() if p["rtt_ms"] is not None)
        median = f"{rtts[len(rtts) // 2]:.1f} ms" if rtts else "-"
        rows.append((s["name"], r["address"], r["fingerprint"], f"{r['alive_peers']}/{len(r['peers'])}", median))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if not temp:
        lines.append(f"sites, keys and daemon logs: {workdir}")
    return "\n".join(lines)
