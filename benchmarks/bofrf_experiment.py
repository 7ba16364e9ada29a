"""BOFRF vs each site's local random forest, averaged over seeds (thesis tables 7.1–7.6 setting).

Each dataset is split into N sites with unequal sizes; one site is small and one is imbalanced
(most of its positives removed), because the thesis' claim is about such sites: BOFRF should
raise every site's AUC over its local RF, and the weakest sites should gain most. The runs use
`fedpeer.kinds.forest.bofrf.reference`, the same steps the decentralized job runs (a test checks the
job equals it), so many seeds stay cheap.

Run: .venv/bin/python benchmarks/bofrf_experiment.py [--seeds 10] [--data-dir ../shared/data] [--markdown]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.data.dataset import Dataset, DataSpec, load_csv  # noqa: E402
from fedpeer.kinds.forest import bofrf  # noqa: E402

# name -> (file, label, positive, ignore, site fractions, imbalanced site)
DATASETS = {
    "sonar": ("Sonar.csv", "Class", "M", (), (0.45, 0.35, 0.2), 1),
    "ionosphere": ("Ionosphere.csv", "Class", "bad", (), (0.4, 0.3, 0.2, 0.1), 2),
    "breastcancer": ("BreastCancer.csv", "Class", "malignant", ("Id",), (0.4, 0.25, 0.2, 0.1, 0.05), 1),
    "sklearn_breast_cancer": (None, None, None, (), (0.5, 0.3, 0.2), 2),
}
IMBALANCE_KEEP = 0.25     # the imbalanced site keeps this share of its positives


def load(name: str, data_dir: Path) -> Dataset:
    file, label, positive, ignore, _, _ = DATASETS[name]
    if file is None:
        from sklearn.datasets import load_breast_cancer
        raw = load_breast_cancer()
        X = np.ascontiguousarray(raw.data, dtype=np.float64)
        y = (raw.target == 0).astype(np.int8)            # malignant = positive
        features = tuple(n.replace(" ", "_") for n in raw.feature_names)
        return _dataset(features, X, y)
    return load_csv(DataSpec(csv=data_dir / file, label=label, positive=positive, ignore=ignore, missing="drop"))


def _dataset(features: tuple[str, ...], X: np.ndarray, y: np.ndarray) -> Dataset:
    from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, schema_fingerprint
    labels = np.where(y == 1, "pos", "neg")
    return Dataset(features, X, y, labels, 0, schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features)))


def split_sites(ds: Dataset, fractions: tuple[float, ...], imbalanced: int, seed: int) -> list[Dataset]:
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in fractions]
    for cls in (0, 1):
        idx = rng.permutation(np.flatnonzero(ds.y == cls))
        bounds = np.round(np.cumsum((0,) + fractions) * len(idx)).astype(int)
        for k in range(len(fractions)):
            chosen = idx[bounds[k]:bounds[k + 1]]
            if k == imbalanced and cls == 1:
                chosen = chosen[: max(4, int(len(chosen) * IMBALANCE_KEEP))]
            parts[k].extend(chosen.tolist())
    return [_dataset(ds.features, ds.X[np.sort(p)], ds.y[np.sort(p)]) for p in parts]


def members(n: int, seed: int) -> list[bytes]:
    return sorted(hashlib.sha256(f"site-{i}-{seed}".encode()).digest() for i in range(n))


def run(name: str, data_dir: Path, seeds: int, params: dict) -> dict:
    ds = load(name, data_dir)
    fractions, imbalanced = DATASETS[name][4], DATASETS[name][5]
    local, final = [], []
    for seed in range(seeds):
        sites = split_sites(ds, fractions, imbalanced, seed)
        keys = members(len(sites), seed)
        # members are in ring (sorted key) order; site i of the split is held by keys[i]
        results = bofrf.reference(sites, keys, {**params, "seed": seed})
        local.append([r[0]["local_rf"]["auc"] for r in results])
        final.append([r[0]["final"]["auc"] for r in results])
    local_m, final_m = np.nanmean(np.array(local, dtype=float), 0), np.nanmean(np.array(final, dtype=float), 0)
    rows = [len(s.y) for s in split_sites(ds, fractions, imbalanced, 0)]
    return {"dataset": name, "seeds": seeds, "sites": [
        {"site": i + 1, "rows": rows[i], "imbalanced": i == imbalanced, "local_rf_auc": float(local_m[i]),
         "bofrf_auc": float(final_m[i]), "change_pct": float(100 * (final_m[i] - local_m[i]) / local_m[i])}
        for i in range(len(rows))]}


def markdown(results: list[dict]) -> str:
    lines = ["| dataset | site | rows | local RF AUC | BOFRF AUC | change |", "|---|---|---|---|---|---|"]
    for r in results:
        for s in r["sites"]:
            tag = " (imbalanced)" if s["imbalanced"] else ""
            lines.append(f"| {r['dataset']} | {s['site']}{tag} | {s['rows']} | {s['local_rf_auc']:.3f} | "
                         f"{s['bofrf_auc']:.3f} | {s['change_pct']:+.1f} % |")
    return "\n".join(lines)


def check(results: list[dict]) -> list[str]:
    """The thesis' claims, as checks: never worse than local on average; the weakest gains most."""
    problems = []
    for r in results:
        sites = r["sites"]
        for s in sites:
            if s["bofrf_auc"] + 1e-9 < s["local_rf_auc"]:
                problems.append(f"{r['dataset']} site {s['site']}: BOFRF {s['bofrf_auc']:.3f} "
                                f"< local {s['local_rf_auc']:.3f}")
        weakest = min(sites, key=lambda s: s["local_rf_auc"])
        best_gain = max(sites, key=lambda s: s["change_pct"])
        if weakest is not best_gain and weakest["change_pct"] + 1e-9 < best_gain["change_pct"]:
            problems.append(f"{r['dataset']}: weakest site {weakest['site']} gains {weakest['change_pct']:+.1f} %, "
                            f"site {best_gain['site']} gains more ({best_gain['change_pct']:+.1f} %)")
    return problems


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    params = {k: p.default for k, p in bofrf.PARAMS.items()} | {"n_estimators": args.trees}
    results = [run(name, args.data_dir, args.seeds, params) for name in args.datasets]
    print(markdown(results))
    problems = check(results)
    print("\nchecks: " + ("all hold" if not problems else "; ".join(problems)))
    print(json.dumps(results))
