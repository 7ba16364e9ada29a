"""Every job kind in the catalogue honours the kind contract (fedpeer/jobs/kind.py): one shared
test, as scikit-learn checks every estimator with one. Each kind's parameters round-trip through
the wire's encoding; a tiny job runs with three members over the in-memory network; its result
reads (`describe`), tabulates (`site_table`), draws (`history`), and, where the kind stores a model,
the saved model scores rows (`predict`) and exports (`export`)."""

from __future__ import annotations

import asyncio
import hashlib
import math
from pathlib import Path

import msgpack
import numpy as np
import pytest

from fedpeer.data.dataset import DataSpec, load_csv
from fedpeer.jobs.kind import JobContext, JobKind
from fedpeer.kinds.catalog import job_kinds
from fedpeer.testing.memory import MemoryNetwork

KINDS = job_kinds()
# Small, fast parameters per kind; every other parameter keeps its default.
TINY: dict[str, dict] = {
    "stats": {"bins": 4},
    "sumcheck": {"entries": 4096},
    "bofrf": {"n_estimators": 5, "max_depth": 3},
    "xgboost": {"rounds": 3, "max_depth": 2},
    "tree": {"max_depth": 3},
    "logreg": {"max_iter": 20},
    "mlp": {"rounds": 3, "hidden_layer_sizes": "4"},
    "kmeans": {"k": 2, "n_init": 1, "max_iter": 5},
    "gmm": {"k": 2, "n_init": 1, "max_iter": 5},
    "dbscan": {"eps": 3.0, "min_samples": 5},
}
SITES = 3


def test_every_kind_is_covered_here() -> None:
    assert set(TINY) == set(KINDS), "add the new kind's tiny parameters to TINY"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_declaration(name: str) -> None:
    kind = KINDS[name]
    assert isinstance(kind, JobKind) and kind.name == name and kind.help
    defaults = kind.check_params({})
    assert set(defaults) == set(kind.params)
    asked = kind.check_params({k: v for k, v in TINY[name].items() if k in kind.params})
    on_the_wire = msgpack.unpackb(msgpack.packb(asked), raw=False, strict_map_key=True)
    assert kind.check_params(on_the_wire) == asked, "parameters survive the wire's encoding"
    for limit_name, limit in kind.limits.items():
        assert limit.param in kind.params and limit_name.endswith(("_max", "_min")) and limit.help
    assert callable(kind.describe) and callable(kind.site_table)
    if kind.export is not None:
        assert kind.predict is not None and kind.save_model is not None, "what exports, predicts"
    if kind.predict is not None:
        assert kind.save_model is not None, "a kind that predicts stores a model"


@pytest.fixture(scope="module")
def site_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Breast cancer in three shares (every third row), as CSVs with a 0/1 label column."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    X, y = data.data[:, :6], data.target
    root = tmp_path_factory.mktemp("sites")
    files = []
    for i in range(SITES):
        path = root / f"site-{i + 1}.csv"
        rows = [",".join([*(f"f{j}" for j in range(X.shape[1])), "label"])]
        rows += [",".join([*(repr(float(v)) for v in X[r]), str(int(y[r]))]) for r in range(i, len(X), SITES)]
        path.write_text("\n".join(rows) + "\n")
        files.append(path)
    return files


