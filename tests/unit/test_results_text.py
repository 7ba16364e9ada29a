"""What people read of a job (issue 27): `job show`'s lines are text, its parameters only those
that differ from the defaults, one phase text for `jobs`, `job show` and `run --wait`, what a job
waits for in words, progress on a pipe, Ctrl-C during `run --wait`, BOFRF's probability.
(Every kind's `describe` on a real result: tests/unit/test_kind_contract.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fedpeer.app import runwait
from fedpeer.app.jobtext import format_job, jobs_table, params_text, phase_text, progress_text
from fedpeer.kinds.catalog import job_kinds


def record(kind: str = "xgboost", state: str = "running", **kw) -> dict:
    params = {name: p.default for name, p in job_kinds()[kind].params.items()}
    return {"id": "j-1", "kind": kind, "state": state, "proposer": "site-1",
            "members": [{"name": "site-1"}, {"name": "site-2"}], "phase": "histogram mode: round 3 of 20",
            "progress": {"step": 3, "total": 20}, "params": params, "elapsed_s": 4.2, "rows": 10,
            "error": None, "result": None, **kw}


def test_parameters_are_shown_where_they_differ_from_the_defaults() -> None:
    r = record()
    assert params_text(r) == "parameters: the defaults"
    r["params"] |= {"objective": "reg:squarederror", "rounds": 50, "eta": 0.1}
    assert params_text(r) == ("parameters: eta=0.1, objective=reg:squarederror, rounds=50 "
                              "(the others at their defaults)")
    assert "{" not in format_job(r) and "max_bin" not in format_job(r)


def test_one_phase_text_for_jobs_job_show_and_run_wait() -> None:
    counted = record()
    assert phase_text(counted) == "histogram mode: round 3 of 20"       # no "step 3 of 20" again
    plain = record(kind="kmeans", phase="kmeans round 7", progress={"step": 7, "total": 301})
    assert phase_text(plain) == "kmeans round 7 (step 7 of 301)"
    done = record(kind="kmeans", state="done", phase="done", progress={"step": 36, "total": 301})
    assert phase_text(done) == "done"
    assert "step" not in format_job(done)
    for r in (counted, plain):
        assert f"  phase: {phase_text(r)}" in format_job(r).splitlines()
        assert phase_text(r) in jobs_table([r]) and phase_text(r) in progress_text(r)


def test_a_job_without_data_says_so_instead_of_rows_none() -> None:
    shown = format_job(record(kind="sumcheck", state="done", phase="done", rows=None))
    assert "reads no data" in shown and "None" not in shown


def test_every_message_a_job_waits_for_is_named_in_words() -> None:
    """`job show`'s "waiting for ..." names the message in words (WAITING_FOR), never its class."""
    import fedpeer.protocols.securesum.wire as securesum_wire

    classes = {d.cls for kind in job_kinds().values() for d in kind.messages}
    classes |= {c for c in vars(securesum_wire).values() if isinstance(c, type) and dataclasses.is_dataclass(c)}
    unnamed = sorted(c.__name__ for c in classes if not isinstance(getattr(c, "WAITING_FOR", None), str))
    assert len(classes) > 15 and unnamed == []


def test_a_secure_sums_chunks_never_replace_the_kinds_phase() -> None:
    """The misleading "secure sum (step 1 of 1)": a one-chunk sum leaves the phase alone, a longer
    one is a detail of it."""
    from fedpeer.jobs.lifecycle.nodechannel import NodeChannel
    from fedpeer.jobs.records import JobRecord
    from fedpeer.protocols.securesum.core import PHASE

    rec = JobRecord(id="j", kind="xgboost", params={}, proposer=b"a", members=(b"a", b"b"), created_ms=0)
    registry = SimpleNamespace(transport=SimpleNamespace(me=b"a", now_ms=lambda: 0),
                               records=SimpleNamespace(save=lambda r: None))
    ch = NodeChannel(registry, rec)
    ch.progress("histogram mode: round 3 of 20", 3, 20)
    ch.progress(PHASE, 1, 1)
    assert (rec.phase, rec.step, rec.total) == ("histogram mode: round 3 of 20", 3, 20)
    ch.progress(PHASE, 2, 8)
    assert (rec.phase, rec.step, rec.total) == ("histogram mode: round 3 of 20 (secure sum: chunk 2 of 8)", 3, 20)
    ch.progress("histogram mode: round 4 of 20", 4, 20)
    assert rec.phase == "histogram mode: round 4 of 20"


def test_progress_on_a_pipe_is_one_line_every_interval() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = runwait.Progress(out, live=False, clock=lambda: now[0])
    for t in range(0, 12):       # a poll every second for 12 s
        now[0] = float(t)
        progress.show(record(elapsed_s=float(t)))
    progress.show(record(state="done", phase="done"))
    progress.end()
    lines = out.getvalue().splitlines()
    assert runwait.PROGRESS_PIPE_INTERVAL_S == 5.0
    assert len(lines) == 3 and all("round 3 of 20" in line and "\r" not in line for line in lines), lines


