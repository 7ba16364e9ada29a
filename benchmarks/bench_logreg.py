"""Exact federated logistic regression vs FedAvg vs centralised, and MLP FedAvg with and without
groups vs a centralised MLP (issue 17, "side by side").

Data: scikit-learn's breast cancer (569 rows, 30 features), a stratified 20 % held out; the rest
split over 4 sites of non-IID sizes (50 %, 25 %, 15 %, 10 %; same class mix). The federated jobs
run over fedpeer's in-memory network in virtual time (the job code a daemon runs, secure sums
included), so the figures are the algorithms', not the network's.

Reported:
* centralised: scikit-learn LogisticRegression(C) on the pooled, standardised rows — its mean
  training log-loss (unpenalised) and held-out AUC;
* exact (`logreg`, mode exact, Newton): the federated training log-loss after each iteration
  (one secure sum each, plus 2 for the standardisation and 1 for the final evaluation);
* fedavg (`logreg`, mode fedavg): the federated training log-loss after each round;
* per method: the first iteration / round whose training log-loss is within 1 % of the
  centralised one, and the held-out AUC of the final model;
* MLP: `mlp` FedAvg without groups and with groups (sites 1+2, 3+4; global average every
  `--global-every` rounds), against MLPClassifier trained centrally with the same optimiser (plain
  SGD, same learning rate and batch size) for rounds x local_epochs epochs: training log-loss per
  round, held-out AUC, federation-wide averages done and saved.

Run: .venv/bin/python benchmarks/bench_logreg.py [--rounds 40] [--C 1.0] [--learning-rate 0.1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.data.dataset import FEATURE_TYPE_FLOAT, Dataset, schema_fingerprint  # noqa: E402
from fedpeer.jobs.kind import JobContext  # noqa: E402
from fedpeer.kinds.linear import logreg
from fedpeer.kinds.linear import mlp as mlp_job  # noqa: E402
from fedpeer.ml.linear import logistic as linear
from fedpeer.ml.linear import mlp  # noqa: E402
from fedpeer.testing.memory import MemoryNetwork  # noqa: E402

SHARES = (0.5, 0.25, 0.15, 0.10)


def data(seed: int = 0) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in SHARES]
    test: list[int] = []
    for c in (0, 1):
        rows = rng.permutation(np.flatnonzero(y == c))
        cut = round(0.2 * len(rows))
        test += rows[:cut].tolist()
        bounds = np.cumsum([0] + [round(s * (len(rows) - cut)) for s in SHARES[:-1]])
        for k, chunk in enumerate(np.split(rows[cut:], bounds[1:])):
            parts[k] += chunk.tolist()
    return [(X[sorted(p)], y[sorted(p)]) for p in parts], (X[test], y[test])


def dataset(X: np.ndarray, y: np.ndarray) -> Dataset:
    features = tuple(f"f{j}" for j in range(X.shape[1]))
    labels = np.array([str(v) for v in y])
    return Dataset(features, np.ascontiguousarray(X), (y == 1).astype(np.int8), labels, 0,
                   schema_fingerprint(features, [FEATURE_TYPE_FLOAT] * len(features)))


async def _inline(fn, *args):
    return fn(*args)


def federate(module, sites: list[Dataset], params: dict) -> dict:
    """Site 1's result of one job over the in-memory network (every member ends with the same model)."""
    import looptime

    keys = sorted(hashlib.sha256(f"bench-lr-{i}".encode()).digest() for i in range(len(sites)))
    names = {k: f"site-{i + 1}" for i, k in enumerate(keys)}
    # every site's rows train (test_fraction 0): the centralised fits below see the same rows
    checked = module.KIND.check_params({"secure_sum": "ring", "test_fraction": 0.0, **params})

    async def go() -> list:
        net = MemoryNetwork(keys, seed=0)
        return await asyncio.gather(*(module.run_job(net.channel(k), checked,
                                                     JobContext(names[k], names, 2_000, data=d), offload=_inline)
                                      for k, d in zip(keys, sites)))

    loop = looptime.new_event_loop(start=0, noop_cycles=1)
    try:
        results = loop.run_until_complete(go())
    finally:
        loop.close()
    return results[0]


