"""The thesis' headline claim, on fixed seeds: averaged over seeds, BOFRF's AUC is at least each
site's local random forest's, including a small and an imbalanced site (benchmarks/bofrf_experiment.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bofrf_experiment as exp  # noqa: E402

from fedpeer.kinds.forest import bofrf  # noqa: E402

PARAMS = {k: p.default for k, p in bofrf.PARAMS.items()} | {"n_estimators": 40}
SONAR = Path(bofrf.__file__).resolve().parents[2] / "app" / "harness" / "data" / "sonar.csv"   # shipped


@pytest.mark.parametrize("name", ["sklearn_breast_cancer", "sonar"])
def test_bofrf_never_below_local_rf_on_average(name: str, tmp_path: Path) -> None:
    (tmp_path / "Sonar.csv").symlink_to(SONAR)      # the experiment's file name for the shipped copy
    result = exp.run(name, tmp_path, seeds=5, params=PARAMS)
    for site in result["sites"]:
        assert site["bofrf_auc"] >= site["local_rf_auc"], (name, site)
    weakest = min(result["sites"], key=lambda s: s["local_rf_auc"])
    assert weakest["change_pct"] > 0, (name, weakest)
