"""Every job kind on real daemons against its reference on the pooled rows, in one run (issue 25
item 6: every kind's job within 3x of its pooled reference on loopback).

Two data sets, one `Harness` federation of `--sites` daemons (3) each, rows split evenly:
  * labelled: make_classification, `--rows` training rows (30,000) x `--features` (20, half
    informative), plus `--rows` / 5 held-out rows every site gets as `[data] test_csv`;
  * blobs: make_blobs, `--blob-rows` (30,000) x `--blob-features` (10), 8 centres, std 1, centres in
    a +-20 box; no label column.
Before measuring, every daemon has logged `ml_libraries_loaded` and ran one warm-up job of each
kind (small parameters), and each reference ran once with the same, so neither side pays a first
import. Proposals wait (unmeasured) for the daemons' proposal budget (8 at once, then one per 2 s).
Then per repeat, per kind, in this order: the job (proposed at site 1; time = the slowest member's
elapsed_s, start -> done, the CSV read before; CPU = utime + stime of every daemon process from
proposal to done, /proc), then its reference in this process on the pooled rows
(time.perf_counter; CPU = process_time, all threads), with the same parameters:
  stats              numpy: count, mean, std (ddof 1), and the job's histograms (bins between
                     mean +- 3 sd, one below, one above) of every column
  xgboost-histogram  xgboost.train(tree_method hist, same depth / eta / max_bin / lambda /
                     min_child_weight, nthread 1), `rounds` trees
  xgboost-bagging    the job in mode bagging (each round one tree per site, same rounds): the SAME
                     xgboost reference as histogram mode (the pooled model it approximates)
  bofrf              fedpeer.kinds.forest.bofrf.reference: the same steps (per-site forests on the
                     same per-site rows, confusion sums, weights) in one process, sites one after
                     another; not a pooled-rows model (BOFRF keeps one model per site)
  tree               sklearn DecisionTreeClassifier(criterion, max_depth, min_samples_leaf =
                     min_leaf_rows, ccp_alpha) on the raw pooled rows (the job grows on max_bin cut
                     points), if this build's catalogue has the kind
  logreg             StandardScaler + LogisticRegression(C, newton-cholesky, tol = the job's tol,
                     max_iter): the job's exact mode claims these coefficients
  mlp                StandardScaler + MLPClassifier(same hidden layers, alpha, plain SGD, learning
                     rate, batch size, rounds x local_epochs epochs, no early stop)
  kmeans             KMeans(k, n_init, max_iter, tol, lloyd) (its own k-means++ starts)
  gmm                GaussianMixture(k, covariance, reg_covar, max_iter, tol, init_params kmeans)
                     (one k-means start, as the job with n_init 1)
  dbscan             DBSCAN(eps, min_samples)
Quality, next to each other, so that a fast but wrong result shows: test AUC on the held-out rows
(xgboost, tree, logreg, mlp; logreg also the largest difference of the standardised
coefficients), the mean over sites of each site's final AUC on its own test part (bofrf), the
largest relative difference of the means and standard deviations (stats), the inertia (kmeans),
the mean log-likelihood per row (gmm) and, for the three clustering kinds, the adjusted Rand index
against the blobs' true labels (the job's clusters from its stored model on the pooled rows).
Reported per kind: job and reference best / median s, ratio best / best (and median / median), CPU
ratio (best / best), the quality figures; the 1-minute load average at the start and end of each
federation; the last line is one JSON object of everything. sumcheck (a protocol check, no model)
is left out.

Run: .venv/bin/python benchmarks/bench_kinds.py [--sites 3] [--repeats 2] [--kinds logreg kmeans ...]
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
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness  # noqa: E402
from fedpeer.kinds.catalog import job_kinds  # noqa: E402

LABELLED = {"label": "label", "positive": "1", "ignore": [], "missing": "error"}
UNLABELLED = {"label": "", "positive": "", "ignore": [], "missing": "error"}
TICKS = os.sysconf("SC_CLK_TCK")
CENTRES = 8


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes so far (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# -- data -----------------------------------------------------------------------------------


@dataclass
class Data:
    name: str
    X: np.ndarray                 # the pooled training rows, in site order
    y: np.ndarray | None          # labels (labelled) or the blobs' true clusters (blobs)
    site_paths: list[Path]
    test: tuple[np.ndarray, np.ndarray] | None = None
    test_path: Path | None = None
    settings: dict = field(default_factory=dict)
    features: list[str] = field(default_factory=list)

    def rows(self, names: Any) -> np.ndarray:
        index = {f: j for j, f in enumerate(self.features)}
        return self.X[:, [index[f] for f in names]]


def write_csv(path: Path, X: np.ndarray, y: np.ndarray | None) -> Path:
    names = [f"f{j}" for j in range(X.shape[1])]
    if y is None:
        np.savetxt(path, X, delimiter=",", header=",".join(names), comments="", fmt="%.17g")
    else:
        np.savetxt(path, np.column_stack([X, y]), delimiter=",", header=",".join([*names, "label"]), comments="",
                   fmt=["%.17g"] * X.shape[1] + ["%d"])
    return path


def split(X: np.ndarray, y: np.ndarray | None, sites: int, tmp: Path, prefix: str,
          with_label: bool) -> tuple[np.ndarray, np.ndarray | None, list[Path]]:
    per = len(X) // sites
    X, y = X[:per * sites], (None if y is None else y[:per * sites])
    paths = [write_csv(tmp / f"{prefix}{k}.csv", X[k * per:(k + 1) * per],
                       y[k * per:(k + 1) * per] if with_label and y is not None else None) for k in range(sites)]
    return X, y, paths


def labelled_data(tmp: Path, rows: int, features: int, sites: int) -> Data:
    from sklearn.datasets import make_classification
    test_rows = rows // 5
    X, y = make_classification(n_samples=rows + test_rows, n_features=features, n_informative=features // 2,
                               random_state=7)
    Xtr, ytr, paths = split(X[:rows], y[:rows], sites, tmp, "labelled", with_label=True)
    test = (X[rows:], y[rows:])
    return Data("labelled", Xtr, ytr, paths, test, write_csv(tmp / "test.csv", *test), LABELLED,
                [f"f{j}" for j in range(features)])


def blobs_data(tmp: Path, rows: int, features: int, sites: int) -> Data:
    from sklearn.datasets import make_blobs
    X, y = make_blobs(rows, n_features=features, centers=CENTRES, cluster_std=1.0, center_box=(-20, 20),
                      random_state=7)
    # the blobs come shuffled: every site holds rows of every cluster
    X, y, paths = split(X, y, sites, tmp, "blobs", with_label=False)
    return Data("blobs", X, y, paths, None, None, UNLABELLED, [f"f{j}" for j in range(features)])


# -- references -----------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    started, cpu0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - started, time.process_time() - cpu0


def auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, score))


def ari(truth: np.ndarray, labels: np.ndarray) -> float:
    from sklearn.metrics import adjusted_rand_score
    return round(float(adjusted_rand_score(truth, labels)), 4)


def ref_stats(d: Data, p: dict) -> dict:
    X, y, bins = d.X, d.y, p["bins"]

    def run() -> tuple:
        n = len(X)
        mean, std = X.mean(axis=0), X.std(axis=0, ddof=1)
        hists = []
        for j in range(X.shape[1]):
            edges = np.linspace(mean[j] - 3 * std[j], mean[j] + 3 * std[j], bins + 1)
            inside, _ = np.histogram(X[:, j], edges)
            hists.append((int((X[:, j] < edges[0]).sum()), inside, int((X[:, j] > edges[-1]).sum())))
        return n, float(y.mean()), mean, std, hists
    (_, _, mean, std, _), wall, cpu = timed(run)
    return {"seconds": wall, "cpu_s": cpu, "mean": mean, "std": std}


def xgb_params(p: dict) -> dict:
    return {"objective": "binary:logistic", "tree_method": "hist", "max_depth": p["max_depth"], "eta": p["eta"],
            "max_bin": p["max_bin"], "lambda": p["reg_lambda"], "min_child_weight": p["min_child_weight"],
            "nthread": 1}


def ref_xgboost(d: Data, p: dict) -> dict:
    import xgboost as xgb
    booster, wall, cpu = timed(lambda: xgb.train(xgb_params(p), xgb.DMatrix(d.X, label=d.y, nthread=1),
                                                 p["rounds"]))
    return {"seconds": wall, "cpu_s": cpu, "quality": {"test_auc": auc(d.test[1], booster.predict(
        xgb.DMatrix(d.test[0], nthread=1)))}}


def ref_bofrf(d: Data, p: dict, context: dict) -> dict:
    from fedpeer.kinds.forest import bofrf
    full = {k: v.default for k, v in job_kinds()["bofrf"].params.items()} | p
    results, wall, cpu = timed(lambda: bofrf.reference(context["bofrf_datasets"], context["bofrf_keys"], full))
    return {"seconds": wall, "cpu_s": cpu,
            "quality": {"mean_site_final_auc": round(statistics.mean(r[0]["final"]["auc"] for r in results), 4)}}


def ref_tree(d: Data, p: dict) -> dict:
    from sklearn.tree import DecisionTreeClassifier
    model, wall, cpu = timed(lambda: DecisionTreeClassifier(
        criterion=p["criterion"], max_depth=p["max_depth"], min_samples_leaf=p["min_leaf_rows"],
        ccp_alpha=p["ccp_alpha"], random_state=0).fit(d.X, d.y))
    return {"seconds": wall, "cpu_s": cpu,
            "quality": {"test_auc": auc(d.test[1], model.predict_proba(d.test[0])[:, 1])}}


def ref_logreg(d: Data, p: dict) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    def run() -> tuple:
        scaler = StandardScaler().fit(d.X)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = LogisticRegression(C=p["C"], solver="newton-cholesky", tol=p["tol"],
                                       max_iter=p["max_iter"]).fit(scaler.transform(d.X), d.y)
        return scaler, model
    (scaler, model), wall, cpu = timed(run)
    return {"seconds": wall, "cpu_s": cpu, "coef_standardised": model.coef_[0],
            "quality": {"test_auc": auc(d.test[1], model.predict_proba(scaler.transform(d.test[0]))[:, 1])}}


def ref_mlp(d: Data, p: dict) -> dict:
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler
    epochs = p["rounds"] * p["local_epochs"]

    def run() -> tuple:
        scaler = StandardScaler().fit(d.X)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = MLPClassifier(hidden_layer_sizes=tuple(int(v) for v in p["hidden_layer_sizes"].split(",")),
                                  solver="sgd", momentum=0.0, nesterovs_momentum=False, learning_rate="constant",
                                  learning_rate_init=p["learning_rate"], batch_size=p["batch_size"],
                                  alpha=p["alpha"], max_iter=epochs, tol=0.0, n_iter_no_change=epochs + 1,
                                  shuffle=True, random_state=0).fit(scaler.transform(d.X), d.y)
        return scaler, model
    (scaler, model), wall, cpu = timed(run)
    return {"seconds": wall, "cpu_s": cpu,
            "quality": {"test_auc": auc(d.test[1], model.predict_proba(scaler.transform(d.test[0]))[:, 1])}}


def ref_kmeans(d: Data, p: dict) -> dict:
    from sklearn.cluster import KMeans
    model, wall, cpu = timed(lambda: KMeans(p["k"], n_init=p["n_init"], max_iter=p["max_iter"], tol=p["tol"],
                                            algorithm="lloyd", random_state=0).fit(d.X))
    return {"seconds": wall, "cpu_s": cpu, "quality": {"inertia": float(model.inertia_),
                                                       "ari": ari(d.y, model.labels_)}}


def ref_gmm(d: Data, p: dict) -> dict:
    from sklearn.mixture import GaussianMixture
    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # "did not converge" after the warm-up's one round
            return GaussianMixture(p["k"], covariance_type=p["covariance"], reg_covar=p["reg_covar"],
                                   max_iter=p["max_iter"], tol=p["tol"], n_init=1, init_params="kmeans",
                                   random_state=0).fit(d.X)
    model, wall, cpu = timed(run)
    return {"seconds": wall, "cpu_s": cpu, "quality": {"mean_log_likelihood": round(float(model.score(d.X)), 4),
                                                       "ari": ari(d.y, model.predict(d.X))}}


def ref_dbscan(d: Data, p: dict) -> dict:
    from sklearn.cluster import DBSCAN
    labels, wall, cpu = timed(lambda: DBSCAN(eps=p["eps"], min_samples=p["min_samples"]).fit_predict(d.X))
    return {"seconds": wall, "cpu_s": cpu, "quality": {"clusters": int(labels.max()) + 1,
                                                       "noise": round(float((labels < 0).mean()), 4),
                                                       "ari": ari(d.y, labels)}}


# -- the jobs' quality ----------------------------------------------------------------------


def auc_quality(results: list[dict], d: Data, ref: dict | None = None) -> dict:
    r = results[0]
    return {"test_auc": (r.get("test_csv") or {}).get("auc", r.get("auc"))}


def q_stats(results: list[dict], d: Data, ref: dict) -> dict:
    r = results[0]
    mean = np.array([r["mean"][f] for f in d.features])
    std = np.array([r["std"][f] for f in d.features])
    diff = max(float(np.max(np.abs(mean - ref["mean"]) / ref["std"])), float(np.max(np.abs(std / ref["std"] - 1))))
    return {"rows": r["count"], "max_rel_diff_mean_std": float(f"{diff:.2g}")}


def q_bofrf(results: list[dict], d: Data, ref: dict) -> dict:
    return {"mean_site_final_auc": round(statistics.mean(r["final"]["auc"] for r in results), 4)}


def q_logreg(results: list[dict], d: Data, ref: dict) -> dict:
    coef = np.array(results[0]["coef_standardised"][0])
    diff = np.max(np.abs(coef - ref["coef_standardised"]))
    return {**auc_quality(results, d), "max_abs_coef_diff": float(f"{diff:.2g}")}


def job_clusters(kind: str, results: list[dict], d: Data) -> np.ndarray:
    r = results[0]
    rows = job_kinds()[kind].predict(Path(r["model_file"]), r, d.rows)
    return np.array([row["cluster"] for row in rows])


def q_kmeans(results: list[dict], d: Data, ref: dict) -> dict:
    return {"inertia": float(results[0]["inertia"]), "ari": ari(d.y, job_clusters("kmeans", results, d))}


def q_gmm(results: list[dict], d: Data, ref: dict) -> dict:
    return {"mean_log_likelihood": round(float(results[0]["mean_log_likelihood"]), 4),
            "ari": ari(d.y, job_clusters("gmm", results, d))}


def q_dbscan(results: list[dict], d: Data, ref: dict) -> dict:
    r = results[0]
    return {"clusters": r["clusters"], "noise": round(float(r["noise_fraction"]), 4),
            "ari": ari(d.y, job_clusters("dbscan", results, d))}


# -- the cases ------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    kind: str
    data: str                                   # "labelled" or "blobs"
    params: dict
    reference: Callable[..., dict]
    quality: Callable[[list[dict], Data, dict], dict]
    warm: dict                                  # parameter changes of the warm-up job (and reference)
    note: str = ""
    full: dict = field(default_factory=dict)    # the kind's defaults with `params` over them


def cases(args: argparse.Namespace) -> list[Case]:
    xgb = {"rounds": args.trees, "max_depth": 6, "eta": 0.3, "max_bin": 256, "reg_lambda": 1.0,
           "min_child_weight": 1.0, "nthread": 1, "test_fraction": 0.0, "eval_every": 0}
    return [
        Case("stats", "stats", "labelled", {"bins": 10}, ref_stats, q_stats, {}),
        Case("xgboost-histogram", "xgboost", "labelled", {**xgb, "mode": "histogram"}, ref_xgboost, auc_quality,
             {"rounds": 1}),
        Case("xgboost-bagging", "xgboost", "labelled", {**xgb, "mode": "bagging", "normalize": "none"},
             ref_xgboost, auc_quality, {"rounds": 1},
             note="same xgboost reference as histogram mode; bagging grows sites x rounds trees"),
        Case("bofrf", "bofrf", "labelled", {"n_estimators": args.forest_trees, "seed": 1}, ref_bofrf, q_bofrf,
             {"n_estimators": 2}, note="reference: bofrf.reference, the same per-site steps in one process"),
        Case("tree", "tree", "labelled", {"criterion": "gini", "max_depth": 5, "min_leaf_rows": 5, "ccp_alpha": 0.0,
                                          "test_fraction": 0.0}, ref_tree, auc_quality, {"max_depth": 1}),
        Case("logreg", "logreg", "labelled", {"mode": "exact", "C": 1.0, "tol": 1e-8, "max_iter": 100,
                                              "test_fraction": 0.0}, ref_logreg,
             q_logreg, {"max_iter": 1}),
        Case("mlp", "mlp", "labelled", {"hidden_layer_sizes": "16", "alpha": 1e-4, "rounds": 20, "local_epochs": 1,
                                        "learning_rate": 0.05, "batch_size": 32, "test_fraction": 0.0}, ref_mlp,
             auc_quality, {"rounds": 1}),
        Case("kmeans", "kmeans", "blobs", {"k": CENTRES, "n_init": 10, "max_iter": 20, "tol": 0.0, "seed": 0},
             ref_kmeans, q_kmeans, {"n_init": 1, "max_iter": 1}),
        Case("gmm", "gmm", "blobs", {"k": CENTRES, "covariance": "full", "reg_covar": 1e-6, "max_iter": 100,
                                     "tol": 1e-3, "seed": 0, "n_init": 1}, ref_gmm, q_gmm,
             {"max_iter": 1, "kmeans_max_iter": 1, "n_init": 1},
             note="one k-means start on both sides (the job: n_init 1)"),
        Case("dbscan", "dbscan", "blobs", {"eps": args.eps, "min_samples": 5, "seed": 0}, ref_dbscan, q_dbscan,
             {"min_samples": 100_000}),     # warm-up: every row local noise, nothing to describe
    ]


def pick(all_cases: list[Case], wanted: list[str] | None, known: dict, secure_sum: str | None = None) -> list[Case]:
    chosen = [c for c in all_cases if c.kind in known]
    if wanted:
        unknown = [w for w in wanted if not any(w in (c.name, c.kind) for c in all_cases)]
        if unknown:
            sys.exit(f"--kinds: {', '.join(unknown)}: not a case here (cases: {', '.join(c.name for c in all_cases)})")
        missing = [w for w in wanted if not any(w in (c.name, c.kind) for c in chosen)]
        if missing:
            sys.exit(f"--kinds: {', '.join(missing)}: this build's catalogue has no such kind")
        chosen = [c for c in chosen if c.name in wanted or c.kind in wanted]
    for c in chosen:      # the kind's own parameter names: a renamed one fails here, not in the daemon
        bad = sorted(set(c.params) - set(known[c.kind].params))
        assert not bad, f"{c.name}: {bad} are not parameters of the {c.kind} kind"
        c.full = {k: v.default for k, v in known[c.kind].params.items()} | c.params
        if secure_sum and "secure_sum" in c.full:
            c.full["secure_sum"] = secure_sum
    return chosen


# -- running --------------------------------------------------------------------------------


class Budget:
    """The daemons' proposal budget per proposer (fedpeer/jobs/lifecycle/admission.py: a burst of 8,
    then one per 2 s), mirrored here: before proposing, wait (unmeasured) until a token is there,
    rather than have the members refuse the job."""

    BURST, REFILL_S = 8, 2.2         # a little slower than the daemons refill

    def __init__(self) -> None:
        self.tokens, self.at = float(self.BURST), time.monotonic()

    async def take(self) -> None:
        now = time.monotonic()
        self.tokens = min(float(self.BURST), self.tokens + (now - self.at) / self.REFILL_S)
        self.at = now
        if self.tokens < 1.0:
            await asyncio.sleep((1.0 - self.tokens) * self.REFILL_S)
            self.tokens, self.at = 1.0, time.monotonic()
        self.tokens -= 1.0


BUDGET = Budget()


async def run_job(h: Harness, kind: str, params: dict, timeout_s: float) -> tuple[dict, list[dict]]:
    pids = [site.process.pid for site in h.sites]
    await BUDGET.take()
    cpu0, started = cpu_seconds(pids), time.perf_counter()
    job_id = await h.propose(0, kind, params)
    records = await h.wait_job(job_id, timeout_s)
    wall, cpu = time.perf_counter() - started, cpu_seconds(pids) - cpu0
    bad = {h.sites[i].name: r and (r.get("error") or r["state"]) for i, r in records.items()
           if not r or r["state"] != "done"}
    if bad:
        raise RuntimeError(f"{kind} job {job_id} did not finish everywhere: {bad}")
    results = [records[i]["result"] for i in sorted(records)]
    return ({"seconds": max(r["elapsed_s"] for r in records.values()), "proposal_to_done_s": wall, "cpu_s": cpu,
             "secure_sums": results[0].get("secure_sums")}, results)


def bofrf_context(d: Data, h: Harness) -> dict:
    """The per-site datasets the bofrf reference needs, in ring order (sorted keys)."""
    from fedpeer.data.dataset import DataSpec, load_csv
    from fedpeer.identity import parse_public_key
    keys = [parse_public_key(s.public_key) for s in h.sites]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    datasets = [load_csv(DataSpec(csv=d.site_paths[i], label="label", positive="1")) for i in order]
    return {"bofrf_datasets": datasets, "bofrf_keys": [keys[i] for i in order]}


async def federation(d: Data, chosen: list[Case], args: argparse.Namespace, tmp: Path,
                     runs: dict[str, dict[str, list]]) -> dict:
    load_start = load1()
    h = Harness(tmp / f"fed-{d.name}", args.sites, site_data=d.site_paths, data_settings=d.settings,
                test_data=d.test_path)
    h.create()
    h.start()
    BUDGET.__init__()       # new daemons, full buckets
    try:
        await h.wait_all_alive(120)
        loaded_s = await h.wait_ml_loaded(180)
        context = bofrf_context(d, h) if any(c.kind == "bofrf" for c in chosen) else {}
        for c in chosen:      # warm-up: the kind's code paths and imports, in every daemon and here
            try:
                await run_job(h, c.kind, {**c.params, **c.warm}, args.timeout_s)
            except Exception as exc:   # noqa: BLE001 - a warm-up only warms; the measured job reports
                print(f"warm-up {c.name}: {exc}", file=sys.stderr)
        for c in chosen:
            call_reference(c, d, context, c.warm)
        for rep in range(args.repeats):
            for c in chosen:
                load_before = load1()
                job, results = await run_job(h, c.kind, c.params, args.timeout_s)
                ref = call_reference(c, d, context)
                job["quality"] = c.quality(results, d, ref)
                runs[c.name]["job"].append(job)
                runs[c.name]["reference"].append(ref)
                runs[c.name]["load"].append(load_before)
                print(f"repeat {rep + 1} {c.name}: job {job['seconds']:.2f} s (cpu {job['cpu_s']:.2f}), "
                      f"reference {ref['seconds']:.3f} s (cpu {ref['cpu_s']:.2f}), load {load_before}",
                      file=sys.stderr)
    finally:
        h.stop()
    return {"data": d.name, "rows": len(d.X), "features": d.X.shape[1], "sites": args.sites,
            "daemons_loaded_after_s": round(loaded_s, 1), "load_1min": {"start": load_start, "end": load1()}}


def call_reference(c: Case, d: Data, context: dict, changes: dict | None = None) -> dict:
    """The reference with the job's parameters (its kind's defaults under the case's own)."""
    params = {**c.full, **(changes or {})}
    if c.kind == "bofrf":
        return c.reference(d, params, context)
    return c.reference(d, params)


