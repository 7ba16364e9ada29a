"""Differential privacy inside the secure sum: what it costs `stats` in accuracy, time and bits.

Data: (1) synthetic, 100 000 rows x 20 columns (column j ~ N(1 + j/5, 1), labels Bernoulli(0.3)),
over 5 sites of 20 000 rows, dp_clip 10 (about 5 standard deviations from 0 for the last column);
(2) scikit-learn's breast cancer, 569 rows x 30 raw columns over 5 sites, dp_clip the largest
|value| (4 254: one public bound serves every column, so small-scale columns drown), and (3) the
same rows standardised with their pooled mean and std (as if those were public), dp_clip 4.
Members run in one process over fedpeer's in-memory network (the job code a daemon runs, secure
sums included, zero delay), so the times are CPU, not network.

Reported per data set and ε: the relative error of the means against the non-private job
(median and worst column, |Δmean| / |mean|; standardised data: |Δmean| in standard deviations),
the row count's error, the job's wall time with DP / without, the bits a member sends per summed
value, and the ε the accountant counted. k-means: (4) 100 000 rows x 20 around 5 centres drawn
N(0, 9), unit spread, dp_clip 10, k 5, 8 DP rounds; (5) breast cancer standardised, k 2, dp_clip 4,
5 DP rounds; the inertia of the DP centres on the pooled rows over the exact job's from the same
initial centres (n_init 1, same seed) and over the exact job's best of 3 restarts, and the times
(the exact job runs to convergence, the DP one its fixed rounds). Logistic regression: (6)
synthetic 100 000 x 20 (N(0, 1) columns, labels from a logistic model) over 5 sites, scored on
20 000 fresh rows, and (7) breast cancer standardised, a stratified 80/20 split per repeat, the
455 training rows over 5 sites: the DP job (20 gradient steps, dp_grad_clip 1, dp_step 2)
against the exact job (Newton, the pooled rows' scikit-learn model), test error and AUC on the
held-out rows, the time ratio and the secure sums each made. Histogram XGBoost (`xgb_table`):
(8) synthetic 100 000 training rows x 20 N(0, 1) columns over 5 sites (`xgb_data`: a logistic label
in 6 columns with interactions), scored on 20 000 held-out rows of the same law, public bounds
[-5, 5] for every column; (9) breast cancer, 455 rows over 5 sites, 114 held out (stratified),
public bounds [0, each column's maximum rounded up] (assumed public: the maxima are the data's);
20 trees of depth 4, 16 bins; the exact job against ε 1 and 8, interleaved in every repeat. One
tree (`--only tree`, mode exact, gini, depth 4, 16 bins, min_leaf_rows 5) on the same two data sets
and bounds: the exact job (federated quantile cut points) against ε 1 and 8 (uniform bins).

Run: PYTHONPATH=. .venv/bin/python benchmarks/bench_dp.py [--repeats 3] [--json] [--only KIND ...]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint  # noqa: E402
from fedpeer.config.bounds import bounds_text  # noqa: E402
from fedpeer.jobs.kind import JobContext  # noqa: E402
from fedpeer.kinds import stats, stats_dp  # noqa: E402
from fedpeer.kinds.cluster import kmeans  # noqa: E402
from fedpeer.kinds.linear import logreg  # noqa: E402
from fedpeer.kinds.tree import kind as tree_kind  # noqa: E402
from fedpeer.kinds.xgboost import kind as xgb_kind  # noqa: E402
from fedpeer.testing.memory import MemoryNetwork  # noqa: E402

SITES = 5


def dataset(X: np.ndarray, y: np.ndarray) -> Dataset:
    features = tuple(f"x{j}" for j in range(X.shape[1]))
    X = np.ascontiguousarray(X, dtype=float)
    y = y.astype(np.int8)
    for a in (X, y):
        a.setflags(write=False)
    return Dataset(features, X, y, np.array([str(v) for v in y]), 0,
                   schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * X.shape[1]))


def split(X: np.ndarray, y: np.ndarray) -> list[Dataset]:
    return [dataset(X[i::SITES], y[i::SITES]) for i in range(SITES)]


def federate(sites: list[Dataset], params: dict, seed: int, kind=stats) -> tuple[dict, float]:
    keys = sorted(hashlib.sha256(f"dp-{i}".encode()).digest() for i in range(len(sites)))
    names = {k: f"site-{i + 1}" for i, k in enumerate(keys)}
    checked = kind.KIND.check_params(params)

    run = getattr(kind, "run", None) or kind.run_job      # logreg's run_job: its local terms in a thread

    async def go() -> list:
        net = MemoryNetwork(keys, seed=0, delay_ms=(0.0, 0.0))
        return await asyncio.gather(*[run(net.channel(k), checked, JobContext(
            names[k], names, 60_000, data=sites[i], noise_rng=np.random.default_rng(seed * 100 + i)))
            for i, k in enumerate(keys)])
    start = time.perf_counter()
    results = asyncio.run(go())
    return results[0], time.perf_counter() - start


def measure(name: str, sites: list[Dataset], clip: float, epsilons: list[float], repeats: int,
            standardised: bool) -> list[dict]:
    base, base_s = min((federate(sites, {"bins": 10}, r) for r in range(repeats)), key=lambda rt: rt[1])
    cols = list(base["mean"])
    true = np.array([base["mean"][c] for c in cols])
    rows = []
    for eps in epsilons:
        params = {"bins": 10, "dp_epsilon": eps, "dp_clip": clip, "dp_rows_max": 10 ** 6}
        runs = [federate(sites, params, r) for r in range(repeats)]
        errs = []
        for r, _ in runs:
            got = np.array([r["mean"][c] for c in cols])
            errs.append(np.abs(got - true) / (1.0 if standardised else np.maximum(np.abs(true), 1e-12)))
        errs = np.array(errs)
        rows.append({"data": name, "rows": base["count"], "epsilon": eps,
                     "mean_error_median": float(np.median(errs)), "mean_error_worst": float(errs.max()),
                     "error_unit": "std" if standardised else "relative",
                     "count_error": float(np.mean([abs(r["count"] - base["count"]) for r, _ in runs])),
                     "time_ratio": min(s for _, s in runs) / base_s,
                     "bits_per_value": runs[0][0]["privacy"]["bits_per_value"],
                     "epsilon_counted": runs[0][0]["privacy"]["epsilon"]})
    return rows


def inertia(X: np.ndarray, centres: list) -> float:
    c = np.asarray(centres)
    return float(sum(((X[i:i + 4096, None] - c[None]) ** 2).sum(axis=2).min(axis=1).sum()
                     for i in range(0, len(X), 4096)))


def measure_kmeans(name: str, X: np.ndarray, sites: list[Dataset], k: int, clip: float, epsilons: list[float],
                   repeats: int, rounds: int) -> list[dict]:
    """DP centres against the exact job from the same initial centres (one restart, seed r), and
    against the exact job's best of 3 restarts (what an exact user would run)."""
    # DP k-means clusters the values clipped to ±dp_clip in their own units: the exact job too
    # (standardize=false), else the two minimise different inertias
    exact = [federate(sites, {"k": k, "n_init": 1, "seed": r, "secure_sum": "allreduce", "standardize": False}, r,
                      kmeans) for r in range(repeats)]
    same_init = [inertia(X, r["centers"]) for r, _ in exact]
    best3 = inertia(X, federate(sites, {"k": k, "n_init": 3, "seed": 0, "secure_sum": "allreduce",
                                        "standardize": False}, 0, kmeans)[0]["centers"])
    rows = []
    for eps in epsilons:
        params = {"k": k, "dp_epsilon": eps, "dp_clip": clip, "dp_rounds": rounds, "dp_rows_max": 10 ** 6}
        runs = [federate(sites, {**params, "seed": r}, r, kmeans) for r in range(repeats)]
        got = [inertia(X, r["centers"]) for r, _ in runs]
        ratios = [g / e for g, e in zip(got, same_init)]
        rows.append({"data": name, "k": k, "epsilon": eps, "inertia_ratio_median": float(np.median(ratios)),
                     "inertia_ratio_worst": float(max(ratios)), "inertia_vs_best_of_3": float(np.median(got) / best3),
                     "time_ratio": float(np.median([s for _, s in runs]) / np.median([s for _, s in exact])),
                     "rounds_dp": rounds, "rounds_exact": int(np.median([r["iterations"] for r, _ in exact])),
                     "bits_per_value": runs[0][0]["privacy"]["bits_per_value"],
                     "epsilon_counted": runs[0][0]["privacy"]["epsilon"]})
    return rows


