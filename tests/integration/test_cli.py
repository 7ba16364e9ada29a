"""The command line as an operator uses it: init, key show, peer add, start, status, signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import free_ports
from fedpeer.app.sitefiles import add_peers, init_site
from fedpeer.identity import encode_public_key

pytestmark = pytest.mark.integration


def fedpeer(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedpeer", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def site_pair_by_hand(tmp_path: Path) -> tuple[Path, Path]:
    """Two sites made as an operator makes them: init, key show and peer add on the command line."""
    pa, pb = free_ports(2)
    for name, port in (("a", pa), ("b", pb)):
        r = fedpeer("init", "--dir", str(tmp_path / name), "--name", name, "--listen", f"127.0.0.1:{port}")
        assert r.returncode == 0, r.stderr
        assert "public key:" in r.stdout
    ca, cb = tmp_path / "a" / "peers.toml", tmp_path / "b" / "peers.toml"
    ka = fedpeer("key", "show", "--config", str(ca)).stdout.splitlines()[0]
    kb = fedpeer("key", "show", "--config", str(cb)).stdout.splitlines()[0]
    assert fedpeer("peer", "add", "--config", str(ca), "--name", "b", "--address", f"127.0.0.1:{pb}",
                   "--public-key", kb).returncode == 0
    assert fedpeer("peer", "add", "--config", str(cb), "--name", "a", "--address", f"127.0.0.1:{pa}",
                   "--public-key", ka).returncode == 0
    return ca, cb


@pytest.fixture
def site_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The same two sites made by the code behind those commands, in this process: six interpreter
    start-ups fewer per test (on a loaded 2-core runner, up to a minute of a test's set-up)."""
    pa, pb = free_ports(2)
    ca, ida = init_site(tmp_path / "a", "a", f"127.0.0.1:{pa}")
    cb, idb = init_site(tmp_path / "b", "b", f"127.0.0.1:{pb}")
    add_peers(ca, [("b", f"127.0.0.1:{pb}", encode_public_key(idb.public_key))])
    add_peers(cb, [("a", f"127.0.0.1:{pa}", encode_public_key(ida.public_key))])
    return ca, cb


