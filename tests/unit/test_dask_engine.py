"""[data] engine = "dask" (fedpeer/data/dask.py, dask_hist.py) on a real LocalCluster of 2 worker
processes (one per module): a site's rows read on the cluster are the memory engine's rows, and
the stats and histogram-XGBoost jobs give the memory engine's results — the same model byte for
byte — while only totals reach the daemon; an unreachable scheduler, a bad part file, a lost worker
and a job kind the engine lacks each end in a clear error naming what to fix."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import socket
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fedpeer.config.load import DataSection, JobLimits
from fedpeer.data.dask import open_site
from fedpeer.app.datacheck import format_report, report
from fedpeer.data.site import load_site
from fedpeer.errors import DataError, JobError
from fedpeer.jobs.kind import JobContext
from fedpeer.jobs.kind import dask_refusal as refusal_of
from fedpeer.kinds.catalog import job_kinds
from fedpeer.kinds import stats
from fedpeer.kinds.xgboost import kind as xj
from fedpeer.testing.memory import MemoryNetwork
from fedpeer.testing.members import member_keys

LIMITS = JobLimits()
PARTS = ((0, 90), (90, 100), (100, 190))        # a small middle part: partitions of unequal size


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as c:
        yield c


@pytest.fixture(scope="module")
def cancer() -> tuple[np.ndarray, np.ndarray, list[str]]:
    from sklearn.datasets import load_breast_cancer

    raw = load_breast_cancer()
    return raw.data, np.where(raw.target == 0, "malignant", "benign"), [f"f{j}" for j in range(raw.data.shape[1])]


def _table(X: np.ndarray, labels: np.ndarray, names: list[str]) -> pa.Table:
    return pa.table({**{n: X[:, j] for j, n in enumerate(names)}, "id": np.arange(len(X)), "diagnosis": labels})


def _write_csv(path: Path, X: np.ndarray, labels: np.ndarray, names: list[str]) -> None:
    """A plain CSV of the rows (repr of each float: exact round trip), id and label last."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*names, "id", "diagnosis"])
        for i, (row, label) in enumerate(zip(X, labels)):
            out.writerow([*(repr(float(v)) for v in row), i, label])