def test_scores(result: dict, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(test error, AUC) of a binary logreg result's coefficients (original units) on rows X."""
    from sklearn.metrics import roc_auc_score

    z = X @ np.asarray(result["coef"][0]) + result["intercept"][0]
    return float(((z > 0) != y).mean()), float(roc_auc_score(y, z))


def measure_logreg(name: str, draws: list[tuple[list[Dataset], np.ndarray, np.ndarray]], epsilons: list[float],
                   iterations: int) -> list[dict]:
    """DP logreg (gradient descent, `iterations` steps) against the exact job (Newton, the pooled
    rows' scikit-learn model) on the same sites, scored on rows no site trained on; one draw per repeat."""
    exact = [(federate(sites, {"test_fraction": 0.0}, r, logreg), Xt, yt) for r, (sites, Xt, yt) in enumerate(draws)]
    e_scores = np.array([test_scores(res, Xt, yt) for (res, _), Xt, yt in exact])
    rows = []
    for eps in epsilons:
        params = {"test_fraction": 0.0, "dp_epsilon": eps, "dp_iterations": iterations, "dp_rows_max": 10 ** 6}
        runs = [federate(sites, params, r, logreg) for r, (sites, _, _) in enumerate(draws)]
        scores = np.array([test_scores(res, Xt, yt) for (res, _), (_, Xt, yt) in zip(runs, draws)])
        rows.append({"data": name, "epsilon": eps, "test_error": float(scores[:, 0].mean()),
                     "test_error_exact": float(e_scores[:, 0].mean()), "auc": float(scores[:, 1].mean()),
                     "auc_exact": float(e_scores[:, 1].mean()),
                     "time_ratio": float(np.median([t for _, t in runs]) / np.median([t for (_, t), _, _ in exact])),
                     "sums_dp": runs[0][0]["secure_sums"], "sums_exact": exact[0][0][0]["secure_sums"],
                     "bits_per_value": runs[0][0]["privacy"]["bits_per_value"],
                     "epsilon_counted": runs[0][0]["privacy"]["epsilon"]})
    return rows


def logreg_table(repeats: int) -> list[dict]:
    """Synthetic 100 000 x 20 (N(0, 1) columns, labels from a logistic model) over 5 sites, scored
    on 20 000 fresh rows; breast cancer standardised (pooled mean and std, as if public), each
    repeat a stratified 80/20 split, the 455 training rows over 5 sites."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    rng = np.random.default_rng(1)
    beta = rng.normal(scale=0.5, size=20)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        X = rng.normal(size=(n, 20))
        return X, rng.random(n) < 1 / (1 + np.exp(-(X @ beta - 0.5)))
    draws = []
    for _ in range(repeats):
        (X, y), (Xt, yt) = draw(100_000), draw(20_000)
        draws.append((split(X, y), Xt, yt))
    table = measure_logreg("synthetic 100k x 20", draws, [1.0, 8.0], 20)
    Xc, yc = load_breast_cancer(return_X_y=True)
    Xs = (Xc - Xc.mean(axis=0)) / Xc.std(axis=0)
    draws = []
    for r in range(repeats):
        X, Xt, y, yt = train_test_split(Xs, yc, test_size=0.2, stratify=yc, random_state=r)
        draws.append((split(X, y), Xt, yt))
    return table + measure_logreg("cancer standardised", draws, [1.0, 8.0], 20)


def print_logreg(table: list[dict]) -> None:
    print(f"{'LOGREG DATA':<22} {'ε':>4} {'TEST ERR DP / exact':>20} {'AUC DP / exact':>16} {'TIME x':>7} "
          f"{'SUMS':>6} {'BITS':>5} {'ε COUNTED':>9}")
    for r in table:
        err = f"{100 * r['test_error']:>8.2f} / {100 * r['test_error_exact']:<5.2f} %"
        sums = f"{r['sums_dp']:>3}/{r['sums_exact']:<2}"
        print(f"{r['data']:<22} {r['epsilon']:>4g} {err} {r['auc']:>7.4f} / {r['auc_exact']:<6.4f} "
              f"{r['time_ratio']:>7.2f} {sums} {r['bits_per_value']:>5} {r['epsilon_counted']:>9.3f}")


def xgb_data(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic classification rows: 20 N(0, 1) columns, P(y = 1) logistic in 6 of them with two
    interactions (a stump ensemble's job), about 12 % of labels irreducible noise."""
    X = rng.normal(size=(rows, 20))
    logit = 1.5 * X[:, 0] - X[:, 1] + 0.8 * X[:, 2] * X[:, 3] + np.where(X[:, 4] > 0.5, 1.2, -0.4) \
        + 0.6 * np.abs(X[:, 5]) - 0.5
    return X, (rng.random(rows) < 1.0 / (1.0 + np.exp(-2.0 * logit))).astype(int)


def xgb_error(result: dict, X: np.ndarray, y: np.ndarray) -> float:
    from fedpeer.ml.xgb import boosting

    return float(np.mean((np.asarray(boosting.predict_proba(result["_model"], X)) > 0.5) != y))


def tree_error(result: dict, X: np.ndarray, y: np.ndarray) -> float:
    from fedpeer.ml.tree.model import load_model, predict_value

    return float(np.mean(np.argmax(predict_value(load_model(result["_model"])[0], X), axis=1) != y))


def measure_xgb(name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                bounds: dict, base: dict, epsilons: list[float], repeats: int, kind=xgb_kind,
                error=xgb_error) -> list[dict]:
    """Histogram XGBoost (or with `kind` tree_kind and `error` tree_error, one tree) trained over
    the sites (test_fraction 0), scored on held-out pooled rows:
    the non-private job and each ε in turn, `repeats` times interleaved (the same machine load
    for every variant); test error (1 - accuracy at 0.5), medians over the repeats; the time ratio
    in wall time and in this process's CPU time (steadier on a shared machine)."""
    sites = split(*train)
    variants = [0.0, *epsilons]
    errors: dict[float, list[float]] = {e: [] for e in variants}
    times: dict[float, list[float]] = {e: [] for e in variants}
    cpu: dict[float, list[float]] = {e: [] for e in variants}    # this process's CPU (the members' threads too)
    privacy: dict[float, dict] = {}
    for r in range(repeats):
        for eps in variants:
            params = {**base, "seed": r}
            if eps:
                params.update(dp_epsilon=eps, dp_bounds=bounds_text(bounds), dp_rows_max=10 ** 6)
            started = time.process_time()
            result, seconds = federate(sites, params, r, kind)
            cpu[eps].append(time.process_time() - started)
            errors[eps].append(error(result, *test))
            times[eps].append(seconds)
            privacy[eps] = result.get("privacy") or {}
    rows = []
    for eps in epsilons:
        rows.append({"data": name, "epsilon": eps, "error_exact": float(np.median(errors[0.0])),
                     "error_dp": float(np.median(errors[eps])), "error_dp_worst": float(max(errors[eps])),
                     "points": 100 * float(np.median(errors[eps]) - np.median(errors[0.0])),
                     "time_ratio": float(np.median(times[eps]) / np.median(times[0.0])),
                     "seconds_exact": float(np.median(times[0.0])), "seconds_dp": float(np.median(times[eps])),
                     "cpu_ratio": float(np.median(cpu[eps]) / np.median(cpu[0.0])),
                     "bits_per_value": privacy[eps]["bits_per_value"], "epsilon_counted": privacy[eps]["epsilon"],
                     "releases": privacy[eps]["releases"], "test_rows": int(len(test[1]))})
    return rows


def xgb_table(repeats: int, base: dict, kind=xgb_kind, error=xgb_error) -> list[dict]:
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    rng = np.random.default_rng(1)
    X, y = xgb_data(rng, 120_000)
    table = measure_xgb("synthetic 100k x 20", (X[:100_000], y[:100_000]), (X[100_000:], y[100_000:]),
                        {f"x{j}": (-5.0, 5.0) for j in range(20)}, base, [1.0, 8.0], repeats, kind, error)
    Xc, yc = load_breast_cancer(return_X_y=True)
    Xa, Xb, ya, yb = train_test_split(Xc, yc, test_size=0.2, random_state=0, stratify=yc)
    # public bounds assumed: [0, each column's maximum rounded up to 2 significant digits]
    top = [float(f"{v:.2g}") if float(f"{v:.2g}") >= v else float(f"{v * 1.05:.2g}") for v in Xc.max(axis=0)]
    table += measure_xgb("cancer (455 train, 114 test)", (Xa, ya), (Xb, yb),
                         {f"x{j}": (0.0, t) for j, t in enumerate(top)}, base, [1.0, 8.0], repeats, kind, error)
    return table


# One tree (mode exact): the exact job's federated quantile cut points against the DP job's uniform bins
# over the same public bounds, both 16 bins per feature; gini, depth 4, min_leaf_rows 5.
TREE_BASE = {"max_depth": 4, "max_bin": 16, "min_leaf_rows": 5, "test_fraction": 0.0, "secure_sum": "allreduce"}


XGB_BASE = {"mode": "histogram", "rounds": 20, "max_depth": 4, "max_bin": 16, "test_fraction": 0.0,
            "eval_every": 0, "secure_sum": "allreduce"}


def print_xgb(xtable: list[dict], repeats: int, title: str = "") -> None:
    print(title or f"histogram XGBoost, {XGB_BASE['rounds']} trees of depth {XGB_BASE['max_depth']}, "
          f"{XGB_BASE['max_bin']} uniform bins from public bounds; test error on held-out pooled rows, median of "
          f"{repeats} interleaved runs")
    head = "TREE DATA" if title else "XGBOOST DATA"
    print(f"{head:<30} {'ε':>4} {'ERR EXACT':>9} {'ERR DP':>7} {'worst':>7} {'+POINTS':>7} "
          f"{'TIME x':>7} {'CPU x':>6} {'s EXACT':>8} {'s DP':>6} {'BITS':>5} {'ε COUNTED':>9} {'RELEASES':>8}")
    for r in xtable:
        print(f"{r['data']:<30} {r['epsilon']:>4g} {100 * r['error_exact']:>8.2f}% {100 * r['error_dp']:>6.2f}% "
              f"{100 * r['error_dp_worst']:>6.2f}% {r['points']:>7.2f} {r['time_ratio']:>7.2f} "
              f"{r['cpu_ratio']:>6.2f} "
              f"{r['seconds_exact']:>8.2f} {r['seconds_dp']:>6.2f} {r['bits_per_value']:>5} "
              f"{r['epsilon_counted']:>9.3f} {r['releases']:>8}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", choices=("stats", "kmeans", "logreg", "xgboost", "tree"), action="append",
                        help="run only these kinds' parts (repeatable; default: all)")
    args = parser.parse_args()
    only = set(args.only or ("stats", "kmeans", "logreg", "xgboost", "tree"))
    from sklearn.datasets import load_breast_cancer

    ltable = logreg_table(args.repeats) if "logreg" in only else []
    xtable = xgb_table(args.repeats, XGB_BASE) if "xgboost" in only else []
    ttable = xgb_table(args.repeats, TREE_BASE, tree_kind, tree_error) if "tree" in only else []
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100_000, 20)) + 1 + np.arange(20) / 5
    y = rng.random(100_000) < 0.3
    Xc, yc = load_breast_cancer(return_X_y=True)
    Xs = (Xc - Xc.mean(axis=0)) / Xc.std(axis=0)
    table, ktable = [], []
    if "stats" in only:
        table = measure("synthetic 100k x 20", split(X, y), 10.0, [1.0, 8.0], args.repeats, False)
        table += measure("cancer raw (569 x 30)", split(Xc, yc), float(np.abs(Xc).max()), [1.0, 8.0], args.repeats,
                         False)
        table += measure("cancer standardised", split(Xs, yc), 4.0, [1.0, 8.0], args.repeats, True)
    if "kmeans" in only:
        centres = rng.normal(size=(5, 20)) * 3
        owner = rng.integers(0, 5, 100_000)
        Xk = centres[owner] + rng.normal(size=(100_000, 20))
        ktable = measure_kmeans("synthetic 100k x 20, 5 blobs", Xk, split(Xk, y), 5, 10.0, [1.0, 8.0], args.repeats,
                                8)
        ktable += measure_kmeans("cancer standardised", Xs, split(Xs, yc), 2, 4.0, [1.0, 8.0], args.repeats, 5)
    if args.json:
        print(json.dumps({"stats": table, "kmeans": ktable, "logreg": ltable, "xgboost": xtable, "tree": ttable},
                         indent=1))
        return 0
    if ktable:
        print(f"{'KMEANS DATA':<30} {'ε':>4} {'INERTIA/SAME INIT med':>21} {'worst':>7} {'/BEST OF 3':>10} "
              f"{'TIME x':>7} {'ROUNDS':>8} {'BITS':>5} {'ε COUNTED':>9}")
        for r in ktable:
            print(f"{r['data']:<30} {r['epsilon']:>4g} {r['inertia_ratio_median']:>21.4f} "
                  f"{r['inertia_ratio_worst']:>7.4f} {r['inertia_vs_best_of_3']:>10.4f} {r['time_ratio']:>7.2f} "
                  f"{r['rounds_dp']:>3}/{r['rounds_exact']:<4} {r['bits_per_value']:>5} {r['epsilon_counted']:>9.3f}")
        print()
    if table:
        print(f"{'DATA':<24} {'ε':>4} {'MEAN ERR median':>16} {'worst':>10} {'ROWS ±':>7} {'TIME x':>7} "
              f"{'BITS':>5} {'ε COUNTED':>9}")
        for r in table:
            pct = r["error_unit"] != "std"
            shown = [f"{100 * v:.3g} %" if pct else f"{v:.3g} σ"
                     for v in (r["mean_error_median"], r["mean_error_worst"])]
            print(f"{r['data']:<24} {r['epsilon']:>4g} {shown[0]:>16} {shown[1]:>10} {r['count_error']:>7.1f} "
                  f"{r['time_ratio']:>7.2f} {r['bits_per_value']:>5} {r['epsilon_counted']:>9.3f}")
        print()
    if ltable:
        print_logreg(ltable)
        print()
    if xtable:
        print_xgb(xtable, args.repeats)
        print()
    if ttable:
        print_xgb(ttable, args.repeats, f"one tree (mode exact), gini, depth {TREE_BASE['max_depth']}, "
                  f"{TREE_BASE['max_bin']} bins (exact: federated quantiles; DP: uniform from public bounds); test "
                  f"error on held-out pooled rows, median of {args.repeats} interleaved runs; RELEASES: noised levels")
    print(f"stats_dp.VALUE_BITS = {stats_dp.VALUE_BITS}: a member's value is {stats_dp.VALUE_BITS + 1} bits "
          "with its sign, inside a 64-bit sum entry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
