"""Creating and editing a site's files: `fedpeer init`, `fedpeer peer add/remove/list` (and
`peer add --invite`, fedpeer/app/invite.py).

peers.toml is edited with tomlkit so the operator's comments survive; every edit is checked by
loading the result with config.load before it replaces the file, and `init` checks the file it
would write before it writes anything (a refused command leaves nothing to clean up).
"""

from __future__ import annotations

import csv
import itertools
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path

import tomlkit

from fedpeer.base.store import atomic_write
from fedpeer.app.invite import Invite
from fedpeer.config import load as cfg
from fedpeer.data.header import check_columns, read_header
from fedpeer.errors import ConfigError
from fedpeer.identity import Identity, create_key_file, encode_public_key, load_key_file, parse_public_key
from fedpeer.kinds.catalog import job_kinds, load_config

PEERS_TEMPLATE = """\
# fedpeer configuration of one site ("{name}").
# Every key is checked: an unknown key is an error. Limits carry their unit in their name.
# Relative paths are relative to this file's directory.

[node]
name = "{name}"                 # this site's name, shown in logs and status (local label)
listen = "{listen}"             # where peers reach this daemon (host:port)
{advertise_line}
key_file = "identity.key"       # Ed25519 identity; mode 0600; back it up, never share it
state_dir = "state"             # job records, models, incarnation, election vote (needs write access)
admin = "unix:state/admin.sock" # local admin API for `fedpeer status`: unix:PATH (mode 0600), or
                                # 127.0.0.1:PORT, which needs the token the daemon writes to
                                # state_dir/admin.token (0600) at each start; the CLI reads it

# One [[peer]] table per other site, added with `fedpeer peer add`. The public key pins the
# site: a message signed by any other key is rejected before it is decoded.
# [[peer]]
# name = "lab-b"
# address = "lab-b.example.org:7400"
# public_key = "BASE64-PUBLIC-KEY-FROM-fedpeer-key-show"

[policy]
allowed_jobs = {kinds}   # kinds it joins
members_max = 100                               # largest federation this site joins a job with

[limits]
message_bytes_max = 67108864    # one frame (64 MiB): large enough for a forest

[membership]
probe_interval_ms = 500         # SWIM protocol period
suspect_timeout_ms = 4000       # a silent member is suspect this long before it is declared dead
                                # (up to 10 sites; x log10(sites) above: 8 s at 100)
"""


DATA_TEMPLATE = """
[data]
csv = {csv}   # this site's rows (a header row); relative paths are relative to this file
{label_line}
{positive_line}
{more}# bounds = {{ age = [0, 120] }}   # public bounds per column for DP jobs (histogram xgboost's cut points):
#   the same at every site, known without the rows (never this file's own min/max)
"""


def init_site(directory: Path, name: str, listen: str, advertise: str | None = None,
              admin: str | None = None, data: Path | None = None, label: str | None = None,
              positive: str | None = None, key_seed: bytes | None = None, ignore: Sequence[str] = (),
              id_column: str | None = None, partition: str | None = None) -> tuple[Path, Identity]:
    """Create DIR/peers.toml and DIR/identity.key. Refuses to overwrite either. With `data` (a CSV),
    the file gets a [data] table naming it, its `label` column, the `positive` class (a value of
    the label column), the `ignore` columns, the `id_column` and the `partition`, each column
    checked against the header as `fedpeer data check` would."""
    conf_path = directory / "peers.toml"
    try:
        listen_addr = cfg.parse_address(listen)
        if advertise:
            cfg.parse_address(advertise)
    except ValueError as exc:
        raise ConfigError(conf_path, "node.listen" if not advertise else "node.advertise", str(exc)) from None
    if conf_path.exists():
        raise ConfigError(conf_path, "", "already exists; refusing to overwrite a site's configuration")
    advertise = advertise or (None if listen_addr.is_wildcard else listen)
    advertise_line = (f'advertise = "{advertise}"          # the address other sites use for this one'
                      if advertise else '# advertise = "host:port"   # required when listen is 0.0.0.0')
    kinds = json.dumps(list(job_kinds()))
    text = PEERS_TEMPLATE.format(name=name, listen=listen, advertise_line=advertise_line, kinds=kinds)
    if admin:
        text = text.replace('admin = "unix:state/admin.sock"', f'admin = "{admin}"')
    if data is not None:
        text += _data_table(conf_path, data, label, positive, tuple(ignore), id_column, partition)
    _check_before_writing(conf_path, text)
    key_path = directory / "identity.key"
    if key_path.exists():
        raise ConfigError(key_path, "", "key file already exists; refusing to overwrite an identity")
    created = not directory.exists()
    identity = create_key_file(key_path, key_seed)     # key_seed: the harness's reproducible demo keys
    if created:
        directory.chmod(0o700)        # peers.toml and the key: nobody else may replace them
    try:
        atomic_write(conf_path, text.encode("utf-8"), mode=0o644)
    except BaseException:
        key_path.unlink(missing_ok=True)   # a site is both files or neither
        raise
    return conf_path, identity


