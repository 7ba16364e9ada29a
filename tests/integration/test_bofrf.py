"""BOFRF on real daemons equals the in-process reference with the same seeds: same metrics, same
kept trees and weights, same predictions through `fedpeer predict`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedpeer.identity import parse_public_key
from fedpeer.jobs import bofrf
from fedpeer.ml.data import DataSpec, load_csv
from tests.integration.conftest import predict_scores
from tests.integration.test_jobs import breast_cancer_federation

pytestmark = pytest.mark.integration
PARAMS = {"n_estimators": 15, "seed": 7, "baseline": "boppid", "boppid_rounds": 10}


@pytest.mark.parametrize("variant", ["base", "personalized"])
async def test_decentralized_equals_reference(make_federation, tmp_path: Path, variant: str) -> None:
    h, full, parts = await breast_cancer_federation(make_federation, tmp_path, 3, "0.5,0.35,0.15", seed=5)
    params = {**PARAMS, "variant": variant}
    job_id = await h.propose(2, "bofrf", params)
    records = await h.wait_job(job_id, timeout_s=240)
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]

    keys = [parse_public_key(s.public_key) for s in h.sites]
    order = sorted(range(3), key=lambda i: keys[i])          # ring order = sorted keys
    datasets = [load_csv(DataSpec(csv=parts[i], label="diagnosis", positive="malignant")) for i in order]
    full_params = {k: p.default for k, p in bofrf.PARAMS.items()} | params
    expected = bofrf.reference(datasets, [keys[i] for i in order], full_params)
    for pos, i in enumerate(order):
        result = records[i]["result"]
        ref, ref_forest, ref_weights = expected[pos]
        for block in ("local_rf", "bofrf_local", "bofrf_global", "final"):
            assert result[block] == ref[block], (i, block)
        assert result["tau"] == ref["tau"] and result["trees_kept"] == ref["trees_kept"]
        forest, weights = bofrf.load_model(result["model_file"])
        assert np.array_equal(weights, ref_weights)
        assert np.array_equal(forest.threshold, ref_forest.threshold) and np.array_equal(forest.value, ref_forest.value)
        assert "auc" in result["boppid"]
    # fedpeer predict with the stored model gives the reference model's scores
    scores = predict_scores(h.sites[order[0]].config_path, job_id, full, tmp_path / "scores.csv")
    data = load_csv(DataSpec(csv=full, label="diagnosis", positive="malignant"))
    want = bofrf.predict((expected[0][1], expected[0][2]), data.X, data.features)
    assert np.allclose(scores, want, rtol=0, atol=1e-12) and len(scores) == 569
