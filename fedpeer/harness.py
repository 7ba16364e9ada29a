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
from .errors import FedpeerError, JobError, NoDaemonError
from .identity import encode_public_key
from .net import admin
from .sitefiles import add_peers, init_site

HOST = "127.0.0.1"
POLL_MS = 100
STOP_GRACE_S = 5.0
START_TIMEOUT_S = 20.0
TERMINAL = ("done", "failed", "cancelled")
UNHEARD_GRACE_S = 5.0   # how long a site may take to learn of a proposed job


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
    site_data: list[Path] | None = None      # one CSV per site, copied into the site as data.csv
    data_settings: dict[str, Any] = field(default_factory=dict)          # [data] keys other than csv
    test_data: Path | None = None            # a held-out CSV copied into every site as test.csv
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
        if self.site_data is not None and len(self.site_data) != self.n_sites:
            raise HarnessError(f"{len(self.site_data)} data files for {self.n_sites} sites")
        for i, site in enumerate(self.sites):
            others = [(o.name, o.address, o.public_key) for o in self.sites if o is not site]
            settings = dict(self.settings)
            if self.site_data is not None:
                shutil.copyfile(self.site_data[i], site.dir / "data.csv")
                settings["data"] = {**self.data_settings, "csv": "data.csv"}
                if self.test_data is not None:
                    shutil.copyfile(self.test_data, site.dir / "test.csv")
                    settings["data"]["test_csv"] = "test.csv"
            add_peers(site.config_path, others, settings)
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
            await asyncio.sleep(POLL_MS / 1000)

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

    async def wait_peer_state(self, target: int, state: str, timeout_s: float) -> float:
        name = self.sites[target].name
        others = [i for i in range(self.n_sites) if i != target]

        def ok(statuses: dict[int, dict | None]) -> bool:
            return all(doc is not None and any(p["name"] == name and p["state"] == state for p in doc["peers"])
                       for doc in statuses.values())
        return await self.wait_until(ok, timeout_s, f"every other node sees {name} {state}", others)


# -- command line ---------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    from .jobs.kinds import job_kinds

    p.add_argument("--sites", type=int, default=5, help="number of sites (daemons) to start")
    p.add_argument("--workdir", type=Path, help="where sites live (default: a temporary directory, removed after)")
    p.add_argument("--job", default="membership", choices=["membership", *job_kinds()],
                   help="what to run once all sites see each other (membership: only the health report)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--data", type=Path, help="one CSV split across the sites (see --split); "
                      "builtin:breast_cancer uses scikit-learn's bundled Wisconsin data (label diagnosis, "
                      "positive malignant); builtin:sonar the bundled UCI Sonar data (label Class, positive M)")
    data.add_argument("--site-data", type=Path, nargs="+", metavar="CSV", help="one CSV per site, in site order")
    p.add_argument("--split", default="stratified",
                   help="how --data is split: 'stratified' (equal parts, same class mix) or comma-separated "
                        "fractions, e.g. 0.5,0.3,0.2 (stratified, one fraction per site)")
    p.add_argument("--label", help="label column of the CSVs (clustering: none needed; a given one is not a feature)")
    p.add_argument("--positive", help="positive class value of the label column")
    p.add_argument("--ignore", default="", help="comma-separated columns that are not features (e.g. Id)")
    p.add_argument("--missing", default="error", choices=["error", "drop"], help="rows with missing values")
    p.add_argument("--seed", type=int, default=0, help="seed for the data split (and the job, where it has one)")
    p.add_argument("--variant", choices=["base", "personalized", "clustered"], help="bofrf: the variant")
    p.add_argument("--baseline", choices=["none", "boppid"], help="bofrf: a baseline reported side by side")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a job parameter (see 'fedpeer run KIND --help'); repeatable")
    p.add_argument("--rounds", type=int, help="xgboost: communication rounds")
    p.add_argument("--num-local-round", type=int, help="xgboost: trees per site and round (1 = tree, >1 = tree+)")
    p.add_argument("--test-data", type=Path, metavar="CSV",
                   help="a held-out CSV every site also scores its final model on (xgboost: result.auc)")
    p.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="carve a stratified held-out part off --data and use it as --test-data (e.g. 0.2)")
    p.add_argument("--kill-leader-at-round", type=int, metavar="R",
                   help="xgboost: kill -9 the leader while round R runs; report how long until the next commit")
    p.add_argument("--chaos", action="store_true",
                   help="also kill -9 one site, wait until the others see it dead, restart it, wait until alive")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--timeout-s", type=float, default=600.0, help="give up after this many seconds")


