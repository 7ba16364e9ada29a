"""`fedpeer harness --json` reports each site's bytes sent to and received from its peers during the
job (`bytes_sent`, `bytes_received`, `bytes_by_peer`), read from every daemon's status before and
after it; the text report has a line and a table of them.

How close a site's sent bytes must be to what the others received from it: the sender counts a
frame once the peer answered 204, the receiver once it accepted the frame, and a refused retry of
a delivered frame counts at neither side again; so the two only differ by frames in flight while
one of the two readings was taken (the readings of the sites are concurrent, not atomic). When
every member's record of the job is final no job frame is in flight, which leaves membership
frames (a few hundred bytes, a handful per pair at a time): 2 KiB per ordered pair, plus 2 % of
the pair's bytes for a job frame a member might still be sending when the proposer's record ends.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness, traffic_delta
from fedpeer.app.harness.report import format_report, traffic_table

pytestmark = pytest.mark.integration

PAIR_SLACK_BYTES = 2048
PAIR_SLACK_SHARE = 0.02


def _close(sent: int, received: int) -> bool:
    return abs(sent - received) <= PAIR_SLACK_BYTES + PAIR_SLACK_SHARE * max(sent, received)


def test_harness_json_reports_each_sites_bytes_and_they_match_between_peers(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "fedpeer", "harness", "--sites", "3", "--job", "stats",
                        "--data", "builtin:sonar", "--json", "--timeout-s", "120"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    sites = {s["name"]: s for s in report["sites"]}
    assert len(sites) == 3
    for name, s in sites.items():
        assert s["bytes_sent"] > 0 and s["bytes_received"] > 0, (name, s["bytes_sent"], s["bytes_received"])
        assert set(s["bytes_by_peer"]) == set(sites) - {name}
        assert s["bytes_sent"] == sum(p["sent"] for p in s["bytes_by_peer"].values())
        assert s["bytes_received"] == sum(p["received"] for p in s["bytes_by_peer"].values())
    # every site's secure-sum shares go to the others: a stats job moves kilobytes (60 columns)
    assert sum(s["bytes_sent"] for s in sites.values()) > 3 * 1024
    for a in sites:
        for b in sites:
            if a != b:
                sent, received = sites[a]["bytes_by_peer"][b]["sent"], sites[b]["bytes_by_peer"][a]["received"]
                assert _close(sent, received), (a, b, sent, received)
    total_sent = sum(s["bytes_sent"] for s in sites.values())
    total_received = sum(s["bytes_received"] for s in sites.values())
    assert _close(total_sent, total_received), (total_sent, total_received)


def test_bytes_scale_with_the_job(make_federation: Callable[..., Harness]) -> None:
    """sumcheck of 2^16 entries (512 KiB vectors) moves about 16 times what 2^12 entries move; each
    of the 3 sites' masked vectors leaves it at least once."""
    h = make_federation(3)

    async def job_bytes(entries: int) -> list[int]:
        before = await h.traffic()
        job_id = await h.propose(0, "sumcheck", {"entries": entries})
        records = await h.wait_job(job_id, 120)
        after = await h.traffic()
        assert all(r is not None and r["state"] == "done" for r in records.values()), records
        return [traffic_delta(before[i], after[i])["bytes_sent"] for i in range(3)]

    async def scenario() -> tuple[list[int], list[int]]:
        await h.wait_all_alive(60)
        return await job_bytes(1 << 12), await job_bytes(1 << 16)

    small, large = asyncio.run(scenario())
    assert all(b > 0 for b in small + large), (small, large)
    assert sum(large) >= 3 * 8 * (1 << 16), large
    assert sum(large) > 8 * sum(small), (small, large)


def test_traffic_delta_and_the_text_report() -> None:
    before = {"pid": 7, "by_peer": {"b": {"sent": 100, "received": 50}}}
    after = {"pid": 7, "by_peer": {"b": {"sent": 1100, "received": 2098}, "c": {"sent": 24, "received": 0}}}
    assert traffic_delta(before, after) == {"bytes_sent": 1024, "bytes_received": 2048, "bytes_by_peer": {
        "b": {"sent": 1000, "received": 2048}, "c": {"sent": 24, "received": 0}}}
    restarted = {**after, "pid": 8}          # its counters started again from zero
    assert traffic_delta(before, restarted)["bytes_sent"] is None
    assert traffic_delta(None, after)["bytes_received"] is None

    sites = [{"name": "site-1", "state": "done", "rows": 3, "result": {}, "bytes_sent": 3 << 20,
              "bytes_received": 1536},
             {"name": "site-2", "state": "done", "rows": 3, "result": {}, "bytes_sent": 1 << 20,
              "bytes_received": None}]
    text = traffic_table(sites)
    assert "sent per site max 3.0 MiB, mean 2.0 MiB" in text
    assert [line.split() for line in text.splitlines()[1:]] == [
        ["SITE", "SENT", "RECEIVED"], ["site-1", "3.0", "MiB", "1.5", "KiB"], ["site-2", "1.0", "MiB", "-"]]
    report = {"job": {"id": "j", "kind": "sumcheck", "state": "done", "elapsed_s": 1.0, "error": None},
              "sites": sites}
    assert text in format_report(report, Path("."), temp=True)
