"""peers.toml -> frozen dataclasses.

Rules of this module:
- Every key is known: an unknown key (a typo) is an error, never silently ignored.
- Every limit and timeout has its unit as the last part of its name (`rtt_ms`, `message_bytes_max`).
- Relative paths are relative to the directory holding peers.toml, not to the working directory.
- Errors are `ConfigError(path, key, problem)`: one line naming file, key and problem.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fedpeer.core.election.raft import ElectionConfig
from fedpeer.core.membership.swim import MembershipConfig
from fedpeer.base.files import check_not_writable_by_others, check_private_file, check_site_directory
from fedpeer.config.address import Address, is_loopback, parse_address
from fedpeer.config.network import Network
from fedpeer.config.bounds import parse_bounds
from fedpeer.errors import ConfigError

DEFAULT_PORT = 7400


@dataclass(frozen=True)
class Limits:
    """Hard bounds on everything a peer can make us hold or wait for."""

    message_bytes_max: int = 64 * 1024 * 1024     # one frame on the wire, header included
    payload_bytes_max: int = 1024 * 1024 * 1024   # one message sent as a stream of frames (a model); also the
                                                  # bytes of all streams being received at once
    inbound_concurrent_max: int = 16              # frames being read/decoded at once (authenticated senders only)
    inbound_per_peer_max: int = 8                 # of those, from one peer
    inbound_bytes_max: int = 128 * 1024 * 1024    # bytes of large frames (> 1 MiB) read/decoded at once; half per peer
    connections_max: int = 1024                   # open peer-port connections (also kept under the open-files limit)
    unverified_connections_max: int = 64          # connections whose sender is not yet authenticated;
                                                  # oldest dropped first
    unverified_per_ip_max: int = 16               # of those, from one IP address (both: at least
                                                  # one per member, PeerServer.fit_members)
    header_timeout_ms: int = 5_000                # from a connection's first byte to the end of the frame header
    idle_timeout_ms: int = 60_000                 # an authenticated keep-alive connection with no request
    body_timeout_ms: int = 10_000                 # a frame body, plus its size at body_bytes_per_s_min
    body_bytes_per_s_min: int = 16_384
    outbound_inflight_max: int = 64               # best-effort sends in flight (gossip); more are dropped
    http_connect_timeout_ms: int = 2_000
    http_timeout_ms: int = 30_000                 # one request, body included
    send_retries_max: int = 3                     # reliable sends: tries after the first
    send_backoff_ms: int = 100                    # first retry delay; doubles, with jitter
    send_backoff_ms_max: int = 2_000
    shutdown_grace_ms: int = 5_000


@dataclass(frozen=True)
class MembershipTiming:
    """SWIM failure detection (see fedpeer/core/membership/swim.py). Defaults: dead within 10 s."""

    tick_ms: int = 100
    probe_interval_ms: int = 500
    probe_timeout_ms: int = 300
    indirect_probes: int = 3
    suspect_timeout_ms: int = 4_000
    dead_probe_interval_ms: int = 2_000
    piggyback_max: int = 8
    retransmit_mult: int = 3

    def __post_init__(self) -> None:
        self.swim()   # its consistency checks (probe_timeout_ms < probe_interval_ms, ...) at load
        if self.tick_ms < 1:
            raise ValueError("tick_ms must be >= 1")

    def swim(self) -> MembershipConfig:
        """The pure core's config; ValueError (a ConfigError at load) when inconsistent."""
        return MembershipConfig(
            probe_interval_ms=self.probe_interval_ms, probe_timeout_ms=self.probe_timeout_ms,
            indirect_probes=self.indirect_probes, suspect_timeout_ms=self.suspect_timeout_ms,
            dead_probe_interval_ms=self.dead_probe_interval_ms, piggyback_max=self.piggyback_max,
            retransmit_mult=self.retransmit_mult)