def main(args: argparse.Namespace) -> int:
    problem = _check_arguments(args)
    if problem:
        print(f"fedpeer harness: {problem}", file=sys.stderr)
        return 2
    temp = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="fedpeer-harness-")) if temp else args.workdir.resolve()
    report: dict[str, Any] = {"job": {"id": None, "kind": args.job, "state": "failed", "elapsed_s": None,
                                      "error": None}, "sites": []}
    started = time.monotonic()
    harness = None
    try:
        harness = _make_harness(args, workdir)
        harness.create()
        harness.start()
        report["job"]["startup_s"] = round(asyncio.run(harness.wait_all_alive(min(args.timeout_s, 120))), 3)
        if args.chaos:
            report["job"]["chaos"] = asyncio.run(_chaos(harness, args.timeout_s))
        if args.job == "membership":
            statuses = asyncio.run(harness.statuses())
            report["sites"] = [_site_report(harness.sites[i], doc) for i, doc in statuses.items()]
            report["job"]["state"] = "done"
        else:
            report.update(asyncio.run(_run_job(harness, args)))
    except (FedpeerError, OSError, ValueError) as exc:
        report["job"]["error"] = str(exc)
    except KeyboardInterrupt:
        report["job"]["error"] = "interrupted"
    finally:
        if harness is not None:
            harness.stop()
        report["job"]["elapsed_s"] = report["job"].get("elapsed_s") or round(time.monotonic() - started, 3)
        if temp:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else format_report(report, workdir, temp))
    return 0 if report["job"]["state"] == "done" else 1


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


def _check_arguments(args: argparse.Namespace) -> str | None:
    from .jobs.kinds import job_kinds

    if not 2 <= args.sites <= 100:
        return "--sites must be between 2 and 100"
    if args.data is not None and str(args.data).startswith("builtin:"):
        if str(args.data) not in BUILTIN:
            return f"--data {args.data}: known built-in data sets: {', '.join(BUILTIN)}"
        builtin_label, builtin_positive = BUILTIN[str(args.data)]
        args.label, args.positive = args.label or builtin_label, args.positive or builtin_positive
    if args.job != "membership":
        if args.data is None and args.site_data is None:
            return f"--job {args.job} needs --data CSV or --site-data CSV ..."
        if not args.label and job_kinds()[args.job].needs_label:
            return f"--label is required with --job {args.job}"
        if args.site_data is not None and len(args.site_data) != args.sites:
            return f"--site-data has {len(args.site_data)} files for --sites {args.sites}"
    if args.holdout is not None and (args.data is None or args.test_data is not None or not 0 < args.holdout < 1):
        return "--holdout needs --data (not --test-data) and a fraction between 0 and 1"
    if args.kill_leader_at_round is not None and (args.job != "xgboost" or args.kill_leader_at_round < 1):
        return "--kill-leader-at-round needs --job xgboost and a round >= 1"
    try:   # usage errors found before any daemon starts (exit 2), not after (exit 1)
        if args.data is not None and args.job != "membership":
            split_fractions(args.split, args.sites)
        if args.job != "membership":
            checked = job_kinds()[args.job].check_params(_job_params(args.job, args.param))
            if args.job == "xgboost" and checked["mode"] == "histogram":
                if args.kill_leader_at_round is not None:
                    return "--kill-leader-at-round needs --param mode=bagging (histogram mode has no leader)"
                if (args.num_local_round or 1) > 1:
                    return "--num-local-round > 1 needs --param mode=bagging (histogram mode grows one tree per round)"
    except (HarnessError, JobError) as exc:
        return str(exc)
    return None


def _make_harness(args: argparse.Namespace, workdir: Path) -> Harness:
    site_data = None
    if args.job != "membership":
        if args.data is not None:
            source = args.data
            if str(source).startswith("builtin:"):
                source = builtin_csv(str(source), workdir / "builtin.csv")
            if args.holdout is not None:
                source, args.test_data = split_csv(source, args.label, 2, f"{1 - args.holdout},{args.holdout}",
                                                   args.seed, workdir / "holdout")
            site_data = split_csv(source, args.label, args.sites, args.split, args.seed, workdir / "splits")
        else:
            site_data = [p.resolve() for p in args.site_data]
    data_settings = {"label": args.label or "", "positive": args.positive or "",
                     "ignore": [c.strip() for c in args.ignore.split(",") if c.strip()], "missing": args.missing}
    return Harness(workdir, args.sites, site_data=site_data, data_settings=data_settings,
                   test_data=args.test_data.resolve() if args.test_data else None)


def _job_params(kind_name: str, pairs: list[str]) -> dict[str, Any]:
    from .jobs.kinds import job_kinds

    kind = job_kinds()[kind_name]
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in kind.params:
            raise HarnessError(f"--param {pair!r}: expected KEY=VALUE with KEY one of {sorted(kind.params)}")
        typ = kind.params[key].type
        try:
            params[key] = (text.lower() in ("1", "true", "yes")) if typ is bool else typ(text)
        except ValueError:
            raise HarnessError(f"--param {pair!r}: {text!r} is not a {typ.__name__}") from None
    return params


