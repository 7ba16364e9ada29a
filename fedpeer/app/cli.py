"""Command line: parse arguments, call the package, print. No logic lives here.

Exit codes (the README's table): 0 success; 1 something asked for failed (a job, a harness run,
a ping, an unknown job); 2 bad configuration or a usage error (an option or job parameter out of
range) — never anything else, because systemd does not restart after 2 and an operator reads it as
"fix what you typed"; 3 no daemon answers on the admin endpoint.

Imports are made where a command needs them: `fedpeer --version` and `fedpeer status` import
neither the job kinds nor numpy nor aiohttp (tests/unit/test_cli_usage.py checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedpeer.app.jobtext import format_job, jobs_table, site_class_names
from fedpeer.errors import ConfigError, FedpeerError, JobError, NoDaemonError

if TYPE_CHECKING:
    from fedpeer.config.load import Config

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_NO_DAEMON = 0, 1, 2, 3
EXIT_USAGE = EXIT_CONFIG   # argparse exits 2 for what it rejects; our own usage checks agree
CONFIG_HELP = "the site's peers.toml{} (default: $FEDPEER_CONFIG, else ./peers.toml, else /etc/fedpeer/peers.toml)"
CONFIG_EPILOG = ("Every command that reads a site's peers.toml takes --config FILE; without it, fedpeer reads "
                 "$FEDPEER_CONFIG, else ./peers.toml, else /etc/fedpeer/peers.toml (the first that exists).")


def _version() -> str:
    from fedpeer.base.build import describe

    return describe()   # this tree's version and commit (the installed metadata may be another build's)


class _VersionAction(argparse.Action):
    """argparse's "version" action, looking the commit up only when asked (it reads git's files)."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        print(f"fedpeer {_version()}")
        parser.exit()


def _count(low: int):
    """An argparse type: an integer of at least `low`, so a nonsense count is a usage error (2)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = "integer"   # argparse names the type in its message
    return parse


# Commands whose parsers need every job kind's parameters (importing the job modules and numpy,
# ~0.4 s): built only when the command line asks for one of them, or for the top-level help.
_KIND_COMMANDS = ("run", "harness")


class _Parser(argparse.ArgumentParser):
    """Every fedpeer parser, subcommands' included (argparse makes them of the top one's class): no
    abbreviations, so `--round 5` is an error, never `--rounds 5`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


_KIND_PARSERS: dict[str, argparse.ArgumentParser] = {}   # `run KIND`'s parser, for its usage errors