def _data_table(conf_path: Path, data: Path, label: str | None, positive: str | None, ignore: tuple[str, ...] = (),
                id_column: str | None = None, partition: str | None = None) -> str:
    """The [data] table of `init --data`: the CSV must exist, and every column named (label, ignore,
    id_column) be in its header; the positive class must be a value of the label column."""
    data = data.resolve()
    header = read_header(conf_path, data)
    check_columns(conf_path, data, header, label, ignore, id_column)
    if label is not None and positive:
        _check_positive(conf_path, data, header.index(label), label, positive)
    label_line = (f"label = {json.dumps(label)}   # the label column" if label is not None
                  else '# label = "Class"   # the label column (clustering jobs need none)')
    positive_line = (f"positive = {json.dumps(positive)}   # the positive class, for binary jobs" if positive
                     else '# positive = "M"   # the positive class, for binary jobs (stats, bofrf)')
    more = f"ignore = {json.dumps(list(ignore))}   # columns that are not features\n" if ignore else ""
    more += f"partition = {json.dumps(partition)}\n" if partition else ""
    more += f"id_column = {json.dumps(id_column)}   # the column naming each entity\n" if id_column else ""
    return DATA_TEMPLATE.format(csv=json.dumps(str(data)), label_line=label_line, positive_line=positive_line,
                                more=more)


def _check_positive(conf_path: Path, data: Path, column: int, label: str, positive: str) -> None:
    """`positive` is one of the label column's values (read as a job reads labels: stripped text)."""
    seen: set[str] = set()
    try:
        with open(data, encoding="utf-8-sig", newline="") as f:
            for row in itertools.islice(csv.reader(f), 1, None):
                if len(row) > column:
                    value = row[column].strip()
                    if value == positive:
                        return
                    if len(seen) < 50:
                        seen.add(value)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(conf_path, "data.csv", f"cannot read {data}: {exc}") from None
    values = ", ".join(repr(v) for v in sorted(seen)) or "none"
    raise ConfigError(conf_path, "data.positive", f"{positive!r} is not a value of label column {label!r} in {data} "
                      f"(its values: {values}); give one of them")


def _check_before_writing(conf_path: Path, text: str) -> None:
    """Load `text` as conf_path would be loaded, from a scratch directory: a ConfigError names
    conf_path and the key, and nothing has been written to the site's directory yet."""
    with tempfile.TemporaryDirectory(prefix="fedpeer-init-") as scratch:
        candidate = Path(scratch) / "peers.toml"
        candidate.write_text(text, encoding="utf-8")
        try:
            load_config(candidate)
        except ConfigError as exc:
            raise ConfigError(conf_path, exc.key, exc.problem) from None


def add_peer(conf_path: Path, name: str, address: str, public_key: str) -> None:
    """Append one [[peer]] table, keeping comments; checked by loading before it is written."""
    add_peers(conf_path, [(name, address, public_key)])