def start(config: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedpeer", "start", "--config", str(config)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_status(config: Path, until, timeout_s: float = 15) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = fedpeer("status", "--config", str(config), "--json")
        if r.returncode == 0 and until(doc := json.loads(r.stdout)):
            return doc
        time.sleep(0.3)
    raise AssertionError(f"status never satisfied the condition; last: {r.stdout or r.stderr}")


def test_two_sites_by_hand_status_and_clean_shutdown(site_pair_by_hand: tuple[Path, Path]) -> None:
    ca, cb = site_pair_by_hand
    r = fedpeer("status", "--config", str(ca))
    assert r.returncode == 3 and "no fedpeer daemon" in r.stderr
    pa, pb = start(ca), start(cb)
    try:
        doc = wait_status(ca, lambda d: d["peers"][0]["state"] == "alive")
        assert set(doc) >= {"node", "peers", "leader", "jobs"}
        assert set(doc["node"]) >= {"name", "public_key", "address", "uptime_s"}
        assert set(doc["peers"][0]) >= {"name", "address", "state", "last_seen_s", "rtt_ms"}
        # an election may already have a leader by the time the peer shows alive (a loaded machine)
        assert doc["leader"] in (None, "a", "b") and doc["jobs"] == []
        table = fedpeer("status", "--config", str(ca)).stdout
        assert "b" in table and "alive" in table and "1 of 1 peers alive" in table
    finally:
        pa.send_signal(signal.SIGTERM)
        pb.send_signal(signal.SIGINT)
        out_a, err_a = pa.communicate(timeout=15)
        pb.communicate(timeout=15)
    assert pa.returncode == 0 and pb.returncode == 0
    assert "event=started" in err_a and "event=stopped" in err_a
    assert all(line.startswith("ts=") for line in err_a.splitlines()), "log lines must be structured"


def _bad_config_case(ca: Path, case: str) -> str:
    """Break site a's configuration one way; returns the text the one-line error must contain."""
    text = ca.read_text()
    key_file = ca.parent / "identity.key"
    if case == "unknown_key":
        ca.write_text(text.replace("suspect_timeout_ms", "suspect_timout_ms"))
        return "membership.suspect_timout_ms: unknown key"
    if case == "world_readable_key":
        os.chmod(key_file, 0o644)
        return "readable by others"
    if case == "world_readable_dsn_file":
        dsn = ca.parent / "cohort.dsn"
        dsn.write_text("postgresql://fedpeer_ro:pw@127.0.0.1/clinic\n")
        os.chmod(dsn, 0o640)
        ca.write_text(text + '\n[data]\nsql = "SELECT a, y FROM t"\ndsn_file = "cohort.dsn"\nlabel = "y"\n')
        return f"data.dsn_file: dsn_file {dsn} is readable by others (mode 0640); run: chmod 600 {dsn}"
    if case == "unreadable_key":
        key_file.unlink()
        return "does not exist"
    if case == "key_of_another_user":
        os.chown(key_file, 65534, -1)          # nobody's
        return f"key file {key_file} belongs to another user (uid 65534)"
    if case == "writable_site_directory":
        os.chmod(ca.parent, 0o777)
        return f"the site directory {ca.parent} is writable by others (mode 0777)"
    if case == "writable_peers_toml":          # another local user could list its own key as a peer
        os.chmod(ca, 0o666)
        return f"peers.toml {ca} is writable by others (mode 0666), who could change this site's peers and " \
               f"policy; run: chmod go-w {ca}"
    if case == "peers_toml_of_another_user":
        os.chown(ca, 65534, -1)
        return f"peers.toml {ca} belongs to another user (uid 65534)"
    if case == "key_in_a_writable_directory":  # another user could swap the key for its own
        keys = ca.parent / "keys"
        keys.mkdir()
        key_file.rename(keys / "identity.key")
        os.chmod(keys, 0o777)
        ca.write_text(text.replace('key_file = "identity.key"', 'key_file = "keys/identity.key"'))
        return f"node.key_file: the key's directory {keys} is writable by others (mode 0777), who could replace " \
               f"this site's identity; run: chmod go-w {keys}"
    if case == "writable_state_dir":
        state = ca.parent / "state"
        state.mkdir(exist_ok=True)
        os.chmod(state, 0o777)
        return f"node.state_dir: the state directory {state} is writable by others (mode 0777)"
    if case == "control_character_in_a_name":
        ca.write_text(text.replace('name = "b"', 'name = "b\\u001b[2J\\u001b[Hall is well"'))
        return "holds the non-printable character U+001B"
    if case == "duplicate_name":
        from fedpeer.identity import Identity, encode_public_key
        block = text[text.index("\n[[peer]]"):]
        key = block.split('public_key = "')[1].split('"')[0]
        ca.write_text(text + block.replace(key, encode_public_key(Identity.generate().public_key)))
        return "name: duplicate of peer[0]"
    if case == "own_key":
        own = fedpeer("key", "show", "--config", str(ca)).stdout.splitlines()[0]
        ca.write_text(text + f'\n[[peer]]\nname = "me"\naddress = "127.0.0.1:1"\npublic_key = "{own}"\n')
        return "own public key"
    if case == "bad_address":
        ca.write_text(text.replace('address = "127.0.0.1:', 'address = "127.0.0.1;'))
        return "address"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["unknown_key", "world_readable_key", "world_readable_dsn_file", "unreadable_key",
                                  "duplicate_name", "own_key", "bad_address", "writable_site_directory",
                                  "writable_peers_toml", "key_in_a_writable_directory", "writable_state_dir",
                                  "control_character_in_a_name",
                                  *(pytest.param(case, marks=pytest.mark.skipif(
                                      os.geteuid() != 0, reason="only root can give a file away"))
                                    for case in ("key_of_another_user", "peers_toml_of_another_user"))])
def test_bad_configuration_exits_2_with_one_line(site_pair: tuple[Path, Path], case: str) -> None:
    ca, _ = site_pair
    expected = _bad_config_case(ca, case)
    r = fedpeer("start", "--config", str(ca), timeout=20)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(ca) in lines[0] and expected in lines[0], lines[0]
    assert "\x1b" not in r.stderr, "a name's control characters never reach the terminal raw"


def test_port_in_use_exits_2(site_pair: tuple[Path, Path]) -> None:
    ca, _ = site_pair
    port = int(ca.read_text().split('listen = "127.0.0.1:')[1].split('"')[0])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        r = fedpeer("start", "--config", str(ca), timeout=20)
    assert r.returncode == 2
    assert "node.listen" in r.stderr and "in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["evil\x1b[2J\x1b[Hall peers alive", "two\rlines", "para\u2028graph",
                                  "bell\x07", "zero\u200bwidth"])
