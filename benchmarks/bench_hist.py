"""Histogram mode's per-site hot path and its whole in-process training (issue 14, "How fast").

(1) One level's histograms at one site (fedpeer.ml.hist.level_histograms: the (node, feature,
    bin) sums of g, h and rows) against ONE np.bincount over the same cells (precomputed int64
    cell indices, no weights) — the floor for any numpy histogram build. Setup: 20,000 rows (one
    of 5 sites of 100,000) x 50 features, max_bin 256, the rows spread over 1, 8 and 32 nodes of a
    level. Printed: ratio = level_histograms / one bincount (median of --repeats).
(2) Training, in one process, with plain sums in place of the secure sum
    (fedpeer.ml.histrun.train_in_process: sketch, binning, every level of every tree) on
    100,000 x 50 synthetic rows over 5 sites, depth 6, max_bin 256 — against xgboost hist on the
    pooled rows with the same parameters (nthread 1 and all CPUs). This excludes the network: the
    job adds one secure sum per level and 33 for the sketch. --trees sets the trees (default 10;
    the issue's 50 takes ~5x as long).
Last line: one JSON object.

Run: .venv/bin/python benchmarks/bench_hist.py [--repeats 5] [--trees 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import xgboost as xgb
from sklearn.datasets import make_classification
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.ml import hist, histrun, xgbmodel

ROWS = 100_000
SITES = 5
FEATURES = 50
MAX_BIN = 256
DEPTH = 6


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_level(repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = ROWS // SITES
    slots = MAX_BIN + 1
    bins = np.asfortranarray(rng.integers(0, slots, size=(rows, FEATURES)).astype(np.uint16))   # as bin_matrix
    gq = rng.integers(-(1 << 28), 1 << 28, rows)
    hq = rng.integers(0, 1 << 28, rows)
    out = []
    for nodes in (1, 8, 32):
        positions = rng.integers(0, nodes, rows)
        build = np.arange(nodes)
        cells = (bins.astype(np.int64) + (np.arange(FEATURES) * slots)[None, :]
                 + (positions * FEATURES * slots)[:, None]).ravel()
        size = nodes * FEATURES * slots
        t_ours = median_time(lambda b=build, p=positions: hist.level_histograms(bins, gq, hq, p, b, slots), repeats)
        t_one = median_time(lambda c=cells, s=size: np.bincount(c, minlength=s), repeats)
        out.append({"nodes": nodes, "rows": rows, "features": FEATURES, "slots": slots,
                    "level_histograms_s": round(t_ours, 4), "one_bincount_s": round(t_one, 4),
                    "ratio": round(t_ours / t_one, 2),
                    "message_bytes": nodes * FEATURES * slots * hist.CHANNELS * 8})
        print(f"level with {nodes:2d} nodes: level_histograms {t_ours * 1e3:7.1f} ms, one np.bincount "
              f"{t_one * 1e3:6.1f} ms, ratio {t_ours / t_one:4.2f}; secure-sum vector "
              f"{out[-1]['message_bytes'] / 1e6:.1f} MB")
    return out


def bench_training(n_trees: int) -> dict:
    X, y = make_classification(n_samples=ROWS + 20_000, n_features=FEATURES, n_informative=20, random_state=0)
    Xtr, ytr, Xte, yte = X[:ROWS], y[:ROWS], X[ROWS:], y[ROWS:]
    params = {"objective": "binary:logistic", "num_round": n_trees, "max_depth": DEPTH, "eta": 0.3,
              "max_bin": MAX_BIN}
    sites = list(zip(np.array_split(Xtr, SITES), np.array_split(ytr, SITES), strict=True))
    start = time.perf_counter()
    fed = histrun.train_in_process(sites, params)
    t_ours = time.perf_counter() - start
    auc_ours = roc_auc_score(yte, xgbmodel.predict_proba(fed.model, Xte))
    result = {"trees": n_trees, "fedpeer_in_process_s": round(t_ours, 2), "fedpeer_auc": round(auc_ours, 4)}
    for nthread in (1, -1):
        xp = {"objective": "binary:logistic", "max_depth": DEPTH, "eta": 0.3, "tree_method": "hist",
              "max_bin": MAX_BIN, "base_score": fed.base[0], "nthread": nthread}
        start = time.perf_counter()
        booster = xgb.train(xp, xgb.DMatrix(Xtr, label=ytr, nthread=nthread), n_trees)
        t_xgb = time.perf_counter() - start
        auc = roc_auc_score(yte, booster.predict(xgb.DMatrix(Xte)))
        key = "xgboost_1thread" if nthread == 1 else "xgboost_all_threads"
        result[f"{key}_s"] = round(t_xgb, 3)
        result[f"{key}_auc"] = round(auc, 4)
        result[f"ratio_vs_{key}"] = round(t_ours / t_xgb, 1)
    print(f"training {n_trees} trees, depth {DEPTH}, {ROWS} x {FEATURES} over {SITES} sites in one process: "
          f"fedpeer {t_ours:.2f} s (AUC {auc_ours:.4f}); xgboost hist pooled 1 thread "
          f"{result['xgboost_1thread_s']:.3f} s (ratio {result['ratio_vs_xgboost_1thread']}), all threads "
          f"{result['xgboost_all_threads_s']:.3f} s (ratio {result['ratio_vs_xgboost_all_threads']}), AUC "
          f"{result['xgboost_1thread_auc']:.4f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trees", type=int, default=10)
    args = parser.parse_args()
    levels = bench_level(args.repeats)
    training = bench_training(args.trees)
    print(json.dumps({"benchmark": "hist", "levels": levels, "training": training}))


if __name__ == "__main__":
    main()