# A site's election timing (fedpeer/core/election/raft.py keeps faster defaults for its simulations):
# 500 ms heartbeats — a leader of 31 followers sends 62 frames/s, not 155; a 32-daemon federation
# idled at 0.435 cores with these and at 0.56 with 200 ms; failover takes a few seconds more.
SITE_ELECTION = ElectionConfig(heartbeat_interval_ms=500, election_timeout_min_ms=2_500,
                               election_timeout_max_ms=5_000)


EVERY_PEER = "*"
EVERY_KIND = "*"


@dataclass(frozen=True)
class Policy:
    """What this site agrees to take part in. Each site decides for itself, and applies it to its
    own proposals too."""

    allowed_jobs: tuple[str, ...] = (EVERY_KIND,)   # the kinds it joins; "*": every kind this build has
    members_max: int = 100
    proposers: tuple[str, ...] = (EVERY_PEER,)   # [[peer]] names whose proposals are considered; "*": all
    rows_min: int = 0                     # a job is refused if this site's data has fewer rows
    relay: bool = True                    # forward sealed frames between members that cannot reach each other
    relay_requests_max: int = 16          # relayed requests in flight at once (beyond: 503, the sender tries another)
    relay_bytes_max: int = 64 * 1024 * 1024   # bytes of relayed requests in flight at once
    ids_max: int = 1_000_000              # vertical jobs: IDs another member may announce for alignment
    # [policy.<kind>] tables: the largest (or smallest) parameters of a job of that kind this site
    # agrees to run, as written (kind -> limit -> value). Here they are checked as numbers only;
    # which kinds and limits exist is the job catalogue's to say (fedpeer/kinds/catalog.py
    # check_config, at start and reload), and an unset limit takes the kind's own default.
    limits: typing.Mapping[str, typing.Mapping[str, int]] = field(default_factory=dict)

    def may_propose(self, peer_name: str) -> bool:
        return EVERY_PEER in self.proposers or peer_name in self.proposers

    def allows(self, kind: str) -> bool:
        return EVERY_KIND in self.allowed_jobs or kind in self.allowed_jobs


@dataclass(frozen=True)
class DataSection:
    """This site's own data for jobs. The rows never leave the site."""

    csv: str = ""                     # path to the CSV (header row); relative to peers.toml's directory
    parquet: str = ""                 # or: a Parquet file or directory of part files (exactly one of csv, parquet)
    label: str = ""                   # the label column ("": none; only clustering jobs run without one)
    positive: str = ""                # the positive class value, for binary jobs
    ignore: tuple[str, ...] = ()      # columns that are not features (identifiers such as "Id")
    missing: str = "error"            # "error": a missing value stops the job; "drop": such rows are dropped;
                                      # "impute": filled site-locally (IterativeImputer fitted on csv's rows)
    test_csv: str = ""                # optional held-out rows (same columns) a job scores its final model on
    sql: str = ""                     # or: a PostgreSQL query whose result columns are the data
    dsn_file: str = ""                # sql: a file (mode 0600) holding the connection string, never peers.toml
    sql_timeout_ms: int = 60_000      # sql: the server cancels a statement running longer
    engine: str = "memory"            # "memory": the rows are loaded into the daemon; "dask": they stay
                                      # partitioned on the site's Dask cluster (fedpeer/data/dask.py)
    scheduler: str = ""               # dask: "tcp://host:port" of the cluster's scheduler, or "local" (a
                                      # LocalCluster of worker processes on this machine)
    dask_workers: int = 2             # dask, scheduler = "local": worker processes (started once, kept)
    dask_connect_timeout_ms: int = 10_000   # dask: the scheduler must answer within this
    dask_step_timeout_ms: int = 600_000     # dask: one step of a job on the cluster (a level's histograms)
    partition: str = "horizontal"     # "horizontal": the sites hold other rows of the same columns; "vertical":
                                      # other columns of the same entities, aligned by a private set intersection
                                      # on id_column (fedpeer/protocols/psi.py)
    id_column: str = ""               # vertical: the column naming each entity (never a feature)
    # public bounds per column, { age = [0, 120] }: what a DP job may assume without the rows (histogram
    # XGBoost's cut points); the same at every site (fedpeer/config/bounds.py `parse_bounds`)
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class JobLimits:
    """Bounds on jobs this site takes part in."""

    jobs_concurrent_max: int = 4          # jobs running at once on this site
    job_accept_timeout_ms: int = 30_000   # proposer waits this long for every member's answer
    job_start_timeout_ms: int = 60_000    # a member that accepted waits this long for the start
    job_timeout_ms: int = 3_600_000       # a job running longer fails on this site
    hop_timeout_ms: int = 20_000          # one hop of a ring protocol (secure sum)
    data_bytes_max: int = 2 * 1024**3     # a CSV larger than this is refused
    data_rows_max: int = 10_000_000
    preload_ml: bool = True               # import the training libraries in the background at start (~4 s of
                                          # CPU, ~240 MiB with numba's kernels): no job waits for them


