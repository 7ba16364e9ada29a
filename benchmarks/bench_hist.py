"""Histogram mode's per-site hot path and its whole in-process training (issue 14, "How fast").

(1) One level's histograms at one site (fedpeer.ml.xgb.hist.level_histograms: the (node, feature,
    bin) sums of g, h and rows) against ONE np.bincount over the same cells (precomputed int64
    cell indices, no weights) — the floor for any numpy histogram build. Setup: 20,000 rows (one
    of 5 sites of 100,000) x 50 features, max_bin 256, the rows spread over 1, 8 and 32 nodes of a
    level. Printed: ratio = level_histograms / one bincount (median of --repeats).
(2) Training, in one process, with plain sums in place of the secure sum
    (fedpeer.ml.xgb.histrun.train_in_process: sketch, binning, every level of every tree) on
    100,000 x 50 synthetic rows over 5 sites, depth 6, max_bin 256 — against xgboost hist on the
    pooled rows with the same parameters (nthread 1 and all CPUs). This excludes the network: the
    job adds one secure sum per level and 33 for the sketch. --trees sets the trees (default 10;
    the issue's 50 takes ~5x as long).
(3) The issue's label-skewed case: 20,000 training rows (make_classification, 20 features) over
    5 sites holding 90/70/50/30/10 % positives, depth 6, 30 rounds at eta 0.3 and 100 at eta 0.1:
    test AUC of the in-process histogram mode vs xgboost hist on the pooled rows (goal: within
    0.002), and both times.
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
from fedpeer.ml.xgb import hist, histrun
from fedpeer.ml.xgb import model as xgbmodel

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
    bins = rng.integers(0, slots, size=(rows, FEATURES)).astype(np.uint16)   # row-major, as HistSite's bin_matrix
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


def bench_skew() -> list[dict]:
    X, y = make_classification(n_samples=25_000, n_features=20, n_informative=10, random_state=0)
    Xtr, ytr, Xte, yte = X[:20_000], y[:20_000], X[20_000:], y[20_000:]
    rng = np.random.default_rng(0)
    pos, neg = rng.permutation(np.flatnonzero(ytr == 1)), rng.permutation(np.flatnonzero(ytr == 0))
    sites, taken_pos, taken_neg = [], 0, 0
    for share in (0.9, 0.7, 0.5, 0.3, 0.1):
        n_pos = int(4_000 * share)
        rows = np.concatenate([pos[taken_pos:taken_pos + n_pos], neg[taken_neg:taken_neg + 4_000 - n_pos]])
        taken_pos, taken_neg = taken_pos + n_pos, taken_neg + 4_000 - n_pos
        sites.append((Xtr[rows], ytr[rows]))
    pooled_X, pooled_y = np.concatenate([s[0] for s in sites]), np.concatenate([s[1] for s in sites])
    out = []
    for rounds, eta in ((30, 0.3), (100, 0.1)):
        start = time.perf_counter()
        fed = histrun.train_in_process(sites, {"objective": "binary:logistic", "num_round": rounds, "eta": eta,
                                              "max_depth": DEPTH})
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        booster = xgb.train({"objective": "binary:logistic", "eta": eta, "max_depth": DEPTH, "tree_method": "hist",
                             "base_score": fed.base[0], "nthread": 1}, xgb.DMatrix(pooled_X, label=pooled_y), rounds)
        t_xgb = time.perf_counter() - start
        auc_ours = roc_auc_score(yte, xgbmodel.predict_proba(fed.model, Xte))
        auc_xgb = roc_auc_score(yte, booster.predict(xgb.DMatrix(Xte)))
        out.append({"rounds": rounds, "eta": eta, "fedpeer_auc": round(auc_ours, 4), "xgboost_auc": round(auc_xgb, 4),
                    "fedpeer_in_process_s": round(t_ours, 2), "xgboost_1thread_s": round(t_xgb, 2)})
        print(f"label skew, {rounds} rounds at eta {eta}: AUC fedpeer {auc_ours:.4f} vs xgboost {auc_xgb:.4f} "
              f"(diff {auc_ours - auc_xgb:+.4f}); {t_ours:.1f} s in process vs {t_xgb:.2f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trees", type=int, default=10)
    args = parser.parse_args()
    levels = bench_level(args.repeats)
    training = bench_training(args.trees)
    skew = bench_skew()
    print(json.dumps({"benchmark": "hist", "levels": levels, "training": training, "label_skew": skew}))


if __name__ == "__main__":
    main()
