"""benchmarks/bench_wan.py's proxies, without timing anything: daemons that advertise their proxy
(`Harness(advertise=...)`) see each other alive through it, every connection's sender is read from
its first request, and what the proxies put on a site's uplink is what the site's daemon says it
sent (frames) plus the HTTP around them."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness, traffic_delta
from fedpeer.identity import parse_public_key

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_wan  # noqa: E402

pytestmark = pytest.mark.integration

# What a site's uplink carries besides its frames: request heads (~70 B per frame), 204 answers to
# the others' requests (~40 B each), session hellos and welcomes; a sumcheck of 2^16 entries sends
# ~30 frames per site, membership a few per second.
OVERHEAD_BYTES_MAX = 32 * 1024
OVERHEAD_SHARE_MAX = 0.05


def test_proxies_attribute_every_byte_to_its_sender(tmp_path: Path) -> None:
    wan = bench_wan.Wan(3, delay_s=0.005, bytes_per_s=0)
    h = Harness(tmp_path / "fed", 3, settings={"jobs": {"preload_ml": False}}, advertise=wan.addresses)
    try:
        h.create()
        assert [s.peer_address for s in h.sites] == wan.addresses
        wan.connect([s.port for s in h.sites], [parse_public_key(s.public_key) for s in h.sites])
        h.start()

        async def scenario() -> tuple[dict, dict, list[int], list[int], dict]:
            await h.wait_all_alive(60)
            before, wire_before = await h.traffic(), wan.uplink_bytes()
            job_id = await h.propose(0, "sumcheck", {"entries": 1 << 16})
            records = await h.wait_job(job_id, 120)
            after = await h.traffic()
            for _ in range(50):     # what the daemons counted as sent may still sit in a proxy's buffers
                wire = wan.uplink_bytes()
                if all(wire[i] - wire_before[i] >= traffic_delta(before[i], after[i])["bytes_sent"] for i in range(3)):
                    break
                await asyncio.sleep(0.1)
            return before, after, wire_before, wire, records

        before, after, wire_before, wire_after, records = asyncio.run(scenario())
        assert all(r is not None and r["state"] == "done" for r in records.values()), records
        statuses = asyncio.run(h.statuses())
    finally:
        h.stop()
        wan.close()
    assert wan.unattributed_bytes == 0
    for i in range(3):
        sent = traffic_delta(before[i], after[i])["bytes_sent"]
        wire = wire_after[i] - wire_before[i]
        assert sent >= 8 * (1 << 16), (i, sent)          # its masked vector leaves it at least once
        assert sent <= wire <= sent * (1 + OVERHEAD_SHARE_MAX) + OVERHEAD_BYTES_MAX, (i, sent, wire)
    for i, doc in statuses.items():       # every site advertises its proxy's address
        assert doc["node"]["address"] == wan.addresses[i]


def test_sender_key_is_read_from_a_frame_or_a_hello() -> None:
    key = bytes(range(32))
    for magic in (bench_wan.FRAME_MAGIC, bench_wan.HELLO_MAGIC):
        body = magic + key + b"rest"
        first = b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        assert bench_wan.sender_key(first) == key
        assert bench_wan.sender_key(first[:-10]) is None         # the key not all there
    assert bench_wan.sender_key(b"GET / HTTP/1.1\r\n\r\n" + b"XXXX" + key) is None
