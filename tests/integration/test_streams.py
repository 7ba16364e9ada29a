"""Payloads larger than a frame (issue 13 item 4): a 200 MiB message between two real daemons goes
as a stream of 4 MiB frames, arrives whole, and costs the receiver the payload plus a window — not
a frame of it, twice. A member's bad stream fails only its own frames."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest

from fedpeer.app.harness.federation import Harness
from fedpeer.daemon import admin
from fedpeer.identity import load_key_file
from fedpeer.net.streams import STREAM_CHUNK_BYTES, StreamChunk, StreamOpen, digest
from fedpeer.net.transport import PATH
from fedpeer.wire import frame as wire
from fedpeer.testing import frames
from tests.integration.conftest import ml_loaded

pytestmark = pytest.mark.integration
PAYLOAD_BYTES = 200 * 1024 * 1024


def vm(pid: int, key: str) -> int:
    """VmRSS / VmHWM of a process, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(key)


async def test_a_200_mib_message_streams_between_two_daemons_with_bounded_memory(make_federation) -> None:
    h: Harness = make_federation(2, {"limits": {"message_bytes_max": 16 * 1024 * 1024}})
    await h.wait_all_alive(timeout_s=30)
    receiver = h.sites[1].process.pid
    ml_loaded(h.sites[1])   # (the background import of the ML libraries is ~240 MiB of its own)
    Path(f"/proc/{receiver}/clear_refs").write_text("5")   # the peak from here on is this transfer's
    before = vm(receiver, "VmRSS")
    started = time.monotonic()
    doc = await admin.request(h.sites[0].config, "POST", "/v1/diag/ping",
                              {"peer": h.sites[1].name, "count": 1, "payload_bytes": PAYLOAD_BYTES},
                              timeout_ms=120_000)
    assert "error" not in doc, doc
    elapsed = time.monotonic() - started
    peak = vm(receiver, "VmHWM") - before
    status = await h.status(1)
    assert status["streams"] == {"receiving_bytes": 0, "received": 1}, status["streams"]
    # the receiver holds a session each way: its own, or the half of the sender's it answers under
    # (its own hello may have failed at start, the sender's port not yet open: then it opened none)
    assert status["sessions"]["inbound"] >= 1 and status["sessions"]["outbound"] >= 1, status["sessions"]
    frames_in = status["peers"][0]["frames_accepted"]
    assert frames_in.get("diag") == 1, frames_in                          # one message was delivered ...
    received = status["peers"][0]["received_bytes"]
    assert received.get("stream", 0) >= PAYLOAD_BYTES - STREAM_CHUNK_BYTES, received   # ... in 4 MiB frames
    # The receiver holds the stream's buffer and the decoded message (each the payload's size) and a
    # few chunk frames; one 200 MiB frame would also hold the frame and its plaintext.
    assert peak < 2.3 * PAYLOAD_BYTES + 32 * STREAM_CHUNK_BYTES, f"peak RSS growth {peak / 2**20:.0f} MiB"
    assert elapsed < 60, elapsed
    print(f"200 MiB stream: {elapsed:.2f} s, receiver peak RSS growth {peak / 2**20:.0f} MiB")
    assert all(code is None for code in h.exit_codes().values())


async def test_a_members_bad_streams_are_refused_and_harmless(make_federation) -> None:
    h: Harness = make_federation(3, {"limits": {"payload_bytes_max": 64 * 1024 * 1024}}, start=False)
    h.start(0)
    h.start(1)
    await h.wait_all_alive(timeout_s=30, among=[0, 1])
    bob = load_key_file(h.sites[0].config.node.key_file).public_key
    mallory = await frames.connected(load_key_file(h.sites[2].config.node.key_file), h, [0])
    port = h.sites[0].port
    data = os.urandom(1000)

    async def post(msg: object, job: str = "") -> tuple[int, str]:
        async with http.post(f"http://127.0.0.1:{port}{PATH}", data=mallory.seal(bob, msg, job=job)) as resp:
            return resp.status, await resp.text()

    async with aiohttp.ClientSession() as http:
        assert await post(StreamOpen(b"s" * 8, 1 << 40, bytes(32))) == (400, "oversize")   # over payload_bytes_max
        assert await post(StreamChunk(b"x" * 8, 0, data)) == (400, "stream")             # never opened
        assert await post(StreamOpen(b"a" * 8, 1500, bytes(32))) == (204, "")
        assert await post(StreamChunk(b"a" * 8, 1000, data)) == (400, "stream")          # past its end: dropped
        assert await post(StreamChunk(b"a" * 8, 0, data)) == (400, "stream")             # ... so this one too
        assert await post(StreamOpen(b"b" * 8, 2000, bytes(32))) == (204, "")
        assert await post(StreamChunk(b"b" * 8, 0, data)) == (204, "")
        assert await post(StreamChunk(b"b" * 8, 1000, data)) == (400, "stream")          # wrong digest
        for i in range(2):    # per-peer stream budget
            assert await post(StreamOpen(bytes([i]) * 8, 1 << 20, bytes(32))) == (204, "")
        assert await post(StreamOpen(b"c" * 8, 1 << 20, bytes(32))) == (400, "stream_busy")
        # a stream whose whole is a well-formed envelope of junk: refused by the gate's decode
        whole = frames.envelope({"payload": 5}, kind="diag_probe")
        assert await post(StreamOpen(b"d" * 8, len(whole), digest(whole))) in ((204, ""), (400, "stream_busy"))
    doc = await h.status(0)
    assert doc["rejected"].get("stream", 0) >= 4 and doc["rejected"].get("oversize", 0) >= 1, doc["rejected"]
    assert next(p for p in doc["peers"] if p["name"] == "site-2")["state"] == "alive"
    await asyncio.sleep(0)
    assert all(code is None for code in h.exit_codes().values())


def test_a_stream_reassembles_out_of_order_and_checks_its_digest() -> None:
    from fedpeer.errors import RemoteProtocolError
    from fedpeer.net.streams import InboundStreams
    streams = InboundStreams(payload_bytes_max=10_000)
    whole = os.urandom(2500)
    streams.open(b"p" * 32, StreamOpen(b"s" * 8, len(whole), digest(whole)), 0)
    assert streams.chunk(b"p" * 32, StreamChunk(b"s" * 8, 2000, whole[2000:]), 1) is None
    assert streams.chunk(b"p" * 32, StreamChunk(b"s" * 8, 0, whole[:1000]), 2) is None
    assert bytes(streams.chunk(b"p" * 32, StreamChunk(b"s" * 8, 1000, whole[1000:2000]), 3)) == whole
    assert streams.held_bytes() == 0
    streams.open(b"p" * 32, StreamOpen(b"t" * 8, 100, digest(whole[:100])), 0)
    with pytest.raises(RemoteProtocolError, match="stream"):   # another sender cannot write into it
        streams.chunk(b"q" * 32, StreamChunk(b"t" * 8, 0, whole[:100]), 1)
    assert streams.prune(29_999) == 0 and streams.prune(30_000) == 1


def test_pack_of_a_stream_chunk_fits_a_frame() -> None:
    chunk = wire.pack(StreamChunk(b"s" * 8, 0, bytes(STREAM_CHUNK_BYTES)), job="j" * 64, term=2**62)
    assert len(chunk) < STREAM_CHUNK_BYTES + 256