def write_site(root: Path, X: np.ndarray, labels: np.ndarray, names: list[str]) -> dict[str, Path]:
    """The same rows as one Parquet file, a directory of 3 parts, one CSV and a glob of 3 CSVs."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "parts").mkdir(exist_ok=True)
    (root / "csv").mkdir(exist_ok=True)
    pq.write_table(_table(X, labels, names), root / "whole.parquet")
    _write_csv(root / "whole.csv", X, labels, names)
    for i, (a, b) in enumerate(PARTS):
        part = _table(X[a:b], labels[a:b], names)
        pq.write_table(part, root / "parts" / f"part-{i}.parquet")
        _write_csv(root / "csv" / f"part-{i}.csv", X[a:b], labels[a:b], names)
    return {"whole_parquet": root / "whole.parquet", "parts": root / "parts", "whole_csv": root / "whole.csv",
            "glob": root / "csv" / "part-*.csv"}


def section(cluster, **kw) -> DataSection:
    base = {"label": "diagnosis", "positive": "malignant", "ignore": ("id",)}
    if cluster is not None:
        base.update(engine="dask", scheduler=cluster.scheduler_address)
    return DataSection(**{**base, **kw})


@pytest.fixture(scope="module")
def site_files(tmp_path_factory, cancer):
    X, labels, names = cancer
    return write_site(tmp_path_factory.mktemp("dask-site"), X[:190], labels[:190], names)


def test_rows_read_on_the_cluster_are_the_memory_engines(cluster, site_files) -> None:
    memory, _ = load_site(section(None, parquet=str(site_files["whole_parquet"])), LIMITS, needs_label=True,
                          binary=True)
    for dask_source in ({"parquet": str(site_files["parts"])}, {"csv": str(site_files["glob"])}):
        site, _ = load_site(section(cluster, **dask_source), LIMITS, needs_label=True, binary=True)
        try:
            assert site.features == memory.features and site.fingerprint == memory.fingerprint
            assert site.rows == memory.rows == 190 and site.part_rows == [90, 10, 90]
            values, counts = np.unique(memory.labels, return_counts=True)
            assert site.label_counts == dict(zip(values.tolist(), counts.tolist()))
            assert site.parts and not hasattr(site, "X")           # the rows are on the workers
        finally:
            site.close()
    doc = report(section(cluster, parquet=str(site_files["parts"])), LIMITS)
    assert doc["rows"] == 190 and doc["partitions"] == 3 and doc["schema_fingerprint"] == memory.fingerprint.hex()
    in_memory = report(section(None, parquet=str(site_files["whole_parquet"])), LIMITS)
    assert doc["label_counts"] == in_memory["label_counts"] and doc["missing"] == in_memory["missing"]
    assert f"engine dask: 3 partitions on {cluster.scheduler_address}" in format_report(doc)


def test_missing_values_dropped_per_part_as_in_memory(cluster, tmp_path, cancer) -> None:
    X, labels, names = cancer
    X = X[:190].copy()
    X[[3, 95, 150], [0, 2, 2]] = np.nan
    files = write_site(tmp_path, X, labels[:190], names)
    memory, _ = load_site(section(None, parquet=str(files["whole_parquet"]), missing="drop"), LIMITS,
                          needs_label=True, binary=True)
    site, _ = load_site(section(cluster, parquet=str(files["parts"]), missing="drop"), LIMITS, needs_label=True,
                        binary=True)
    try:
        assert site.rows == memory.rows == 187 and site.rows_dropped == memory.rows_dropped == 3
        assert site.missing_counts == memory.missing_counts
    finally:
        site.close()
    with pytest.raises(DataError, match=r"part-0\.parquet: column 'f0' has 1 missing value \(first at row 4\)"):
        load_site(section(cluster, parquet=str(files["parts"])), LIMITS, needs_label=True, binary=True)


def test_a_bad_part_file_is_named(cluster, tmp_path, cancer) -> None:
    X, labels, names = cancer
    files = write_site(tmp_path, X[:190], labels[:190], names)
    bad = files["glob"].parent / "part-1.csv"
    bad.write_text(bad.read_text().replace(bad.read_text().splitlines()[3].split(",")[0], "n/a?", 1))
    with pytest.raises(DataError, match=r"part-1\.csv: column 'f0' is not numeric"):
        load_site(section(cluster, csv=str(files["glob"])), LIMITS, needs_label=True, binary=True)
    with pytest.raises(DataError, match=r"no file matches"):
        load_site(section(cluster, csv=str(tmp_path / "nothing-*.csv")), LIMITS, needs_label=True, binary=True)


def test_an_unreachable_scheduler_fails_fast_naming_it() -> None:
    with socket.socket() as s:           # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = DataSection(parquet="/nonexistent", label="diagnosis", positive="malignant", engine="dask",
                       scheduler=f"tcp://127.0.0.1:{port}", dask_connect_timeout_ms=1500)
    with pytest.raises(JobError, match=rf"scheduler tcp://127\.0\.0\.1:{port}: cannot reach the Dask scheduler "
                                       r"within dask_connect_timeout_ms 1500 ms"):
        open_site(dataclasses.replace(data, parquet=str(Path(__file__))), LIMITS, needs_label=True, binary=True)


def dask_refusal(kind: str, params: dict) -> str | None:
    kinds = job_kinds()
    return refusal_of(kinds[kind], params, kinds)


def test_job_kinds_the_engine_lacks_are_refused_by_name() -> None:
    assert dask_refusal("stats", {}) is None and dask_refusal("xgboost", {"mode": "histogram"}) is None
    assert dask_refusal("bofrf", {"variant": "base", "baseline": "none"}) is None
    assert dask_refusal("bofrf", {"variant": "personalized", "baseline": "none"}) is None
    for kind, params in (("bofrf", {"variant": "clustered", "baseline": "none"}),
                         ("bofrf", {"variant": "base", "baseline": "boppid"}), ("xgboost", {"mode": "bagging"}),
                         ("logreg", {}), ("kmeans", {})):
        reason = dask_refusal(kind, params)
        assert reason is not None and ('engine = "dask" supports stats, bofrf (variant "base" or "personalized", '
                                     'baseline "none") and xgboost with mode = "histogram" jobs, not') in reason, reason
    assert "not bofrf with variant = 'clustered'" in dask_refusal("bofrf", {"variant": "clustered", "baseline": "none"})


def test_empty_parts_and_parts_dropped_whole_are_empty_partitions(cluster, tmp_path, cancer, off_loop) -> None:
    """Spark and Dask write empty part files; with missing = "drop" a part may lose every row. The
    memory engine reads such a directory; so must the Dask engine (and its jobs run on the empty
    partitions), while a site left with no row at all is still refused."""
    X, labels, names = cancer
    files = write_site(tmp_path, X[:190], labels[:190], names)
    parts, csvs = files["parts"], files["glob"].parent
    pq.write_table(_table(X[:0], labels[:0], names), parts / "part-3.parquet")
    nan = X[190:195].copy()
    nan[:, 1] = np.nan
    pq.write_table(_table(nan, labels[190:195], names), parts / "part-4.parquet")
    _write_csv(csvs / "part-3.csv", X[:0], labels[:0], names)              # a header, no rows
    memory, _ = load_site(section(None, parquet=str(parts), missing="drop"), LIMITS, needs_label=True, binary=True)
    assert memory.rows == 190 and memory.rows_dropped == 5
    for source in ({"parquet": str(parts)}, {"csv": str(files["glob"])}):
        site, _ = load_site(section(cluster, missing="drop", **source), LIMITS, needs_label=True, binary=True)
        try:
            assert site.rows == 190 and site.fingerprint == memory.fingerprint
            assert site.part_rows == ([90, 10, 90, 0, 0] if "parquet" in source else [90, 10, 90, 0])
        finally:
            site.close()

    params = {"mode": "histogram", "rounds": 2, "max_depth": 2, "max_bin": 16, "test_fraction": 0.2,
              "subsample": 0.8, "nthread": 1, "secure_sum": "ring"}
    from fedpeer.data.dataset import Dataset, schema_fingerprint

    def sites(dask: bool) -> list:
        first = load_site(section(cluster if dask else None, parquet=str(parts), missing="drop"), LIMITS,
                          needs_label=True, binary=True)[0]
        lab = labels[190:380]
        return [first, Dataset(tuple(names), np.ascontiguousarray(X[190:380]), (lab == "malignant").astype(np.int8),
                               lab, 0, schema_fingerprint(names, ["float"] * len(names)))]
    for kind, p in ((stats.KIND, {"bins": 8}), (xj.KIND, params)):
        want, got = _run(kind, sites(False), p), _run(kind, sites(True), p)
        for a, b in zip(want, got):
            assert isinstance(b, dict), b
            if kind is stats.KIND:
                assert a["count"] == b["count"] == 380 and a["class_counts"] == b["class_counts"]
            else:
                assert a["_model"] == b["_model"] and a["rows"] == b["rows"]
    assert off_loop == []

    for f in list(parts.iterdir()):
        f.unlink()
    pq.write_table(_table(X[:0], labels[:0], names), parts / "part-0.parquet")
    pq.write_table(_table(nan, labels[190:195], names), parts / "part-1.parquet")
    with pytest.raises(DataError, match=r"parts: all 5 data rows of its 2 parts have a missing or infinite value"):
        load_site(section(cluster, parquet=str(parts), missing="drop"), LIMITS, needs_label=True, binary=True)
    (parts / "part-1.parquet").unlink()
    with pytest.raises(DataError, match=r"parts: its 1 part holds no data rows"):
        load_site(section(cluster, parquet=str(parts), missing="drop"), LIMITS, needs_label=True, binary=True)


# -- jobs: a dask site among memory sites gives the all-memory result -------------------------------

def _sites(cluster, site_files, cancer, dask: bool, needs_binary: bool = True) -> list:
    X, labels, names = cancer
    first = (load_site(section(cluster, parquet=str(site_files["parts"])), LIMITS, needs_label=True,
                       binary=needs_binary)[0] if dask else
             load_site(section(None, parquet=str(site_files["whole_parquet"])), LIMITS, needs_label=True,
                       binary=needs_binary)[0])
    from fedpeer.data.dataset import Dataset, schema_fingerprint

    def memory(a: int, b: int) -> Dataset:
        lab = labels[a:b]
        return Dataset(tuple(names), np.ascontiguousarray(X[a:b]), (lab == "malignant").astype(np.int8), lab, 0,
                       schema_fingerprint(names, ["float"] * len(names)))
    return [first, memory(190, 380), memory(380, len(X))]


@pytest.fixture
def off_loop(monkeypatch) -> list[str]:
    """Every call to the cluster (DaskSite._guarded) is checked to run off the event loop: the
    names of the calls made on a thread running a loop (which would stall the daemon)."""
    from fedpeer.data.dask import DaskSite

    on_loop: list[str] = []
    guarded = DaskSite._guarded

    def checked(self, call):
        try:
            asyncio.get_running_loop()
            on_loop.append(getattr(call, "__qualname__", repr(call)))
        except RuntimeError:
            pass
        return guarded(self, call)
    monkeypatch.setattr(DaskSite, "_guarded", checked)
    return on_loop


def _run(kind, sites: list, params: dict) -> list:
    keys, names = member_keys("dask", len(sites))
    checked = kind.check_params(params)

    async def go() -> list:
        net = MemoryNetwork(keys, seed=0)
        return await asyncio.gather(*[kind.run(net.channel(k), checked, JobContext(names[k], names, 20_000,
                                                                                   data=sites[i]))
                                      for i, k in enumerate(keys)], return_exceptions=True)
    try:
        return asyncio.run(go())
    finally:
        for s in sites:
            if getattr(s, "engine", "") == "dask":
                s.close()


def test_stats_on_a_dask_site_equal_the_memory_engines(cluster, site_files, cancer, off_loop) -> None:
    params = {"bins": 8}
    want = _run(stats.KIND, _sites(cluster, site_files, cancer, dask=False), params)
    got = _run(stats.KIND, _sites(cluster, site_files, cancer, dask=True), params)
    assert off_loop == []
    for a, b in zip(want, got):
        assert isinstance(b, dict), b
        assert a["count"] == b["count"] == 569 and a["class_counts"] == b["class_counts"]
        for key in ("mean", "std"):
            assert a[key].keys() == b[key].keys()
            assert np.allclose(list(a[key].values()), list(b[key].values()), rtol=1e-12, atol=0)
        counts = [(h["below"], h["counts"], h["above"]) for h in a["histograms"].values()]
        assert counts == [(h["below"], h["counts"], h["above"]) for h in b["histograms"].values()]


def test_histogram_xgboost_on_a_dask_site_gives_the_memory_engines_model(cluster, site_files, cancer,
                                                                       off_loop) -> None:
    params = {"mode": "histogram", "rounds": 2, "max_depth": 2, "max_bin": 16, "test_fraction": 0.2,
              "subsample": 0.8, "nthread": 1, "secure_sum": "ring"}
    want = _run(xj.KIND, _sites(cluster, site_files, cancer, dask=False), params)
    got = _run(xj.KIND, _sites(cluster, site_files, cancer, dask=True), params)
    assert off_loop == []                  # the daemon's loop never waited on the cluster
    for a, b in zip(want, got):
        assert isinstance(b, dict), b
        assert a["_model"] == b["_model"] and a["model_sha256"] == b["model_sha256"]
        assert a["rows"] == b["rows"] and a["secure_sums"] == b["secure_sums"]
        fa, fb = a["federated_eval"], b["federated_eval"]
        assert fa["test_rows"] == fb["test_rows"] and fa["accuracy"] == fb["accuracy"]
        assert fa["auc"] == pytest.approx(fb["auc"], abs=1e-6) and fa["logloss"] == pytest.approx(fb["logloss"],
                                                                                                abs=1e-6)
        ta, tb = a["history"][-1], b["history"][-1]         # the training loss, from each partition's margins
        assert ta["train_rows"] == tb["train_rows"] == sum(r["rows"]["train"] for r in want)
        assert ta["train_logloss"] == pytest.approx(tb["train_logloss"], abs=1e-9)


@pytest.mark.parametrize("variant", ["base", "personalized"])
def test_bofrf_on_a_dask_site_gives_the_memory_engines_forest_weights_and_metrics(cluster, site_files, cancer,
                                                                                 off_loop, variant) -> None:
    """The Dask site (3 partitions of unequal size) trains its forest on a worker, scores every
    tree per partition and reports its test metrics from a worker: every site's kept forest,
    weights and metrics are the memory engine's, bit for bit."""
    from fedpeer.kinds.forest import bofrf
    from fedpeer.ml.forest import trees

    params = {"n_estimators": 6, "max_depth": 6, "variant": variant, "seed": 3, "secure_sum": "pairwise"}
    want = _run(bofrf.KIND, _sites(cluster, site_files, cancer, dask=False), params)
    got = _run(bofrf.KIND, _sites(cluster, site_files, cancer, dask=True), params)
    assert off_loop == []
    for a, b in zip(want, got):
        assert isinstance(b, dict), b
        (fa, wa), (fb, wb) = a.pop("_model"), b.pop("_model")
        assert np.array_equal(wa, wb) and trees.to_wire(fa) == trees.to_wire(fb)
        assert a == b, {k: (a[k], b[k]) for k in a if a[k] != b.get(k)}   # metrics, tau, rows, trees kept
    assert got[0]["rows"] == {"train": 142, "test": 48} if variant == "base" else got[0]["rows"]["test"] == 48
    assert got[0]["trees_total"] == 18


