"""Session handshakes from many loopback addresses against a real daemon, from the attacker's side
(fedpeer/net/admission.py HelloRate). A holder of a member's key who sends fresh, valid hellos
from 512 addresses in 512 different /24s gets no more full handshakes (signature check, key
exchange) than that key's budget; a host without a key who spreads hellos over the addresses of
one /24 gets no more answers past the 429 gate than that prefix's budget.

The bounds asserted grow with the time the attack took, so a slow machine only loosens them."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from fedpeer.app.harness.federation import Harness
from fedpeer.net.admission import (
    HELLO_BURST_PER_IP,
    HELLO_BURST_PER_KEY,
    HELLO_RATE_PER_IP_PER_S,
    HELLO_RATE_PER_KEY_PER_S,
)
from fedpeer.net.transport import HELLO_PATH
from fedpeer.wire.session import HELLO_BYTES

pytestmark = pytest.mark.integration

ADDRESSES = 512
ANSWER_TIMEOUT_S = 30.0
SLACK = 5                      # answers allowed beyond the budget (a refill at a second's edge)


async def _send_hello(port: int, source: str, hello: bytes) -> int:
    """One hello from `source`; the answer's HTTP status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        writer.write(f"POST {HELLO_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(hello)}\r\n\r\n".encode() + hello)
        line = await asyncio.wait_for(reader.readline(), ANSWER_TIMEOUT_S)
        return int(line.split()[1])
    finally:
        writer.close()


async def _flood(port: int, sources: list[str], hellos: list[bytes]) -> tuple[list[int], float]:
    started = time.monotonic()
    statuses = [await _send_hello(port, src, hello) for src, hello in zip(sources, hellos, strict=True)]
    return statuses, time.monotonic() - started


async def test_a_members_key_from_512_prefixes_gets_only_its_keys_budget_of_full_handshakes(make_federation) -> None:
    from fedpeer.identity import load_key_file
    from fedpeer.testing.frames import Forger

    h: Harness = make_federation(2)
    await h.wait_all_alive(timeout_s=30)
    insider = Forger(load_key_file(h.sites[1].config.node.key_file))
    target = load_key_file(h.sites[0].config.node.key_file).public_key
    hellos = [insider.handshakes.hello(target).hello for _ in range(ADDRESSES)]     # fresh: no replay
    sources = [f"127.{1 + k // 256}.{k % 256}.1" for k in range(ADDRESSES)]         # one per /24
    statuses, took_s = await _flood(h.sites[0].port, sources, hellos)
    full = sum(1 for s in statuses if s != 429)          # answered past both gates: paid a signature check
    assert statuses.count(429) > 0, statuses
    assert full <= HELLO_BURST_PER_KEY + HELLO_RATE_PER_KEY_PER_S * took_s + SLACK, (full, took_s)
    doc = await h.status(0)
    assert doc["node"]["name"] == "site-1"


async def test_a_stranger_spread_over_one_slash_24_shares_its_budget(make_federation) -> None:
    h: Harness = make_federation(1)
    await h.wait_until(lambda s: s[0] is not None, 30, "the daemon answers")
    sources = [f"127.0.77.{1 + k % 254}" for k in range(ADDRESSES)]               # one /24, many addresses
    junk = [os.urandom(HELLO_BYTES) for _ in range(ADDRESSES)]
    statuses, took_s = await _flood(h.sites[0].port, sources, junk)
    past_gate = sum(1 for s in statuses if s != 429)
    assert past_gate <= HELLO_BURST_PER_IP + HELLO_RATE_PER_IP_PER_S * took_s + SLACK, (past_gate, took_s)
