"""A job's history out of the daemon: the gauges of the latest point (fedpeer/daemon/metrics.py
`fedpeer_job_metric`, `fedpeer_job_round`: bounded, label values escaped) and the MLflow run of
an ended job (fedpeer/daemon/tracking.py: what it holds, written to a local store, and the refusal
when the extra is missing). The daemons' side: tests/integration/test_metrics.py and
tests/integration/test_tracking.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fedpeer.daemon import metrics, tracking
from fedpeer.errors import ConfigError

NOW_MS = 1_700_000_000_000


def need_mlflow() -> None:
    """MLflow is in the test extra: missing under CI it is a failure, elsewhere a skip."""
    if importlib.util.find_spec("mlflow") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mlflow is not installed: pip install -e '.[test]' (it is in the test extra)")
        pytest.skip("mlflow is not installed (pip install 'fedpeer[mlflow]')")


def job(job_id: str, state: str = "running", history: list | None = None, finished_ms: int | None = None,
        kind: str = "kmeans", created_ms: int = NOW_MS) -> dict:
    return {"id": job_id, "kind": kind, "state": state, "created_ms": created_ms, "finished_ms": finished_ms,
            "history": history if history is not None else [{"round": 3, "objective": 2.5}]}


class FakeNode:
    def __init__(self, jobs: list[dict]) -> None:
        self._jobs = jobs
        self.jobs = self

    def list(self) -> list[dict]:
        return self._jobs

    def status(self) -> dict:
        return {}

    def now_ms(self) -> int:
        return NOW_MS


def scrape(jobs: list[dict]) -> tuple[str, dict]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.NodeCollector(FakeNode(jobs)))
    text = generate_latest(registry).decode()
    return text, {(s.name, frozenset(s.labels.items())): s.value
                  for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name in ("fedpeer_job_metric", "fedpeer_job_round")}


def test_the_latest_point_of_running_and_recently_ended_jobs_only() -> None:
    linger_ms = metrics.JOB_METRICS_LINGER_S * 1000
    _, got = scrape([
        job("run", history=[{"round": 1, "objective": 9.0}, {"round": 2, "objective": 4.0, "auc": None,
                                                              "converged": True, "Bad-Name": 1.0}]),
        job("iter", kind="logreg", history=[{"iteration": 7, "loss": 0.25, "step": 1.0}]),
        job("ended", "done", finished_ms=NOW_MS - linger_ms + 1),
        job("old", "done", finished_ms=NOW_MS - linger_ms - 1),        # ended too long ago
        job("none", history=[]),                                         # nothing reported yet
    ])
    assert got == {
        ("fedpeer_job_round", frozenset({("job", "run"), ("kind", "kmeans")})): 2.0,
        ("fedpeer_job_metric", frozenset({("job", "run"), ("kind", "kmeans"), ("metric", "objective")})): 4.0,
        ("fedpeer_job_round", frozenset({("job", "iter"), ("kind", "logreg")})): 7.0,
        ("fedpeer_job_metric", frozenset({("job", "iter"), ("kind", "logreg"), ("metric", "loss")})): 0.25,
        ("fedpeer_job_metric", frozenset({("job", "iter"), ("kind", "logreg"), ("metric", "step")})): 1.0,
        ("fedpeer_job_round", frozenset({("job", "ended"), ("kind", "kmeans")})): 3.0,
        ("fedpeer_job_metric", frozenset({("job", "ended"), ("kind", "kmeans"), ("metric", "objective")})): 2.5,
    }


def test_bounded_and_label_values_escaped() -> None:
    wide = {"round": 1, **{f"m{i}": float(i) for i in range(3 * metrics.JOB_METRICS_PER_JOB_MAX)}}
    many = [job(f"j{i}", history=[wide], created_ms=NOW_MS - i) for i in range(3 * metrics.JOB_METRICS_JOBS_MAX)]
    hostile = 'a"b\\c\nd'
    text, got = scrape([job(hostile, created_ms=NOW_MS + 1), *many])
    rounds = [k for k in got if k[0] == "fedpeer_job_round"]
    assert len(rounds) == metrics.JOB_METRICS_JOBS_MAX             # the newest running jobs
    assert ("fedpeer_job_round", frozenset({("job", hostile), ("kind", "kmeans")})) in got   # parsed back intact
    assert 'job="a\\"b\\\\c\\nd"' in text                           # the text format's escapes
    per_job = [k for k in got if k[0] == "fedpeer_job_metric" and ("job", "j0") in k[1]]
    assert len(per_job) == metrics.JOB_METRICS_PER_JOB_MAX
    assert not [k for k in got if ("job", f"j{3 * metrics.JOB_METRICS_JOBS_MAX - 1}") in k[1]]   # the oldest: out


def test_run_document_holds_params_history_result_and_tags() -> None:
    doc = {"id": "0123456789abcdef", "kind": "logreg", "state": "failed", "error": "site-2: declared dead",
           "params": {"C": 0.5, "classes": "", "bad key!": 1}, "started_ms": NOW_MS - 5000, "finished_ms": NOW_MS,
           "history": [{"iteration": 1, "loss": 0.69, "step": 1.0}, {"iteration": 2, "loss": 0.3, "step": 0.5,
                                                                    "auc": None}],
           "result": {"rows": 455, "test_rows": 114, "auc": 0.98, "coef": [[1.0]], "lost": [], "converged": True,
                      "federated_eval": {"auc": 0.98, "rows": 114, "on": "the sites' held-out parts"},
                      "history": [{"loss": 1.0}]}}
    run = tracking.run_document(doc, "site-1")
    assert run["params"] == {"C": "0.5", "classes": ""}
    assert run["history"] == [("loss", 0.69, 1, NOW_MS), ("step", 1.0, 1, NOW_MS), ("loss", 0.3, 2, NOW_MS),
                              ("step", 0.5, 2, NOW_MS)]
    assert run["final"] == {"rows": 455.0, "test_rows": 114.0, "auc": 0.98, "federated_eval.auc": 0.98,
                            "federated_eval.rows": 114.0}
    assert run["tags"]["fedpeer.kind"] == "logreg" and run["tags"]["fedpeer.job"] == doc["id"]
    assert run["tags"]["fedpeer.site"] == "site-1" and run["tags"]["fedpeer.error"] == doc["error"]
    assert run["status"] == "FAILED" and (run["start_ms"], run["end_ms"]) == (NOW_MS - 5000, NOW_MS)


def test_a_set_uri_without_the_extra_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "available", lambda: False)
    tracking.check("", "peers.toml")                      # off: nothing needed
    with pytest.raises(ConfigError) as err:
        tracking.check("sqlite:///x.db", "peers.toml")
    assert "tracking.mlflow_uri" in str(err.value) and "fedpeer[mlflow]" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_a_run_in_a_local_store(tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3 keeps the file store in maintenance mode: it needs MLFLOW_ALLOW_FILE_STORE=true."""
    need_mlflow()
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri() if store == "file" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    doc = {"id": "job1", "kind": "kmeans", "state": "done", "params": {"k": 3}, "started_ms": NOW_MS - 1000,
           "finished_ms": NOW_MS, "history": [{"round": r, "objective": 10.0 / r} for r in range(1, 4)],
           "result": {"rows": 90, "objective": 3.3}}
    run_id = tracking.log_run(uri, tracking.run_document(doc, "site-1"))
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"k": "3"}
    assert run.data.tags["fedpeer.job"] == "job1" and run.data.metrics == {"objective": 3.3, "rows": 90.0}
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "objective")]
    assert sorted(history) == [(1, 10.0), (2, 5.0), (3, 3.3), (3, 10.0 / 3)]
    assert client.get_experiment(run.info.experiment_id).name == tracking.EXPERIMENT
