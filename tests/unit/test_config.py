"""peers.toml loading: every mistake an operator can make gives one line naming file, key, problem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedpeer.app.sitefiles import add_peer, init_site
from fedpeer.config import load as cfg
from fedpeer.errors import ConfigError
from fedpeer.identity import Identity, encode_public_key, load_key_file
from fedpeer.kinds.catalog import job_kinds

KIND_NAMES = tuple(job_kinds())


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in config"
    path.write_text(text.replace(old, new, 1))


def test_init_creates_loadable_config_and_private_key(tmp_path: Path) -> None:
    path, identity = init_site(tmp_path / "site", "hospital-a", "127.0.0.1:7400")
    config = cfg.load(path)
    assert config.node.name == "hospital-a"
    assert str(config.node.listen) == "127.0.0.1:7400" == str(config.node.advertise)
    assert config.node.state_dir == (tmp_path / "site" / "state")
    assert config.node.admin_socket == tmp_path / "site" / "state" / "admin.sock"
    assert config.peers == ()
    assert os.stat(config.node.key_file).st_mode & 0o777 == 0o600
    assert load_key_file(config.node.key_file).public_key == identity.public_key


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    init_site(tmp_path, "a", "127.0.0.1:7400")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        init_site(tmp_path, "a", "127.0.0.1:7400")
    (tmp_path / "peers.toml").unlink()
    with pytest.raises(ConfigError, match="key file already exists"):
        init_site(tmp_path, "a", "127.0.0.1:7400")


def test_unknown_key_is_an_error_naming_the_key(two_sites: tuple[Path, Path]) -> None:
    a, _ = two_sites
    _edit(a, "message_bytes_max", "mesage_bytes_max")
    with pytest.raises(ConfigError) as err:
        cfg.load(a)
    assert err.value.key == "limits.mesage_bytes_max" and "unknown key" in str(err.value)
    assert str(a) in str(err.value)



def test_obsolete_replay_limits_of_earlier_versions_still_load(two_sites: tuple[Path, Path]) -> None:
    """Files written before sessions hold `clock_skew_ms_max` (and may hold the replay window
    keys): they load, the keys have no effect, and `config.ignored` names them (logged at start)."""
    a, _ = two_sites
    _edit(a, "[limits]", "[limits]\nclock_skew_ms_max = 30000\nreplay_window_ms = 10000")
    config = cfg.load(a)
    assert config.ignored == ("limits.clock_skew_ms_max", "limits.replay_window_ms")
    assert not hasattr(config.limits, "clock_skew_ms_max")


@pytest.mark.parametrize("old,new,key,problem", [
    ('listen = "127.0.0.1:17401"', 'listen = "127.0.0.1"', "node.listen", "host:port"),
    ('listen = "127.0.0.1:17401"', 'listen = "127.0.0.1:99999"', "node.listen", "out of range"),
    ('admin = "unix:state/admin.sock"', 'admin = "10.0.0.1:9000"', "node.admin", "loopback"),
    ('probe_interval_ms = 500', 'probe_interval_ms = "fast"', "membership.probe_interval_ms", "integer"),
    (f"allowed_jobs = {json.dumps(list(KIND_NAMES))}", 'allowed_jobs = "stats"', "policy.allowed_jobs",
     "list"),
    ('members_max = 100', 'members_max = -1', "policy.members_max", "non-negative"),
    ('[limits]', '[election]\nelection_timeout_max_ms = 100\n\n[limits]', "[election]", "election_timeout"),
])
def test_bad_values_name_the_key(two_sites: tuple[Path, Path], old: str, new: str, key: str,
                                 problem: str | None) -> None:
    a, _ = two_sites
    _edit(a, old, new)
    with pytest.raises(ConfigError) as err:
        cfg.load(a)
    assert err.value.key == key
    if problem:
        assert problem in err.value.problem


def test_duplicate_peer_name_and_key(two_sites: tuple[Path, Path]) -> None:
    a, _ = two_sites
    text = a.read_text()
    block = text[text.index("\n[[peer]]"):]
    a.write_text(text + "\n" + block)
    with pytest.raises(ConfigError, match="duplicate"):
        cfg.load(a)
    a.write_text(text + "\n" + block.replace('name = "b"', 'name = "c"'))
    with pytest.raises(ConfigError) as err:
        cfg.load(a)
    assert err.value.key.endswith(".public_key") and "duplicate" in err.value.problem


def test_own_key_listed_as_peer_is_refused(tmp_path: Path) -> None:
    path, identity = init_site(tmp_path, "a", "127.0.0.1:7400")
    with pytest.raises(ConfigError, match="own public key"):
        add_peer(path, "me-again", "127.0.0.1:7401", encode_public_key(identity.public_key))
    config = cfg.load(path)
    assert config.peers == (), "a refused edit must leave the file unchanged"
    with pytest.raises(ConfigError, match="own public key"):
        own_key_as_peer = cfg.PeerEntry("x", config.node.listen, identity.public_key)
        cfg.check_own_key_not_peer(cfg.Config(path, config.node, (own_key_as_peer,)), identity.public_key)


def test_peer_add_keeps_comments_and_rejects_bad_key(tmp_path: Path) -> None:
    path, _ = init_site(tmp_path, "a", "127.0.0.1:7400")
    other = Identity.generate()
    add_peer(path, "b", "127.0.0.1:7401", encode_public_key(other.public_key))
    text = path.read_text()
    assert "# One [[peer]] table per other site" in text and 'name = "b"' in text
    assert cfg.load(path).peers[0].public_key == other.public_key
    with pytest.raises(ConfigError, match="base64"):
        add_peer(path, "c", "127.0.0.1:7402", "not a key!")
    with pytest.raises(ConfigError, match="32 bytes"):
        add_peer(path, "c", "127.0.0.1:7402", "AAAA")


def test_world_readable_or_missing_key_file(two_sites: tuple[Path, Path]) -> None:
    a, _ = two_sites
    config = cfg.load(a)
    os.chmod(config.node.key_file, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_key_file(config.node.key_file, a)
    config.node.key_file.unlink()
    with pytest.raises(ConfigError, match="does not exist"):
        load_key_file(config.node.key_file, a)


def test_garbage_key_file(tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_text("hello\n")
    os.chmod(key, 0o600)
    with pytest.raises(ConfigError, match="not a fedpeer identity key"):
        load_key_file(key)


@pytest.mark.parametrize("text,host,port", [("127.0.0.1:1", "127.0.0.1", 1), ("[::1]:7400", "::1", 7400),
                                            ("example.org:65535", "example.org", 65535)])
def test_parse_address(text: str, host: str, port: int) -> None:
    addr = cfg.parse_address(text)
    assert (addr.host, addr.port) == (host, port) and str(cfg.parse_address(str(addr))) == str(addr)


@pytest.mark.parametrize("text", ["", "host", ":80", "host:0", "host:x", "a b:80", "::1:80", "[::1]80"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        cfg.parse_address(text)


def test_example_peers_toml_loads_and_documents_every_key() -> None:
    """The repository's peers.toml is the reference: it must load and name every setting."""
    import dataclasses
    example = Path(__file__).resolve().parents[2] / "peers.toml"
    config = cfg.load(example)
    assert config.node.name == "hospital-a" and len(config.peers) == 2
    assert config.data is not None and config.data.label == "Class" and config.data.ignore == ("Id",)
    import dataclasses as dc
    for f in dc.fields(cfg.DataSection):
        assert f"\n{f.name} = " in example.read_text(), f"peers.toml does not document data.{f.name}"
    text = example.read_text()
    for section in (cfg.Limits, cfg.MembershipTiming, cfg.Policy, cfg.JobLimits, cfg.ElectionConfig, cfg.Tracking):
        defaults = cfg.SITE_ELECTION if section is cfg.ElectionConfig else section()
        for f in dataclasses.fields(section):
            if section is cfg.Policy and f.name == "limits":
                continue      # the [policy.<kind>] tables: test_policy checks each kind's limits
            assert f"\n{f.name} = " in text, f"peers.toml does not document {f.name}"
        values = _section_values(config, section)
        if section is cfg.Policy:     # the example lists every kind and every limit at its default
            assert all(values.allows(kind) for kind in KIND_NAMES)
            values = dataclasses.replace(values, allowed_jobs=defaults.allowed_jobs, limits={})
        assert values == defaults, f"peers.toml disagrees with {section.__name__} defaults"


def _section_values(config: cfg.Config, section: type) -> object:
    return {cfg.Limits: config.limits, cfg.MembershipTiming: config.membership, cfg.Policy: config.policy,
            cfg.JobLimits: config.jobs, cfg.ElectionConfig: config.election, cfg.Tracking: config.tracking}[section]