def summary(c: Case, samples: dict[str, list]) -> dict:
    def bm(xs: list[dict], key: str) -> tuple[float, float]:
        v = [x[key] for x in xs]
        return min(v), statistics.median(v)
    job, ref = samples["job"], samples["reference"]
    (jb, jm), (rb, rm) = bm(job, "seconds"), bm(ref, "seconds")
    (jc, _), (rc, _) = bm(job, "cpu_s"), bm(ref, "cpu_s")
    return {"kind": c.kind, "params": c.full, "note": c.note,
            "job_best_s": round(jb, 3), "job_median_s": round(jm, 3),
            "reference_best_s": round(rb, 3), "reference_median_s": round(rm, 3),
            "ratio_best": round(jb / rb, 2), "ratio_median": round(jm / rm, 2),
            "job_best_cpu_s": round(jc, 3), "reference_best_cpu_s": round(rc, 3),
            "cpu_ratio_best": round(jc / rc, 2) if rc > 0 else None,
            "job_proposal_to_done_best_s": round(min(x["proposal_to_done_s"] for x in job), 3),
            "job_secure_sums": job[-1]["secure_sums"],
            "job_quality": job[-1]["quality"], "reference_quality": ref[-1].get("quality", {}),
            "load_1min_before_each_job": samples["load"], "within_3x": jb / rb <= 3.0}


