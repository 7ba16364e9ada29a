"""The ε a DP job spent, as the console shows it (fedpeer/app/console/views.py `job_list`, `privacy`):
the job list's words are `fedpeer jobs`' and the numbers are the site's ledger's, the one
`fedpeer privacy` prints."""

from __future__ import annotations

import json
from pathlib import Path

from fedpeer.app.console import views
from fedpeer.app.jobtext import jobs_table
from fedpeer.jobs.privacy import PrivacyLedger, show


def _job(job_id: str, kind: str, spent: dict | None, result: dict | None = None, state: str = "done") -> dict:
    return {"id": job_id, "kind": kind, "state": state, "phase": state, "progress": {"step": 0, "total": 0},
            "elapsed_s": 1.0, "error": None, "members": [], "params": {}, "result": result,
            "privacy_spent": spent}


def test_the_job_list_shows_each_jobs_charge_and_they_add_up_to_what_fedpeer_privacy_says(tmp_path: Path) -> None:
    ledger = PrivacyLedger(tmp_path, 8.0, 1e-5)
    ledger.reserve("ds", "j1", "logreg", 1.0, 1e-8, 1)
    ledger.reserve("ds", "j2", "stats", 0.25, 1e-8, 2)      # e.g. a job that failed: still charged
    ledger.settle("ds", "j1", 1.2, 1e-8)                      # its accountant counted more
    jobs = [_job("j1", "logreg", ledger.charged("ds", "j1")), _job("j2", "stats", ledger.charged("ds", "j2"), None,
                                                                     "failed"),
            _job("j3", "stats", ledger.charged("ds", "j3"))]
    shown = views.job_list({"jobs": jobs})["jobs"]
    assert [j["epsilon_spent"] for j in shown] == ["1.2 (δ 1e-08)", "0.25 (δ 1e-08)", "-"]
    total = sum(j["privacy_spent"]["epsilon"] for j in shown if j["privacy_spent"])
    assert total == ledger.rows()[0]["epsilon_spent"] == 1.45
    assert "1.45" in show(ledger.rows())                      # `fedpeer privacy`
    table = jobs_table(jobs)                                  # `fedpeer jobs`: the same words
    assert "ε SPENT HERE" in table and "1.2 (δ 1e-08)" in table and "0.25 (δ 1e-08)" in table
    assert "ε SPENT" not in jobs_table([_job("j3", "stats", None)])   # no DP job, no column
    json.dumps(views.finite(views.job_list({"jobs": jobs})), allow_nan=False)


def test_a_dp_jobs_page_shows_every_read_sites_charge_and_the_accountants_count() -> None:
    counted = {"epsilon": 0.998, "delta": 1e-8, "split": "equal noise multipliers over 13 releases"}
    here = _job("j1", "logreg", {"epsilon": 1.0, "delta": 1e-8}, {"privacy": counted})
    other = _job("j1", "logreg", {"epsilon": 1.0, "delta": 1e-8}, {"privacy": counted})
    readings = [("aa", "site-1", here, None), ("bb", "site-2", other, None), ("cc", "site-3", None, "unreachable")]
    doc = views.job_view(here, readings)["privacy"]
    assert doc["here"] == {"epsilon": 1.0, "delta": 1e-8}
    assert [(s["name"], s["epsilon"]) for s in doc["sites"]] == [("site-1", 1.0), ("site-2", 1.0)]
    assert doc["counted"]["epsilon"] == 0.998 and "13 releases" in doc["counted"]["split"]
    plain = _job("j2", "stats", None, {"count": 5})
    assert views.job_view(plain, [("aa", "site-1", plain, None)])["privacy"] is None
