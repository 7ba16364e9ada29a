"""fedpeer.daemon.metrics against a small fake node: every series is read from `status()` at scrape time,
the registry is the node's own, jobs observe durations through their channel, and the optional
TCP listener answers the 0.0.4 text format on loopback only."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import aiohttp
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedpeer.config.load import Address
from fedpeer.daemon.metrics import (
    PATH,
    MetricsListener,
    NodeMetrics,
)
from fedpeer.errors import ConfigError
from fedpeer.runtime.channel import observe_round

STATUS: dict[str, Any] = {
    "node": {"name": "site-1", "fingerprint": "ab12cd34", "uptime_s": 12.5, "incarnation": 3},
    "peers": [
        {"name": "site-2", "state": "alive", "rtt_ms": 1.5, "last_seen_s": 0.25},
        {"name": "site-3", "state": "alive", "rtt_ms": 4.0, "last_seen_s": 0.5},
        {"name": "site-4", "state": "dead", "rtt_ms": None, "last_seen_s": None},
    ],
    "leader": "site-3", "term": 7, "role": "follower", "term_jumps_ignored": 2,
    "rejected": {"replay": 3, "bad_tag": 1},
    "dropped_sends": 5,
    "connections": {"open": 4, "unverified": 1, "shed": {"evicted_unverified": 6}, "open_files_limit": 4096},
    "loop_errors": {"state_probe": 2},
    "state_dir": {"path": "/x", "writable": False, "error": "disk full", "since_ms": 1, "failed_writes": 9},
    "sent_bytes": {"reliable": 1000, "best_effort": 200},
}
TRAFFIC = {   # what each peer entry carries once the node counts per peer (see the module docstring)
    "site-2": {"sent_bytes": {"reliable": 700, "best_effort": 100},
               "received_bytes": {"membership": 50, "job": 900}, "frames_accepted": {"membership": 2, "job": 3}},
    "site-3": {"sent_bytes": {"reliable": 300, "best_effort": 100},
               "received_bytes": {"election": 40}, "frames_accepted": {"election": 1}},
}


class FakeJobs:
    kinds: ClassVar[dict[str, None]] = {"stats": None, "xgboost": None}

    def __init__(self) -> None:
        self.records = [{"kind": "stats", "state": "done"}, {"kind": "stats", "state": "done"},
                        {"kind": "xgboost", "state": "running"}]

    def list(self) -> list[dict]:
        return list(self.records)


class FakeNode:
    def __init__(self) -> None:
        self.doc = copy.deepcopy(STATUS)
        self.jobs = FakeJobs()
        self.scrapes = 0

    def status(self) -> dict[str, Any]:
        self.scrapes += 1
        return copy.deepcopy(self.doc)


class FakeChannel:
    """The two things the observe_* helpers use of a job's Channel: its clock and the node's metrics."""

    def __init__(self, metrics: NodeMetrics | None) -> None:
        self.clock_ms = 1_000_000
        if metrics is not None:
            self.metrics = metrics

    def now_ms(self) -> int:
        return self.clock_ms


def samples(metrics: NodeMetrics) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, parsed back by Prometheus's own parser: {(name, labels): value}."""
    text = metrics.exposition().decode("utf-8")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scraped: dict, series: str, **labels: str) -> float:
    return scraped[(series, frozenset(labels.items()))]


def test_gauges_and_counters_come_from_status() -> None:
    scraped = samples(NodeMetrics(FakeNode(), process=False))
    assert value(scraped, "fedpeer_peers", state="alive") == 2
    assert value(scraped, "fedpeer_peers", state="dead") == 1
    assert value(scraped, "fedpeer_peers", state="suspect") == 0   # present at 0: alerts see no gap
    assert value(scraped, "fedpeer_peer_state", peer="site-4", state="dead") == 1
    assert value(scraped, "fedpeer_peer_state", peer="site-4", state="alive") == 0
    assert value(scraped, "fedpeer_peer_rtt_seconds", peer="site-2") == pytest.approx(0.0015)
    assert ("fedpeer_peer_rtt_seconds", frozenset({("peer", "site-4")})) not in scraped   # never measured
    assert value(scraped, "fedpeer_frames_rejected_total", reason="replay") == 3
    assert value(scraped, "fedpeer_sent_bytes_total", **{"class": "reliable"}) == 1000
    assert value(scraped, "fedpeer_sends_dropped_total") == 5
    assert value(scraped, "fedpeer_election_term") == 7
    assert value(scraped, "fedpeer_election_role", role="follower") == 1
    assert value(scraped, "fedpeer_election_role", role="leader") == 0
    assert value(scraped, "fedpeer_election_leader", leader="site-3") == 1
    assert value(scraped, "fedpeer_election_term_jumps_ignored_total") == 2
    assert value(scraped, "fedpeer_state_dir_writable") == 0
    assert value(scraped, "fedpeer_state_dir_failed_writes_total") == 9
    assert value(scraped, "fedpeer_connections", state="open") == 4
    assert value(scraped, "fedpeer_connections", state="unverified") == 1
    assert value(scraped, "fedpeer_connections_shed_total", reason="evicted_unverified") == 6
    assert value(scraped, "fedpeer_loop_errors_total", step="state_probe") == 2
    assert value(scraped, "fedpeer_node_info", name="site-1", fingerprint="ab12cd34") == 1