def _parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    _KIND_PARSERS.clear()
    p = _Parser(prog="fedpeer", description="Peer-to-peer federated learning daemon.",
                                epilog=CONFIG_EPILOG)
    p.add_argument("--version", action=_VersionAction, help="print this build's fedpeer version and commit, and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init", help="create a site: peers.toml and identity key")
    s.add_argument("--dir", required=True, type=Path, help="directory for peers.toml and identity.key")
    s.add_argument("--name", required=True, help="this site's name")
    s.add_argument("--listen", required=True, help="HOST:PORT the daemon listens on for peers")
    s.add_argument("--advertise", help="HOST:PORT other sites use (default: --listen)")
    s.add_argument("--admin", help="admin endpoint: unix:PATH (default unix:state/admin.sock) or 127.0.0.1:PORT")
    s.add_argument("--data", type=Path, metavar="CSV", help="this site's rows: writes a [data] table naming the CSV "
                   "(it must exist)")
    s.add_argument("--label", help="with --data: the label column (it must be in the CSV's header)")
    s.add_argument("--positive", help="with --data: the positive class, for binary jobs (a value of the label)")
    s.add_argument("--ignore", action="append", default=[], metavar="COL", help="with --data: a column that is "
                   "not a feature, such as a row ID (repeatable)")
    s.add_argument("--id-column", metavar="COL", help="with --data and --partition vertical: the column naming "
                   "each entity, the same entities at every site")
    s.add_argument("--partition", choices=("horizontal", "vertical"), help="with --data: horizontal (the sites "
                   "hold other rows of the same columns; the default) or vertical (other columns of the same "
                   "entities, aligned on --id-column)")

    s = sub.add_parser("invite", help="print this site's invite: one line (name, address, public key, fingerprint) "
                       "the other sites give to 'fedpeer peer add --invite'")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))

    s = sub.add_parser("key", help="identity key commands")
    ks = s.add_subparsers(dest="key_command", required=True, metavar="SUBCOMMAND")
    k = ks.add_parser("show", help="print this site's public key and fingerprint")
    k.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))

    s = sub.add_parser("peer", help="federation membership commands")
    ps = s.add_subparsers(dest="peer_command", required=True, metavar="SUBCOMMAND")
    k = ps.add_parser("add", help="add other sites to peers.toml: from their invites, or one by name, address "
                      "and key")
    k.add_argument("--config", type=Path, help=CONFIG_HELP.format(" to add the peer to"))
    k.add_argument("--invite", action="append", metavar="LINE", help="a line 'fedpeer invite' printed at another "
                   "site (repeatable: every other site at once; this site's own invite is passed over)")
    k.add_argument("--name", help="without --invite: this site's name for the other site (a local label)")
    k.add_argument("--address", help="without --invite: HOST:PORT the other site advertises")
    k.add_argument("--public-key", help="without --invite: the site's key, from its 'fedpeer key show'")
    k = ps.add_parser("remove", help="remove a site from peers.toml (the running daemon refuses it at once)")
    k.add_argument("--config", type=Path, help=CONFIG_HELP.format(" to remove the peer from"))
    k.add_argument("name", help="the peer's name in peers.toml")
    k = ps.add_parser("list", help="the sites in peers.toml (with their state, if the daemon answers)")
    k.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))

    s = sub.add_parser("reload", help="make the running daemon re-read peers.toml (as SIGHUP does)")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(" (checked here first)"))
    s.add_argument("--json", action="store_true", help="print what changed as JSON")

    s = sub.add_parser("start", help="run the daemon in the foreground")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="least severe log lines written to stderr (default: info)")

    s = sub.add_parser("status", help="ask the running local daemon for the federation's health")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
    s.add_argument("--json", action="store_true", help="machine-readable output")

    s = sub.add_parser("netcheck", help="how this site and each peer reach each other: whether peers can dial "
                                        "this site, its proxy, and per peer the path (direct, proxy, inbound "
                                        "links, relayed by whom), RTT and links")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
    s.add_argument("--json", action="store_true", help="machine-readable output (the whole status)")

    s = sub.add_parser("ping", help="time sealed messages from the local daemon to a peer")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
    s.add_argument("peer", help="the peer's name in peers.toml")
    s.add_argument("--count", type=_count(1), default=10, help="messages to send (default: 10)")
    s.add_argument("--size", type=_count(0), default=64, help="payload bytes per message (default: 64)")
    s.add_argument("--json", action="store_true", help="print the delivery times as JSON")

    given = sys.argv[1:] if argv is None else argv
    first = next((a for a in given if not a.startswith("-")), None)
    kinds_needed = first in _KIND_COMMANDS or (first is None and "--version" not in given)
    _add_job_commands(sub, kinds_needed)

    s = sub.add_parser("predict", help="score new rows with a job's stored model (no daemon needed)")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(" (its state_dir holds the model)"))
    s.add_argument("--job", required=True, help="the job id whose model to use")
    s.add_argument("--data", required=True, type=Path, help="CSV with the model's feature columns (others are ignored)")
    s.add_argument("--out", type=Path, help="write the scores here as CSV (default: standard output)")
    s.add_argument("--id-column", metavar="COL", help="a column of --data naming each row: the output's first column "
                   "holds its values instead of the row number")

    s = sub.add_parser("export", help="write a job's model as JSON (no daemon needed): logreg as scikit-learn "
                       "LogisticRegression coefficients, mlp its weights, tree scikit-learn's tree arrays, xgboost "
                       "xgboost's own JSON model (xgboost.Booster(model_file=...) loads it)")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(" (its state_dir holds the model)"))
    s.add_argument("--job", required=True, help="the job id (logreg, mlp, tree or xgboost) whose model to export")
    s.add_argument("--out", type=Path, help="write the JSON here (default: standard output)")

    s = sub.add_parser("data", help="this site's [data]: check it before a job does")
    ds = s.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    k = ds.add_parser("check", help="load the site's data exactly as a job would and print rows, features, "
                      "label balance, missing values per column and the schema fingerprint (no daemon needed)")
    k.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
    k.add_argument("--json", action="store_true", help="print rows, features, schema_fingerprint (hex), "
                   "label_counts, missing and binary_refusal (what stats and bofrf would say of the label, "
                   "or null) as JSON")

    s = sub.add_parser("privacy", help="what DP jobs released of this site's data against [privacy] (no daemon needed)")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(" (its state_dir holds the ledger)"))

    s = sub.add_parser("console", help="serve a page on loopback that shows the federation and its jobs and "
                       "proposes jobs; prints its URL (with a fresh token) on the first line")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(" (the daemon the page talks to)"))
    s.add_argument("--site", action="append", type=Path, metavar="CONFIG",
                   help="another site's peers.toml on this machine whose daemon the page also reads, "
                   "for per-site results (a local federation); repeatable")
    s.add_argument("--port", type=_count(0), default=0, help="loopback port to serve on (default: 0, a free one)")

    harness = sub.add_parser("harness", help="run a local federation of real daemons")
    if kinds_needed:
        from fedpeer.app.harness.cli import add_arguments as add_harness_arguments
        add_harness_arguments(harness)
    return p


