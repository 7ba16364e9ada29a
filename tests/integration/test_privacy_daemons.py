"""The privacy ledger between real daemons (docs/security.md, differential privacy): a DP job run
from the CLI is charged at every site, a DP job that fails stays charged, the job that would pass
one site's [privacy] epsilon_budget is refused by that site by name before its rows are used, and
the ledger keeps every charge through kill -9 and a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import Harness, split_csv
from fedpeer.app.sitefiles import add_peers
from fedpeer.config import load as cfg
from fedpeer.jobs.privacy import PrivacyLedger, show
from tests.integration.test_jobs import _attach_data, _fedpeer, breast_cancer_csv

pytestmark = pytest.mark.integration

DP = ["--param", "dp_iterations=4", "--param", "dp_rows_max=10000"]


def _privacy(h: Harness, i: int, cli: bool = False) -> str:
    """What `fedpeer privacy` prints at site i: the command itself, or its two lines in this process
    (fedpeer/app/cli.py `_privacy`; a command costs a Python start)."""
    if cli:
        r = _fedpeer("privacy", "--config", str(h.sites[i].config_path))
        assert r.returncode == 0, r.stderr
        return r.stdout
    config = cfg.load(h.sites[i].config_path)
    return show(PrivacyLedger(config.node.state_dir, config.privacy.epsilon_budget,
                              config.privacy.delta_budget).rows())


def _spent(text: str) -> tuple[int, float]:
    """(jobs, ε spent) of the one dataset `fedpeer privacy` lists."""
    rows = text.strip().splitlines()
    assert len(rows) == 2, text
    fields = rows[1].split()
    return int(fields[1]), float(fields[2])


async def test_a_small_budget_refuses_by_name_and_the_ledger_survives_kill_9(make_federation, tmp_path: Path) -> None:
    parts = split_csv(breast_cancer_csv(tmp_path / "bc.csv"), "diagnosis", 3, "stratified", seed=4,
                      out_dir=tmp_path / "parts")
    h: Harness = make_federation(3, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    add_peers(h.sites[1].config_path, [], {"privacy": {"epsilon_budget": 1.5}})
    h.sites[1].config = cfg.load(h.sites[1].config_path)
    h.start()
    await h.wait_all_alive(timeout_s=30)
    conf = str(h.sites[0].config_path)

    # fits every budget: runs, and every site's ledger holds it
    r = _fedpeer("run", "logreg", "--config", conf, "--wait", "--json", "--param", "dp_epsilon=1", *DP)
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert first["state"] == "done" and first["result"]["privacy"]["epsilon"] <= 1.0
    assert first["privacy_spent"] == {"epsilon": 1.0, "delta": 1e-8}
    assert [_spent(_privacy(h, i, cli=i == 0)) for i in range(3)] == [(1, 1.0)] * 3

    # fails after its start (no noise left for a site with 5 colluders among 3): still charged everywhere
    failed = await h.propose(0, "logreg", {"dp_epsilon": 0.25, "dp_colluders": 5, "dp_iterations": 4})
    records = await h.wait_job(failed, timeout_s=30)
    assert {rec["state"] for rec in records.values()} == {"failed"}, records
    assert all("leaves no member's noise" in rec["error"] for rec in records.values())
    assert all(rec["privacy_spent"]["epsilon"] == 0.25 for rec in records.values())
    assert [_spent(_privacy(h, i)) for i in range(3)] == [(2, 1.25)] * 3

    # would pass site-2's budget: refused there, by name, before its rows are used; nobody charged
    refused = await h.propose(0, "logreg", {"dp_epsilon": 1.0, "dp_iterations": 4, "dp_rows_max": 10_000})
    records = await h.wait_job(refused, timeout_s=30)
    for rec in records.values():
        assert rec["state"] == "failed" and rec["privacy_spent"] is None, rec
        assert "site-2: this job needs ε 1; its budget has 0.25 left of 1.5" in rec["error"], rec["error"]
    assert records[1]["rows"] is None                    # site-2 never took its rows into the job
    assert [_spent(_privacy(h, i)) for i in range(3)] == [(2, 1.25)] * 3

    # kill -9 and restart: the ledger, and each job's charge, are still there
    h.kill9(1)
    h.restart(1)
    await h.wait_until(lambda statuses: statuses[1] is not None, 30, "site-2 answers again", among=[1])
    assert _spent(_privacy(h, 1, cli=True)) == (2, 1.25)
    charged = {j["id"]: j["privacy_spent"] for j in (await h.status(1))["jobs"]}     # `fedpeer status`
    assert charged[first["id"]]["epsilon"] == 1.0 and charged[failed]["epsilon"] == 0.25
    assert charged.get(refused) is None       # a proposal refused at acceptance is not kept
