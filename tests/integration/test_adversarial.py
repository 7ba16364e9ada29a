"""Hostile input against a live daemon: each bad frame is rejected with a counted reason, the
daemon keeps serving its peers, and its memory stays bounded. Also: the admin API is not on the
peer port."""

from __future__ import annotations

import asyncio
import os
import socket

import aiohttp
import pytest

from fedpeer.app.harness.federation import Harness
from fedpeer.identity import Identity, load_key_file
from fedpeer.net.transport import HELLO_PATH, PATH
from fedpeer.wire.session import HELLO_BYTES
from fedpeer.testing import frames
from tests.integration.conftest import ml_loaded, rss_kib

pytestmark = pytest.mark.integration
FRAME_CAP = 256 * 1024


async def post(session: aiohttp.ClientSession, port: int, body: bytes, path: str = PATH) -> tuple[int, str]:
    async with session.post(f"http://127.0.0.1:{port}{path}", data=body) as resp:
        return resp.status, await resp.text()


def raw_http(port: int, head: bytes, body: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + body)
        return s.recv(200)    # the answer must come before the (never sent) rest of the body


async def test_hostile_frames_are_rejected_counted_and_harmless(make_federation) -> None:
    # site-3 is never started: the test speaks with its (allow-listed) key, like a compromised peer.
    h: Harness = make_federation(3, {"limits": {"message_bytes_max": FRAME_CAP}}, start=False)
    h.start(0)
    h.start(1)
    await h.wait_all_alive(timeout_s=30, among=[0, 1])
    target, port = h.sites[0], h.sites[0].port
    bob = load_key_file(target.config.node.key_file).public_key
    carol = load_key_file(h.sites[1].config.node.key_file).public_key
    mallory = frames.Forger(load_key_file(h.sites[2].config.node.key_file))   # in the allowlist
    stranger = frames.Forger(Identity.generate())                              # not in the allowlist
    with pytest.raises(frames.HelloRefused, match="unknown_sender"):
        await stranger.connect(bob, port)
    stranger.fake_session(bob)
    await mallory.connect(carol, h.sites[1].port)
    for_carol = mallory.seal(carol, ping := _ping(h))
    session = await mallory.connect(bob, port)
    valid = mallory.seal(bob, ping)
    ml_loaded(target)
    rss_before = rss_kib(target.process.pid)

    async with aiohttp.ClientSession() as s:
        assert (await post(s, port, valid))[0] == 204
        cases = {
            "unknown_sender": stranger.seal(bob, ping),
            "decrypt": frames.flip(mallory.seal(bob, ping), -5),     # a bit of the body (its AEAD tag)
            "replay": valid,
            "unknown_session": for_carol,                             # under mallory's session with carol
            "header": frames.flip(mallory.seal(bob, ping), 45),       # a bit of the counter
            "frame": valid[:60],                                      # truncated
            "decode": mallory.seal_raw(bob, b"\x91" * 10_000 + b"\xc0"),   # 10,000-deep nesting
            "oversize": b"x" * (FRAME_CAP + 1),
        }
        for expected, body in cases.items():
            status, text = await post(s, port, body)
            assert status in (400, 413) and text == expected, f"{expected}: got {status} {text}"
        # a bin32 claiming 2^32-1 bytes inside an authenticated frame; an HTTP body claiming 2^32
        huge_bin = mallory.seal_raw(bob, b"\xc6\xff\xff\xff\xff" + b"x" * 10)
        assert await post(s, port, huge_bin) == (400, "decode")
        reply = raw_http(port, b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 4294967296\r\n\r\n",
                         b"x" * 100)
        assert b" 413 " in reply.split(b"\r\n")[0]
        # random bytes and many oversize attempts: memory must stay bounded
        for i in range(300):
            await post(s, port, os.urandom(64 + i))
        for _ in range(100):   # random hellos, and random hellos naming a member
            await post(s, port, os.urandom(HELLO_BYTES), HELLO_PATH)
            await post(s, port, b"FPH1" + mallory.public_key + os.urandom(HELLO_BYTES - 36), HELLO_PATH)
        # (the server answers 413 from the Content-Length and closes without reading the body:
        # the client may see the answer or, still writing, a reset)
        answers = await asyncio.gather(*(post(s, port, b"y" * (FRAME_CAP * 2)) for _ in range(60)),
                                       return_exceptions=True)
        assert all(a == (413, "oversize") or isinstance(a, aiohttp.ClientError) for a in answers), answers
        assert (await post(s, port, mallory.seal(bob, ping)))[0] == 204   # the session still works

    doc = await h.status(0)
    rejected = doc["rejected"]
    for reason in ("unknown_sender", "decrypt", "replay", "unknown_session", "header", "decode", "oversize"):
        assert rejected.get(reason, 0) >= 1, f"{reason} not counted: {rejected}"
    assert rejected["frame"] + rejected.get("hello_rate", 0) >= 300 + 100   # hellos beyond an address's rate: 429
    assert next(p for p in doc["peers"] if p["name"] == "site-2")["state"] == "alive"
    assert (await h.status(1))["peers"][0]["state"] == "alive", "site-2 must still see site-1 alive"
    growth_mib = (rss_kib(target.process.pid) - rss_before) / 1024
    assert growth_mib < 40, f"RSS grew by {growth_mib:.1f} MiB under hostile input"
    log = target.log_path.read_text()
    assert "event=rejected reason=unknown_sender" in log
    # a refused frame's log names a sender only when its header verified, never the claimed key
    unknown = next(line for line in log.splitlines() if "reason=unknown_sender" in line)
    assert 'sender="unverified claim"' in unknown and "sender_name=-" in unknown

    # after the receiver restarts, no frame of a session it held opens: not the captured one, not
    # a new one under the old keys; a new session works at once
    h.restart(0)
    await h.wait_all_alive(timeout_s=30, among=[0, 1])
    async with aiohttp.ClientSession() as s:
        assert await post(s, port, valid) == (400, "unknown_session")
        assert await post(s, port, mallory.seal(bob, ping)) == (400, "unknown_session")
        assert session.next_counter > 2
        await mallory.connect(bob, port)
        assert (await post(s, port, mallory.seal(bob, ping)))[0] == 204


def _ping(h: Harness):
    from fedpeer.core.membership import swim as mb
    return mb.Ping(probe_id=1, incarnation=1, address=h.sites[2].address, updates=())


async def test_admin_api_is_not_on_the_peer_port(make_federation) -> None:
    h: Harness = make_federation(2)
    await h.wait_all_alive(timeout_s=30)
    async with aiohttp.ClientSession() as s:
        for path in ("/v1/status", "/status", "/", "/v1/jobs"):
            async with s.get(f"http://127.0.0.1:{h.sites[0].port}{path}") as resp:
                assert resp.status in (404, 405), path
                assert "fingerprint" not in await resp.text()
        async with s.get(f"http://127.0.0.1:{h.sites[0].port}{PATH}") as resp:
            assert resp.status == 405
    sock = h.sites[0].config.node.admin_socket
    assert sock is not None and (os.stat(sock).st_mode & 0o777) == 0o600
    assert (await h.status(0))["node"]["name"] == "site-1"
