"""Blame on evidence between real daemons (issue 11, item 6): a member's malformed secure-sum chunk
must not get the honest successor that refused it dropped from the sum.

Four daemons run a `sumcheck` job. The test holds the key of the second site in ring order (the
"liar", allow-listed like a compromised site) and, while the job starts, sends the liar's ring
successor a secure-sum chunk of float64 for that job, sealed under a session the test opens with
the liar's key, as the liar's daemon would. The successor's gate refuses it, its job's receives
from the liar fail (MalformedFrom), and it reports the liar's chunk as malformed. Before the fix
it reported nothing useful, or the refusal was taken for a dead peer, and the honest site was
dropped; now the two are a dispute: the next attempt runs over all four in an order that keeps
them apart. (The liar's daemon itself runs honestly, so it stays in too.)
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import pytest

from fedpeer.app.harness.federation import Harness
from fedpeer.identity import load_key_file
from fedpeer.net.transport import PATH
from fedpeer.protocols.securesum.api import SumChunk
from fedpeer.testing import frames

pytestmark = pytest.mark.integration
ENTRIES = 2 * 1024 * 1024           # 16 MiB per site in 32 chunks: the ring runs for a while
CHUNK_ENTRIES = 65_536
INJECT_FOR_S = 20.0                 # how long to keep trying before the successor knows the job


async def inject_until_refused(port: int, liar_sealer: frames.Forger, dst: bytes, job_id: str) -> str:
    """Post the malformed chunk until the successor's gate refuses it for its schema (it answers
    unknown_job until the proposal has reached it). Returns the last answer."""
    chunk = SumChunk("sumcheck/ss-pairwise/a1/c0", np.zeros(4, dtype=np.float64))
    deadline = time.monotonic() + INJECT_FOR_S
    text = ""
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            frame = liar_sealer.seal(dst, chunk, job=job_id)
            async with session.post(f"http://127.0.0.1:{port}{PATH}", data=frame) as resp:
                text = await resp.text()
                if resp.status == 400 and text == "schema":
                    return text
            await asyncio.sleep(0.002)
    return text


async def test_a_malformed_chunk_does_not_get_the_honest_successor_dropped(make_federation) -> None:
    h: Harness = make_federation(4)
    await h.wait_all_alive(timeout_s=30)
    idents = [load_key_file(site.config.node.key_file) for site in h.sites]
    ring = sorted(range(4), key=lambda i: idents[i].public_key)     # ring order = key order
    initiator, liar, successor = ring[0], ring[1], ring[2]

    job_id = await h.propose(initiator, "sumcheck", {"entries": ENTRIES, "secure_sum": "pairwise",
                                                     "chunk_entries": CHUNK_ENTRIES})
    # The gate checks a frame's schema before it looks the job up: a chunk refused before the
    # proposal reaches the successor is evidence against nothing (the job is unknown there), so
    # inject only once the successor holds the job (on a loaded machine that can lag the propose).
    deadline = time.monotonic() + INJECT_FOR_S
    while await h.job(successor, job_id) is None:
        assert time.monotonic() < deadline, "the proposal never reached the successor"
        await asyncio.sleep(0.01)
    answer = await inject_until_refused(h.sites[successor].port, await frames.connected(idents[liar], h, [successor]),
                                        idents[successor].public_key, job_id)
    assert answer == "schema", f"the successor's gate never refused the chunk for its schema: {answer!r}"

    records = await h.wait_job(job_id, timeout_s=90)
    names = sorted(site.name for site in h.sites)
    for i, record in records.items():
        assert record is not None and record["state"] == "done", (h.sites[i].name, record)
        result = record["result"]
        assert sorted(result["participants"]) == names, (h.sites[i].name, result["participants"])
        assert result["attempts"] >= 2, "the refused chunk must have ended the first attempt"
    assert h.exit_codes() == {site.name: None for site in h.sites}, "no daemon may exit"
    doc = await h.status(successor)
    assert all(p["state"] == "alive" for p in doc["peers"]), doc["peers"]