def test_progress_on_a_terminal_is_one_live_line() -> None:
    out = io.StringIO()
    progress = runwait.Progress(out, live=True)
    progress.show(record())
    progress.show(record(state="done", phase="done"))
    progress.end()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1


def test_ctrl_c_not_on_a_terminal_says_in_one_line_that_the_job_goes_on(tmp_path: Path) -> None:
    err = io.StringIO()
    config = SimpleNamespace(path=tmp_path / "peers.toml")
    assert runwait.interrupted(config, "j-1", io.StringIO(), err, ask=False) == 130
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "continues at every site" in lines[0]
    assert f"`fedpeer job cancel j-1 --config {tmp_path / 'peers.toml'}`" in lines[0]


@pytest.mark.parametrize("answer, cancels", [("y\n", True), ("\n", False), ("no\n", False)])
def test_ctrl_c_on_a_terminal_asks_whether_to_cancel_at_every_site(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str, cancels: bool) -> None:
    asked = []

    async def request(config, method, path, payload=None, **kw):
        asked.append((method, path))
        return {"state": "cancelled"}
    monkeypatch.setattr("fedpeer.daemon.adminclient.request", request)
    err = io.StringIO()
    config = SimpleNamespace(path=tmp_path / "peers.toml")
    assert runwait.interrupted(config, "j-1", io.StringIO(answer), err, ask=True) == 130
    assert "cancel job j-1 at every site? [y/N]" in err.getvalue()
    assert asked == ([("POST", "/v1/jobs/j-1/cancel")] if cancels else [])
    assert ("cancelled at every site" if cancels else "continues at every site") in err.getvalue()


def test_bofrf_predicts_a_probability_the_vote_sum_gives_the_same_prediction() -> None:
    from fedpeer.ml.forest import bofrf as mb

    rng = np.random.default_rng(3)
    proba = rng.random((9, 200))
    proba[rng.random(proba.shape) < 0.2] = np.nan        # trees that abstain
    proba[:, 0] = np.nan                                  # a row no tree votes on
    for alpha in (rng.random(9), rng.normal(size=9)):
        votes, share = mb.ensemble_score(proba, alpha), mb.vote_share(proba, alpha)
        weight = (np.abs(alpha)[:, None] * ~np.isnan(proba)).sum(axis=0)
        assert ((0 <= share) & (share <= 1)).all() and share[0] == 0.5
        assert np.allclose(votes, weight * (2 * share - 1), rtol=0, atol=1e-12)


def test_the_harness_table_of_every_kind_takes_a_failed_site() -> None:
    """No KeyError on a site without a result; every kind has a table of its own."""
    from fedpeer.jobs.report import plain_sites

    for name, kind in job_kinds().items():
        assert kind.site_table is not plain_sites, f"{name} has no harness table of its own"
        assert "site-9" in kind.site_table([{"name": "site-9", "rows": None, "state": "failed", "result": None}])


def test_wait_follows_the_job_and_returns_its_last_record(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([record(), record(state="done", phase="done")])

    async def request(config, method, path, payload=None, **kw):
        return next(answers)
    monkeypatch.setattr("fedpeer.daemon.adminclient.request", request)
    out = io.StringIO()
    last = asyncio.run(runwait.follow(None, "j-1", runwait.Progress(out, live=False), poll_s=0))
    assert last["state"] == "done" and out.getvalue().count("\n") == 1


def test_the_bofrf_table_says_what_each_column_means() -> None:
    """make demo's table: every column a new user reads is named in the legend under it."""
    from fedpeer.kinds.catalog import job_kinds

    result = {"local_rf": {"auc": 0.9}, "final": {"auc": 0.95, "model": "global"}, "boppid": {"auc": 0.8},
              "tau": 0.2, "trees_kept": 250, "trees_total": 300, "rows": {"test": 48}}
    text = job_kinds()["bofrf"].site_table([{"name": "site-1", "rows": 190, "state": "done", "result": result}])
    head, row, *legend = text.splitlines()
    assert row.split()[:4] == ["site-1", "190", "48", "0.900"] and "+5.6 %" in row
    said = " ".join(legend)
    for column in ("TEST ROWS", "LOCAL RF", "BOFRF", "MODEL", "CHANGE", "BOPPID", "TAU", "TREES KEPT"):
        assert column in head and f"{column}:" in said or f"({column})" in said, column
    assert all(len(line) <= 100 for line in legend)


def test_a_history_entry_with_no_number_where_a_score_goes_prints_a_dash() -> None:
    """Bagging members adopt the leader's history entries checked for their round only: job show
    prints "-" for a score that is no number instead of failing."""
    from fedpeer.jobs.report import score

    assert score(0.91234) == "0.9123" and score(None) == "-" and score("0.9") == "-" and score(True) == "-"