def test_jobs_by_kind_and_state_every_known_kind_at_zero() -> None:
    scraped = samples(NodeMetrics(FakeNode(), process=False))
    assert value(scraped, "fedpeer_jobs", kind="stats", state="done") == 2
    assert value(scraped, "fedpeer_jobs", kind="xgboost", state="running") == 1
    assert value(scraped, "fedpeer_jobs", kind="xgboost", state="failed") == 0


def test_values_are_read_at_each_scrape_not_cached() -> None:
    node = FakeNode()
    metrics = NodeMetrics(node, process=False)
    samples(metrics)
    node.doc["peers"][1]["state"] = "suspect"
    node.doc["rejected"]["replay"] = 10
    node.doc["role"], node.doc["leader"] = "leader", "site-1"
    node.jobs.records.append({"kind": "stats", "state": "failed"})
    scraped = samples(metrics)
    assert node.scrapes == 2
    assert value(scraped, "fedpeer_peers", state="alive") == 1
    assert value(scraped, "fedpeer_peers", state="suspect") == 1
    assert value(scraped, "fedpeer_frames_rejected_total", reason="replay") == 10
    assert value(scraped, "fedpeer_election_role", role="leader") == 1
    assert value(scraped, "fedpeer_election_leader", leader="site-1") == 1
    assert ("fedpeer_election_leader", frozenset({("leader", "site-3")})) not in scraped
    assert value(scraped, "fedpeer_jobs", kind="stats", state="failed") == 1


def test_no_leader_no_leader_sample() -> None:
    node = FakeNode()
    node.doc["leader"] = None
    scraped = samples(NodeMetrics(node, process=False))
    assert not [k for k in scraped if k[0] == "fedpeer_election_leader"]


def test_per_peer_traffic_only_once_the_node_counts_it() -> None:
    node = FakeNode()
    metrics = NodeMetrics(node, process=False)
    before = samples(metrics)
    assert not [k for k in before if k[0] in ("fedpeer_peer_sent_bytes_total", "fedpeer_frames_accepted_total",
                                               "fedpeer_peer_received_bytes_total")], "no false zeros"
    for peer in node.doc["peers"]:
        peer.update(TRAFFIC.get(peer["name"], {}))
    scraped = samples(metrics)
    assert value(scraped, "fedpeer_peer_sent_bytes_total", peer="site-2", **{"class": "reliable"}) == 700
    assert value(scraped, "fedpeer_peer_received_bytes_total", peer="site-2", kind="job") == 900
    assert value(scraped, "fedpeer_frames_accepted_total", peer="site-3", kind="election") == 1


def test_each_node_has_its_own_registry_never_the_global_one() -> None:
    a, b = FakeNode(), FakeNode()
    b.doc["node"]["name"] = "site-9"
    ma, mb = (NodeMetrics(node, process=False, round_kinds=["xgboost"]) for node in (a, b))
    ma.round_done("xgboost", 1.0)
    assert value(samples(ma), "fedpeer_round_duration_seconds_count", kind="xgboost") == 1
    assert value(samples(mb), "fedpeer_round_duration_seconds_count", kind="xgboost") == 0
    assert ("fedpeer_node_info", frozenset({("name", "site-9"), ("fingerprint", "ab12cd34")})) in samples(mb)
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "fedpeer_" not in global_text


def test_process_collector_is_in_the_node_registry() -> None:
    scraped = samples(NodeMetrics(FakeNode()))
    assert value(scraped, "process_open_fds") > 0


def test_secure_sum_durations_and_retries() -> None:
    metrics = NodeMetrics(FakeNode(), process=False)
    metrics.secure_sum_done("ring", 0.75, ok=True, attempts=3)
    metrics.secure_sum_done("pairwise", 20, ok=False)
    scraped = samples(metrics)
    assert value(scraped, "fedpeer_secure_sum_duration_seconds_count", mode="ring", outcome="ok") == 1
    assert value(scraped, "fedpeer_secure_sum_duration_seconds_sum", mode="ring", outcome="ok") == pytest.approx(0.75)
    assert value(scraped, "fedpeer_secure_sum_duration_seconds_bucket", mode="ring", outcome="ok", le="0.5") == 0
    assert value(scraped, "fedpeer_secure_sum_duration_seconds_bucket", mode="ring", outcome="ok", le="1.0") == 1
    assert value(scraped, "fedpeer_secure_sum_retries_total", mode="ring") == 2
    assert value(scraped, "fedpeer_secure_sum_retries_total", mode="pairwise") == 0
    assert value(scraped, "fedpeer_secure_sum_duration_seconds_count", mode="pairwise", outcome="failed") == 1
    assert value(scraped, "fedpeer_secure_sum_duration_seconds_count", mode="pairwise", outcome="ok") == 0