def add_peers(conf_path: Path, peers: list[tuple[str, str, str]],
              settings: dict[str, dict[str, object]] | None = None) -> None:
    """Append [[peer]] tables (name, address, public key) and set `settings` ({section: {key: value}}).

    The edited text is loaded with config.load (and checked against this site's own key) before it
    replaces the file, so a bad edit leaves the file as it was."""
    conf_path = conf_path.resolve()
    doc = tomlkit.parse(conf_path.read_text(encoding="utf-8"))
    for name, address, public_key in peers:
        if (problem := cfg.name_problem(name)) is not None:
            raise ConfigError(conf_path, "peer.name", problem)
        key = parse_public_key_or_raise(conf_path, public_key)
        try:
            cfg.parse_address(address)
        except ValueError as exc:
            raise ConfigError(conf_path, f"peer ({name}).address", str(exc)) from None
        table = tomlkit.table()
        table.add("name", name)
        table.add("address", address)
        table.add("public_key", encode_public_key(key))
        if "peer" not in doc:
            doc.add(tomlkit.nl())
            doc.append("peer", tomlkit.aot())
        doc["peer"].append(table)
    for section, values in (settings or {}).items():
        if section not in doc:
            doc.append(section, tomlkit.table())
        for key, value in values.items():
            doc[section][key] = value
    _replace_checked(conf_path, tomlkit.dumps(doc))


def add_invited(conf_path: Path, invites: list[Invite]) -> list[tuple[Invite, str]]:
    """Add the sites of `invites` as [[peer]] tables in one checked edit, as add_peers does; an
    invite of this site itself, or of a peer already listed with the same name, address and key,
    is passed over, so every site of a federation may run the same command with every site's
    invite. Returns (invite, "added" | "this site" | "already listed") in order."""
    conf_path = conf_path.resolve()
    config = load_config(conf_path)
    own = load_key_file(config.node.key_file, conf_path).public_key if config.node.key_file.exists() else None
    listed = {(p.name, str(p.address), p.public_key) for p in config.peers}
    done: list[tuple[Invite, str]] = []
    for invite in invites:
        key = invite.key
        if key == own:
            done.append((invite, "this site"))
        elif (invite.name, str(cfg.parse_address(invite.address)), key) in listed or any(
                d == "added" and i.key == key for i, d in done):
            done.append((invite, "already listed"))
        else:
            done.append((invite, "added"))
    added = [(i.name, i.address, i.public_key) for i, d in done if d == "added"]
    if added:
        add_peers(conf_path, added)
    return done


def remove_peer(conf_path: Path, name: str) -> None:
    """Delete the [[peer]] table named `name`, keeping comments; checked like add_peers (a
    [policy] proposers entry naming it is then an error naming that key)."""
    conf_path = conf_path.resolve()
    doc = tomlkit.parse(conf_path.read_text(encoding="utf-8"))
    peers = doc.get("peer", [])
    names = [str(t.get("name", "")) for t in peers]
    if name not in names:
        raise ConfigError(conf_path, "peer", f"no [[peer]] named {name!r}; listed: {', '.join(names) or 'none'}")
    del peers[names.index(name)]
    if not peers:
        del doc["peer"]
    _replace_checked(conf_path, tomlkit.dumps(doc))


def _replace_checked(conf_path: Path, updated: str) -> None:
    candidate = conf_path.with_name(f".{conf_path.name}.candidate")
    candidate.write_text(updated, encoding="utf-8")
    try:
        config = load_config(candidate)
        if config.node.key_file.exists():
            cfg.check_own_key_not_peer(config, load_key_file(config.node.key_file, conf_path).public_key)
    except ConfigError as exc:
        raise ConfigError(conf_path, exc.key, exc.problem) from None
    finally:
        candidate.unlink(missing_ok=True)
    atomic_write(conf_path, updated.encode("utf-8"), mode=0o644)


def parse_public_key_or_raise(conf_path: Path, text: str) -> bytes:
    try:
        return parse_public_key(text)
    except ValueError as exc:
        raise ConfigError(conf_path, "peer.public_key", str(exc)) from None
