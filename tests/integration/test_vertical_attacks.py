"""Issue 38 against real daemons over vertical sites: a member's key in hostile hands claims every
gathered value came back altered (finding 3), and a member announces more IDs than a site's
[policy] ids_max lets it (finding 8). Each daemon keeps serving, and the job ends as the checks
say: done, with the false claim named; or failed at the first step, naming the site over the cap."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from fedpeer.identity import load_key_file
from fedpeer.kinds.aligned import GatherCheck
from fedpeer.net.transport import PATH
from fedpeer.testing import frames
from tests.integration.test_vertical import attach, write_blocks

pytestmark = pytest.mark.integration


async def test_a_member_claiming_its_gathered_values_were_altered_is_named_and_the_job_ends_done(
        make_federation, tmp_path: Path) -> None:
    """A second session under site-3's key tells site-1 and site-2, under the very tags they wait
    on, that site-3's values came back altered from both of a vertical stats job's gathers. The
    members' commitments show every value came back as committed: the claim is refuted, site-3
    is named in both honest results (false_claims), and the job ends done at all three sites."""
    _, paths = write_blocks(tmp_path, seed=2)
    h = make_federation(3, start=False)
    attach(h.sites, paths, partition="vertical", id_column="ID")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    ids = [load_key_file(site.config.node.key_file) for site in h.sites]
    forger = await frames.connected(ids[2], h, [0, 1])
    job_id = await h.propose(0, "stats", {"bins": 8})
    await h.wait_step(0, job_id, 1, timeout_s=30)       # aligning: no gather has begun
    await h.wait_step(1, job_id, 1, timeout_s=30)
    async with aiohttp.ClientSession() as s:
        for i in (0, 1):
            for gather in ("moments", "spread"):
                frame = forger.seal(ids[i].public_key, GatherCheck(f"stats/{gather}/check", False), job=job_id)
                async with s.post(f"http://127.0.0.1:{h.sites[i].port}{PATH}", data=frame) as resp:
                    assert resp.status == 204, resp.status
    records = await h.wait_job(job_id, timeout_s=60)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    assert records[0]["result"]["false_claims"] == [h.sites[2].name], records[0]["result"]
    assert records[1]["result"]["false_claims"] == [h.sites[2].name], records[1]["result"]
    assert records[0]["result"]["mean"] == records[1]["result"]["mean"] == records[2]["result"]["mean"]
    assert all(code is None for code in h.exit_codes().values())


async def test_a_member_over_a_sites_ids_max_is_refused_at_the_first_step(make_federation, tmp_path: Path) -> None:
    """site-2 lets another member announce at most 100 IDs ([policy] ids_max); the others hold
    about 510 each. site-2 refuses at the intersection's first step, naming a member over its
    cap and the setting to change (no count), and every site's record says why."""
    _, paths = write_blocks(tmp_path, seed=3)
    h = make_federation(3, start=False)
    attach(h.sites, paths, partition="vertical", id_column="ID")
    add_peers(h.sites[1].config_path, [], {"policy": {"ids_max": 100}})
    h.sites[1].config = cfg.load(h.sites[1].config_path)
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "kmeans", {"k": 2})
    records = await h.wait_job(job_id, timeout_s=30)
    assert {r["state"] for r in records.values()} == {"failed"}, records
    error = records[1]["error"]
    here = r"site-2: site-[13] announces more IDs than this site's \[policy\] ids_max; raise ids_max here"
    assert re.match(here, error), error
    assert all("ids_max" in r["error"] for r in records.values()), [r["error"] for r in records.values()]
    assert not re.search(r"\d{3}", error), error


async def test_a_job_wide_failure_names_no_site_at_any_daemon(make_federation, tmp_path: Path) -> None:
    """Finding 6: site-3's IDs are written another way, so no ID is held by every member. Every
    site meets that at once; whichever aborts first used to be named at the head of every record.
    Now every record says why, naming no site."""
    _, paths = write_blocks(tmp_path, seed=4)
    text = paths[2].read_text().replace("\nP", "\nQ")
    paths[2].write_text(text)
    h = make_federation(3, start=False)
    attach(h.sites, paths, partition="vertical", id_column="ID")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "stats", {"bins": 8})
    records = await h.wait_job(job_id, timeout_s=30)
    errors = [r["error"] for r in records.values()]
    assert {r["state"] for r in records.values()} == {"failed"}, errors
    assert all(e.startswith("aligning the rows: no ID is held by every member") for e in errors), errors