@dataclass(frozen=True)
class Tracking:
    """[tracking]: where this site records the jobs it takes part in (fedpeer/daemon/tracking.py)."""

    mlflow_uri: str = ""       # an MLflow tracking URI ("file:///srv/mlruns", "http://mlflow:5000"); "": off


@dataclass(frozen=True)
class Privacy:
    """[privacy]: the (ε, δ) this site lets its data release, in total, per dataset (fedpeer/jobs/privacy.py)."""

    epsilon_budget: float = 8.0       # ε over every DP job on one dataset (they add up)
    delta_budget: float = 1e-5        # δ likewise

    def __post_init__(self) -> None:
        if not (self.epsilon_budget >= 0 and 0 <= self.delta_budget < 1):
            raise ValueError("epsilon_budget must be >= 0 and delta_budget in [0, 1)")


@dataclass(frozen=True)
class NodeSection:
    name: str
    listen: Address
    advertise: Address
    key_file: Path
    state_dir: Path
    admin: str            # "unix:/path/to/socket" or "127.0.0.1:PORT"
    metrics: Address | None = None   # optional loopback listener for Prometheus (fedpeer/daemon/metrics.py)

    @property
    def admin_socket(self) -> Path | None:
        return Path(self.admin[5:]) if self.admin.startswith("unix:") else None


@dataclass(frozen=True)
class PeerEntry:
    name: str
    address: Address
    public_key: bytes


@dataclass(frozen=True)
class Config:
    path: Path
    node: NodeSection
    peers: tuple[PeerEntry, ...]
    policy: Policy = field(default_factory=Policy)
    limits: Limits = field(default_factory=Limits)
    membership: MembershipTiming = field(default_factory=MembershipTiming)
    data: DataSection | None = None
    jobs: JobLimits = field(default_factory=JobLimits)
    election: ElectionConfig = field(default_factory=lambda: SITE_ELECTION)   # [election]
    tracking: Tracking = field(default_factory=Tracking)
    privacy: Privacy = field(default_factory=Privacy)
    network: Network = field(default_factory=Network)
    ignored: tuple[str, ...] = ()     # obsolete keys present in the file (accepted, no effect; logged at start)

    def peer_by_key(self, key: bytes) -> PeerEntry | None:
        return next((p for p in self.peers if p.public_key == key), None)


# [limits] keys of earlier versions that no longer mean anything: accepted (files written by
# `fedpeer init` hold one) and reported, never an error. Replay protection is per session now.
OBSOLETE_LIMITS = ("clock_skew_ms_max", "replay_window_ms", "replay_recent_max")
_TOP_KEYS = {"node", "peer", "policy", "limits", "membership", "data", "jobs", "election", "tracking",
             "network", "privacy"}
_NODE_KEYS = {"name", "listen", "advertise", "key_file", "state_dir", "admin", "metrics"}
_PEER_KEYS = {"name", "address", "public_key"}