def test_bofrf_training_rows_are_bounded_on_a_dask_site(cluster, site_files, monkeypatch) -> None:
    from fedpeer.kinds.forest import bofrf
    from fedpeer.kinds.forest import dask as dask_bofrf

    monkeypatch.setattr(dask_bofrf, "GATHERED_ROWS_MAX", 100)
    site, _ = load_site(section(cluster, parquet=str(site_files["parts"])), LIMITS, needs_label=True, binary=True)
    try:
        with pytest.raises(DataError, match=r"142 training rows exceed GATHERED_ROWS_MAX=100"):
            bofrf.prepare_site(site, bofrf.KIND.check_params({"n_estimators": 2}), b"k" * 32)
    finally:
        site.close()


def test_a_worker_lost_mid_job_is_recomputed_to_the_same_model(cluster, site_files, cancer) -> None:
    """Last but one in the module (the nanny restarts the killed worker): the partitions and the
    boosting state the worker held are computed again from their lineage (each step is
    deterministic), so the model is still the memory engine's."""
    from functools import partial

    from fedpeer.kinds.xgboost.target import site_labels
    from fedpeer.ml.xgb.histboost import HistParams
    from fedpeer.ml.xgb.histrun import HistSite, train_members

    p = HistParams(num_round=2, max_depth=2, max_bin=8)
    labeller = partial(site_labels, params={"objective": "binary:logistic"})
    site, _ = load_site(section(cluster, parquet=str(site_files["parts"])), LIMITS, needs_label=True, binary=True)
    memory, _ = load_site(section(None, parquet=str(site_files["whole_parquet"])), LIMITS, needs_label=True,
                          binary=True)
    try:
        from fedpeer.kinds.xgboost.dask import DaskHistSite

        member = DaskHistSite(site, p, 2, 0, labeller, None)
        start_tree = member.start_tree

        def killing_start_tree(k: int, tree: int = 0) -> None:
            if tree == 1:
                site.settle(member.states)
                held = {w for f in member.states for w in site.client.who_has(f)[f.key]}
                _kill(site.client, sorted(held)[0])
            start_tree(k, tree)
        member.start_tree = killing_start_tree
        got = train_members([member], p).model
    finally:
        site.close()
    assert got == train_members([HistSite(memory.X, memory.y.astype(np.int64), p, 2, 0)], p).model


