"""The kmeans job on real daemons against scikit-learn's KMeans on the pooled rows (issue 16 item 7),
measured side by side in one run, variants interleaved per repeat.

Data: `--rows` rows (default 200,000) x `--features` (20) drawn from a standard normal (no cluster
structure, so Lloyd keeps moving for all rounds), split evenly over `--sites` daemons (5); no label
column. Per repeat, in this order:
  1. kmeans job, k = `--k` (8), `--iterations` Lloyd rounds (20) with tol 0 (every round runs unless
     the assignment stops changing), one restart from explicit centres (`init`: the first k rows
     rounded to 2 decimals, so k x d values fit a parameter's 1024 characters), `--secure-sum`
     (pairwise) — time = the slowest member's elapsed_s (start -> done; the CSV is read before, when the
     job is accepted);
  2. sklearn.cluster.KMeans(init=the same centres, n_init=1, max_iter, tol 0, algorithm "lloyd") on
     the pooled rows, all CPUs.
Reported: best-of and median seconds, the ratio job / scikit-learn, rounds run by each, the largest
relative difference between the two sets of centres, bytes per round per site: the secure-sum
vector each site adds (payload) and what each daemon really sent (reliable bytes from `fedpeer
status`, all traffic during the job including membership) divided by the job's secure sums.

Run: .venv/bin/python benchmarks/bench_kmeans.py [--rows 200000] [--features 20] [--repeats 1]
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
from fedpeer.app.harness.federation import Harness  # noqa: E402
from fedpeer.ml.cluster import kmeans as cl  # noqa: E402

DATA = {"label": "", "positive": "", "ignore": [], "missing": "error"}


def make_data(tmp: Path, rows: int, features: int, sites: int) -> tuple[list[Path], np.ndarray]:
    X = np.random.default_rng(7).standard_normal((rows, features))
    per = rows // sites
    header = ",".join(f"f{j}" for j in range(features))
    paths = []
    for k in range(sites):
        path = tmp / f"site{k}.csv"
        np.savetxt(path, X[k * per:(k + 1) * per], delimiter=",", header=header, comments="", fmt="%.17g")
        paths.append(path)
    return paths, X[:per * sites]


async def run_job(h: Harness, params: dict, timeout_s: float) -> dict:
    before = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    job_id = await h.propose(0, "kmeans", params)
    records = await h.wait_job(job_id, timeout_s)
    after = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    bad = {i: r and r.get("error") for i, r in records.items() if not r or r["state"] != "done"}
    assert not bad, bad
    results = [r["result"] for r in records.values()]
    assert all(r["centers"] == results[0]["centers"] for r in results), "members hold different centres"
    r = results[0]
    return {"seconds": max(rec["elapsed_s"] for rec in records.values()), "centers": np.array(r["centers"]),
            "rounds": r["iterations"], "secure_sums": r["secure_sums"],
            "payload_bytes_per_round": r["bytes_per_round_per_site"],
            "sent_bytes_per_sum": [(after[i] - before[i]) / r["secure_sums"] for i in before]}


def sklearn_pooled(X: np.ndarray, init: np.ndarray, iterations: int) -> dict:
    from sklearn.cluster import KMeans
    started = time.perf_counter()
    km = KMeans(len(init), init=init, n_init=1, max_iter=iterations, tol=0.0, algorithm="lloyd").fit(X)
    seconds = time.perf_counter() - started
    order = cl.canonical_order(km.cluster_centers_)
    return {"seconds": seconds, "centers": km.cluster_centers_[order], "rounds": int(km.n_iter_)}


def best_median(samples: list[dict]) -> dict:
    secs = [s["seconds"] for s in samples]
    return {"best_s": round(min(secs), 3), "median_s": round(statistics.median(secs), 3),
            "rounds": samples[0]["rounds"]}


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        paths, X = make_data(tmp, args.rows, args.features, args.sites)
        init = np.round(X[:args.k], 2)      # 2 decimals: k x d values fit a parameter's 1024 characters
        text = ";".join(",".join(f"{v:.2f}" for v in row) for row in init)
        params = {"k": args.k, "init": text, "max_iter": args.iterations, "tol": 0.0, "secure_sum": args.secure_sum}
        h = Harness(tmp / "fed", args.sites, site_data=paths, data_settings=DATA)
        h.create()
        h.start()
        jobs: list[dict] = []
        pooled: list[dict] = []
        try:
            await h.wait_all_alive(60)
            for rep in range(args.repeats):
                jobs.append(await run_job(h, params, args.timeout_s))
                pooled.append(sklearn_pooled(X, init, args.iterations))
                print(f"repeat {rep + 1}: job {jobs[-1]['seconds']:.2f} s, sklearn {pooled[-1]['seconds']:.3f} s",
                      file=sys.stderr)
        finally:
            h.stop()
    job, sk = best_median(jobs), best_median(pooled)
    diff = np.abs(jobs[0]["centers"] - pooled[0]["centers"]) / np.maximum(np.abs(pooled[0]["centers"]), 1e-300)
    sent = jobs[0]["sent_bytes_per_sum"]
    return {
        "kmeans_job": job, "sklearn_kmeans_pooled": sk,
        "ratio_job_vs_sklearn": round(job["best_s"] / sk["best_s"], 1),
        "centres_max_relative_difference": float(diff.max()),
        "payload_bytes_per_round_per_site": jobs[0]["payload_bytes_per_round"],
        "sent_bytes_per_secure_sum_per_site": {"min": int(min(sent)), "median": int(statistics.median(sent)),
                                               "max": int(max(sent))},
        "setup": {"rows": args.rows, "features": args.features, "sites": args.sites, "k": args.k,
                  "iterations": args.iterations, "repeats": args.repeats, "cpus": os.cpu_count(),
                  "secure_sum": args.secure_sum},
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--secure-sum", choices=("pairwise", "ring"), default="pairwise")
    ap.add_argument("--timeout-s", type=float, default=3600)
    print(json.dumps(asyncio.run(main(ap.parse_args())), indent=1))
