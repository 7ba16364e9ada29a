"""Editing peers.toml while real daemons run (issue 12 items 1, 2): `fedpeer peer add/remove` and
`fedpeer reload` or SIGHUP apply it without a restart; a file that does not validate is refused
and the running configuration stays; `status` says who does not list us, whose address answers
with another key, and when a second process uses a peer's key; `init` leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import tomlkit

from fedpeer.app.harness.federation import Harness, split_csv
from fedpeer.app.sitefiles import remove_peer
from fedpeer.config import load as cfg
from fedpeer.daemon.admin import request
from fedpeer.errors import FedpeerError
from fedpeer.identity import Identity, encode_public_key, load_key_file
from fedpeer.net.transport import PATH
from fedpeer.wire import frame as wire
from fedpeer.testing import frames
from tests.integration.test_jobs import _attach_data, _fedpeer, breast_cancer_csv

pytestmark = pytest.mark.integration


def _edit(path: Path, section: str, key: str, value: object) -> None:
    doc = tomlkit.parse(path.read_text())
    doc.setdefault(section, tomlkit.table())[key] = value
    path.write_text(tomlkit.dumps(doc))


def _peer(status: dict, name: str) -> dict | None:
    return next((p for p in status["peers"] if p["name"] == name), None)


async def test_a_fourth_site_joins_three_running_ones_without_a_restart(make_federation, tmp_path: Path) -> None:
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 4, "stratified", seed=5, out_dir=tmp_path / "parts")
    h: Harness = make_federation(4, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    for i in range(3):
        remove_peer(h.sites[i].config_path, "site-4")
    h.start()
    await h.wait_all_alive(timeout_s=30, among=[0, 1, 2])
    site4 = h.sites[3]
    for i in range(3):
        r = await asyncio.to_thread(_fedpeer, "peer", "add", "--config", str(h.sites[i].config_path),
                                    "--name", "site-4", "--address", site4.address, "--public-key", site4.public_key)
        assert r.returncode == 0, r.stderr
        assert "the running daemon picked it up: peers: +site-4; policy: unchanged" in r.stdout, r.stdout
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=60)
    for i, record in records.items():
        assert record["state"] == "done", (i, record)
        assert sorted(record["result"]["participants"]) == ["site-1", "site-2", "site-3", "site-4"]
    assert [s.starts for s in h.sites] == [1, 1, 1, 1], "nobody restarted"
    listed = await asyncio.to_thread(_fedpeer, "peer", "list", "--config", str(h.sites[0].config_path))
    assert listed.returncode == 0 and "site-4" in listed.stdout and "alive" in listed.stdout, listed.stdout


async def test_a_removed_peer_is_refused_at_once_and_its_job_ends(make_federation) -> None:
    h: Harness = make_federation(3, {"jobs": {"job_accept_timeout_ms": 20_000}})
    await h.wait_all_alive(timeout_s=30)
    before = (await h.status(0))["rejected"].get("unknown_sender", 0)
    h.pause(2)   # site-3 cannot answer: the job waits for it
    # a session opened with site-3's key before the removal (the daemon's own, or a copy's)
    site3 = await frames.connected(load_key_file(h.sites[2].config.node.key_file), h, [0])
    site1 = load_key_file(h.sites[0].config.node.key_file).public_key
    probe = wire.DiagProbe(b"still here?")
    job_id = (await request(h.sites[0].config, "POST", "/v1/jobs",
                            {"kind": "sumcheck", "params": {}, "members": ["site-1", "site-2", "site-3"]}))["id"]
    await asyncio.sleep(0.5)
    assert (await h.job(0, job_id))["state"] == "proposed"
    r = await asyncio.to_thread(_fedpeer, "peer", "remove", "--config", str(h.sites[0].config_path), "site-3")
    assert r.returncode == 0, r.stderr
    assert "the running daemon picked it up: peers: -site-3;" in r.stdout, r.stdout
    status = await h.status(0)
    assert _peer(status, "site-3") is None
    record = await h.job(0, job_id)
    assert record["state"] == "failed" and record["error"] == "site-3: removed from site-1's peers.toml", record
    async with aiohttp.ClientSession() as http:   # its open session ends with the removal, and no new one opens
        async with http.post(f"http://127.0.0.1:{h.sites[0].port}{PATH}", data=site3.seal(site1, probe)) as resp:
            assert (resp.status, await resp.text()) == (400, "unknown_sender")
    with pytest.raises(frames.HelloRefused, match="unknown_sender"):
        await site3.connect(site1, h.sites[0].port)
    h.resume(2)

    async def refused() -> bool:
        return (await h.status(0))["rejected"].get("unknown_sender", 0) > before
    for _ in range(40):   # site-3 pings every 500 ms: its next frame is refused
        if await refused():
            break
        await asyncio.sleep(0.1)
    assert await refused()


async def test_a_config_that_does_not_validate_is_refused_and_the_old_one_keeps_running(make_federation) -> None:
    h: Harness = make_federation(2)
    await h.wait_all_alive(timeout_s=30)
    conf = h.sites[0].config_path
    good = conf.read_text()
    _edit(conf, "membership", "probe_timeout_ms", 900)   # must be below probe_interval_ms (500)
    start = await asyncio.to_thread(_fedpeer, "start", "--config", str(conf))
    reload = await asyncio.to_thread(_fedpeer, "reload", "--config", str(conf))
    assert start.returncode == reload.returncode == 2
    assert reload.stderr == start.stderr and "membership" in reload.stderr, (reload.stderr, start.stderr)
    with pytest.raises(FedpeerError, match="configuration error: .*membership"):   # the daemon checks too
        await request(h.sites[0].config, "POST", "/v1/reload")
    os.kill(h.sites[0].process.pid, signal.SIGHUP)
    await asyncio.sleep(0.5)
    status = await h.status(0)
    assert "membership" in status["config"]["last_reload"]["error"]
    assert _peer(status, "site-2")["state"] == "alive" and h.sites[0].process.poll() is None
    conf.write_text(good)
    r = await asyncio.to_thread(_fedpeer, "reload", "--config", str(conf), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["changes"]["membership"] == "unchanged", r.stdout


async def test_sighup_applies_an_edit(make_federation) -> None:
    h: Harness = make_federation(3)
    await h.wait_all_alive(timeout_s=30)
    remove_peer(h.sites[0].config_path, "site-2")
    _edit(h.sites[0].config_path, "policy", "allowed_jobs", ["stats"])
    loaded = (await h.status(0))["config"]["loaded_at"]
    os.kill(h.sites[0].process.pid, signal.SIGHUP)
    for _ in range(30):
        status = await h.status(0)
        if status["config"]["last_reload"]:
            break
        await asyncio.sleep(0.1)
    changes = status["config"]["last_reload"]["changes"]
    assert changes["peers"] == "-site-2" and changes["policy"] == "changed", changes
    assert [p["name"] for p in status["peers"]] == ["site-3"]
    assert status["config"]["loaded_at"] >= loaded
    with pytest.raises(FedpeerError, match="allowed_jobs"):
        await request(h.sites[0].config, "POST", "/v1/jobs", {"kind": "sumcheck", "params": {}})


def test_init_that_fails_leaves_nothing_behind(tmp_path: Path) -> None:
    site = tmp_path / "site"
    r = _fedpeer("init", "--dir", str(site), "--name", "a", "--listen", "0.0.0.0:7620")
    assert r.returncode == 2 and "node.advertise" in r.stderr, r.stderr
    assert not site.exists() or not any(site.iterdir())
    r = _fedpeer("init", "--dir", str(site), "--name", "a", "--listen", "0.0.0.0:7620", "--advertise", "10.0.0.1:7620")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in site.iterdir()) == ["identity.key", "peers.toml"]


async def test_status_names_a_wrong_key_and_a_peer_that_does_not_list_us(make_federation) -> None:
    h: Harness = make_federation(3, start=False)
    doc = tomlkit.parse(h.sites[0].config_path.read_text())
    for peer in doc["peer"]:   # site-1 pins another key for site-2's address
        if peer["name"] == "site-2":
            peer["public_key"] = encode_public_key(Identity.generate().public_key)
    h.sites[0].config_path.write_text(tomlkit.dumps(doc))
    remove_peer(h.sites[2].config_path, "site-1")   # site-3 does not list site-1
    h.start()

    def hinted(statuses: dict[int, dict | None]) -> bool:
        return statuses[0] is not None and all(p["hint"] for p in statuses[0]["peers"])
    await h.wait_until(hinted, 15, "site-1 shows a hint for both peers", among=[0])
    status = await h.status(0)
    assert _peer(status, "site-2")["refused"]["reason"] == "header"
    assert "site-2's address answers with another key" in _peer(status, "site-2")["hint"]
    assert _peer(status, "site-3")["refused"]["reason"] == "unknown_sender"
    assert "site-3 does not list this site: run `fedpeer peer add` there" in _peer(status, "site-3")["hint"]
    text = await asyncio.to_thread(_fedpeer, "status", "--config", str(h.sites[0].config_path))
    assert "hint: site-3 does not list this site" in text.stdout, text.stdout
    # a proposal among them says which pair is missing, by name
    job_id = (await request(h.sites[0].config, "POST", "/v1/jobs",
                            {"kind": "sumcheck", "params": {}, "members": ["site-1", "site-3"]}))["id"]
    record = (await h.wait_job(job_id, timeout_s=20, among=[0]))[0]
    assert record["state"] == "failed", record
    assert "site-3 does not list site-1: run `fedpeer peer add` there" in record["error"], record


async def test_a_second_process_with_a_peers_key_is_reported(make_federation, tmp_path: Path) -> None:
    h: Harness = make_federation(2)
    await h.wait_all_alive(timeout_s=30)
    twin = tmp_path / "twin"
    shutil.copytree(h.sites[1].dir, twin, ignore=shutil.ignore_patterns("state", "*.log"))
    port = _free_port()
    _edit(twin / "peers.toml", "node", "listen", f"127.0.0.1:{port}")
    _edit(twin / "peers.toml", "node", "advertise", f"127.0.0.1:{port}")
    proc = await asyncio.to_thread(
        subprocess.Popen, [sys.executable, "-m", "fedpeer", "start", "--config", str(twin / "peers.toml")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(50):
            peer = _peer(await h.status(0), "site-2")
            if peer["duplicate"]:
                break
            await asyncio.sleep(0.2)
        assert peer["duplicate"]["other_address"] in (f"127.0.0.1:{port}", h.sites[1].address), peer
        assert peer["hint"].startswith("two processes use site-2's key"), peer
        log = h.sites[0].log_path.read_text()
        assert "duplicate_identity" in log
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)


def _free_port() -> int:
    from fedpeer.app.harness.federation import free_ports
    return free_ports(1)[0]


def test_peer_remove_of_an_unknown_name_says_which_exist(tmp_path: Path) -> None:
    r = _fedpeer("init", "--dir", str(tmp_path / "s"), "--name", "a", "--listen", "127.0.0.1:7620")
    assert r.returncode == 0
    r = _fedpeer("peer", "remove", "--config", str(tmp_path / "s" / "peers.toml"), "site-9")
    assert r.returncode == 2 and "no [[peer]] named 'site-9'" in r.stderr, r.stderr
    assert cfg.load(tmp_path / "s" / "peers.toml").peers == ()


async def test_the_data_errors_own_advice_works_after_a_reload(make_federation, tmp_path: Path) -> None:
    """The walk-through's finding: `[data] missing = "drop"`, as the error advises, did nothing
    until a restart. Now a reload makes the next job read the data with it."""
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 2, "stratified", seed=6, out_dir=tmp_path / "parts")
    h: Harness = make_federation(2, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    data = h.sites[0].dir / "data.csv"
    lines = data.read_text().splitlines()
    first = lines[1].split(",")
    lines[1] = ",".join(["", *first[1:]] if first[0] != "" else first)   # one missing value
    data.write_text("\n".join(lines) + "\n")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    failed = (await h.wait_job(await h.propose(0, "stats", {}), timeout_s=30, among=[0]))[0]
    assert failed["state"] == "failed" and "drop" in failed["error"], failed
    _edit(h.sites[0].config_path, "data", "missing", "drop")
    r = await asyncio.to_thread(_fedpeer, "reload", "--config", str(h.sites[0].config_path))
    assert r.returncode == 0 and "data: changed" in r.stdout, (r.stdout, r.stderr)
    done = (await h.wait_job(await h.propose(0, "stats", {}), timeout_s=30, among=[0]))[0]
    assert done["state"] == "done", done


async def test_a_rotated_key_is_taken_by_a_reload(make_federation) -> None:
    """site-2 gets a new identity key; the other sites replace its key in peers.toml and reload."""
    from fedpeer.identity import create_key_file

    h: Harness = make_federation(3)
    await h.wait_all_alive(timeout_s=30)
    h.stop(1)
    key_file = h.sites[1].dir / "identity.key"
    key_file.unlink()
    new_key = encode_public_key(create_key_file(key_file).public_key)
    h.start(1)
    for i in (0, 2):
        doc = tomlkit.parse(h.sites[i].config_path.read_text())
        for entry in doc["peer"]:
            if entry["name"] == "site-2":
                entry["public_key"] = new_key
        h.sites[i].config_path.write_text(tomlkit.dumps(doc))
        r = await asyncio.to_thread(_fedpeer, "reload", "--config", str(h.sites[i].config_path))
        assert r.returncode == 0 and "peers: site-2 new key;" in r.stdout, (r.stdout, r.stderr)
    await h.wait_all_alive(timeout_s=30)
    assert _peer(await h.status(0), "site-2")["public_key"] == new_key


async def test_a_reload_with_a_wrong_data_label_is_refused_and_the_old_data_keeps_working(
        make_federation, tmp_path: Path) -> None:
    """[data] label edited to a column the CSV lacks: `fedpeer reload` exits 2 with one line naming
    data.label, the nearest column and the fix; SIGHUP logs the same and status shows it; the
    running configuration stays (a job reads the old label), and the fixed file is taken."""
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 2, "stratified", seed=6, out_dir=tmp_path / "parts")
    h: Harness = make_federation(2, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    conf = h.sites[0].config_path
    good = conf.read_text()
    _edit(conf, "data", "label", "Diagnosis")
    r = await asyncio.to_thread(_fedpeer, "reload", "--config", str(conf))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, (r.stdout, r.stderr)
    assert "data.label" in r.stderr and "did you mean 'diagnosis'?" in r.stderr and "fix [data] label" in r.stderr
    os.kill(h.sites[0].process.pid, signal.SIGHUP)
    await asyncio.sleep(0.5)
    status = await h.status(0)
    assert "data.label" in status["config"]["last_reload"]["error"] and h.sites[0].process.poll() is None
    done = (await h.wait_job(await h.propose(0, "stats", {}), timeout_s=60, among=[0]))[0]
    assert done["state"] == "done", done
    conf.write_text(good)
    r = await asyncio.to_thread(_fedpeer, "reload", "--config", str(conf))
    assert r.returncode == 0, r.stderr