def test_a_name_with_control_characters_is_refused_at_peer_add_and_from_an_invite(
        site_pair: tuple[Path, Path], name: str) -> None:
    """A hostile site names itself with terminal escapes (in an invite, or told to an operator who
    types it): `peer add` refuses it in one line that shows it escaped, and peers.toml is unchanged."""
    from fedpeer.app import invite
    from fedpeer.identity import Identity, encode_public_key

    ca, _ = site_pair
    before = ca.read_text()
    key = Identity.generate().public_key
    line = invite.make(name, "127.0.0.1:9", key)
    for args in (["--invite", line], ["--name", name, "--address", "127.0.0.1:9", "--public-key",
                                      encode_public_key(key)]):
        r = fedpeer("peer", "add", "--config", str(ca), *args)
        assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "non-printable character" in r.stderr, r.stderr
        assert not any(not c.isprintable() for c in r.stderr.strip()), repr(r.stderr)
        assert ca.read_text() == before


def test_init_refuses_existing_key(tmp_path: Path) -> None:
    assert fedpeer("init", "--dir", str(tmp_path), "--name", "x", "--listen", "127.0.0.1:7400").returncode == 0
    (tmp_path / "peers.toml").unlink()
    r = fedpeer("init", "--dir", str(tmp_path), "--name", "x", "--listen", "127.0.0.1:7400")
    assert r.returncode == 2 and "refusing to overwrite" in r.stderr


def test_systemd_readiness_notification(site_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Type=notify: READY=1 arrives on $NOTIFY_SOCKET once the listeners are bound, STOPPING=1 on stop."""
    ca, _ = site_pair
    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(sock_path))
        listener.settimeout(20)
        proc = subprocess.Popen([sys.executable, "-m", "fedpeer", "start", "--config", str(ca)],
                                env={**os.environ, "NOTIFY_SOCKET": str(sock_path)},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert listener.recv(100) == b"READY=1"
            assert fedpeer("status", "--config", str(ca)).returncode == 0, "ready means the admin API answers"
            proc.terminate()     # once: a second SIGTERM during teardown may find the handlers gone
            assert listener.recv(100) == b"STOPPING=1"
        finally:
            if proc.returncode is None:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 0


def test_output_pipe_closed_by_the_reader_is_not_a_traceback(tmp_path: Path) -> None:
    """`fedpeer key show | head -c1`: the reader leaving early is no error worth a traceback."""
    from fedpeer.app.sitefiles import init_site

    path, _ = init_site(tmp_path, "x", "127.0.0.1:7400")
    proc = subprocess.Popen([sys.executable, "-m", "fedpeer", "key", "show", "--config", str(path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()   # long before the interpreter has started and printed anything
    err = proc.stderr.read()
    proc.wait(timeout=30)
    proc.stderr.close()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 1


def test_status_with_a_broken_peers_toml_asks_the_daemon_running_the_last_good_one(
        site_pair: tuple[Path, Path]) -> None:
    """An edit breaks peers.toml while the daemon runs: `status` still answers (the admin endpoint
    the daemon recorded in state_dir/running.json) and says the file has an error and what the
    daemon runs; the file fixed, status is as before; no daemon and a broken file: exit 2."""
    ca, _ = site_pair
    good = ca.read_text()
    broken_toml = good.replace("[membership]", "[membership", 1)
    invalid = good.replace("suspect_timeout_ms", "suspect_timout_ms")
    proc = start(ca)
    try:
        wait_status(ca, lambda d: True)
        for text, expected in ((broken_toml, "not valid TOML: "),
                               (invalid, "membership.suspect_timout_ms: unknown key")):
            ca.write_text(text)
            r = fedpeer("status", "--config", str(ca))
            assert r.returncode == 0, r.stderr
            last = r.stdout.strip().splitlines()[-1]
            assert last.startswith("peers.toml has an error (") and expected in last, last
            assert "): the daemon runs the configuration it loaded at 20" in last, last
            assert "node a" in r.stdout
            doc = json.loads(fedpeer("status", "--config", str(ca), "--json").stdout)
            assert doc["config_error"] == last and doc["node"]["name"] == "a"
        ca.write_text(good)
        r = fedpeer("status", "--config", str(ca))
        assert r.returncode == 0 and "has an error" not in r.stdout
    finally:
        proc.terminate()
        proc.communicate(timeout=15)
    ca.write_text(broken_toml)
    r = fedpeer("status", "--config", str(ca))
    assert r.returncode == 2 and "not valid TOML" in r.stderr and len(r.stderr.strip().splitlines()) == 1
