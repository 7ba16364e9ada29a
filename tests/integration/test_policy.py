"""A member's [policy] between real daemons: its limit or its rows_min refuses a proposal, and
the proposer's job (and every other member's record) fails with that member's reason, naming the
limit; a site's own policy refuses its own proposal before anyone is asked (issue 12 item 4)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness, builtin_csv, split_csv
from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from fedpeer.daemon import admin
from fedpeer.errors import FedpeerError

pytestmark = pytest.mark.integration


async def test_a_members_policy_refuses_and_the_proposer_says_why(make_federation, tmp_path: Path) -> None:
    full = builtin_csv("builtin:breast_cancer", tmp_path / "bc.csv")
    # site-3 holds about 57 of the 569 rows: fewer than its rows_min
    parts = split_csv(full, "diagnosis", 3, "0.45,0.45,0.1", seed=3, out_dir=tmp_path / "parts")
    h: Harness = make_federation(3, start=False)
    policies = [{}, {"xgboost": {"rounds_max": 200}}, {"rows_min": 100}]
    for site, part, policy in zip(h.sites, parts, policies):
        shutil.copyfile(part, site.dir / "data.csv")
        add_peers(site.config_path, [], {"data": {"csv": "data.csv", "label": "diagnosis", "positive": "malignant"},
                                         "policy": policy})
        site.config = cfg.load(site.config_path)
    assert h.sites[1].config.policy.limits["xgboost"]["rounds_max"] == 200 and h.sites[2].config.policy.rows_min == 100
    h.start()
    await h.wait_all_alive(timeout_s=30)

    # site-2's limit (site-3, whose rows_min refuses every job with data, is left out): refused
    # before any training; both records name site-2 and the limit
    doc = await admin.request(h.sites[0].config, "POST", "/v1/jobs",
                              {"kind": "xgboost", "params": {"rounds": 500}, "members": ["site-1", "site-2"]})
    records = await h.wait_job(doc["id"], timeout_s=60, among=[0, 1])
    for i, record in records.items():
        assert record is not None and record["state"] == "failed", (i, record)
        assert record["error"] == "site-2: rounds 500 > [policy.xgboost] rounds_max 200", (i, record["error"])

    # site-3's rows_min: refused after it looked at its data, without telling how many rows it has
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=60)
    for i in (0, 1, 2):
        record = records[i]
        assert record is not None and record["state"] == "failed", (i, record)
        # not the threshold either: rows_min is an upper bound on the site's rows
        assert record["error"] == "site-3: local data has fewer rows than this site's policy allows", \
            (i, record["error"])

    # site-2 proposing beyond its own limit: refused at once, no job anywhere
    with pytest.raises(FedpeerError, match=r"site-2: rounds 500 > \[policy.xgboost\] rounds_max 200"):
        await h.propose(1, "xgboost", {"rounds": 500})