async def _run_job(harness: Harness, args: argparse.Namespace) -> dict:
    from .jobs.kinds import job_kinds

    params = _job_params(args.job, args.param)
    known = job_kinds()[args.job].params
    for name, value in (("seed", args.seed), ("variant", args.variant), ("baseline", args.baseline),
                        ("rounds", args.rounds), ("num_local_round", args.num_local_round)):
        if value is not None and name in known:
            params.setdefault(name, value)
    job_id = await harness.propose(0, args.job, params)
    failover = None
    if args.kill_leader_at_round is not None:
        failover = asyncio.create_task(kill_leader_at_round(harness, job_id, args.kill_leader_at_round,
                                                            args.timeout_s))
    try:
        records = await harness.wait_job(job_id, args.timeout_s)
    finally:
        if failover is not None and not failover.done():
            failover.cancel()
    if failover is not None and not failover.cancelled():
        try:
            chaos = failover.result()
        except HarnessError as exc:
            chaos = {"error": str(exc)}
        records = {i: r for i, r in records.items() if harness.sites[i].name != chaos.get("killed")}
    proposer = records.get(0) or {}
    states = {r["state"] for r in records.values() if r is not None}
    errors = sorted({r["error"] for r in records.values() if r is not None and r.get("error")})
    job = {"id": job_id, "kind": args.job, "state": "done" if states == {"done"} else "failed",
           "elapsed_s": proposer.get("elapsed_s"), "error": "; ".join(errors) or None}
    sites = [{"name": harness.sites[i].name, "rows": (r or {}).get("rows"),
              "state": (r or {}).get("state", "no record" if harness._running(i) else "daemon gone"),
              "result": (r or {}).get("result")}
             for i, r in records.items()]
    if failover is not None:
        job["failover"] = chaos
    return {"job": job, "sites": sites}


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


async def _chaos(harness: Harness, timeout_s: float) -> dict:
    victim = harness.n_sites - 1
    harness.kill9(victim)
    dead_s = await harness.wait_peer_state(victim, "dead", timeout_s)
    harness.start(victim)
    alive_s = await harness.wait_peer_state(victim, "alive", timeout_s)
    return {"killed": harness.sites[victim].name, "seen_dead_after_s": round(dead_s, 3),
            "alive_after_restart_s": round(alive_s, 3)}