def load(path: str | os.PathLike[str]) -> Config:
    """Read and check peers.toml. Does not read the key file (see `identity.load_key`)."""
    path = Path(path).resolve()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path, "", f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"not valid TOML: {exc}") from None
    _no_unknown(path, "", raw, _TOP_KEYS)
    if "node" not in raw:
        raise ConfigError(path, "[node]", "missing section")
    node = _node(path, _table(path, "node", raw["node"]))
    peers = _peers(path, raw.get("peer", []))
    limits = dict(_table(path, "limits", raw.get("limits", {})))
    ignored = tuple(f"limits.{key}" for key in OBSOLETE_LIMITS if limits.pop(key, None) is not None)
    config = Config(
        path=path,
        node=node,
        peers=peers,
        policy=_policy(path, raw.get("policy", {}), peers),
        limits=_section(path, "limits", limits, Limits),
        membership=_section(path, "membership", raw.get("membership", {}), MembershipTiming),
        data=_data(path, raw["data"]) if "data" in raw else None,
        jobs=_section(path, "jobs", raw.get("jobs", {}), JobLimits),
        election=_section(path, "election", raw.get("election", {}), ElectionConfig, SITE_ELECTION),
        tracking=_section(path, "tracking", raw.get("tracking", {}), Tracking),
        network=_section(path, "network", raw.get("network", {}), Network),
        privacy=_section(path, "privacy", raw.get("privacy", {}), Privacy),
        ignored=ignored,
    )
    _check_peer_uniqueness(config)
    return config


