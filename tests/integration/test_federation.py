"""Membership between real daemons: the promises of the foundation issue, measured as an operator
would see them through `fedpeer status`."""

from __future__ import annotations

import asyncio
import time

import pytest

from fedpeer.app.harness.federation import Harness
from fedpeer.testing import frames

pytestmark = pytest.mark.integration


async def test_five_daemons_alive_kill_restart_pause(make_federation) -> None:
    h: Harness = make_federation(5)
    assert await h.wait_all_alive(timeout_s=30) <= 30

    h.kill9(4)
    assert await h.wait_peer_state(4, "dead", timeout_s=30) <= 30
    h.start(4)
    assert await h.wait_peer_state(4, "alive", timeout_s=30) <= 30

    h.pause(2)
    await asyncio.sleep(15)
    statuses = await h.statuses([0, 1, 3, 4])
    assert all(next(p for p in doc["peers"] if p["name"] == "site-3")["state"] != "alive"
               for doc in statuses.values()), "a node stopped for 15 s must not look alive"
    h.resume(2)
    await h.wait_all_alive(timeout_s=30)
    assert all(code is None for code in h.exit_codes().values()), f"a daemon exited: {h.exit_codes()}"


async def test_wrong_public_key_never_becomes_alive(make_federation) -> None:
    h: Harness = make_federation(3, start=False)
    # site-1 lists site-2 under site-3's key: every frame from the real site-2 is from an unknown key.
    conf = h.sites[0].config_path
    text = conf.read_text()
    text = text.replace(f'public_key = "{h.sites[1].public_key}"', 'public_key = "WRONG"')
    text = text.replace('public_key = "WRONG"', f'public_key = "{_other_key()}"')
    conf.write_text(text)
    from fedpeer.config import load as cfg
    h.sites[0].config = cfg.load(conf)
    h.start()
    await h.wait_all_alive(timeout_s=30, among=[1, 2])
    # sites 2 and 3 can see each other before site-1's daemon answers at all: wait for it too
    await h.wait_until(lambda st: st[0] is not None, 10.0, "site-1 answers", among=[0])
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        doc = await h.status(0)
        states = {p["name"]: p["state"] for p in doc["peers"]}
        assert states["site-2"] != "alive", "a peer pinned to another key must never be alive"
        await asyncio.sleep(0.2)
    assert states["site-3"] == "alive"
    assert doc["rejected"].get("unknown_sender", 0) > 0


def _other_key() -> str:
    from fedpeer.identity import Identity, encode_public_key
    return encode_public_key(Identity.generate().public_key)


async def test_leader_election_failover_and_rejoin(make_federation) -> None:
    """Every status agrees on one leader and term; kill -9 it and the others elect another in a
    higher term; the old leader, restarted, follows without bumping the term (PreVote, leases)."""
    h: Harness = make_federation(3)
    await h.wait_all_alive(timeout_s=30)

    async def agreed(among: list[int], timeout_s: float, not_leader: str | None = None) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            docs = (await h.statuses(among)).values()
            views = {(d["leader"], d["term"]) for d in docs if d}
            if len(views) == 1 and None not in next(iter(views)) and next(iter(views))[0] != not_leader:
                return next(iter(views))
            await asyncio.sleep(0.1)
        raise AssertionError(f"no agreed leader among {among}: {views}")

    leader, term = await agreed([0, 1, 2], 20)
    assert sum(d["role"] == "leader" for d in (await h.statuses()).values()) == 1
    old = next(i for i, s in enumerate(h.sites) if s.name == leader)
    h.kill9(old)
    survivors = [i for i in range(3) if i != old]
    failover_started = time.monotonic()
    new_leader, new_term = await agreed(survivors, 20, not_leader=leader)
    assert time.monotonic() - failover_started < 3 * 5.0, "within a few election timeouts (max 5 s)"
    assert new_leader != leader and new_term > term
    h.start(old)
    final = await agreed([0, 1, 2], 20)
    assert final == (new_leader, new_term), "a rejoining node must not depose a healthy leader"


async def test_a_members_heartbeat_claiming_the_next_term_is_not_followed(make_federation) -> None:
    """issue 11 against real daemons: with a follower's (allow-listed) key, tell the other two "I lead
    term + 1" in heartbeats without a certificate, with made-up signatures and with the forger's own
    signature in the others' names. Before the fix both took it as leader of term + 1 (and then obeyed
    its xgboost directives); now every status keeps the real leader and term."""
    import aiohttp

    from fedpeer.core.election import raft as el
    from fedpeer.identity import load_key_file
    from fedpeer.net.transport import PATH

    h: Harness = make_federation(3)
    await h.wait_all_alive(timeout_s=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        views = {(d["leader"], d["term"]) for d in (await h.statuses()).values() if d}
        if len(views) == 1 and None not in next(iter(views)):
            break
        await asyncio.sleep(0.1)
    leader, term = next(iter(views))
    keys = [load_key_file(s.config.node.key_file) for s in h.sites]
    forger = next(i for i, s in enumerate(h.sites) if s.name != leader)
    me = keys[forger]
    others = [k.public_key for i, k in enumerate(keys) if i != forger]
    claim = term + 1
    certificates = [(), tuple(el.VoteSig(k, bytes(64)) for k in others),
                    tuple(el.VoteSig(k, me.sign(el.vote_statement(claim, me.public_key))) for k in others)]
    sealer = frames.Forger(me)
    for i, k in enumerate(keys):
        if i != forger:
            await sealer.connect(k.public_key, h.sites[i].port)
    async with aiohttp.ClientSession() as session:
        for _ in range(6):   # a "leader" repeats itself: six rounds over ~3 s
            for i, dst in ((i, k.public_key) for i, k in enumerate(keys) if i != forger):
                for cert in certificates:
                    frame = sealer.seal(dst, el.Heartbeat(claim, 0, 0, cert), term=claim)
                    async with session.post(f"http://127.0.0.1:{h.sites[i].port}{PATH}", data=frame) as resp:
                        assert resp.status == 204, (resp.status, await resp.text())   # delivered to the core
            await asyncio.sleep(0.5)
            docs = await h.statuses()
            assert {(d["leader"], d["term"]) for d in docs.values()} == {(leader, term)}, docs
    assert all(code is None for code in h.exit_codes().values()), h.exit_codes()
