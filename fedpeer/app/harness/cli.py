"""`fedpeer harness`: start N real daemons on loopback (`fedpeer.app.harness.federation.Harness`), run one job
on them, print its report (`fedpeer.app.harness.report`), stop them."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedpeer.app.harness.federation import (
    BUILTIN,
    Harness,
    HarnessError,
    builtin_csv,
    kill_leader_at_round,
    split_csv,
    split_fractions,
    traffic_delta,
)
from fedpeer.app.harness import zygote
from fedpeer.app.harness.report import format_report, site_report
from fedpeer.errors import FedpeerError, JobError


START_WAIT_S_MIN = 120        # how long the sites may take to see each other alive, at least ...
START_WAIT_S_PER_SITE = 3     # ... and per site (100 sites on 2 cores: minutes)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fedpeer.kinds.catalog import job_kinds

    p.add_argument("--sites", type=int, default=5,
                   help="number of sites (daemons) to start, 2 to 100; above 20 a core they share this machine's "
                        "cores with [membership] and [election] periods and [jobs] hop_timeout_ms grown in proportion "
                        "(slower detection)")
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
    p.add_argument("--partition", default="horizontal", choices=["horizontal", "vertical"],
                   help="vertical: each --site-data file holds other columns of the same entities, named by "
                        "--id-column; the files go to the sites in ring order, so a job's joined columns (kmeans's "
                        "centers and init) are in --site-data order")
    p.add_argument("--id-column", help="the column naming each entity ([data] id_column), with --partition vertical")
    p.add_argument("--seed", type=int, default=0,
                   help="seed for the data split, the sites' demo keys (so a run's figures repeat) and the job, "
                   "where it has one")
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
    p.add_argument("--fork", action=argparse.BooleanOptionalAction, default=True,
                   help="fork every daemon from one process that imported the daemon and its ML libraries once, "
                        "so they share those pages (the default: ~30 MiB of memory of its own per daemon instead of "
                        "~290 MiB, and no imports at start); --no-fork starts each as its own "
                        "`python -m fedpeer start`")


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
    zygote.share(args.fork)     # started by the first daemon's start, stopped below
    try:
        harness = _make_harness(args, workdir)
        harness.create()
        harness.start()
        startup_s = min(args.timeout_s, max(START_WAIT_S_MIN, START_WAIT_S_PER_SITE * args.sites))
        report["job"]["startup_s"] = round(asyncio.run(harness.wait_all_alive(startup_s)), 3)
        if args.chaos:
            report["job"]["chaos"] = asyncio.run(_chaos(harness, args.timeout_s))
        if args.job == "membership":
            statuses = asyncio.run(harness.statuses())
            report["sites"] = [site_report(harness.sites[i], doc) for i, doc in statuses.items()]
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
        zygote.share(False)     # the daemons are stopped: the zygote goes too
        report["job"]["elapsed_s"] = report["job"].get("elapsed_s") or round(time.monotonic() - started, 3)
        if temp:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2) if args.json else format_report(report, workdir, temp))
    return 0 if report["job"]["state"] == "done" else 1


def _check_arguments(args: argparse.Namespace) -> str | None:
    from fedpeer.kinds.catalog import job_kinds

    if not 2 <= args.sites <= 100:
        return "--sites must be between 2 and 100"
    if args.data is not None and str(args.data).startswith("builtin:"):
        if str(args.data) not in BUILTIN:
            return f"--data {args.data}: known built-in data sets: {', '.join(BUILTIN)}"
        builtin_label, builtin_positive = BUILTIN[str(args.data)]
        args.label, args.positive = args.label or builtin_label, args.positive or builtin_positive
    if args.job != "membership":
        if args.data is None and args.site_data is None and job_kinds()[args.job].needs_data:
            return f"--job {args.job} needs --data CSV or --site-data CSV ..."
        if not args.label and job_kinds()[args.job].needs_label and job_kinds()[args.job].needs_data \
                and args.partition != "vertical":     # a vertical job needs no label
            return f"--label is required with --job {args.job}"
        if args.site_data is not None and len(args.site_data) != args.sites:
            return f"--site-data has {len(args.site_data)} files for --sites {args.sites}"
    if (args.partition == "vertical") != bool(args.id_column):
        return "--partition vertical and --id-column go together"
    if args.partition == "vertical" and args.job != "membership" and args.site_data is None:
        return "--partition vertical needs --site-data: one file per site, each a block of columns and the ID column"
    if args.holdout is not None and (args.data is None or args.test_data is not None or not 0 < args.holdout < 1):
        return "--holdout needs --data (not --test-data) and a fraction between 0 and 1"
    led = [name for name, kind in job_kinds().items() if kind.led is not None]
    if args.kill_leader_at_round is not None and (args.job not in led or args.kill_leader_at_round < 1):
        return f"--kill-leader-at-round needs --job {' or '.join(led)} and a round >= 1"
    try:   # usage errors found before any daemon starts (exit 2), not after (exit 1)
        if args.data is not None and args.job != "membership":
            split_fractions(args.split, args.sites)
        if args.job != "membership":
            checked = job_kinds()[args.job].check_params(_job_params(args.job, args.param))
            kind = job_kinds()[args.job]
            if kind.led is not None and not kind.led(checked):
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
        elif args.site_data is not None:
            site_data = [p.resolve() for p in args.site_data]
    data_settings = {"label": args.label or "", "positive": args.positive or "",
                     "ignore": [c.strip() for c in args.ignore.split(",") if c.strip()], "missing": args.missing}
    if args.partition == "vertical":
        data_settings.update(partition="vertical", id_column=args.id_column)
    return Harness(workdir, args.sites, site_data=site_data, data_settings=data_settings,
                   test_data=args.test_data.resolve() if args.test_data else None,
                   data_in_ring_order=args.partition == "vertical", key_seed=args.seed)


def _job_params(kind_name: str, pairs: list[str]) -> dict[str, Any]:
    from fedpeer.kinds.catalog import job_kinds

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
    from fedpeer.kinds.catalog import job_kinds

    params = _job_params(args.job, args.param)
    known = job_kinds()[args.job].params
    for name, value in (("seed", args.seed), ("variant", args.variant), ("baseline", args.baseline),
                        ("rounds", args.rounds), ("num_local_round", args.num_local_round)):
        if value is not None and name in known:
            params.setdefault(name, value)
    before = await harness.traffic()
    job_id = await harness.propose(0, args.job, params)
    failover = None
    if args.kill_leader_at_round is not None:
        failover = asyncio.create_task(kill_leader_at_round(harness, job_id, args.kill_leader_at_round,
                                                            args.timeout_s))
    shown = asyncio.create_task(_show_progress(harness, job_id))
    try:
        records = await harness.wait_job(job_id, args.timeout_s)
    finally:
        shown.cancel()
        await asyncio.gather(shown, return_exceptions=True)
        if failover is not None and not failover.done():
            failover.cancel()
    after = await harness.traffic()
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
              "result": (r or {}).get("result"), **traffic_delta(before.get(i), after.get(i))}
             for i, r in records.items()]
    if failover is not None:
        job["failover"] = chaos
    return {"job": job, "sites": sites}


async def _show_progress(harness: Harness, job_id: str) -> None:
    """The proposer's view of the job on stderr while it runs, as `fedpeer run --wait` shows it
    (a terminal: one live line; else a line every PROGRESS_PIPE_INTERVAL_S)."""
    from fedpeer.app.runwait import POLL_S, Progress

    progress = Progress(sys.stderr, live=sys.stderr.isatty())
    try:
        while True:
            record = await harness.job(0, job_id)
            if record is not None:
                progress.show(record)
            await asyncio.sleep(POLL_S)
    finally:
        progress.end()


async def _chaos(harness: Harness, timeout_s: float) -> dict:
    victim = harness.n_sites - 1
    harness.kill9(victim)
    dead_s = await harness.wait_peer_state(victim, "dead", timeout_s)
    harness.start(victim)
    alive_s = await harness.wait_peer_state(victim, "alive", timeout_s)
    return {"killed": harness.sites[victim].name, "seen_dead_after_s": round(dead_s, 3),
            "alive_after_restart_s": round(alive_s, 3)}