def _add_job_commands(sub: argparse._SubParsersAction, with_kinds: bool) -> None:
    """run (with every kind's parameters only when `with_kinds`: else it is listed, never parsed),
    jobs, job."""
    s = sub.add_parser("run", help="propose a federated job from this site")
    kinds = s.add_subparsers(dest="kind", required=True, metavar="KIND")
    if with_kinds:
        from fedpeer.app.runargs import add_kind_arguments
        from fedpeer.kinds.catalog import job_kinds
    for kind in job_kinds().values() if with_kinds else ():
        k = kinds.add_parser(kind.name, help=kind.help)
        k.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
        k.add_argument("--members", help="comma-separated member names (default: this site and every alive peer)")
        k.add_argument("--wait", action="store_true", help="wait for the result, showing progress on stderr (a "
                       "terminal: one live line; else a line every few seconds); Ctrl-C asks whether to cancel it")
        k.add_argument("--json", action="store_true", help="print the job record as JSON")
        add_kind_arguments(k, kind)
        _KIND_PARSERS[kind.name] = k

    s = sub.add_parser("jobs", help="list this site's jobs")
    s.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
    s.add_argument("--json", action="store_true", help="print the list as JSON")

    s = sub.add_parser("job", help="one job: show or cancel")
    js = s.add_subparsers(dest="job_command", required=True, metavar="SUBCOMMAND")
    for name, text in (("show", "spec, members, phase, progress, timings, errors and this site's result"),
                       ("cancel", "cancel a running job on every member")):
        k = js.add_parser(name, help=text)
        k.add_argument("id", help="the job id, as 'fedpeer jobs' lists it")
        k.add_argument("--config", type=Path, help=CONFIG_HELP.format(""))
        k.add_argument("--json", action="store_true", help="print the job record as JSON")


