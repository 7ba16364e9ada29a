"""The relay's side (fedpeer/net/relay.py): what it refuses, its budgets, and the destination's
answer carried back whole (status, refusal tag, body)."""

from __future__ import annotations

import asyncio

import pytest

from fedpeer.errors import RemoteProtocolError
from fedpeer.net.http1 import HELLO_PATH, PATH, REFUSAL_HEADER
from fedpeer.net.link import Answer, BadAnswer
from fedpeer.net.relay import RelayRequest, Relayer, request, unwrap, wrap

ME, SRC, DST, STRANGER = b"m" * 32, b"s" * 32, b"d" * 32, b"x" * 32


class FakeClient:
    def __init__(self, answer: Answer | None = None, hold: asyncio.Event | None = None) -> None:
        self.answer, self.hold, self.calls = answer, hold, []

    async def exchange(self, address, body, path, peer, timeout_ms, relay_ok=True):
        self.calls.append((address, bytes(body), path, peer, relay_ok))
        if self.hold is not None:
            await self.hold.wait()
        if self.answer is None:
            raise ConnectionRefusedError("refused")
        return self.answer


def relayer(client: FakeClient, on: bool = True, requests_max: int = 16, bytes_max: int = 1 << 20) -> Relayer:
    return Relayer(client, lambda: (on, requests_max, bytes_max), {DST: "10.0.0.4:7400", SRC: "10.0.0.2:7400"}.get)


async def test_the_destinations_answer_comes_back_whole_and_is_never_relayed_further() -> None:
    refusal = Answer(400, {"content-length": "6", REFUSAL_HEADER.lower(): "ab" * 16}, b"replay", False)
    client = FakeClient(refusal)
    r = relayer(client)
    status, body = await r.take(SRC, ME, request(DST, PATH, memoryview(b"sealed for dst")))
    assert status == 200 and client.calls == [("10.0.0.4:7400", b"sealed for dst", PATH, DST, False)]
    back = unwrap(body)
    assert (back.status, back.body, back.headers[REFUSAL_HEADER.lower()]) == (400, b"replay", "ab" * 16)
    assert r.counts["requests"] == 1 and r.counts["bytes"] == len(b"sealed for dst")
    assert r.pairs[SRC, DST] == len(b"sealed for dst")
    welcome = Answer(200, {"content-length": "3"}, b"hi!", True)
    status, body = await relayer(FakeClient(welcome)).take(SRC, ME, request(DST, HELLO_PATH, b"hello"))
    assert unwrap(body).body == b"hi!" and unwrap(body).status == 200


def test_a_relay_refuses_when_off_to_non_members_to_itself_and_back_to_the_sender() -> None:
    with pytest.raises(RemoteProtocolError, match="relay = false"):
        relayer(FakeClient(), on=False).take(SRC, ME, request(DST, PATH, b"x"))
    for dst in (STRANGER, SRC, ME):
        with pytest.raises(RemoteProtocolError) as caught:
            relayer(FakeClient()).take(SRC, ME, RelayRequest(dst, "frame", b"x"))
        assert caught.value.reason == "relay_destination"


async def test_beyond_its_budgets_a_relay_answers_busy_and_an_unreachable_destination_is_502() -> None:
    hold = asyncio.Event()
    client = FakeClient(Answer(204, {}, b"", True), hold)
    r = relayer(client, requests_max=1, bytes_max=100)
    first = asyncio.ensure_future(r.take(SRC, ME, request(DST, PATH, b"a" * 10)))
    await asyncio.sleep(0)
    assert await r.take(SRC, ME, request(DST, PATH, b"b")) == (503, b"relay_busy")        # requests
    hold.set()
    assert (await first)[0] == 200
    assert await r.take(SRC, ME, request(DST, PATH, b"c" * 101)) == (503, b"relay_busy")   # bytes
    assert await relayer(FakeClient(None)).take(SRC, ME, request(DST, PATH, b"d")) == (502, b"relay_unreachable")
    assert r.counts["busy"] == 2


def test_a_relayed_answer_that_is_not_one_is_refused() -> None:
    assert unwrap(wrap(Answer(204, {}, b"", True))).status == 204
    for bad in (b"", b"\x01", (999).to_bytes(2, "little") + b"\x00\x00", (204).to_bytes(2, "little") + b"\x05\x00ab"):
        with pytest.raises(BadAnswer):
            unwrap(bad)
