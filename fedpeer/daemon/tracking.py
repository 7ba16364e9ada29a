"""[tracking] mlflow_uri: every job this site takes part in, recorded as an MLflow run.

Rules:
- Optional: MLflow is the extra `mlflow` (pip install 'fedpeer[mlflow]'), imported only when the
  URI is set; a daemon whose URI is set without it refuses to start (ConfigError: exit 2, one
  line naming the extra).
- One run per job and site, written when the job ends here (done, failed or cancelled): the
  job's params as the run's params; its history (the points the kind reported while it ran, one
  per round or iteration) as metrics whose step is the round; the result's numbers (top level,
  and one level into its tables: `federated_eval.auc`) as the final metrics; tags: kind, job id,
  site, state (and the error of a job that did not finish). Every site of a federation that
  tracks logs its own run of the job: `fedpeer.job` groups them.
- Off the event loop: MLflow's calls block (files, HTTP), so they run in one worker thread, one
  run after another. A failure (a store that is down, full, refuses) is a warning in the log and
  never touches the job, whose record is already final.
- What is sent is what `job show --json` shows this site's operator: no rows, no model.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import re
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedpeer.base.logs import fields
from fedpeer.errors import ConfigError

log = logging.getLogger("fedpeer.tracking")
EXTRA = "mlflow"
EXPERIMENT = "fedpeer"               # the MLflow experiment every site's runs go to
STEP_KEYS = ("round", "iteration")   # a history point's step, the first of these it has
METRIC_NAME = re.compile(r"[A-Za-z0-9_.\- /]{1,250}")   # what MLflow accepts as a metric or param key
PARAM_VALUE_CHARS_MAX = 6000         # MLflow's bound on a param's value
BATCH_MAX = 1000                     # metrics per log_batch call (MLflow's bounds)
PARAMS_BATCH_MAX = 100               # params per log_batch call
STORE_ATTEMPTS = 3                   # opening the store and its experiment (nothing written yet)
QUEUED_MAX = 256                     # runs waiting for the worker; more are dropped with a warning
STATUS = {"done": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def available() -> bool:
    try:
        return importlib.util.find_spec(EXTRA) is not None
    except (ImportError, ValueError):
        return False


def check(uri: str, config_path: Any) -> None:
    """ConfigError (exit 2 at `start`) when `uri` is set and the extra is not installed."""
    if uri and not available():
        raise ConfigError(config_path, "tracking.mlflow_uri", f"is set but MLflow is not installed: "
                          f"pip install 'fedpeer[{EXTRA}]' (or set it to \"\" to turn tracking off)")


def step_of(point: Mapping[str, Any], index: int) -> int:
    for key in STEP_KEYS:
        value = point.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return index


def numbers(point: Mapping[str, Any], prefix: str = "", depth: int = 1) -> Iterator[tuple[str, float]]:
    """The finite numbers of `point` (bools and the step keys left out), under their keys; with
    `depth`, those of the tables in it as `table.key`."""
    for key, value in point.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and depth > 0:
            yield from numbers(value, f"{name}.", depth - 1)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and not (not prefix and key in STEP_KEYS) and METRIC_NAME.fullmatch(name):
            yield name, float(value)


def run_document(doc: Mapping[str, Any], site: str) -> dict[str, Any]:
    """What the run of one ended job holds (pure): params, history metrics (key, value, step,
    ms), final metrics, tags, status, start and end (ms)."""
    params = {str(k): (str(v) if not isinstance(v, str) else v)[:PARAM_VALUE_CHARS_MAX]
              for k, v in (doc.get("params") or {}).items() if METRIC_NAME.fullmatch(str(k))}
    end = doc.get("finished_ms") or doc.get("started_ms") or 0
    history = [(key, value, step_of(point, i), end)
               for i, point in enumerate(doc.get("history") or []) if isinstance(point, Mapping)
               for key, value in numbers(point, depth=0)]
    result = doc.get("result") or {}
    final = dict(numbers({k: v for k, v in result.items() if k != "history"})) if isinstance(result, Mapping) else {}
    tags = {"fedpeer.kind": str(doc.get("kind", "")), "fedpeer.job": str(doc.get("id", "")),
            "fedpeer.site": site, "fedpeer.state": str(doc.get("state", "")),
            "mlflow.runName": f"{doc.get('kind', 'job')} {str(doc.get('id', ''))[:12]} {site}"}
    if doc.get("error"):
        tags["fedpeer.error"] = str(doc["error"])[:PARAM_VALUE_CHARS_MAX]
    return {"params": params, "history": history, "final": final, "tags": tags,
            "status": STATUS.get(str(doc.get("state")), "FINISHED"), "start_ms": doc.get("started_ms") or end,
            "end_ms": end}


def log_run(uri: str, run: Mapping[str, Any]) -> str:
    """Write one run to the tracking store at `uri` (blocking: the worker thread); its run id."""
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    def experiment() -> tuple[Any, str]:
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(EXPERIMENT)
        if found is not None:
            return client, found.experiment_id
        try:
            return client, client.create_experiment(EXPERIMENT)
        except MlflowException:     # another site sharing the store created it first
            found = client.get_experiment_by_name(EXPERIMENT)
            if found is None:
                raise
            return client, found.experiment_id

    for attempt in range(STORE_ATTEMPTS):    # sites sharing a new store set it up at once: a race to retry
        try:
            client, experiment_id = experiment()
            break
        except Exception:
            if attempt == STORE_ATTEMPTS - 1:
                raise
            time.sleep(attempt + 1)
    created = client.create_run(experiment_id, start_time=int(run["start_ms"]), tags=dict(run["tags"]))
    run_id = created.info.run_id
    try:
        end = int(run["end_ms"])
        metrics = [Metric(k, v, int(ms), int(step)) for k, v, step, ms in run["history"]]
        last = max((step for _, _, step, _ in run["history"]), default=0)   # a name in both: the result's is latest
        metrics += [Metric(k, v, end + 1, last) for k, v in run["final"].items()]
        params = [Param(k, v) for k, v in run["params"].items()]
        for i in range(0, len(params), PARAMS_BATCH_MAX):
            client.log_batch(run_id, params=params[i:i + PARAMS_BATCH_MAX])
        for i in range(0, len(metrics), BATCH_MAX):
            client.log_batch(run_id, metrics=metrics[i:i + BATCH_MAX])
        client.set_terminated(run_id, status=run["status"], end_time=end)
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    return run_id


class MlflowTracker:
    """The node's tracker: `job_ended` (on the event loop) queues the run, a worker thread writes it."""

    def __init__(self, uri: str, site: str, config_path: Path | str = "") -> None:
        check(uri, config_path)
        self.uri, self.site = uri, site
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedpeer-mlflow")
        self._pending: set[Future] = set()

    def job_ended(self, doc: Mapping[str, Any]) -> None:
        """A job that ran here ended: `doc` is its record as `job show --json` prints it. Never raises."""
        if len(self._pending) >= QUEUED_MAX:
            log.warning("tracking_dropped", extra=fields(job=doc.get("id"), why=f"{QUEUED_MAX} runs already "
                                                         "wait for the tracking store"))
            return
        try:
            run = run_document(doc, self.site)
            future = self._pool.submit(log_run, self.uri, run)
        except Exception as exc:   # noqa: BLE001  (a bug here, or the pool shut down: the job is final anyway)
            self._failed(doc.get("id"), exc)
            return
        self._pending.add(future)
        future.add_done_callback(functools.partial(self._done, doc.get("id")))

    def _done(self, job: Any, future: Future) -> None:
        self._pending.discard(future)
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self._failed(job, exc)
        else:
            log.info("job_tracked", extra=fields(job=job, run=future.result(), uri=self.uri))

    def _failed(self, job: Any, exc: BaseException) -> None:
        log.warning("tracking_failed", extra=fields(job=job, uri=self.uri, error=f"{type(exc).__name__}: {exc}"[:500]))

    def close(self) -> None:
        """The daemon stops: runs already queued are still written (the interpreter waits for the worker)."""
        self._pool.shutdown(wait=False)
