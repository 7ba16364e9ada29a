"""Jobs between real daemons: the stats job, refusals that name the site, persistence, a member
that stops answering, and the CLI an operator uses."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpeer.app.harness.federation import Harness, split_csv

pytestmark = pytest.mark.integration


def breast_cancer_csv(path: Path) -> Path:
    """scikit-learn's bundled Wisconsin data as a CSV (no download, no ../shared)."""
    from fedpeer.app.harness.federation import builtin_csv
    return builtin_csv("builtin:breast_cancer", path)


async def breast_cancer_federation(make_federation, tmp_path: Path, n: int, split: str, seed: int,
                                   settings: dict | None = None) -> tuple[Harness, Path, list[Path]]:
    """n daemons, each holding a stratified share of the breast cancer data, all alive."""
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", n, split, seed=seed, out_dir=tmp_path / "parts")
    h: Harness = make_federation(n, settings, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    return h, full, parts


def read_matrix(path: Path, label: str, positive: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    with open(path) as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    col = header.index(label)
    feats = [h for i, h in enumerate(header) if i != col]
    X = np.array([[float(v) for i, v in enumerate(r) if i != col] for r in body])
    y = np.array([r[col] == positive for r in body])
    return feats, X, y


async def test_stats_equals_pooled_numpy_on_every_member(make_federation, tmp_path: Path) -> None:
    h, full, parts = await breast_cancer_federation(make_federation, tmp_path, 3, "0.5,0.3,0.2", seed=1)
    job_id = await h.propose(1, "stats", {"bins": 8, "secure_sum": "pairwise"})
    records = await h.wait_job(job_id, timeout_s=120)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    results = [r["result"] for r in records.values()]
    assert all(r == results[0] for r in results), "every member must hold the same result"
    feats, X, y = read_matrix(full, "diagnosis", "malignant")
    res = results[0]
    assert res["count"] == len(X) == 569
    assert res["class_counts"] == {"positive": int(y.sum()), "negative": int((~y).sum())}
    for j, name in enumerate(feats):
        assert res["mean"][name] == pytest.approx(X[:, j].mean(), rel=1e-9, abs=1e-9)
        assert res["std"][name] == pytest.approx(X[:, j].std(ddof=1), rel=1e-9, abs=1e-9)
        hist = res["histograms"][name]
        assert hist["below"] + sum(hist["counts"]) + hist["above"] == 569
        inner, _ = np.histogram(X[:, j], bins=np.array(hist["edges"]))
        assert list(inner) == hist["counts"]
    assert sorted(r["rows"] for r in records.values()) == sorted(_rows(p) for p in parts)
    # the record survives a restart of a member
    h.restart(2)
    await h.wait_all_alive(timeout_s=30)
    again = await h.job(2, job_id)
    assert again["state"] == "done" and again["result"] == res


async def test_missing_values_refused_naming_the_site(make_federation, tmp_path: Path) -> None:
    """Two sites hold clean rows of scikit-learn's breast cancer data, the third 16 rows without a
    mean_area: every member hears site-3's public reason, naming the column (never a path or a row)."""
    with open(breast_cancer_csv(tmp_path / "bc.csv")) as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    column = header.index("mean_area")
    na = [[*r[:column], "", *r[column + 1:]] for r in body[:16]]
    clean = body[16:]
    paths = []
    for k, part in enumerate([clean[:250], clean[250:], clean[:100] + na]):
        p = tmp_path / f"bc{k}.csv"
        with open(p, "w", newline="") as f:
            csv.writer(f).writerows([header, *part])
        paths.append(p)
    h: Harness = make_federation(3, start=False)
    _attach_data(h, paths, label="diagnosis", positive="malignant")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=60)
    for record in records.values():
        assert record["state"] == "failed", record
        assert record["error"].startswith("site-3: ") and "mean_area" in record["error"], record["error"]
        if record is not records.get(2):
            assert str(tmp_path) not in record["error"] and "row" not in record["error"], record["error"]


async def test_schema_mismatch_and_unresponsive_member(make_federation, tmp_path: Path) -> None:
    full = breast_cancer_csv(tmp_path / "bc.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=2, out_dir=tmp_path / "parts")
    renamed = parts[1].read_text().replace("mean_radius", "radius_mean", 1)
    parts[1].write_text(renamed)
    h: Harness = make_federation(3, {"jobs": {"job_accept_timeout_ms": 3000, "hop_timeout_ms": 3000}}, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant")
    h.start()
    await h.wait_all_alive(timeout_s=30)
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=60)
    for record in records.values():
        assert record["state"] == "failed" and "site-2" in record["error"], record["error"]
        assert "columns differ" in record["error"] and "mean_radius" in record["error"]

    # a member that stops answering: the job fails within the accept timeout on every survivor
    parts[1].write_text(renamed.replace("radius_mean", "mean_radius", 1))
    h.pause(2)
    job_id = await h.propose(0, "stats", {})
    records = await h.wait_job(job_id, timeout_s=30, among=[0, 1])
    for record in records.values():
        assert record["state"] == "failed" and "site-3" in record["error"], record
    h.resume(2)


async def test_cli_run_wait_jobs_show(make_federation, tmp_path: Path) -> None:
    h, full, parts = await breast_cancer_federation(make_federation, tmp_path, 2, "stratified", seed=3)
    conf = str(h.sites[0].config_path)
    r = _fedpeer("run", "stats", "--config", conf, "--wait", "--json", "--bins", "5", "--secure-sum", "ring")
    assert r.returncode == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["state"] == "done" and record["result"]["count"] == 569
    assert {k: record["params"][k] for k in ("bins", "secure_sum")} == {"bins": 5, "secure_sum": "ring"}
    assert record["params"]["dp_epsilon"] == 0      # no differential privacy unless asked
    listing = _fedpeer("jobs", "--config", conf)
    assert record["id"] in listing.stdout and "done" in listing.stdout
    shown = _fedpeer("job", "show", record["id"], "--config", str(h.sites[1].config_path))
    assert shown.returncode == 0 and "569 rows" in shown.stdout and "mean_radius" in shown.stdout
    cancel = _fedpeer("job", "cancel", record["id"], "--config", conf)
    assert cancel.returncode == 1 and "already done" in cancel.stderr
    status = json.loads(_fedpeer("status", "--config", conf, "--json").stdout)
    assert status["jobs"][0]["id"] == record["id"]


def _attach_data(h: Harness, paths: list[Path], **data: object) -> None:
    import shutil

    from fedpeer.app.sitefiles import add_peers
    from fedpeer.config import load as cfg
    for site, path in zip(h.sites, paths):
        shutil.copyfile(path, site.dir / "data.csv")
        add_peers(site.config_path, [], {"data": {"csv": "data.csv", **data}})
        site.config = cfg.load(site.config_path)


def _rows(path: Path) -> int:
    return sum(1 for _ in open(path)) - 1


def _fedpeer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedpeer", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


async def test_cancel_running_job_and_sigterm_during_a_job(make_federation) -> None:
    import asyncio
    import signal as sig
    h: Harness = make_federation(2)
    await h.wait_all_alive(timeout_s=30)
    # 64 MiB in 32 KiB chunks: runs for many seconds (in the default 2 MiB chunks it can end before
    # the cancel command's process has started; in 128 KiB chunks it did once under a loaded machine)
    big = {"entries": 8 * 1024 * 1024, "secure_sum": "pairwise", "chunk_entries": 4 * 1024}
    job_id = await h.propose(0, "sumcheck", big)
    await asyncio.sleep(0.5)
    cancel = _fedpeer("job", "cancel", job_id, "--config", str(h.sites[1].config_path))
    assert cancel.returncode == 0, cancel.stderr
    records = await h.wait_job(job_id, timeout_s=60)
    assert records[1]["state"] == "cancelled" and "cancelled by the operator" in records[1]["error"]
    assert records[0]["state"] in ("failed", "cancelled") and "site-2" in records[0]["error"], records[0]

    # SIGTERM while a job runs: the daemon exits 0 promptly; restarted, it shows the job ended
    job_id = await h.propose(0, "sumcheck", big)
    await asyncio.sleep(0.5)
    proc = h.sites[0].process
    proc.send_signal(sig.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 20) == 0
    h.start(0)
    await h.wait_all_alive(timeout_s=30)
    record = await h.job(0, job_id)
    assert record["state"] in ("cancelled", "failed") and "stopped" in record["error"], record
