"""Histogram-mode xgboost on real daemons against xgboost hist on the pooled rows (and, with
--bagging, against bagging mode). Everything in one run, variants interleaved per repeat.

Data: make_classification, `--rows` training rows (default 80,000) x `--features` (50, half of them
informative), split evenly over `--sites` daemons (5), plus 20 % as many held-out rows (the
default: 20,000) every site scores the final model on (`[data] test_csv`). Per repeat, in order:
  1. histogram job: `--trees` rounds (50), depth 6, max_bin 256, eta 0.3, the default secure sum
     (the all-reduce), test_fraction 0, eval_every 0 (no evaluation rounds: training only),
     once every daemon has loaded its ML libraries —
     time = the slowest member's elapsed_s (proposal -> done); CPU = utime + stime of every
     daemon process over the job (/proc), i.e. all the federation's work on this one machine;
  2. (--bagging) bagging jobs with the same trees and with the same rounds;
  3. xgboost.train(tree_method=hist) on the pooled rows, same parameters, nthread 1 (its CPU is
     its process time) and all CPUs;
  4. the in-process histogram builder (fedpeer.ml.xgb.histrun.train_in_process: the same sites
     summed with plain additions, no network), its process time against xgboost's nthread 1.
Reported: best-of and median of each; the ratios (wall vs xgboost nthread 1, CPU of all daemons vs
xgboost's CPU, builder CPU vs xgboost's CPU); bytes sent per site per tree (max, mean, max/mean) and
the federation's per tree (reliable bytes, from `fedpeer status`); peak RSS per daemon; test AUC.

Run: .venv/bin/python benchmarks/bench_xgbhist_job.py [--rows 80000] [--trees 50] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_bofrf import peak_rss_mib  # noqa: E402
from bench_kinds import cpu_seconds  # noqa: E402

from fedpeer.app.harness.federation import Harness  # noqa: E402

DATA = {"label": "label", "positive": "1", "ignore": [], "missing": "error"}
COMMON = {"max_depth": 6, "eta": 0.3, "max_bin": 256, "test_fraction": 0.0, "nthread": 1, "reg_lambda": 1.0,
          "min_child_weight": 1.0, "eval_every": 0}


def write_csv(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    header = ",".join([f"f{j}" for j in range(X.shape[1])] + ["label"])
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header=header, comments="",
               fmt=["%.17g"] * X.shape[1] + ["%d"])
    return path


def make_data(tmp: Path, rows: int, features: int, sites: int) -> tuple[list[Path], Path, tuple, tuple]:
    from sklearn.datasets import make_classification
    test_rows = rows // 5
    X, y = make_classification(n_samples=rows + test_rows, n_features=features, n_informative=features // 2,
                               random_state=7)
    Xtr, ytr, Xte, yte = X[:rows], y[:rows], X[rows:], y[rows:]
    per = rows // sites
    paths = [write_csv(tmp / f"site{k}.csv", Xtr[k * per:(k + 1) * per], ytr[k * per:(k + 1) * per])
             for k in range(sites)]
    return paths, write_csv(tmp / "test.csv", Xte, yte), (Xtr, ytr), (Xte, yte)


async def run_job(h: Harness, params: dict, timeout_s: float) -> dict:
    pids = [site.process.pid for site in h.sites]
    before = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    cpu0 = cpu_seconds(pids)
    job_id = await h.propose(0, "xgboost", params)
    records = await h.wait_job(job_id, timeout_s)
    cpu = cpu_seconds(pids) - cpu0
    after = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    bad = {i: r and r.get("error") for i, r in records.items() if not r or r["state"] != "done"}
    assert not bad, bad
    results = [r["result"] for r in records.values()]
    assert len({r["model_sha256"] for r in results}) == 1, "members hold different models"
    return {"seconds": max(r["elapsed_s"] for r in records.values()), "trees": results[0]["trees"], "cpu_s": cpu,
            "test_auc": results[0]["auc"], "sent_bytes": [after[i] - before[i] for i in before]}


def xgboost_pooled(train: tuple, test: tuple, trees: int, nthread: int) -> dict:
    import xgboost as xgb
    from sklearn.metrics import roc_auc_score
    params = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": COMMON["max_depth"],
              "eta": COMMON["eta"], "max_bin": COMMON["max_bin"], "lambda": 1.0, "min_child_weight": 1.0,
              "nthread": nthread}
    started, cpu0 = time.perf_counter(), time.process_time()
    booster = xgb.train(params, xgb.DMatrix(train[0], label=train[1], nthread=nthread), trees)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
    return {"seconds": seconds, "cpu_s": cpu,
            "test_auc": float(roc_auc_score(test[1], booster.predict(xgb.DMatrix(test[0]))))}


def builder_in_process(train: tuple, sites: int, trees: int) -> dict:
    """The histogram builder with plain sums, in this process (one thread: OMP and BLAS at 1)."""
    from fedpeer.ml.xgb.histrun import train_in_process
    per = len(train[1]) // sites
    parts = [(train[0][k * per:(k + 1) * per], train[1][k * per:(k + 1) * per]) for k in range(sites)]
    params = {"objective": "binary:logistic", "num_round": trees, "eta": COMMON["eta"],
              "max_depth": COMMON["max_depth"], "max_bin": COMMON["max_bin"], "reg_lambda": 1.0,
              "min_child_weight": 1.0}
    started, cpu0 = time.perf_counter(), time.process_time()
    train_in_process(parts, params)
    return {"seconds": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0, "test_auc": None}


def summary(samples: list[dict]) -> dict:
    secs, cpus = [s["seconds"] for s in samples], [s["cpu_s"] for s in samples]
    return {"best_s": round(min(secs), 3), "median_s": round(statistics.median(secs), 3),
            "best_cpu_s": round(min(cpus), 3), "median_cpu_s": round(statistics.median(cpus), 3),
            "test_auc": samples[0]["test_auc"], **({"trees": samples[0]["trees"]} if "trees" in samples[0] else {})}


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        paths, test_csv, train, test = make_data(tmp, args.rows, args.features, args.sites)
        h = Harness(tmp / "fed", args.sites, site_data=paths, data_settings=DATA, test_data=test_csv)
        h.create()
        h.start()
        variants = {"histogram": {**COMMON, "mode": "histogram", "rounds": args.trees}}
        if args.bagging:
            variants["bagging_same_trees"] = {**COMMON, "mode": "bagging", "normalize": "none",
                                              "rounds": max(1, args.trees // args.sites)}
            variants["bagging_same_rounds"] = {**COMMON, "mode": "bagging", "normalize": "none", "rounds": args.trees}
        runs: dict[str, list[dict]] = {name: [] for name in [*variants, "xgboost_1_thread", "xgboost_all_threads",
                                                             "builder_in_process"]}
        try:
            await h.wait_all_alive(60)
            await h.wait_ml_loaded(180)     # the daemons' ML imports are not the job's CPU
            for rep in range(args.repeats):
                for name, params in variants.items():
                    runs[name].append(await run_job(h, params, args.timeout_s))
                    print(f"repeat {rep + 1}: {name} {runs[name][-1]['seconds']:.2f} s", file=sys.stderr)
                runs["xgboost_1_thread"].append(xgboost_pooled(train, test, args.trees, 1))
                runs["xgboost_all_threads"].append(xgboost_pooled(train, test, args.trees, os.cpu_count() or 1))
                runs["builder_in_process"].append(builder_in_process(train, args.sites, args.trees))
            rss = [round(peak_rss_mib(site.process.pid), 1) for site in h.sites]
        finally:
            h.stop()
    out = {name: summary(samples) for name, samples in runs.items()}
    hist = out["histogram"]
    trees = hist["trees"]
    sent = [b / trees for b in runs["histogram"][0]["sent_bytes"]]
    xgb1 = out["xgboost_1_thread"]
    out["ratios"] = {
        "histogram_wall_vs_xgboost_1_thread": round(hist["best_s"] / xgb1["best_s"], 2),
        "histogram_wall_vs_xgboost_all_threads": round(hist["best_s"] / out["xgboost_all_threads"]["best_s"], 2),
        "histogram_cpu_all_daemons_vs_xgboost_cpu": round(hist["best_cpu_s"] / xgb1["best_cpu_s"], 2),
        "builder_cpu_vs_xgboost_cpu": round(out["builder_in_process"]["best_cpu_s"] / xgb1["best_cpu_s"], 2),
        **{f"histogram_vs_{name}": round(hist["best_s"] / out[name]["best_s"], 2)
           for name in variants if name != "histogram"},
    }
    out["auc_difference_vs_xgboost"] = round(hist["test_auc"] - xgb1["test_auc"], 4)
    out["histogram_bytes_per_site_per_tree"] = {"min": int(min(sent)), "mean": int(statistics.mean(sent)),
                                                "max": int(max(sent)),
                                                "max_over_mean": round(max(sent) / statistics.mean(sent), 2),
                                                "federation": int(sum(sent))}
    out["peak_rss_mib_per_daemon"] = rss
    out["setup"] = {"load_1min": round(os.getloadavg()[0], 1),
                    "rows": args.rows, "features": args.features, "sites": args.sites, "trees": args.trees,
                    "repeats": args.repeats, "cpus": os.cpu_count(), **COMMON}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=80_000)
    ap.add_argument("--features", type=int, default=50)
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--trees", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=3600)
    ap.add_argument("--bagging", action="store_true", help="also run the two bagging variants")
    print(json.dumps(asyncio.run(main(ap.parse_args())), indent=1))