def test_without_node_metrics_observe_round_does_nothing() -> None:
    observe_round(FakeChannel(None), "xgboost", 0)   # a unit-test or simulator channel: no `metrics`


def test_observe_round_and_a_clock_step_back_is_zero() -> None:
    metrics = NodeMetrics(FakeNode(), process=False)
    ch = FakeChannel(metrics)
    observe_round(ch, "xgboost", ch.clock_ms - 2_500)
    observe_round(ch, "xgboost", ch.clock_ms + 1_000)    # wall clock stepped back during the round
    scraped = samples(metrics)
    assert value(scraped, "fedpeer_round_duration_seconds_count", kind="xgboost") == 2
    assert value(scraped, "fedpeer_round_duration_seconds_sum", kind="xgboost") == pytest.approx(2.5)
    assert value(scraped, "fedpeer_round_duration_seconds_bucket", kind="xgboost", le="0.05") == 1


# -- serving --------------------------------------------------------------------------------------

async def get(port: int, path: str = PATH, **headers: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


@pytest.fixture
async def listener():
    node = FakeNode()
    served = MetricsListener(NodeMetrics(node, process=False), Address("127.0.0.1", 0))
    await served.start()
    yield served, node
    await served.stop()


async def test_listener_serves_the_0_0_4_text_format(listener) -> None:
    served, _ = listener
    status, content_type, text = await get(served.port)
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [s.value for s in families["fedpeer_peers"].samples if s.labels["state"] == "alive"] == [2]


async def test_listener_refuses_rebinding_hosts_browsers_and_other_paths(listener) -> None:
    served, _ = listener
    assert (await get(served.port, Host=f"evil.example:{served.port}"))[0] == 403
    assert (await get(served.port, Host="127.0.0.1:1"))[0] == 403
    assert (await get(served.port, Origin="http://evil.example"))[0] == 403
    assert (await get(served.port, Host=f"localhost:{served.port}"))[0] == 200
    assert (await get(served.port, path="/v1/status"))[0] == 404
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{served.port}{PATH}") as resp:
            assert resp.status == 405


async def test_a_failing_scrape_answers_500_and_the_listener_keeps_serving(listener) -> None:
    served, node = listener
    real_status = node.status
    node.status = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    status, _, text = await get(served.port)
    assert status == 500 and "RuntimeError" in text
    node.status = real_status
    assert (await get(served.port))[0] == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::"])
async def test_listener_refuses_a_non_loopback_address(host: str) -> None:
    served = MetricsListener(NodeMetrics(FakeNode(), process=False), Address(host, 0), "peers.toml")
    with pytest.raises(ConfigError, match="node.metrics: .*not a loopback"):
        await served.start()
    assert served.port is None


async def test_listener_on_a_taken_port_is_a_config_error(listener) -> None:
    served, _ = listener
    second = MetricsListener(NodeMetrics(FakeNode(), process=False), Address("127.0.0.1", served.port), "peers.toml")
    with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
        await second.start()


def test_reach_paths_and_relays_are_metrics() -> None:
    node = FakeNode()
    node.doc["reach"] = {"state": "outbound-only", "links_dialed_for_peers": 4}
    node.doc["relayed"] = {"requests": 12, "bytes": 3400, "busy": 1}
    node.doc["peers"][0]["path"] = {"to": "relayed by site-3"}
    node.doc["peers"][1]["path"] = {"to": "inbound", "links_it_dialed": 2}
    scraped = samples(NodeMetrics(node, process=False))
    assert value(scraped, "fedpeer_reach_state", state="outbound-only") == 1
    assert value(scraped, "fedpeer_reach_state", state="dialable") == 0
    assert value(scraped, "fedpeer_links_dialed_for_peers") == 4
    first, second = node.doc["peers"][0]["name"], node.doc["peers"][1]["name"]
    assert value(scraped, "fedpeer_peer_path", peer=first, path="relayed") == 1
    assert value(scraped, "fedpeer_peer_path", peer=second, path="inbound") == 1
    assert value(scraped, "fedpeer_peer_path", peer=second, path="direct") == 0
    assert value(scraped, "fedpeer_relayed_total", what="bytes") == 3400
