"""The kmeans (or gmm) job on real daemons against scikit-learn's KMeans (GaussianMixture) on the
pooled rows (issue 16 item 7), measured side by side in one run, variants interleaved per repeat.

Data: `--rows` rows (default 200,000) x `--features` (20) drawn from a standard normal (no cluster
structure, so Lloyd keeps moving for all rounds), split evenly over `--sites` daemons (5); no label
column. Per repeat, in this order:
  1. kmeans job, k = `--k` (8), `--iterations` Lloyd rounds (20) with tol 0 (every round runs unless
     the assignment stops changing), `--secure-sum` (pairwise); with `--n-init` 1 (the default) one
     restart from explicit centres (`init`: the first k rows rounded to 2 decimals, so k x d values
     fit a parameter's 1024 characters), with `--n-init` N > 1 N restarts from centres the job draws
     with its seed — time = the slowest member's elapsed_s (start -> done; the CSV is read before,
     when the job is accepted);
  2. sklearn.cluster.KMeans(k, n_init, max_iter, tol 0, algorithm "lloyd") on the pooled rows, all
     CPUs: init = the same centres when n_init is 1, its default (k-means++) otherwise.
Reported: best-of and median seconds, the ratio job / scikit-learn (best-of and median), rounds run by
each, the largest relative difference between the job's centres and scikit-learn's (n_init 1) or
the in-process reference's (`reference_kmeans` on the pooled rows, n_init > 1: scikit-learn starts
elsewhere), bytes per round per site: the secure-sum vector each site adds (payload) and what each
daemon really sent (reliable bytes from `fedpeer status`, all traffic during the job including
membership) divided by the job's secure sums.

`--kind gmm`: the gmm job (`--covariance`, full by default; its k-means initialisation with
`--n-init` restarts and at most 300 rounds, scikit-learn's KMeans defaults; `--iterations` EM rounds
with tol 0) against GaussianMixture(k, covariance_type, max_iter, tol 0, n_init 1, init_params
"kmeans") on the pooled rows; the means are compared with the in-process reference
(`reference_kmeans` + `em_reference`).
The 1-minute load average is reported at the start and the end (the host may be shared).

Run: .venv/bin/python benchmarks/bench_kmeans.py [--rows 200000] [--features 20] [--repeats 1]
The issue's k-means case: --rows 60000 --features 50 --sites 3 --n-init 10 --iterations 20
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


async def run_job(h: Harness, kind: str, params: dict, timeout_s: float) -> dict:
    before = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    job_id = await h.propose(0, kind, params)
    records = await h.wait_job(job_id, timeout_s)
    after = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    bad = {i: r and r.get("error") for i, r in records.items() if not r or r["state"] != "done"}
    assert not bad, bad
    results = [r["result"] for r in records.values()]
    key = "centers" if kind == "kmeans" else "means"
    assert all(r[key] == results[0][key] for r in results), "members hold different centres"
    r = results[0]
    return {"seconds": max(rec["elapsed_s"] for rec in records.values()), "centers": np.array(r[key]),
            "rounds": r["iterations"], "secure_sums": r["secure_sums"],
            "payload_bytes_per_round": r["bytes_per_round_per_site"],
            "sent_bytes_per_sum": [(after[i] - before[i]) / r["secure_sums"] for i in before]}


def sklearn_pooled(X: np.ndarray, init: np.ndarray, iterations: int, n_init: int) -> dict:
    from sklearn.cluster import KMeans
    started = time.perf_counter()
    if n_init == 1:
        km = KMeans(len(init), init=init, n_init=1, max_iter=iterations, tol=0.0, algorithm="lloyd").fit(X)
    else:
        km = KMeans(len(init), n_init=n_init, max_iter=iterations, tol=0.0, algorithm="lloyd",
                    random_state=0).fit(X)
    seconds = time.perf_counter() - started
    order = cl.canonical_order(km.cluster_centers_)
    return {"seconds": seconds, "centers": km.cluster_centers_[order], "rounds": int(km.n_iter_)}


def sklearn_gmm(X: np.ndarray, k: int, covariance: str, iterations: int) -> dict:
    from sklearn.mixture import GaussianMixture
    started = time.perf_counter()
    gm = GaussianMixture(k, covariance_type=covariance, max_iter=iterations, tol=0.0, n_init=1,
                         init_params="kmeans", random_state=0).fit(X)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "centers": gm.means_[cl.canonical_order(gm.means_)], "rounds": int(gm.n_iter_)}


def reference_centers(X: np.ndarray, kind: str, params: dict) -> np.ndarray:
    """The in-process reference's centres or means (the job's own initial centres, pooled rows)."""
    from fedpeer.ml.cluster import mixture as mx
    space, lloyd, _ = cl.reference_kmeans(X, k=params["k"], seed=params["seed"], n_init=params["n_init"],
                                          standardize=False, tol=params.get("tol", 0.0) if kind == "kmeans" else 1e-4,
                                          max_iter=params.get("kmeans_max_iter", params["max_iter"]),
                                          fuzziness=1.0, init=None)
    centers = space.back(lloyd.restarts[lloyd.best()].centers)
    if kind == "gmm":
        model, _, _ = mx.em_reference(X, centers, cl.nearest(X, centers)[0], covariance=params["covariance"],
                                      reg_covar=1e-6, tol=0.0, max_iter=params["max_iter"])
        centers = model.means
    return centers[cl.canonical_order(centers)]


def job_params(args: argparse.Namespace, init_text: str) -> dict:
    params = {"k": args.k, "init": init_text, "max_iter": args.iterations, "tol": 0.0, "secure_sum": args.secure_sum}
    if args.n_init > 1 or args.kind == "gmm":
        params.update(init="", n_init=args.n_init, seed=1)
    if args.kind == "gmm":
        params.update(covariance=args.covariance, kmeans_max_iter=300)
    return params


def pooled_reference(X: np.ndarray, init: np.ndarray, args: argparse.Namespace) -> dict:
    if args.kind == "gmm":
        return sklearn_gmm(X, args.k, args.covariance, args.iterations)
    return sklearn_pooled(X, init, args.iterations, args.n_init)


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
        params = job_params(args, text)
        load_start = os.getloadavg()[0]
        h = Harness(tmp / "fed", args.sites, site_data=paths, data_settings=DATA)
        h.create()
        h.start()
        jobs: list[dict] = []
        pooled: list[dict] = []
        try:
            await h.wait_all_alive(60)
            await h.wait_ml_loaded(180)     # the daemons' background preload is not the first job's time
            for rep in range(args.repeats):
                jobs.append(await run_job(h, args.kind, params, args.timeout_s))
                pooled.append(pooled_reference(X, init, args))
                print(f"repeat {rep + 1}: job {jobs[-1]['seconds']:.2f} s, sklearn {pooled[-1]['seconds']:.3f} s",
                      file=sys.stderr)
        finally:
            h.stop()
    load_end = os.getloadavg()[0]
    job, sk = best_median(jobs), best_median(pooled)
    exact = args.kind == "kmeans" and args.n_init == 1
    against = pooled[0]["centers"] if exact else reference_centers(X, args.kind, params)
    diff = np.abs(jobs[0]["centers"] - against) / np.maximum(np.abs(against), 1e-300)
    sent = jobs[0]["sent_bytes_per_sum"]
    return {
        f"{args.kind}_job": job, f"sklearn_{args.kind}_pooled": sk,
        "ratio_job_vs_sklearn": round(job["best_s"] / sk["best_s"], 1),
        "ratio_job_vs_sklearn_median": round(job["median_s"] / sk["median_s"], 1),
        "centres_compared_with": "sklearn" if exact else "in-process reference",
        "load_average_1min": {"start": load_start, "end": load_end},
        "centres_max_relative_difference": float(diff.max()),
        "payload_bytes_per_round_per_site": jobs[0]["payload_bytes_per_round"],
        "sent_bytes_per_secure_sum_per_site": {"min": int(min(sent)), "median": int(statistics.median(sent)),
                                               "max": int(max(sent))},
        "setup": {"kind": args.kind, "rows": args.rows, "features": args.features, "sites": args.sites, "k": args.k,
                  "iterations": args.iterations, "n_init": args.n_init, "repeats": args.repeats, "cpus": os.cpu_count(),
                  "secure_sum": args.secure_sum},
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("kmeans", "gmm"), default="kmeans")
    ap.add_argument("--covariance", choices=("full", "diag"), default="full", help="gmm only")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--n-init", type=int, default=1, help="restarts; > 1: centres drawn by the job's seed "
                    "(scikit-learn: its own k-means++ init, same n_init)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--secure-sum", choices=("pairwise", "ring"), default="pairwise")
    ap.add_argument("--timeout-s", type=float, default=3600)
    print(json.dumps(asyncio.run(main(ap.parse_args())), indent=1))