def _table(path: Path, where: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(path, where, "expected a table")
    return value


def _no_unknown(path: Path, where: str, table: dict, known: set[str]) -> None:
    for key in table:
        if key not in known:
            hint = f" (known: {', '.join(sorted(known))})"
            raise ConfigError(path, f"{where}.{key}" if where else key, "unknown key" + hint)


def _string(path: Path, where: str, table: dict, key: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if value is None:
        raise ConfigError(path, f"{where}.{key}", "missing")
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(path, f"{where}.{key}", "expected a non-empty string")
    return value.strip()


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a site, or None. A site's name reaches logs, `fedpeer status` and
    other sites' terminals: a control character (ESC, CR, U+2028, any non-printable one) there
    could rewrite what an operator sees."""
    bad = next((c for c in name if not c.isprintable() and c != " "), None)
    if bad is None:
        return None
    return (f"{name!r} holds the non-printable character U+{ord(bad):04X}; a site's name is printable text "
            "only (it reaches logs and terminals)")


def _site_name(path: Path, where: str, name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise ConfigError(path, where, problem)
    return name


def _address(path: Path, where: str, text: str) -> Address:
    try:
        return parse_address(text)
    except ValueError as exc:
        raise ConfigError(path, where, str(exc)) from None


def _node(path: Path, table: dict) -> NodeSection:
    _no_unknown(path, "node", table, _NODE_KEYS)
    base = path.parent
    name = _site_name(path, "node.name", _string(path, "node", table, "name"))
    listen = _address(path, "node.listen", _string(path, "node", table, "listen"))
    if "advertise" in table:
        advertise = _address(path, "node.advertise", _string(path, "node", table, "advertise"))
    elif listen.is_wildcard:
        raise ConfigError(path, "node.advertise", f"required when listen is the wildcard {listen}")
    else:
        advertise = listen
    state_dir = base / _string(path, "node", table, "state_dir", "state")
    admin = _string(path, "node", table, "admin", "unix:state/admin.sock")
    if admin.startswith("unix:"):
        admin = "unix:" + str(base / admin[5:])
    else:
        admin_addr = _address(path, "node.admin", admin)
        if not is_loopback(admin_addr.host):
            raise ConfigError(path, "node.admin", "must be 'unix:PATH' or a loopback address; "
                              "the admin API must never be reachable from the network")
        if admin_addr == listen:
            raise ConfigError(path, "node.admin", "must differ from node.listen")
    metrics = None
    if "metrics" in table:
        metrics = _address(path, "node.metrics", _string(path, "node", table, "metrics"))
        if not is_loopback(metrics.host):
            raise ConfigError(path, "node.metrics", "must be a loopback address such as 127.0.0.1:9464; "
                              "metrics name peers and jobs and must never be reachable from the network")
        if metrics == listen or str(metrics) == admin:
            raise ConfigError(path, "node.metrics", "must differ from node.listen and node.admin")
    return NodeSection(
        name=name,
        listen=listen,
        advertise=advertise,
        key_file=base / _string(path, "node", table, "key_file", "identity.key"),
        state_dir=state_dir,
        admin=admin,
        metrics=metrics,
    )


def _data(path: Path, table: object) -> DataSection:
    table = dict(_table(path, "data", table))
    raw_bounds = table.pop("bounds", {})
    data = _section(path, "data", table, DataSection)
    try:
        data = dataclasses.replace(data, bounds=parse_bounds(raw_bounds, "data.bounds"))
    except ValueError as exc:
        where, _, why = str(exc).partition(": ")
        raise ConfigError(path, where, why) from None
    if not data.csv and not data.parquet and not data.sql:   # label may stay unset: clustering jobs need none
        raise ConfigError(path, "data.csv", "missing (required when [data] is present, or set data.parquet "
                          "or data.sql)")
    if data.csv and data.parquet:
        raise ConfigError(path, "data.parquet", "set csv or parquet, not both")
    if data.sql and (data.csv or data.parquet):
        raise ConfigError(path, "data.sql", "set one of csv, parquet and sql")
    if bool(data.sql) != bool(data.dsn_file):
        raise ConfigError(path, "data.dsn_file" if data.sql else "data.sql",
                          "sql and dsn_file go together: dsn_file names the file (mode 0600) holding the "
                          "PostgreSQL connection string, so that no password sits in peers.toml")
    if data.sql and data.sql_timeout_ms < 1:
        raise ConfigError(path, "data.sql_timeout_ms", "expected a positive number of milliseconds")
    if data.missing not in ("error", "drop", "impute"):
        raise ConfigError(path, "data.missing", "expected \"error\", \"drop\" or \"impute\"")
    _check_engine(path, data)
    _check_partition(path, data)
    def resolve(name: str) -> str:
        return name and str(Path(name) if Path(name).is_absolute() else path.parent / name)
    return dataclasses.replace(data, csv=resolve(data.csv), parquet=resolve(data.parquet),
                               test_csv=resolve(data.test_csv), dsn_file=resolve(data.dsn_file))


PARTITIONS = ("horizontal", "vertical")


def _check_partition(path: Path, data: DataSection) -> None:
    """[data] partition and id_column: a vertical site names the column its entities are aligned on."""
    if data.partition not in PARTITIONS:
        raise ConfigError(path, "data.partition", f"expected \"horizontal\" or \"vertical\", got {data.partition!r}")
    if data.partition == "horizontal":
        if data.id_column:
            raise ConfigError(path, "data.id_column", "only with partition = \"vertical\" (a horizontal site lists "
                              "an identifier column in ignore)")
        return
    if not data.id_column.strip():
        raise ConfigError(path, "data.id_column", "missing: partition = \"vertical\" needs the column that names "
                          "each entity (e.g. id_column = \"patient_id\"), the same entities at every site")
    if data.id_column == data.label:
        raise ConfigError(path, "data.id_column", f"{data.id_column!r} is also [data] label; the ID column names "
                          "entities, the label is a column of values")
    for key, fix in (("engine", "engine = \"memory\""), ("test_csv", "no test_csv")):
        if getattr(data, key) != getattr(DataSection, key):
            raise ConfigError(path, f"data.{key}", f"partition = \"vertical\" needs {fix}: a vertical site's rows "
                              "are aligned with the other sites' in memory, and a held-out file would need "
                              "aligning too")


def _check_engine(path: Path, data: DataSection) -> None:
    """[data] engine and its scheduler: the Dask engine reads Parquet directories and CSV globs."""
    if data.engine not in ("memory", "dask"):
        raise ConfigError(path, "data.engine", f"expected \"memory\" or \"dask\", got {data.engine!r}")
    if data.engine == "memory":
        if data.scheduler:
            raise ConfigError(path, "data.scheduler", "only with engine = \"dask\" (the memory engine loads the "
                              "rows into the daemon)")
        return
    if not data.scheduler:
        raise ConfigError(path, "data.scheduler", "missing: engine = \"dask\" needs the cluster's scheduler, "
                          "\"tcp://host:8786\", or \"local\" to start worker processes on this machine")
    if data.scheduler != "local" and not re.fullmatch(r"(tcp|tls)://[^\s/]+:\d{1,5}", data.scheduler):
        raise ConfigError(path, "data.scheduler", f"expected \"tcp://host:port\" or \"local\", got "
                          f"{data.scheduler!r}")
    if data.sql:
        raise ConfigError(path, "data.sql", "engine = \"dask\" reads parquet (a directory of part files) or csv "
                          "(a file or a glob such as \"parts/*.csv\"), not sql")
    if data.missing == "impute":
        raise ConfigError(path, "data.missing", "engine = \"dask\" supports \"error\" and \"drop\": the "
                          "imputer is fitted on all of a site's rows at once, which the Dask engine never holds")
    for key in ("dask_workers", "dask_connect_timeout_ms", "dask_step_timeout_ms"):
        if getattr(data, key) < 1:
            raise ConfigError(path, f"data.{key}", "expected a positive number")


def _peers(path: Path, value: object) -> tuple[PeerEntry, ...]:
    from fedpeer.identity import parse_public_key  # local: identity imports nacl

    if not isinstance(value, list):
        raise ConfigError(path, "peer", "expected [[peer]] tables")
    peers = []
    for i, table in enumerate(value):
        where = f"peer[{i}]"
        table = _table(path, where, table)
        _no_unknown(path, where, table, _PEER_KEYS)
        name = _site_name(path, f"{where}.name", _string(path, where, table, "name"))
        where = f"peer[{i}] ({name})"
        address = _address(path, f"{where}.address", _string(path, where, table, "address"))
        try:
            key = parse_public_key(_string(path, where, table, "public_key"))
        except ValueError as exc:
            raise ConfigError(path, f"{where}.public_key", str(exc)) from None
        peers.append(PeerEntry(name=name, address=address, public_key=key))
    return tuple(peers)


def _policy(path: Path, value: object, peers: tuple[PeerEntry, ...]) -> Policy:
    """[policy] and its [policy.<kind>] sub-tables. Peer names are checked here, where a typo can
    still be told apart from intent; kind names and their limits by the job catalogue
    (fedpeer/kinds/catalog.py check_config), which knows them."""
    table = dict(_table(path, "policy", value))
    scalars = {f.name for f in dataclasses.fields(Policy)} - {"limits"}
    limits = {kind: _limits(path, kind, table.pop(kind)) for kind in [k for k in table if k not in scalars]}
    policy = dataclasses.replace(_section(path, "policy", table, Policy), limits=limits)
    if EVERY_KIND in policy.allowed_jobs and len(policy.allowed_jobs) > 1:
        raise ConfigError(path, "policy.allowed_jobs", f'"{EVERY_KIND}" means every kind: '
                          "write it alone, or list kinds only")
    names = [p.name for p in peers]
    for name in policy.proposers:
        if name == EVERY_PEER and len(policy.proposers) > 1:
            raise ConfigError(path, "policy.proposers", f'"{EVERY_PEER}" means every peer: '
                              "write it alone, or list [[peer]] names only")
        if name != EVERY_PEER and name not in names:
            raise ConfigError(path, "policy.proposers", f"{name!r} is not a [[peer]] name; "
                              f"known peers: {', '.join(names) or 'none'}")
    return policy


def _limits(path: Path, kind: str, value: object) -> dict[str, int]:
    """One [policy.<kind>] table: limits named `*_max` (at least 1) or `*_min`, whole numbers."""
    where = f"policy.{kind}"
    table = _table(path, where, value)
    for key, bound in table.items():
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise ConfigError(path, f"{where}.{key}", "expected a non-negative integer")
        if key.endswith("_max") and bound < 1:
            raise ConfigError(path, f"{where}.{key}", "must be at least 1; to refuse every "
                              f"{kind} job, leave {kind!r} out of [policy] allowed_jobs")
    return dict(table)


def _check_peer_uniqueness(config: Config) -> None:
    names: dict[str, int] = {}
    keys: dict[bytes, int] = {}
    for i, peer in enumerate(config.peers):
        where = f"peer[{i}] ({peer.name})"
        if peer.name == config.node.name:
            raise ConfigError(config.path, f"{where}.name", "same name as this node ([node].name)")
        if peer.name in names:
            raise ConfigError(config.path, f"{where}.name", f"duplicate of peer[{names[peer.name]}]")
        if peer.public_key in keys:
            raise ConfigError(config.path, f"{where}.public_key", f"duplicate of peer[{keys[peer.public_key]}]")
        names[peer.name], keys[peer.public_key] = i, i


def check_own_key_not_peer(config: Config, own_key: bytes) -> None:
    """Called once the key file is read: our own key must not be listed as a peer."""
    for i, peer in enumerate(config.peers):
        if peer.public_key == own_key:
            raise ConfigError(config.path, f"peer[{i}] ({peer.name}).public_key",
                              "this is this node's own public key; a node is not its own peer")


_T = typing.TypeVar("_T")


def _section(path: Path, name: str, table: object, cls: type[_T], defaults: _T | None = None) -> _T:
    """A flat table of scalars onto a frozen dataclass, with type and range checks; keys not
    given take `defaults`' values (or the class defaults)."""
    table = _table(path, name, table)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    _no_unknown(path, name, table, fields)
    values = {}
    for key, value in table.items():
        expected = hints[key]
        where = f"{name}.{key}"
        if expected is int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(path, where, "expected a non-negative integer")
        elif typing.get_origin(expected) is tuple:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(path, where, "expected a list of strings")
            value = tuple(value)
        elif expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)          # epsilon_budget = 8 means 8.0
        elif expected in (str, bool, float):
            if not isinstance(value, expected) or (expected is float and isinstance(value, bool)):
                raise ConfigError(path, where, f"expected {expected.__name__}")
        else:
            raise AssertionError(f"config field type {expected} has no checker")
        values[key] = value
    try:
        return dataclasses.replace(defaults, **values) if defaults is not None else cls(**values)
    except ValueError as exc:      # the section's own consistency checks (e.g. min < max)
        raise ConfigError(path, f"[{name}]", str(exc)) from None


def check_secret_files(config: Config) -> None:
    """What nobody else may write (the site directory, peers.toml, the key's directory, the state
    directory) and the files besides the key that hold a secret, checked like the key when the
    daemon starts and on every reload: [data] dsn_file (the database password; data/sources/sql.py
    reads it again, with the same check, each time a job loads the site's rows)."""
    check_site_directory(config.path.parent, config.path)
    check_not_writable_by_others(config.path, config.path, "", "peers.toml",
                                 "who could change this site's peers and policy")
    check_not_writable_by_others(config.node.key_file.parent, config.path, "node.key_file", "the key's directory",
                                 "who could replace this site's identity")
    check_not_writable_by_others(config.node.state_dir, config.path, "node.state_dir", "the state directory",
                                 "who could change this site's jobs, results and ledgers")
    if config.data is not None and config.data.sql:
        check_private_file(Path(config.data.dsn_file), "data.dsn_file", config.path, "dsn_file",
                            "put the PostgreSQL connection string in it, readable by its owner only: chmod 600")