def fmt_quality(q: dict) -> str:
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in q.items())


def table(rows: dict[str, dict]) -> str:
    lines = ["| kind | job best / median s | reference best / median s | ratio best (median) | CPU ratio "
             "| job quality | reference quality |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['job_best_s']:.3f} / {r['job_median_s']:.3f} | {r['reference_best_s']:.3f} / "
                     f"{r['reference_median_s']:.3f} | **{r['ratio_best']:.2f}×** ({r['ratio_median']:.2f}×) | "
                     f"{r['cpu_ratio_best']}× | {fmt_quality(r['job_quality'])} | "
                     f"{fmt_quality(r['reference_quality'])} |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict:
    known = job_kinds()
    chosen = pick(cases(args), args.kinds, known, args.secure_sum)
    started, load_start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), load1()
    runs: dict[str, dict[str, list]] = {c.name: {"job": [], "reference": [], "load": []} for c in chosen}
    feds = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, make, size in (("labelled", labelled_data, (args.rows, args.features)),
                                 ("blobs", blobs_data, (args.blob_rows, args.blob_features))):
            mine = [c for c in chosen if c.data == name]
            if mine:
                d = make(tmp, *size, args.sites)
                print(f"{name}: {len(d.X)} rows x {d.X.shape[1]} features over {args.sites} daemons"
                      + (f", {len(d.test[1])} held-out rows" if d.test else ""), file=sys.stderr)
                feds.append(await federation(d, mine, args, tmp, runs))
    rows = {c.name: summary(c, runs[c.name]) for c in chosen}
    print(f"{started}, load average (1 min) {load_start} -> {load1()}, {os.cpu_count()} CPUs; "
          f"{args.repeats} repeats, job then reference per kind per repeat")
    for f in feds:
        print(f"  {f['data']}: {f['rows']} rows x {f['features']} features over {f['sites']} daemons; "
              f"load {f['load_1min']['start']} -> {f['load_1min']['end']}")
    print(table(rows))
    over = [n for n, r in rows.items() if not r["within_3x"]]
    print(f"over 3x (best / best): {', '.join(over) or 'none'}")
    for n, r in rows.items():
        if r["note"]:
            print(f"  {n}: {r['note']}")
    return {"started": started, "load_1min": {"start": load_start, "end": load1()}, "cpus": os.cpu_count(),
            "repeats": args.repeats, "federations": feds, "kinds": rows, "over_3x": over,
            "setup": {"sites": args.sites, "rows": args.rows, "features": args.features,
                      "test_rows": args.rows // 5, "blob_rows": args.blob_rows, "blob_features": args.blob_features,
                      "blob_centres": CENTRES}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kinds", nargs="+", help="kinds or cases to run (xgboost: both modes; "
                    "xgboost-histogram, xgboost-bagging: one); default: every kind but sumcheck")
    ap.add_argument("--rows", type=int, default=30_000, help="labelled training rows (held out: a fifth more)")
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--blob-rows", type=int, default=30_000)
    ap.add_argument("--blob-features", type=int, default=10)
    ap.add_argument("--eps", type=float, default=3.0, help="dbscan eps (both sides)")
    ap.add_argument("--trees", type=int, default=20, help="xgboost rounds (both sides)")
    ap.add_argument("--forest-trees", type=int, default=100, help="bofrf n_estimators per site")
    ap.add_argument("--timeout-s", type=float, default=900)
    ap.add_argument("--secure-sum", choices=["ring", "pairwise", "allreduce"],
                    help="every kind's secure-sum mode (default: each kind's own)")
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