def auc(y: np.ndarray, p: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score
    return round(float(roc_auc_score(y, p)), 4)


def within(losses: list[float], target: float) -> int | None:
    return next((i for i, v in enumerate(losses) if v <= 1.01 * target), None)


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--C", type=float, default=1.0)
    ap.add_argument("--learning-rate", type=float, default=0.1)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--global-every", type=int, default=4)
    ap.add_argument("--hidden", default="16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    parts, (X_test, y_test) = data()
    sites = [dataset(X, y) for X, y in parts]
    X_all, y_all = np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    scaler = StandardScaler().fit(X_all)
    Z = scaler.transform(X_all)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        central = LogisticRegression(C=args.C, solver="newton-cholesky", tol=1e-12, max_iter=1000).fit(Z, y_all)
    p = central.predict_proba(Z)[:, 1]
    central_loss = float(-np.mean(y_all * np.log(p) + (1 - y_all) * np.log(1 - p)))
    out: dict = {"sites_rows": [len(y) for _, y in parts], "test_rows": len(y_test),
                 "centralised": {"logloss": round(central_loss, 6),
                                 "test_auc": auc(y_test, central.predict_proba(scaler.transform(X_test))[:, 1])}}

    exact = federate(logreg, sites, {"C": args.C, "tol": 1e-10})
    losses = [h["loss"] for h in exact["history"]]
    proba = linear.predict_proba(np.asarray(exact["coef"]), np.asarray(exact["intercept"]), X_test)
    out["exact"] = {"logloss_per_iteration": [round(v, 6) for v in losses], "iterations": exact["iterations"],
                    "secure_sums": exact["secure_sums"], "within_1pct_at_iteration": within(losses, central_loss),
                    "test_auc": auc(y_test, proba)}
    fa = {"C": args.C, "mode": "fedavg", "rounds": args.rounds, "learning_rate": args.learning_rate,
          "local_epochs": args.local_epochs}
    fed = federate(logreg, sites, fa)
    losses = [h["logloss"] for h in fed["history"]]
    proba = linear.predict_proba(np.asarray(fed["coef"]), np.asarray(fed["intercept"]), X_test)
    out["fedavg"] = {"logloss_per_round": losses, "secure_sums": fed["secure_sums"],
                     "within_1pct_at_round": within(losses, central_loss), "test_auc": auc(y_test, proba)}

    mlp_params = {"rounds": args.rounds, "learning_rate": args.learning_rate / 2, "local_epochs": args.local_epochs,
                  "hidden_layer_sizes": args.hidden}
    hidden = mlp.parse_hidden(args.hidden)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = MLPClassifier(hidden_layer_sizes=hidden, solver="sgd", momentum=0.0, nesterovs_momentum=False,
                            learning_rate_init=mlp_params["learning_rate"], batch_size=32,
                            max_iter=args.rounds * args.local_epochs, alpha=1e-4, random_state=0).fit(Z, y_all)
    p = np.clip(clf.predict_proba(Z)[:, 1], 1e-15, 1 - 1e-15)
    out["mlp_centralised"] = {"epochs": args.rounds * args.local_epochs,
                              "logloss": round(float(-np.mean(y_all * np.log(p) + (1 - y_all) * np.log(1 - p))), 6),
                              "test_auc": auc(y_test, clf.predict_proba(scaler.transform(X_test))[:, 1])}
    for name, extra in (("mlp_fedavg", {}), ("mlp_fedavg_groups", {"groups": "site-1,site-2;site-3,site-4",
                                                                    "global_every": args.global_every})):
        r = federate(mlp_job, sites, {**mlp_params, **extra})
        coefs, intercepts = [np.asarray(c) for c in r["coefs"]], [np.asarray(b) for b in r["intercepts"]]
        proba = mlp.predict_proba(coefs, intercepts, (X_test - np.asarray(r["mean"])) / np.asarray(r["scale"]))
        out[name] = {"logloss_per_round": [h["logloss"] for h in r["history"]],
                     "scope_per_round": [h["scope"] for h in r["history"]], "test_auc": auc(y_test, proba),
                     **{k: r["fedavg"][k] for k in ("global_averages", "global_averages_saved")}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"breast cancer, 4 sites {out['sites_rows']} rows (non-IID sizes), {out['test_rows']} held out; C {args.C}")
    print(f"centralised LogisticRegression: training log-loss {out['centralised']['logloss']}, "
          f"test AUC {out['centralised']['test_auc']}")
    e, f = out["exact"], out["fedavg"]
    print(f"exact (Newton): {e['iterations']} iterations, {e['secure_sums']} secure sums, within 1 % at iteration "
          f"{e['within_1pct_at_iteration']}, test AUC {e['test_auc']}")
    print(f"fedavg (lr {args.learning_rate}, {args.local_epochs} local epoch(s)): within 1 % at round "
          f"{f['within_1pct_at_round']} of {args.rounds}, test AUC {f['test_auc']}")
    print("ROUND  EXACT      FEDAVG     MLP-FEDAVG MLP-GROUPS (scope)")
    for i in range(args.rounds + 1):
        ex = e["logloss_per_iteration"][i] if i < len(e["logloss_per_iteration"]) else ""
        g = out["mlp_fedavg_groups"]
        print(f"{i:<6} {ex!s:<10} {f['logloss_per_round'][i]!s:<10} {out['mlp_fedavg']['logloss_per_round'][i]!s:<10} "
              f"{g['logloss_per_round'][i]!s:<10} {g['scope_per_round'][i]}")
    m = out["mlp_centralised"]
    print(f"MLP centralised ({m['epochs']} epochs of the same SGD): training log-loss {m['logloss']}, test AUC "
          f"{m['test_auc']}")
    for name in ("mlp_fedavg", "mlp_fedavg_groups"):
        r = out[name]
        print(f"{name}: test AUC {r['test_auc']}, federation-wide averages {r['global_averages']} "
              f"(saved {r['global_averages_saved']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
