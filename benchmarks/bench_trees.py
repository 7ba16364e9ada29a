"""Scoring every tree of a BOFRF federation on one site's rows (fedpeer.ml.forest.treepredict.predict_trees).

Setup (the issue's): 4 forests x 100 trees (scikit-learn RandomForestClassifier,
min_samples_leaf=2), each trained on 5 000 rows of make_classification(n_features=30, seed 0);
10 000 scoring rows. All timings in the same run, median of --repeats:
  (a) loop: estimators_[i].predict_proba(X)[:, 1] for every tree (the baseline);
  (b) fast path: building scikit-learn Tree objects from the arrays (once per Forest; validation
      included), then evaluating (threads = CPUs of this process, rows sorted for branch prediction);
  (c) the pure-numpy fallback.
Every result is checked against (a) bit for bit. Last line: one JSON object.

Also tried (not in fedpeer): xgboost's predictor (Booster built from the arrays, nodes renumbered
so that siblings are adjacent, pred_leaf) evaluates ~30 % faster than (b) on 2 cores, but the
Booster takes ~0.5 s to build from JSON and mapping its leaf ids back to float64 values costs
~25 ms, which leaves it no faster than (b). scikit-learn's HistGradientBoosting predictor was
slower than (b).

Run: .venv/bin/python benchmarks/bench_trees.py [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import sklearn
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.ml.forest import trees  # noqa: E402
from fedpeer.ml.forest import treepredict

FORESTS = 4
TREES = 100
TRAIN_ROWS = 5_000
SCORE_ROWS = 10_000
FEATURES = 30


def setup() -> tuple[list[RandomForestClassifier], trees.Forest, np.ndarray, list[str]]:
    X, y = make_classification(n_samples=FORESTS * TRAIN_ROWS + SCORE_ROWS, n_features=FEATURES, random_state=0)
    names = [f"x{i}" for i in range(FEATURES)]
    models = []
    for k in range(FORESTS):
        rows = slice(k * TRAIN_ROWS, (k + 1) * TRAIN_ROWS)
        models.append(RandomForestClassifier(n_estimators=TREES, min_samples_leaf=2, random_state=k, n_jobs=-1)
                      .fit(X[rows], y[rows]))
    forest = trees.concat([trees.from_sklearn(m, names) for m in models])
    return models, forest, X[FORESTS * TRAIN_ROWS:], names


def timed(fn: object) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def fresh(forest: trees.Forest) -> trees.Forest:
    """The same trees as a new Forest object: nothing cached."""
    return trees.take(forest, np.arange(forest.n_trees))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="evaluator threads (default: CPUs)")
    args = parser.parse_args()

    models, forest, X, names = setup()
    depth = max(m.estimators_[i].get_depth() for m in models for i in range(TREES))
    print(f"{FORESTS} forests x {TREES} trees = {forest.n_trees} trees, {forest.n_nodes} nodes "
          f"({forest.n_nodes / forest.n_trees:.0f} per tree, depth <= {depth}); {len(X)} x {FEATURES} rows; "
          f"scikit-learn {sklearn.__version__}, numpy {np.__version__}, {len(os.sched_getaffinity(0))} CPUs, "
          f"evaluator {treepredict.evaluator()}")

    runs: dict[str, list[float]] = {"loop": [], "build": [], "fast": [], "numpy": []}
    for r in range(args.repeats):
        seconds, expected = timed(lambda: np.stack([e.predict_proba(X)[:, 1] for m in models for e in m.estimators_]))
        runs["loop"].append(seconds)
        f = fresh(forest)
        seconds, _ = timed(lambda f=f: treepredict._plan(f).sklearn_trees())
        runs["build"].append(seconds)
        seconds, got = timed(lambda f=f: treepredict.predict_trees(f, X, names, engine="sklearn", threads=args.threads))
        assert np.array_equal(got, expected), "fast path differs from predict_proba"
        runs["fast"].append(seconds)
        g = fresh(forest)
        treepredict._plan(g).numpy_tables()      # its (small) set-up, like the build above, is not evaluation
        seconds, got = timed(lambda g=g: treepredict.predict_trees(g, X, names, engine="numpy", threads=args.threads))
        assert np.array_equal(got, expected), "numpy path differs from predict_proba"
        runs["numpy"].append(seconds)
        print(f"run {r + 1}: " + "  ".join(f"{k} {v[-1] * 1000:.0f} ms" for k, v in runs.items()))

    ms = {k: statistics.median(v) * 1000 for k, v in runs.items()}
    print(f"\nmedians of {args.repeats} runs (every result equal to predict_proba, bit for bit):")
    print(f"  (a) loop over estimators_[i].predict_proba : {ms['loop']:7.1f} ms")
    print(f"  (b) fast path, build Tree objects (once)   : {ms['build']:7.1f} ms")
    print(f"      fast path, evaluate                    : {ms['fast']:7.1f} ms   "
          f"{ms['loop'] / ms['fast']:.2f}x the loop")
    print(f"      fast path, build + evaluate            : {ms['build'] + ms['fast']:7.1f} ms   "
          f"{ms['loop'] / (ms['build'] + ms['fast']):.2f}x the loop")
    print(f"  (c) numpy fallback, evaluate               : {ms['numpy']:7.1f} ms   "
          f"{ms['loop'] / ms['numpy']:.2f}x the loop")
    target = ms["loop"] / ms["fast"] >= 5
    print(f"  target (evaluate >= 5x the loop): {'met' if target else 'NOT met'}")
    print(json.dumps({"bench": "trees", "trees": forest.n_trees, "nodes": forest.n_nodes, "rows": len(X),
                      "cpus": len(os.sched_getaffinity(0)), "repeats": args.repeats,
                      **{f"{k}_ms": round(v, 1) for k, v in ms.items()},
                      "speedup_eval": round(ms["loop"] / ms["fast"], 2),
                      "speedup_build_and_eval": round(ms["loop"] / (ms["build"] + ms["fast"]), 2),
                      "speedup_numpy": round(ms["loop"] / ms["numpy"], 2), "target_5x_met": target}))


if __name__ == "__main__":
    main()