def test_a_lost_scheduler_fails_the_step_naming_it(site_files) -> None:
    """Its own cluster (threads: cheap), closed under an open site: the next step is a JobError
    naming the scheduler within dask_step_timeout_ms."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None, protocol="tcp") as own:
        site, _ = load_site(section(own, parquet=str(site_files["parts"]), dask_step_timeout_ms=1500), LIMITS,
                            needs_label=True, binary=True)
    try:
        with pytest.raises(JobError, match=rf"Dask cluster {own.scheduler_address}: .*1500 ms|Dask cluster "
                                           rf"{own.scheduler_address}"):
            asyncio.run(site.additive(stats.local_moments))
    finally:
        site.close()


def _kill(client, worker: str) -> None:
    """The worker process exits at once (its nanny starts a new, empty one)."""
    import contextlib
    import os

    with contextlib.suppress(Exception):          # the call's connection dies with the worker
        client.run(os._exit, 1, workers=[worker])


@pytest.mark.parametrize("data, key, words", [
    ('engine = "spark"', "data.engine", 'expected "memory" or "dask"'),
    ('engine = "dask"', "data.scheduler", 'missing: engine = "dask" needs the cluster\'s scheduler'),
    ('engine = "dask"\nscheduler = "10.0.0.5"', "data.scheduler", 'expected "tcp://host:port" or "local"'),
    ('scheduler = "local"', "data.scheduler", 'only with engine = "dask"'),
    ('engine = "dask"\nscheduler = "local"\nmissing = "impute"', "data.missing", 'supports "error" and "drop"'),
    ('engine = "dask"\nscheduler = "local"\ndask_step_timeout_ms = 0', "data.dask_step_timeout_ms", "positive"),
])
def test_config_engine_and_scheduler_are_checked(tmp_path: Path, data: str, key: str, words: str) -> None:
    from fedpeer.app.sitefiles import init_site
    from fedpeer.config import load as cfg
    from fedpeer.errors import ConfigError

    path, _ = init_site(tmp_path / "site", "a", "127.0.0.1:7400")
    path.write_text(path.read_text() + f'\n[data]\nparquet = "parts"\nlabel = "y"\n{data}\n')
    with pytest.raises(ConfigError) as caught:
        cfg.load(path)
    assert caught.value.key == key and words in caught.value.problem, str(caught.value)


def test_config_engine_dask_loads(tmp_path: Path) -> None:
    from fedpeer.app.sitefiles import init_site
    from fedpeer.config import load as cfg

    path, _ = init_site(tmp_path / "site", "a", "127.0.0.1:7400")
    path.write_text(path.read_text() + '\n[data]\ncsv = "parts/*.csv"\nlabel = "y"\nengine = "dask"\n'
                                       'scheduler = "tcp://dask.example:8786"\n')
    data = cfg.load(path).data
    assert data.engine == "dask" and data.scheduler == "tcp://dask.example:8786"
    assert data.csv == str(tmp_path / "site" / "parts" / "*.csv") and data.dask_connect_timeout_ms == 10_000