def main(argv: list[str] | None = None) -> int:
    parser = _parser(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        from fedpeer.app import runargs
        from fedpeer.kinds.catalog import job_kinds

        kind_parser, kind = _KIND_PARSERS[args.kind], job_kinds()[args.kind]
        if extra:
            runargs.unknown_options(kind_parser, kind, extra)
        args.params = runargs.resolve(kind_parser, kind, args)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if "config" in vars(args):
            from fedpeer.config.locate import find

            args.config = find(args.config)
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()   # a reader that went away (`| head`) surfaces here, not at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # the exit flush must not fail again
        return EXIT_FAILED
    except ConfigError as exc:
        print(f"fedpeer: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except NoDaemonError as exc:
        print(f"fedpeer: {exc}", file=sys.stderr)
        return EXIT_NO_DAEMON
    except FedpeerError as exc:
        print(f"fedpeer: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


def _load(path: Path) -> Config:
    from fedpeer.config.load import load

    return load(path)


def _ask(config: Any, method: str, path: str, payload: Any = None, **kwargs: Any) -> Any:
    """One request to the local daemon's admin API (fedpeer/daemon/adminclient.py: no aiohttp)."""
    import asyncio

    from fedpeer.daemon.adminclient import request

    return asyncio.run(request(config, method, path, payload, **kwargs))


def _init(args: argparse.Namespace) -> int:
    from fedpeer.app import invite
    from fedpeer.app.sitefiles import init_site
    from fedpeer.identity import encode_public_key

    if (args.label or args.positive or args.ignore or args.id_column or args.partition) and args.data is None:
        print("fedpeer init: --label, --positive, --ignore, --id-column and --partition go with --data CSV",
              file=sys.stderr)
        return EXIT_USAGE
    path, identity = init_site(args.dir, args.name, args.listen, args.advertise, args.admin, data=args.data,
                               label=args.label, positive=args.positive, ignore=args.ignore,
                               id_column=args.id_column, partition=args.partition)
    config = _load(path)
    print(f"created {path} and {path.parent / 'identity.key'} (mode 0600)")
    print(f"public key:  {encode_public_key(identity.public_key)}")
    print(f"fingerprint: {identity.fingerprint}")
    print("Give this site's invite to the other sites over a channel you trust ('fedpeer invite' prints it "
          "again); add theirs with 'fedpeer peer add --invite LINE --invite LINE ...':")
    print(invite.make(config.node.name, str(config.node.advertise), identity.public_key))
    return EXIT_OK


def _invite(args: argparse.Namespace) -> int:
    from fedpeer.app import invite
    from fedpeer.identity import load_key_file

    config = _load(args.config)
    identity = load_key_file(config.node.key_file, config.path)
    print(invite.make(config.node.name, str(config.node.advertise), identity.public_key))
    return EXIT_OK


def _key(args: argparse.Namespace) -> int:
    from fedpeer.identity import encode_public_key, load_key_file

    from fedpeer.kinds.catalog import load_config

    config = load_config(args.config)
    identity = load_key_file(config.node.key_file, config.path)
    print(encode_public_key(identity.public_key))
    print(f"fingerprint: {identity.fingerprint}")
    return EXIT_OK


def _peer(args: argparse.Namespace) -> int:
    if args.peer_command == "list":
        return _peer_list(args)
    from fedpeer.app.sitefiles import add_peer, remove_peer

    if args.peer_command == "add" and args.invite:
        return _peer_add_invited(args)
    if args.peer_command == "add":
        missing = [f"--{n.replace('_', '-')}" for n in ("name", "address", "public_key") if not getattr(args, n)]
        if missing:
            print(f"fedpeer peer add: give --invite LINE, or all of --name, --address and --public-key "
                  f"(missing: {', '.join(missing)})", file=sys.stderr)
            return EXIT_USAGE
        add_peer(args.config, args.name, args.address, args.public_key)
        print(f"added peer {args.name} ({args.address}) to {args.config}")
    else:
        remove_peer(args.config, args.name)
        print(f"removed peer {args.name} from {args.config}")
    return _tell_daemon(args.config)


def _peer_add_invited(args: argparse.Namespace) -> int:
    from fedpeer.app import invite
    from fedpeer.app.sitefiles import add_invited

    if args.name or args.address or args.public_key:
        print("fedpeer peer add: --invite carries the name, address and key: give no --name, --address or "
              "--public-key with it", file=sys.stderr)
        return EXIT_USAGE
    try:
        invites = [invite.parse(line) for line in args.invite]
    except ValueError as exc:
        print(f"fedpeer peer add: --invite: {exc}", file=sys.stderr)
        return EXIT_USAGE
    done = add_invited(args.config, invites)
    for site, what in done:
        where = f"{site.name} ({site.address}, fingerprint {site.fingerprint})"
        print({"added": f"added peer {where} to {args.config}", "this site": f"{where} is this site: passed over",
               "already listed": f"{where} is already listed"}[what])
    return _tell_daemon(args.config) if any(what == "added" for _, what in done) else EXIT_OK


def _tell_daemon(config_path: Path) -> int:
    """After an edit of peers.toml: reload the running daemon, and say whether it took the edit."""
    from fedpeer.daemon.reload import one_line

    config = _load(config_path)
    try:
        doc = _ask(config, "POST", "/v1/reload")
    except NoDaemonError:
        print("no daemon answers on this site's admin endpoint: it reads the change when it starts")
        return EXIT_OK
    except FedpeerError as exc:
        print(f"fedpeer: the running daemon did not take the change: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"the running daemon picked it up: {one_line(doc['changes'])}")
    return EXIT_OK


def _peer_list(args: argparse.Namespace) -> int:
    from fedpeer.identity import fingerprint
    from fedpeer.jobs.report import table

    config = _load(args.config)
    try:
        states = {p["name"]: p["state"] for p in _ask(config, "GET", "/v1/status")["peers"]}
    except NoDaemonError:
        states = {}
    rows = [("PEER", "ADDRESS", "FINGERPRINT", "STATE")]
    rows += [(p.name, str(p.address), fingerprint(p.public_key), states.get(p.name, "-")) for p in config.peers]
    print(table(rows) if config.peers else f"no [[peer]] in {config.path}")
    return EXIT_OK


def _reload(args: argparse.Namespace) -> int:
    from fedpeer.daemon.reload import one_line

    from fedpeer.kinds.catalog import load_config

    config = load_config(args.config)   # a file that does not validate is refused here, as by `start`
    try:
        doc = _ask(config, "POST", "/v1/reload")
    except FedpeerError as exc:
        if isinstance(exc, NoDaemonError) or not str(exc).startswith("configuration error: "):
            raise
        # the daemon refused the file ([data] against its CSV): the same line and exit 2 as any config error
        print(f"fedpeer: {exc}; the daemon keeps running the configuration it had", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(doc, indent=2) if args.json else f"reloaded {doc['path']}: {one_line(doc['changes'])}")
    return EXIT_OK


def _start(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from fedpeer.base import logs
    from fedpeer.config import load as cfg
    from fedpeer.daemon.node import Node
    from fedpeer.daemon.warmup import tune_gc
    from fedpeer.identity import load_key_file

    config = _load(args.config)
    identity = load_key_file(config.node.key_file, config.path)
    tune_gc()
    cfg.check_own_key_not_peer(config, identity.public_key)
    cfg.check_secret_files(config)
    logs.setup(args.log_level)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        node = Node(config, identity)
        loop.add_signal_handler(signal.SIGHUP, node.reload_on_signal)   # systemd's ExecReload
        # Writes the counts of log floods that stopped; lives exactly as long as the node.
        flusher = asyncio.create_task(logs.flush_repeats_forever())
        try:
            await node.run(stop)
        finally:
            flusher.cancel()

    asyncio.run(serve())
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    """The daemon's status. When peers.toml does not load (an edit broke it), the daemon still runs
    the configuration it loaded before: ask it at the admin endpoint it recorded
    (fedpeer/config/locate.py) and say that the file has an error."""
    try:
        config: Any = _load(args.config)
        broken = None
    except ConfigError as exc:
        from fedpeer.config.locate import last_good

        config, broken = last_good(args.config), exc
        if config is None:
            raise
    try:
        doc = _ask(config, "GET", "/v1/status")
    except NoDaemonError:
        if broken is not None:
            raise broken from None    # no daemon runs an older copy: the file's error is what matters
        raise
    if broken is not None:
        loaded_at = (doc.get("config") or {}).get("loaded_at") or config.loaded_at
        problem = f"{broken.key}: {broken.problem}" if broken.key else broken.problem
        doc["config_error"] = (f"{Path(broken.path).name} has an error ({problem}): the daemon runs the "
                               f"configuration it loaded at {loaded_at}")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        from fedpeer.app.statustext import format_netcheck, format_status
        print(format_netcheck(doc) if args.command == "netcheck" else format_status(doc))
    return EXIT_OK


def _ping(args: argparse.Namespace) -> int:
    config = _load(args.config)
    payload = {"peer": args.peer, "count": args.count, "payload_bytes": args.size}
    timeout_ms = 60_000 + 100 * args.count
    doc = _ask(config, "POST", "/v1/diag/ping", payload, timeout_ms=timeout_ms)
    if args.json:
        print(json.dumps(doc))
        return EXIT_OK
    times = sorted(doc["delivery_ms"])
    p50, p99 = (times[min(len(times) - 1, int(q * len(times)))] for q in (0.5, 0.99))
    print(f"{len(times)} messages of {args.size} bytes to {args.peer}: "
          f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {times[-1]:.2f} ms")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from fedpeer.kinds.catalog import job_kinds

    params = args.params
    try:   # a parameter out of range is a usage error: say so before asking any daemon
        job_kinds()[args.kind].check_params(params)
    except JobError as exc:
        print(f"fedpeer run {args.kind}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = _load(args.config)
    members = [m.strip() for m in args.members.split(",")] if args.members else None
    job_id = _ask(config, "POST", "/v1/jobs", {"kind": args.kind, "params": params, "members": members})["id"]
    if not args.wait:
        print(job_id)
        return EXIT_OK
    from fedpeer.app.runwait import wait

    record, interrupted = wait(config, job_id)
    if record is None:
        return interrupted
    print(json.dumps(record, indent=2) if args.json else format_job(record, site_class_names(config)))
    return EXIT_OK if record["state"] == "done" else EXIT_FAILED


def _jobs(args: argparse.Namespace) -> int:
    doc = _ask(_load(args.config), "GET", "/v1/jobs")
    print(json.dumps(doc, indent=2) if args.json else jobs_table(doc["jobs"]))
    return EXIT_OK


def _job(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if args.job_command == "cancel":
        record = _ask(config, "POST", f"/v1/jobs/{args.id}/cancel")
    else:
        record = _ask(config, "GET", f"/v1/jobs/{args.id}")
    print(json.dumps(record, indent=2) if args.json else format_job(record, site_class_names(config)))
    return EXIT_OK


def _predict(args: argparse.Namespace) -> int:
    from fedpeer.app.predict import predict_csv

    rows = predict_csv(_load(args.config), args.job, args.data, id_column=args.id_column)
    if not args.out:
        _write_csv(sys.stdout, rows)
        return EXIT_OK
    with open(args.out, "w", newline="", encoding="utf-8") as out:
        _write_csv(out, rows)
    print(f"scored {len(rows)} rows into {args.out}", file=sys.stderr)
    return EXIT_OK


def _export(args: argparse.Namespace) -> int:
    from fedpeer.app.predict import export_model

    doc, note = export_model(_load(args.config), args.job)
    text = json.dumps(doc, indent=2)
    if not args.out:
        print(text)
        print(note, file=sys.stderr)
        return EXIT_OK
    args.out.write_text(text + "\n", encoding="utf-8")
    print(f"wrote job {args.job}'s model to {args.out}: {note}", file=sys.stderr)
    return EXIT_OK


def _write_csv(out, rows: list[dict]) -> None:
    import csv

    writer = csv.writer(out)
    writer.writerow(list(rows[0]))
    writer.writerows([list(r.values()) for r in rows])


def _harness(args: argparse.Namespace) -> int:
    from fedpeer.app.harness.cli import main as harness_main

    return harness_main(args)


def _console(args: argparse.Namespace) -> int:
    from fedpeer.app.console.server import main as console_main

    return console_main(args)


def _data(args: argparse.Namespace) -> int:
    from fedpeer.app.datacheck import format_report, report

    config = _load(args.config)
    if config.data is None:
        raise ConfigError(config.path, "[data]", "missing section: this site has no data to check")
    doc = report(config.data, config.jobs)      # a DataError (file, column, row, fix) exits 1
    print(json.dumps(doc, indent=2) if args.json else format_report(doc))
    return EXIT_OK


def _privacy(args: argparse.Namespace) -> int:
    from fedpeer.jobs.privacy import PrivacyLedger, show

    config = _load(args.config)
    print(show(PrivacyLedger(config.node.state_dir, config.privacy.epsilon_budget, config.privacy.delta_budget).rows()))
    return EXIT_OK


_COMMANDS = {"init": _init, "invite": _invite, "key": _key, "peer": _peer, "reload": _reload, "start": _start,
             "status": _status, "netcheck": _status, "ping": _ping, "run": _run, "jobs": _jobs, "job": _job,
             "predict": _predict,
             "harness": _harness, "export": _export, "data": _data, "console": _console,
             "privacy": _privacy}

if __name__ == "__main__":
    sys.exit(main())
