"""The `tree` job's two modes on the same split: the exact federated CART tree (mode exact) and
ICDTA4FL's aggregated tree (mode icdta), their AUC on the same held-out rows.

Per data set and seed: a stratified held-out part (--holdout) is every site's `[data] test_csv`,
the rest is split into --sites stratified equal parts; both modes run with test_fraction 0 (every
site trains on all its rows), so they see the very same rows. The jobs run in one process over the
in-memory network in virtual time (fedpeer/testing/members.py): the same coroutines as the daemon.
Each line: data set, depth, mode, AUC per seed, mean; the last line one JSON object.

Run: .venv/bin/python benchmarks/bench_tree_icdta.py [--sites 3] [--seeds 5] [--depths 3 5] [--holdout 0.3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint  # noqa: E402
from fedpeer.jobs.kind import JobContext, JobFailsEverywhere  # noqa: E402
from fedpeer.kinds.tree import kind as tree_kind  # noqa: E402
from fedpeer.testing.members import member_keys, run_members  # noqa: E402


def _dataset(X: np.ndarray, labels: np.ndarray, y: np.ndarray | None) -> Dataset:
    features = tuple(f"f{j}" for j in range(X.shape[1]))
    fingerprint = schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features))
    return Dataset(features, np.ascontiguousarray(X, dtype=np.float64), y, labels.astype(str), 0, fingerprint)


def data_sets() -> dict:
    from sklearn.datasets import load_breast_cancer, load_digits, load_wine, make_classification

    X, y = load_breast_cancer(return_X_y=True)
    Xw, yw = load_wine(return_X_y=True)
    Xd, yd = load_digits(return_X_y=True)
    Xs, ys = make_classification(n_samples=6000, n_features=20, n_informative=8, random_state=0)
    return {"breast_cancer": (X, y, ""), "wine": (Xw, yw, "c0,c1,c2"),
            "digits": (Xd, yd, ",".join(f"c{k}" for k in range(10))), "synthetic_6000": (Xs, ys, "")}


def run(X: np.ndarray, y: np.ndarray, classes: str, sites: int, seed: int, holdout: float,
        params: dict) -> float | str:
    """The job's AUC on the held-out rows, or the one line of its refusal."""
    from sklearn.model_selection import StratifiedKFold, train_test_split

    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=holdout, stratify=y, random_state=seed)
    names = np.array([f"c{k}" for k in range(int(y.max()) + 1)])

    def part(Xp: np.ndarray, yp: np.ndarray) -> Dataset:
        return _dataset(Xp, names[yp], None if classes else yp.astype(np.int8))

    folds = StratifiedKFold(sites, shuffle=True, random_state=seed).split(Xtr, ytr)
    parts = [part(Xtr[idx], ytr[idx]) for _, idx in folds]
    test = part(Xte, yte)
    keys, site_names = member_keys("bench-tree", sites)
    checked = tree_kind.KIND.check_params({**params, "classes": classes, "test_fraction": 0.0, "seed": seed})

    async def inline(fn, *args):
        return fn(*args)

    def member(net, i: int, k: bytes):
        ctx = JobContext(site_names[k], site_names, 2_000, data=parts[i], test_data=test)
        return tree_kind.run(net.channel(k), checked, ctx, inline)

    results = run_members(keys, member)
    bad = [r for r in results if not isinstance(r, dict)]
    if bad and all(isinstance(r, JobFailsEverywhere) for r in bad):
        return f"refused: {bad[0]}"
    if bad:
        raise bad[0]
    if len({r["model_sha256"] for r in results}) != 1:
        raise AssertionError("members stored different trees")
    return float(results[0]["auc"])


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--depths", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--holdout", type=float, default=0.3)
    ap.add_argument("--data", nargs="+", default=None, help="data sets (default: all)")
    args = ap.parse_args()
    out: dict = {}
    for name, (X, y, classes) in data_sets().items():
        if args.data and name not in args.data:
            continue
        for depth in args.depths:
            for mode, extra in (("exact", {"max_bin": 1024}), ("icdta", {})):
                params = {"mode": mode, "max_depth": depth, "min_leaf_rows": 5, **extra}
                got = [run(X, y, classes, args.sites, seed, args.holdout, params) for seed in range(args.seeds)]
                key = f"{name}/depth{depth}/{mode}"
                refused = [g for g in got if isinstance(g, str)]
                if refused:
                    out[key] = {"refused": refused[0]}
                    print(f"{key:32s} {refused[0]}", flush=True)
                    continue
                aucs = [float(g) for g in got]
                out[key] = {"auc": [round(a, 4) for a in aucs], "mean": round(statistics.fmean(aucs), 4)}
                print(f"{key:32s} AUC {' '.join(f'{a:.4f}' for a in aucs)}  mean {statistics.fmean(aucs):.4f}",
                      flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
