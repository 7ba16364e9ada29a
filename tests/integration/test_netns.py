"""Five sites on emulated site networks (a network namespace each, tests/integration/netns.py):
two whose firewalls drop inbound connections, one of those able to leave only through an HTTP
CONNECT proxy (Debian's tinyproxy), and one pair cut both ways. Every kind completes with the model
it gives on the flat network, `status` shows each path, and a relay holds no plaintext of what it
forwarded. Skipped, saying why, where namespaces cannot be made."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fedpeer.app.harness.federation import Harness, builtin_csv, split_csv
from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from fedpeer.testing import netns

pytestmark = pytest.mark.integration
SKIP = netns.skip_reason()
# every kind with small parameters (a run of each, twice: this checks paths, not learning), and the
# secure-sum modes and the leader's rounds the defaults do not reach
JOBS: list[tuple[str, dict[str, Any]]] = [
    ("stats", {"bins": 4}),
    ("sumcheck", {"entries": 1000}),
    ("bofrf", {"n_estimators": 4, "max_depth": 3}),
    ("xgboost", {"rounds": 2, "max_depth": 2}),
    ("xgboost", {"mode": "bagging", "rounds": 3, "max_depth": 2}),
    ("tree", {"max_depth": 2}),
    ("logreg", {"max_iter": 5}),
    ("mlp", {"rounds": 2}),
    ("kmeans", {"k": 2, "n_init": 1, "max_iter": 5}),
    ("gmm", {"k": 2, "n_init": 1, "max_iter": 5}),
    ("dbscan", {}),
    ("stats", {"bins": 4, "secure_sum": "pairwise"}),
    ("stats", {"bins": 4, "secure_sum": "ring"}),
]
JOB_TIMEOUT_S = 120
VOLATILE = ("elapsed", "bytes", "model_file", "seconds", "_s", "_ms", "at", "time", "took")


def _stable(value: Any) -> Any:
    """A result without what differs from run to run on the same data (times, bytes, paths)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in sorted(value.items())
                if not any(k == v_ or k.endswith(v_) for v_ in VOLATILE) or k == "model_file_sha256"}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def fingerprint(result: dict) -> str:
    if "model_file_sha256" in result:
        return result["model_file_sha256"]
    return hashlib.sha256(json.dumps(_stable(result), sort_keys=True, default=str).encode()).hexdigest()


