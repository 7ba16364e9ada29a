"""Prometheus metrics of real daemons: scraped as an operator would (GET /metrics over the admin
unix socket, and over the optional loopback listener `[node] metrics`), parsed with Prometheus's
own parser.

These need fedpeer/daemon/node.py and fedpeer/config/load.py to wire fedpeer/daemon/metrics.py (the admin route, the
`[node] metrics` key and its listener); until then they fail, on purpose.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedpeer.app.harness.federation import Harness, free_ports
from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from tests.integration.test_jobs import breast_cancer_federation

pytestmark = pytest.mark.integration
SCRAPE_TIMEOUT_S = 5.0


async def scrape_unix(sock_path: Path) -> tuple[str, dict[tuple[str, frozenset], float]]:
    """GET /metrics over the admin socket (what `curl --unix-socket ... http://x/metrics` does)."""
    connector = aiohttp.UnixConnector(path=str(sock_path))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as s:
        async with s.get("http://fedpeer/metrics") as resp:
            assert resp.status == 200, await resp.text()
            return resp.headers["Content-Type"], parse(await resp.text())


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: dict, series: str, **labels: str) -> float:
    return scraped[(series, frozenset(labels.items()))]


async def test_scrape_over_the_admin_socket_after_a_stats_job(make_federation, tmp_path: Path) -> None:
    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 3, "stratified", seed=4)
    job_id = await h.propose(0, "stats", {"secure_sum": "ring"})
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    for i, site in enumerate(h.sites):
        status = await h.status(i)   # before the scrape: a measured RTT never becomes unknown again
        content_type, scraped = await scrape_unix(site.config.node.admin_socket)
        assert content_type.startswith("text/plain; version=0.0.4"), content_type
        assert value(scraped, "fedpeer_peers", state="alive") == 2, site.name
        assert value(scraped, "fedpeer_peers", state="dead") == 0
        assert value(scraped, "fedpeer_jobs", kind="stats", state="done") == 1, site.name
        assert value(scraped, "fedpeer_jobs", kind="stats", state="failed") == 0
        assert value(scraped, "fedpeer_sent_bytes_total", **{"class": "reliable"}) > 0   # the job's frames
        assert value(scraped, "fedpeer_sent_bytes_total", **{"class": "best_effort"}) > 0  # membership
        assert value(scraped, "fedpeer_state_dir_writable") == 1
        assert sum(v for (name, _), v in scraped.items() if name == "fedpeer_election_role") == 1
        assert value(scraped, "fedpeer_node_info", name=site.name, fingerprint=status["node"]["fingerprint"]) == 1
        measured = [p["name"] for p in status["peers"] if p["rtt_ms"] is not None]
        assert all(value(scraped, "fedpeer_peer_rtt_seconds", peer=name) >= 0 for name in measured)
        assert all(value(scraped, "fedpeer_peer_state", peer=p["name"], state="alive") == 1 for p in status["peers"])
        # the stats job ran two secure sums (moments, then spreads): both timed at every member
        assert value(scraped, "fedpeer_secure_sum_duration_seconds_count", mode="ring", outcome="ok") == 2, site.name
        assert value(scraped, "process_open_fds") > 0


async def test_optional_loopback_listener(make_federation) -> None:
    h: Harness = make_federation(2, start=False)
    (port,) = free_ports(1)
    site = h.sites[0]
    add_peers(site.config_path, [], {"node": {"metrics": f"127.0.0.1:{port}"}})
    site.config = cfg.load(site.config_path)
    h.start()
    await h.wait_all_alive(timeout_s=30)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as s:
        async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            scraped = parse(await resp.text())
        assert value(scraped, "fedpeer_peers", state="alive") == 1
        assert any(k[0] == "fedpeer_node_info" and ("name", site.name) in k[1] for k in scraped)
        h.stop(0)
        with pytest.raises(aiohttp.ClientConnectionError):   # the listener went with the daemon
            async with s.get(f"http://127.0.0.1:{port}/metrics"):
                pass


def test_a_non_loopback_metrics_address_is_refused_at_start(tmp_path: Path) -> None:
    h = Harness(tmp_path / "fed", 1)
    h.create()
    conf = h.sites[0].config_path
    text = conf.read_text()
    conf.write_text(text.replace("[node]\n", '[node]\nmetrics = "0.0.0.0:9464"\n', 1))
    r = subprocess.run([sys.executable, "-m", "fedpeer", "start", "--config", str(conf)],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.returncode, r.stderr)
    _, key, problem = r.stderr.partition("node.metrics: ")
    assert key and "loopback" in problem, r.stderr   # the problem, not the path (it names this test)


async def test_a_running_jobs_latest_history_point_is_a_gauge(make_federation, tmp_path: Path) -> None:
    """fedpeer_job_metric / fedpeer_job_round: the latest point of a job's live history, while it
    runs (a kmeans job of many small rounds: caught if a scrape lands mid-job) and, for
    JOB_METRICS_LINGER_S after it ends, its last one: asserted against `job show`'s history."""
    from fedpeer.daemon.metrics import JOB_METRICS_LINGER_S

    h, _, _ = await breast_cancer_federation(make_federation, tmp_path, 2, "stratified", seed=4)
    job_id = await h.propose(0, "kmeans", {"k": 4, "n_init": 1, "max_iter": 300, "tol": 0.0, "seed": 3,
                                           "secure_sum": "ring"})
    sock = h.sites[1].config.node.admin_socket
    seen_running = None
    for _ in range(600):       # scrape while it runs: a point, once one is reported
        record = await h.job(1, job_id)
        if record is not None and record["state"] in ("done", "failed", "cancelled"):
            break
        _, scraped = await scrape_unix(sock)
        got = [v for (name, labels), v in scraped.items() if name == "fedpeer_job_round" and ("job", job_id) in labels]
        if got and record is not None and record["state"] == "running":
            seen_running = got[0]
            break
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    for i, site in enumerate(h.sites):
        last = records[i]["history"][-1]
        _, scraped = await scrape_unix(site.config.node.admin_socket)   # ended well within JOB_METRICS_LINGER_S
        assert value(scraped, "fedpeer_job_round", job=job_id, kind="kmeans") == last["round"], site.name
        assert value(scraped, "fedpeer_job_metric", job=job_id, kind="kmeans", metric="objective") \
            == pytest.approx(last["objective"])
        assert not [k for k in scraped if k[0] == "fedpeer_job_metric" and ("metric", "round") in k[1]]
    assert JOB_METRICS_LINGER_S >= 60
    if seen_running is not None:      # a scrape that landed mid-job saw a round the job had reached
        assert 1 <= seen_running <= records[1]["history"][-1]["round"]
