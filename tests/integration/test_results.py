"""Results people can use (issue 27), on real daemons through the command line: `run --wait` on a
pipe prints text (a progress line on stderr, the kind's own lines on stdout, the parameters that
differ from the defaults), `predict --id-column` keeps each row's ID, BOFRF predicts a
probability, and `export` of an xgboost model is a file xgboost loads and predicts the same with."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpeer.app.harness.federation import split_csv
from tests.integration.test_jobs import _attach_data, breast_cancer_csv

pytestmark = pytest.mark.integration


def fedpeer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedpeer", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def with_ids(src: Path, dst: Path) -> Path:
    """The breast cancer CSV with a first column ID naming each row (p0001, ...)."""
    with open(src, newline="") as f:
        rows = list(csv.reader(f))
    with open(dst, "w", newline="") as f:
        csv.writer(f).writerows([["ID", *rows[0]]] + [[f"p{i:04d}", *r] for i, r in enumerate(rows[1:], 1)])
    return dst


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


async def test_results_read_as_text_and_models_leave_with_their_ids(make_federation, tmp_path: Path) -> None:
    full = with_ids(breast_cancer_csv(tmp_path / "bc.csv"), tmp_path / "ids.csv")
    parts = split_csv(full, "diagnosis", 3, "stratified", seed=0, out_dir=tmp_path / "parts")
    h = make_federation(3, start=False)
    _attach_data(h, parts, label="diagnosis", positive="malignant", ignore=["ID"])
    h.start()
    await h.wait_all_alive(timeout_s=30)
    config = str(h.sites[0].config_path)

    jobs = {}
    for kind, flags in (("sumcheck", []), ("bofrf", ["--n-estimators", "20"]), ("xgboost", ["--rounds", "5"])):
        r = fedpeer("run", kind, "--wait", "--config", config, *flags)
        assert r.returncode == 0, r.stderr
        jobs[kind] = r.stdout.split()[1]
        assert r.stdout.startswith(f"job {jobs[kind]} ({kind}): done"), r.stdout
        assert "{" not in r.stdout and "None" not in r.stdout, r.stdout        # text, not JSON
        assert jobs[kind] in r.stderr.splitlines()[0] and "\r" not in r.stderr  # progress: lines on a pipe
        assert ("parameters: the defaults" if not flags else "(the others at their defaults)") in r.stdout
    assert "reads no data" in fedpeer("job", "show", jobs["sumcheck"], "--config", config).stdout
    assert "AUC" in fedpeer("job", "show", jobs["xgboost"], "--config", config).stdout

    # predict --id-column: the first column is the row's ID; bofrf: a probability and the vote sum
    out = tmp_path / "bofrf.csv"
    r = fedpeer("predict", "--job", jobs["bofrf"], "--data", str(full), "--id-column", "ID", "--out", str(out),
                "--config", config)
    assert r.returncode == 0, r.stderr
    rows = read(out)
    assert list(rows[0]) == ["ID", "score", "vote_sum", "prediction"] and rows[0]["ID"] == "p0001"
    assert [row["ID"] for row in rows] == [row["ID"] for row in read(full)]
    assert all(0 <= float(row["score"]) <= 1 and (float(row["vote_sum"]) > 0) == (row["prediction"] == "malignant")
               for row in rows)
    r = fedpeer("predict", "--job", jobs["bofrf"], "--data", str(full), "--id-column", "Patient", "--config", config)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "'Patient'" in r.stderr

    # export of an xgboost model: xgboost's own JSON, loaded by xgboost, predicting what fedpeer predict does
    import xgboost

    model = tmp_path / "model.json"
    r = fedpeer("export", "--job", jobs["xgboost"], "--out", str(model), "--config", config)
    assert r.returncode == 0 and "xgboost.Booster(model_file=" in r.stderr, r.stderr
    scores = tmp_path / "xgb.csv"
    assert fedpeer("predict", "--job", jobs["xgboost"], "--data", str(full), "--out", str(scores),
                   "--config", config).returncode == 0
    header = read(full)[0].keys()
    features = [c for c in header if c not in ("ID", "diagnosis")]
    X = np.array([[float(row[c]) for c in features] for row in read(full)])
    got = xgboost.Booster(model_file=str(model)).predict(xgboost.DMatrix(X, feature_names=features))
    assert np.allclose(got, [float(row["score"]) for row in read(scores)], rtol=0, atol=1e-7)