def federation(tmp_path: Path, net: netns.SiteNet, proxy: str) -> Harness:
    full = builtin_csv("builtin:breast_cancer", tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", net.n, "stratified", seed=5, out_dir=tmp_path / "parts")
    h = Harness(tmp_path / "fed", net.n, {"jobs": {"preload_ml": False}}, key_seed=11,
                hosts=[net.host(k) for k in range(1, net.n + 1)], wraps=[net.exec(k) for k in range(1, net.n + 1)])
    h.create()
    for i, (site, path) in enumerate(zip(h.sites, parts)):
        shutil.copyfile(path, site.dir / "data.csv")
        settings: dict[str, dict[str, object]] = {
            "data": {"csv": "data.csv", "label": "diagnosis", "positive": "malignant"}}
        if i == net.n - 1:
            settings["network"] = {"proxy": proxy}
        add_peers(site.config_path, [], settings)
        site.config = cfg.load(site.config_path)
    return h


async def run_every_kind(h: Harness) -> dict[str, list[str]]:
    """Each job once, proposed by each site in turn; job -> every member's fingerprint, by site."""
    out = {}
    for n, (kind, params) in enumerate(JOBS):
        job_id = await h.propose(n % len(h.sites), kind, params)
        records = await h.wait_job(job_id, timeout_s=JOB_TIMEOUT_S)
        states = {i: (r or {}).get("state") for i, r in records.items()}
        assert set(states.values()) == {"done"}, (kind, states, [(r or {}).get("error") for r in records.values()])
        out[f"{kind} {params}"] = [fingerprint(records[i]["result"]) for i in sorted(records)]
    return out


def peer_paths(status: dict) -> dict[str, dict]:
    return {p["name"]: p["path"] for p in status["peers"]}


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
async def test_firewalled_proxied_and_cut_sites_run_every_kind_as_on_a_flat_network(tmp_path: Path) -> None:
    with netns.SiteNet(5) as net:
        proxy = net.start_proxy(tmp_path)
        h = federation(tmp_path, net, proxy)
        try:
            net.block_inbound(4)
            net.block_inbound(5)
            net.only_through_proxy(5)
            net.cut(2, 3)
            h.start()
            await h.wait_all_alive(timeout_s=60)

            def learned(docs: dict) -> bool:
                return all(docs[i] is not None and docs[i]["reach"]["state"] == "outbound-only" for i in (3, 4))
            await h.wait_until(learned, 60, "sites 4 and 5 learn that nobody can dial them")
            walled = await run_every_kind(h)
            await check_paths(h)
            await check_relay_sees_no_plaintext(h)
        finally:
            h.stop()
        # the same sites, keys and data on the flat network: the same models
        net.flat()
        add_peers(h.sites[4].config_path, [], {"network": {"proxy": "none"}})
        h.start()
        try:
            await h.wait_all_alive(timeout_s=60)
            flat = await run_every_kind(h)
        finally:
            h.stop()
    assert walled == flat


async def check_paths(h: Harness) -> None:
    docs = await h.statuses()
    at1, at2, at5 = peer_paths(docs[0]), peer_paths(docs[1]), peer_paths(docs[4])
    assert at1["site-4"]["to"] == at1["site-5"]["to"] == "inbound", at1
    assert at1["site-2"]["to"] == at1["site-3"]["to"] == "direct", at1
    assert at2["site-3"]["to"].startswith("relayed by "), at2
    assert at5["site-1"]["to"] == "proxy", at5
    assert docs[4]["reach"]["proxy"] == f"http://{netns.HUB_HOST}:{netns.PROXY_PORT}"
    assert "no peer could open a connection to" in docs[3]["reach"]["detail"]
    for i in range(5):
        states = {p["name"]: p["state"] for p in docs[i]["peers"]}
        assert set(states.values()) == {"alive"}, (i, states)


async def check_relay_sees_no_plaintext(h: Harness) -> None:
    """A job between the cut pair alone: every frame of it goes through relays, which are not
    members. Its id is in every frame's plaintext; the relays' memory and logs never hold it (and
    a member's memory does: the search finds what is there)."""
    before = {i: (d or {}).get("relayed", {}).get("bytes", 0) for i, d in (await h.statuses()).items()}
    from fedpeer.daemon import admin
    doc = await admin.request(h.sites[1].config, "POST", "/v1/jobs",
                              {"kind": "stats", "params": {"bins": 4}, "members": ["site-2", "site-3"]})
    job_id = doc["id"]
    records = await h.wait_job(job_id, timeout_s=JOB_TIMEOUT_S, among=[1, 2])
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    after = {i: (d or {}).get("relayed", {}).get("bytes", 0) for i, d in (await h.statuses()).items()}
    relays = [i for i in (0, 3, 4) if after[i] > before[i]]
    assert relays, f"no relay forwarded the cut pair's job: {before} -> {after}"
    marker = job_id.encode()
    assert netns.memory_holds(h.sites[2].process.pid, marker), "the search must find what a member holds"
    for i in relays:
        assert not netns.memory_holds(h.sites[i].process.pid, marker), f"{h.sites[i].name} holds the job id"
        assert job_id not in h.sites[i].log_path.read_text(), f"{h.sites[i].name} logged the job id"


# The issue's figures are a middlebox that forgets flows idle 30 s and a keep-alive every 20 s; the
# test keeps their proportions at a quarter of the time (the idle wait was 40 of the suite's seconds)
MIDDLEBOX_IDLE_S = 8           # the middlebox forgets a flow idle this long
KEEPALIVE_MS = 5_000           # [network] keepalive_ms: well inside it, as 20 s is inside 30 s
IDLE_S = 12                    # the federation waits longer than the middlebox's timeout between two jobs


@pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
async def test_links_through_a_middlebox_that_forgets_idle_flows_survive_idle_time(tmp_path: Path) -> None:
    """An outbound-only site behind a NAT-like middlebox that drops flows idle for 8 s: the TCP
    keep-alive (every 5 s, `[network] keepalive_ms`) keeps its links, so after 12 s without a job
    the next job runs on them — no link had to be dialed again, and no job fails. (With the links
    forgotten, a peer's request on one waits for an answer that never comes: http_timeout_ms, 30 s,
    beyond the job's hop timeout, 20 s.)"""
    with netns.SiteNet(3) as net:
        full = builtin_csv("builtin:breast_cancer", tmp_path / "bc.csv")
        parts = split_csv(full, "diagnosis", 3, "stratified", seed=5, out_dir=tmp_path / "parts")
        h = Harness(tmp_path / "fed", 3, {"jobs": {"preload_ml": False}, "network": {"keepalive_ms": KEEPALIVE_MS}},
                    hosts=[net.host(k) for k in (1, 2, 3)], wraps=[net.exec(k) for k in (1, 2, 3)])
        h.create()
        for site, path in zip(h.sites, parts):
            shutil.copyfile(path, site.dir / "data.csv")
            add_peers(site.config_path, [], {"data": {"csv": "data.csv", "label": "diagnosis",
                                                      "positive": "malignant"}})
            site.config = cfg.load(site.config_path)
        net.middlebox(3, MIDDLEBOX_IDLE_S)
        try:
            h.start()
            await h.wait_all_alive(timeout_s=60)
            await h.wait_until(lambda d: d[2] is not None and d[2]["reach"]["state"] == "outbound-only", 60,
                               "site-3 learns that nobody can dial it")
            for proposer in (0, 2):
                job_id = await h.propose(proposer, "kmeans", {"k": 2, "n_init": 2, "max_iter": 5})
                records = await h.wait_job(job_id, timeout_s=JOB_TIMEOUT_S)
                assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
            opened = (await h.status(2))["reach"]["links_opened"]
            await asyncio.sleep(IDLE_S)
            for proposer in (0, 1, 2):
                job_id = await h.propose(proposer, "kmeans", {"k": 2, "n_init": 2, "max_iter": 5})
                records = await h.wait_job(job_id, timeout_s=JOB_TIMEOUT_S)
                assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
            own = await h.status(2)
            assert own["reach"]["links_opened"] == opened, "a link was dialed again: the middlebox dropped it"
            assert own["reach"]["links_dialed_for_peers"] == 2 * 2
            # the middlebox resets every flow of site-3 twice while a job runs: the links are dialed
            # again and the job ends done everywhere
            job_id = await h.propose(0, "xgboost", {"rounds": 30, "max_depth": 3})
            await h.wait_step(0, job_id, 3, JOB_TIMEOUT_S)
            for _ in range(2):
                subprocess.run([*net.exec(3), "ss", "-K", "state", "established"], capture_output=True, check=True)
                await asyncio.sleep(1)
            records = await h.wait_job(job_id, timeout_s=JOB_TIMEOUT_S)
            assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
            assert (await h.status(2))["reach"]["links_opened"] >= opened + 2 * 2 * 2
        finally:
            h.stop()