def _run(kind: JobKind, params: dict, files: list[Path], workdir: Path) -> list[dict]:
    keys = sorted(hashlib.sha256(f"contract-{i}".encode()).digest() for i in range(SITES))
    names = {k: f"site-{i + 1}" for i, k in enumerate(keys)}

    def data(i: int):
        if not kind.needs_data:
            return None
        spec = DataSpec(csv=files[i], label="label" if kind.needs_label else None,
                        positive="1" if kind.needs_label else None, ignore=() if kind.needs_label else ("label",))
        return load_csv(spec, binary=kind.binary_label)

    async def go() -> list:
        net = MemoryNetwork(keys, seed=0)
        jobs = []
        for i, k in enumerate(keys):
            (workdir / names[k]).mkdir(parents=True, exist_ok=True)
            ctx = JobContext(names[k], names, 30_000, data=data(i), workdir=workdir / names[k])
            jobs.append(kind.run(net.channel(k), params, ctx))
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=300)

    return asyncio.run(go())


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_tiny_job_reads_draws_and_predicts(name: str, site_files: list[Path], tmp_path: Path) -> None:
    kind = KINDS[name]
    params = kind.check_params({k: v for k, v in TINY[name].items() if k in kind.params})
    results = _run(kind, params, site_files, tmp_path)
    assert len(results) == SITES and all(isinstance(r, dict) for r in results)
    result = results[0]
    model = result.pop("_model", None)

    lines = kind.describe(result)
    assert lines and all(isinstance(line, str) and line.startswith("  ") for line in lines), lines
    read_as_text(name, result, lines)
    sites = [{"name": f"site-{i + 1}", "rows": 100, "state": "done", "result": r} for i, r in enumerate(results)]
    table = kind.site_table(sites)
    assert "site-1" in table and "site-3" in table

    if kind.history is not None:
        curves = kind.history(result)
        assert isinstance(curves, dict)
        for series, points in curves.items():
            assert points and all(len(p) == 2 and all(math.isfinite(float(v)) for v in p) for p in points), series

    if kind.predict is None:
        return
    assert model is not None, f"{name} stores a model but its result carries none"
    path = tmp_path / kind.model_file
    kind.save_model(path, model)
    scored = load_csv(DataSpec(csv=site_files[0], label=None, ignore=("label",)), binary=False)

    def rows(features):
        return scored.X[:, [scored.features.index(f) for f in features]]

    predictions = kind.predict(path, result, rows)
    assert len(predictions) == scored.X.shape[0]
    assert [p["row"] for p in predictions[:3]] == [1, 2, 3]
    assert all(np.isfinite(v) for p in predictions for v in p.values() if isinstance(v, float))
    if kind.export is not None:
        exported = kind.export(path, result)
        assert isinstance(exported, dict) and exported
        assert kind.export_note is None or kind.export_note(result)
    if name == "xgboost":      # the export is xgboost's own model: xgboost loads it and predicts the same
        import json

        import xgboost

        (tmp_path / "exported.json").write_text(json.dumps(exported, indent=2))
        booster = xgboost.Booster(model_file=str(tmp_path / "exported.json"))
        features = list(result["features"])
        assert booster.feature_names == features and booster.feature_types == ["float"] * len(features)
        assert all(f in kind.export_note(result) for f in features)     # every column, not the first 6
        got = booster.predict(xgboost.DMatrix(rows(features), feature_names=features))
        assert np.allclose(got, [p["score"] for p in predictions], rtol=0, atol=1e-7)
        with pytest.raises(ValueError, match="feature_names mismatch"):    # columns in another order: refused
            booster.predict(xgboost.DMatrix(rows(features[::-1]), feature_names=features[::-1]))
    if name == "bofrf":        # a probability, the vote sum under its own name, the same prediction
        assert all(0 <= p["score"] <= 1 and (p["score"] > 0.5) == (p["vote_sum"] > 0) == p["prediction"]
                   for p in predictions if abs(p["vote_sum"]) > 1e-12)


def read_as_text(name: str, result: dict, lines: list[str]) -> None:
    """A result's `describe` is text: no JSON dump, no Python None, and every score it gives names
    the rows it rests on."""
    from fedpeer.jobs.report import evaluated_rows

    text = "\n".join(lines)
    assert "{" not in text and "None" not in text, f"{name}: {text}"
    for key in ("federated_eval", "test_csv"):
        if isinstance(result.get(key), dict) and name != "tree":   # kinds/tree words its own (not yet with n)
            n, _ = evaluated_rows(result[key])
            assert f"on {n} row" in text, f"{name}: {key} without its {n} rows: {text}"
    if name == "bofrf":
        assert f"{result['rows']['test']} rows" in text


def test_regression_reads_rmse_and_mae_with_its_rows(site_files: list[Path], tmp_path: Path) -> None:
    """An xgboost regression (reg:squarederror) reads and tabulates RMSE and MAE, never "AUC -"."""
    kind = KINDS["xgboost"]
    params = kind.check_params({**TINY["xgboost"], "objective": "reg:squarederror"})
    results = _run(kind, params, site_files, tmp_path)
    for r in results:
        r.pop("_model", None)
    text = "\n".join(kind.describe(results[0]))
    n = results[0]["federated_eval"]["test_rows"]
    assert "RMSE" in text and "MAE" in text and "AUC" not in text and f"on {n} rows" in text, text
    read_as_text("xgboost", results[0], text.splitlines())
    table = kind.site_table([{"name": f"site-{i + 1}", "rows": 100, "state": "done", "result": r}
                             for i, r in enumerate(results)] + [{"name": "site-4", "rows": None, "state": "failed",
                                                                 "result": None}])
    assert "RMSE" in table.splitlines()[0] and "LOG" not in table and "failed" in table
