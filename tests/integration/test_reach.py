"""Sites that cannot be dialed, on loopback: a site whose advertised address nobody can open
(as behind a firewall that drops inbound connections) takes full part through the links it dials
to its peers, learns from a peer's dial-back that it cannot be dialed, and `status` shows each
path. (Firewalls, cut pairs, relays and proxies between network namespaces: test_netns.py.)"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness, builtin_csv, split_csv
from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg

pytestmark = pytest.mark.integration


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released: connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def federation(tmp_path: Path, n: int, advertise: list[str | None], network: dict | None = None) -> Harness:
    full = builtin_csv("builtin:breast_cancer", tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", n, "stratified", seed=3, out_dir=tmp_path / "parts")
    settings = {"jobs": {"preload_ml": False}}
    if network:
        settings["network"] = network
    h = Harness(tmp_path / "fed", n, settings, advertise=advertise)   # type: ignore[arg-type]
    h.create()
    for site, path in zip(h.sites, parts):
        shutil.copyfile(path, site.dir / "data.csv")
        add_peers(site.config_path, [], {"data": {"csv": "data.csv", "label": "diagnosis", "positive": "malignant"}})
        site.config = cfg.load(site.config_path)
    return h


async def test_a_site_nobody_can_dial_takes_full_part(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{closed_port()}"
    h = federation(tmp_path, 3, [None, None, dead])
    try:
        h.start()
        took = await h.wait_all_alive(timeout_s=30)
        assert took < 15, f"every site saw every other alive only after {took:.1f} s"

        def learned(statuses: dict) -> bool:
            return statuses[2] is not None and statuses[2]["reach"]["state"] == "outbound-only"
        await h.wait_until(learned, 30, "site-3 learns from a dial-back that it cannot be dialed")
        own = await h.status(2)
        assert dead in own["reach"]["detail"] and "open it to the other sites" in own["reach"]["detail"]
        assert own["reach"]["links_dialed_for_peers"] == 2 * 2
        assert all(p["state"] == "alive" for p in own["peers"])
        for i in (0, 1):
            seen = {p["name"]: p for p in (await h.status(i))["peers"]}["site-3"]
            assert seen["state"] == "alive"
            assert seen["path"]["links_it_dialed"] == 2   # and what it knew of its reach when it offered them
        # jobs proposed by it and by another site, with it as a member, run on all three
        for proposer in (2, 0):
            job_id = await h.propose(proposer, "stats", {"bins": 4})
            records = await h.wait_job(job_id, timeout_s=120)
            assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
            assert {r["result"]["count"] for r in records.values()} == {569}
        seen = {p["name"]: p for p in (await h.status(0))["peers"]}["site-3"]
        assert seen["path"]["to"] == "inbound"
        # the operator's view: one line with the fix, each peer's path
        out = subprocess.run([sys.executable, "-m", "fedpeer", "netcheck", "--config", str(h.sites[2].config_path)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert "reachable: outbound-only" in out.stdout and f"no peer could open a connection to {dead}" in out.stdout
        assert "2 we dialed to it" in out.stdout
        out = subprocess.run([sys.executable, "-m", "fedpeer", "status", "--config", str(h.sites[0].config_path)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "PATH" in out.stdout and "inbound" in out.stdout, out.stdout + out.stderr
        # a restart of a peer drops its links; they are dialed again and the site stays in
        opened = (await h.status(2))["reach"]["links_dialed_for_peers"]
        h.restart(0)
        await h.wait_all_alive(timeout_s=30)

        def relinked(statuses: dict) -> bool:
            return statuses[2] is not None and statuses[2]["reach"]["links_dialed_for_peers"] == opened
        await h.wait_until(relinked, 30, "site-3 dials its links to the restarted site again")
        job_id = await h.propose(0, "stats", {"bins": 4})
        records = await h.wait_job(job_id, timeout_s=120)
        assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    finally:
        h.stop()


async def test_a_dialable_site_learns_it_and_keeps_no_links(tmp_path: Path) -> None:
    h = federation(tmp_path, 2, [None, None])
    try:
        h.start()
        await h.wait_all_alive(timeout_s=30)

        def learned(statuses: dict) -> bool:
            return all(s is not None and s["reach"]["state"] == "dialable" for s in statuses.values())
        await h.wait_until(learned, 30, "both sites learn from a dial-back that they can be dialed")

        def unlinked(statuses: dict) -> bool:
            return all(s is not None and s["reach"]["links_dialed_for_peers"] == 0 for s in statuses.values())
        await h.wait_until(unlinked, 10, "a dialable site closes the links it kept while it did not know")
        def direct(statuses: dict) -> bool:
            return all(s is not None and s["peers"][0]["path"] == {"to": "direct"} for s in statuses.values())
        await h.wait_until(direct, 10, "each sends to the other on connections it dials")
    finally:
        h.stop()