def split_fractions(split: str, parts: int) -> list[float]:
    """--split as one fraction per part: "stratified" (equal parts) or "0.5,0.3,0.2"."""
    try:
        fractions = [1 / parts] * parts if split == "stratified" else [float(x) for x in split.split(",")]
    except ValueError:
        fractions = []
    if len(fractions) != parts or any(not x > 0 for x in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise HarnessError(f"--split {split!r}: need {parts} positive fractions that add up to 1")
    return fractions


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
    took = f"the job ran {job['elapsed_s']} s" if job["kind"] != "membership" else f"{job['elapsed_s']} s"
    lines = [f"job {job['kind']}{' ' + job['id'] if job.get('id') else ''}: {job['state']} ({took})"
             + (f" — error: {job['error']}" if job["error"] else "")]
    if job.get("startup_s") is not None:
        lines.append(f"all sites saw each other alive after {job['startup_s']} s")
    if job.get("chaos"):
        c = job["chaos"]
        lines.append(f"chaos: killed {c['killed']} (kill -9); others saw it dead after {c['seen_dead_after_s']} s; "
                     f"restarted, alive again after {c['alive_after_restart_s']} s")
    if job["kind"] == "membership":
        lines.append(_membership_table(report["sites"]))
    elif job["kind"] == "stats":
        lines.append(_stats_table(report["sites"]))
    elif job["kind"] == "bofrf":
        lines.append(bofrf_table(report["sites"]))
    elif job["kind"] == "xgboost":
        if job.get("failover"):
            f = job["failover"]
            lines.append(f"failover: killed the leader {f.get('killed')} (kill -9) in round {f.get('at_round')}; "
                         f"{f.get('new_leader')} elected after {f.get('elected_after_s')} s; next round "
                         f"committed {f.get('next_commit_after_s')} s after the kill" if "error" not in f
                         else f"failover: {f['error']}")
        lines.append(xgboost_table(report["sites"]))
    elif job["kind"] in ("kmeans", "gmm", "dbscan"):
        lines.append(cluster_table(report["sites"]))
    if job["kind"] in ("logreg", "mlp"):
        lines.append(logreg_table(report["sites"]))
    if not temp:
        lines.append(f"sites, keys and daemon logs: {workdir}")
    return "\n".join(lines)


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def logreg_table(sites: list[dict]) -> str:
    """logreg / mlp: one row per site: the fit's end, its federated training log-loss and AUC, and
    the classes the site's own rows lack (the coefficients and weights are in --json)."""
    rows = [("SITE", "ROWS HERE", "STATUS", "ITERATIONS", "SECURE SUMS", "LOGLOSS", "AUC", "AUC ON", "LACKS CLASSES")]
    for s in sites:
        r = s["result"] or {}
        if not r:
            rows.append((s["name"], s["rows"] or "-", s["state"], "-", "-", "-", "-", "-", "-"))
            continue
        last = r["history"][-1] if r.get("history") else {}
        loss = f"{last.get('loss', last.get('logloss')):.6f}" if last else "-"
        auc = "-" if r.get("auc") is None else f"{r['auc']:.4f}"
        rows.append((s["name"], s["rows"], r.get("status", "rounds done"), r.get("iterations", r.get("rounds")),
                     r["secure_sums"], loss, auc,
                     r.get("auc_source") or "-", ", ".join(r["classes_absent_here"]) or "-"))
    return _table(rows)


def _membership_table(sites: list[dict]) -> str:
    rows = [("SITE", "ADDRESS", "FINGERPRINT", "ALIVE PEERS", "MEDIAN RTT")]
    for s in sites:
        r = s["result"]
        if "error" in r:
            rows.append((s["name"], "-", "-", r["error"], "-"))
            continue
        rtts = sorted(p["rtt_ms"] for p in r["peers"].values() if p["rtt_ms"] is not None)
        median = f"{rtts[len(rtts) // 2]:.1f} ms" if rtts else "-"
        rows.append((s["name"], r["address"], r["fingerprint"], f"{r['alive_peers']}/{len(r['peers'])}", median))
    return _table(rows)


def bofrf_table(sites: list[dict]) -> str:
    """Per-site table in the shape of the thesis' tables 7.1–7.6."""
    def auc(block: dict | None) -> str:
        return "-" if not block or block.get("auc") is None else f"{block['auc']:.3f}"
    rows = [("SITE", "ROWS", "LOCAL RF AUC", "BOFRF AUC", "CHANGE", "BOPPID AUC", "MODEL", "TAU", "TREES KEPT")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), "-", "-", "-", "-", "-", "-"))
            continue
        base, final = r["local_rf"].get("auc"), r["final"].get("auc")
        change = f"{100 * (final - base) / base:+.1f} %" if base and final is not None else "-"
        rows.append((s["name"], s.get("rows") or "-", auc(r["local_rf"]), auc(r["final"]), change,
                     auc(r.get("boppid")), r["final"]["model"], f"{r['tau']:.2f}",
                     f"{r['trees_kept']}/{r['trees_total']}"))
    return _table(rows)


def xgboost_table(sites: list[dict]) -> str:
    rows = [("SITE", "ROWS", "STATE", "ROUNDS", "AUC", "AUC OF", "FED. LOGLOSS", "FED. ACCURACY", "TREES",
             "MODEL SHA-256")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), *["-"] * 7))
            continue
        fed = r.get("federated_eval") or {}
        rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), r["rounds"],
                     "-" if r.get("auc") is None else f"{r['auc']:.4f}", r.get("auc_source") or "-",
                     f"{fed['logloss']:.4f}" if fed else "-", f"{fed['accuracy']:.4f}" if fed else "-", r["trees"],
                     r["model_sha256"][:16]))
    return _table(rows)


def _stats_table(sites: list[dict]) -> str:
    rows = [("SITE", "STATE", "LOCAL ROWS", "FEDERATION ROWS", "POSITIVE SHARE", "FIRST COLUMN MEAN ± STD")]
    for s in sites:
        r = s.get("result") or {}
        first = next(iter(r.get("mean", {})), None)
        spread = f"{first}: {r['mean'][first]:.4g} ± {r['std'][first]:.4g}" if first else "-"
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("count", "-"), f"{r['positive_share']:.3f}" if r else "-", spread))
    return _table(rows)


def cluster_table(sites: list[dict]) -> str:
    """kmeans / gmm / dbscan: every site holds the same model; sizes are federation-wide ("< N": too few)."""
    rows = [("SITE", "STATE", "LOCAL ROWS", "FEDERATION ROWS", "ROUNDS", "INERTIA / LOG-LIKELIHOOD", "CLUSTER SIZES")]
    for s in sites:
        r = s.get("result") or {}
        fit = r.get("inertia", r.get("log_likelihood"))
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("rows", "-"), r.get("iterations", "-"), "-" if fit is None else f"{fit:.6g}",
                     " ".join(str(c) for c in r.get("cluster_sizes", [])) or "-"))
    return _table(rows)
