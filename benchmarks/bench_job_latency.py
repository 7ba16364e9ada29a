"""Latency of a job, not just of a frame (issue 13 item 7): proposal -> first committed round,
time per round and bytes per job, for the xgboost job in bagging mode on scikit-learn's breast
cancer data (569 rows, 30 features) split stratified over 5 daemons on loopback.

Every repeat:
1. cold: starts 5 fresh daemons (`fedpeer.app.harness.federation.Harness`) and proposes a 30-round job as soon as
   every daemon sees every other alive (the daemons' background import of sklearn + xgboost,
   `ml_libraries_loaded` in their logs, may still run); stops them;
2. preloaded: starts 5 fresh daemons, waits until every one logged `ml_libraries_loaded`, and
   proposes the same job: the first job of a daemon that has been up a while;
3. warm: on those daemons, one 30-round job per evaluation variant (`--variants`), one after the
   other (the code every job runs has now run once).

Per job, with the proposal's time taken in this process just before the POST and the members'
record times (wall clock, same machine):
- proposal -> first committed round: until a majority of the members stored round 1 (the 3rd
  of 5 members' `committed_ms` of round 1 in their histories); split into proposal -> the last
  member started the job (data loaded, proposal, accepts, start) and that -> round 1 committed
  (label-count secure sum, the leader's state round, the round's training, its commit);
- time per round: median gap between consecutive commits in the leader's history;
- bytes: every daemon's `sent_bytes.reliable` (job frames) from `status` before and after the job,
  per member (leader, followers) and in total.

Medians over all repeats; bytes also as a ratio to REFERENCE (every round evaluated with 1,000
bins, the default before issue 13 item 7).

Parameters (as the Flower side-by-side of the issue: FedXgbBagging-like, Flower's quickstart
xgboost settings): mode=bagging, rounds=30, eta=0.1, max_depth=8, normalize=none, nthread=1.

`--auc-errors` instead measures what fewer score-histogram bins cost in AUC (`auc_bin_errors`).

Run: .venv/bin/python benchmarks/bench_job_latency.py [--repeats 3] [--rounds 30] [--no-cold]
         [--variants default eval_round_bins=1000 eval_every=5 eval_every=0 eval_bins=10]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness, builtin_csv, split_csv  # noqa: E402

SITES = 5
PARAMS = {"mode": "bagging", "eta": 0.1, "max_depth": 8, "normalize": "none", "nthread": 1}
DATA = {"label": "diagnosis", "positive": "malignant", "ignore": [], "missing": "error"}
VARIANTS = ["default", "eval_round_bins=1000", "eval_every=5", "eval_every=0", "eval_bins=10"]
REFERENCE = "eval_round_bins=1000"      # every round evaluated with 1,000 bins: the default until issue 13 item 7


def variant_params(variant: str) -> dict:
    if variant == "default":
        return {}
    out = {}
    for pair in variant.split(","):
        key, _, value = pair.partition("=")
        out[key] = int(value)
    return out


async def run_job(h: Harness, params: dict) -> dict:
    before = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    proposed_ms = time.time() * 1000
    job_id = await h.propose(0, "xgboost", params)
    records = await h.wait_job(job_id, 600)
    after = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    firsts = sorted(r["result"]["history"][0]["committed_ms"] for r in records.values())
    majority = firsts[len(firsts) // 2]           # 3rd of 5: round 1 stored by a majority
    leader_name = records[0]["result"]["history"][-1]["leader"]
    leader = next(i for i, s in enumerate(h.sites) if s.name == leader_name)
    history = records[leader]["result"]["history"]
    gaps = [(b["committed_ms"] - a["committed_ms"]) / 1000 for a, b in zip(history, history[1:])]
    started = max(r["started_ms"] for r in records.values())
    sent = {i: after[i] - before[i] for i in before}
    followers = [v for i, v in sent.items() if i != leader]
    return {"to_first_round_s": (majority - proposed_ms) / 1000,
            "to_started_s": (started - proposed_ms) / 1000,
            "started_to_first_round_s": (majority - started) / 1000,
            "s_per_round": statistics.median(gaps) if gaps else None,
            "job_s": (max(r["finished_ms"] for r in records.values()) - proposed_ms) / 1000,
            "bytes_total": sum(sent.values()), "bytes_leader": sent[leader],
            "bytes_follower_median": statistics.median(followers),
            "auc": records[leader]["result"].get("auc")}


def summary(runs: list[dict]) -> dict:
    keys = ("to_first_round_s", "to_started_s", "started_to_first_round_s", "s_per_round", "job_s", "bytes_total",
            "bytes_leader", "bytes_follower_median", "auc")
    return {**{k: med([r[k] for r in runs]) for k in keys},
            "runs_to_first_round_s": [round(r["to_first_round_s"], 3) for r in runs]}


def med(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 4) if xs else None


async def main(args: argparse.Namespace) -> dict:
    load_start = os.getloadavg()
    params = {**PARAMS, "rounds": args.rounds}
    cold, first, warm, preload_wait = [], [], {v: [] for v in args.variants}, []
    with tempfile.TemporaryDirectory() as tmp:
        source = builtin_csv("builtin:breast_cancer", Path(tmp) / "bc.csv")
        paths = split_csv(source, DATA["label"], SITES, "stratified", 1, Path(tmp) / "splits")
        h = Harness(Path(tmp) / "fed", SITES, site_data=paths, data_settings=DATA)
        h.create()
        try:
            for rep in range(args.repeats):
                if not args.no_cold:
                    h.start()               # 1. cold: propose as soon as all are alive
                    alive_s = await h.wait_all_alive(60)
                    loaded_at_proposal = all(site.ml_loaded() for site in h.sites)
                    cold.append({**await run_job(h, params), "alive_after_s": round(alive_s, 2),
                                 "preload_done_at_proposal": loaded_at_proposal})
                    h.stop()
                h.start()                   # 2. the first job of daemons whose preload finished
                t0 = time.monotonic()
                await h.wait_all_alive(60)
                await h.wait_ml_loaded(180)
                preload_wait.append(time.monotonic() - t0)
                first.append(await run_job(h, params))
                for v in args.variants:     # 3. warm: after a first job
                    warm[v].append(await run_job(h, {**params, **variant_params(v)}))
                print(f"repeat {rep + 1}: cold {cold[-1]['to_first_round_s'] if cold else float('nan'):.2f} s; "
                      f"preloaded first job "
                      f"{first[-1]['to_first_round_s']:.2f} s; warm "
                      + ", ".join(f"{v} {warm[v][-1]['to_first_round_s']:.2f} s" for v in args.variants),
                      file=sys.stderr)
                h.stop()
        finally:
            h.stop()
    base = med([r["bytes_total"] for r in warm.get(REFERENCE, [])])
    out = {"sites": SITES, "params": params, "repeats": args.repeats, "cpu_count": os.cpu_count(),
           "loadavg_start": [round(x, 2) for x in load_start], "loadavg_end": [round(x, 2) for x in os.getloadavg()],
           "cold": summary(cold), "preload_done_at_cold_proposal": [r["preload_done_at_proposal"] for r in cold],
           "start_to_preloaded_s": [round(x, 2) for x in preload_wait],
           "preloaded_first_job": summary(first), "warm": {}}
    for v, runs in warm.items():
        out["warm"][v] = summary(runs)
        out["warm"][v]["bytes_vs_reference"] = (round(out["warm"][v]["bytes_total"] / base, 3)
                                              if base and out["warm"][v]["bytes_total"] else None)
    all_warm = [r["to_first_round_s"] for runs in warm.values() for r in runs]
    out["warm_all_variants_to_first_round_s"] = med(all_warm)
    if out["warm_all_variants_to_first_round_s"]:
        if out["cold"]["to_first_round_s"]:
            out["cold_over_warm"] = round(out["cold"]["to_first_round_s"] / out["warm_all_variants_to_first_round_s"],
                                          2)
        out["preloaded_over_warm"] = round(out["preloaded_first_job"]["to_first_round_s"]
                                           / out["warm_all_variants_to_first_round_s"], 2)
    return out


def auc_bin_errors(bins: tuple[int, ...] = (10, 20, 50, 100, 200, 1000), rounds: int = 30) -> dict:
    """|binned AUC - exact AUC| (fedpeer's score histograms against scikit-learn's roc_auc_score) of
    xgboost models after each of `rounds` rounds (eta 0.1, depth 8), on 20 % test splits: breast
    cancer (5 seeds) and 20,000-row make_classification sets (2 seeds each): plain, 20 % flipped
    labels, 3 % positives. Median and worst over all rounds and seeds, per number of bins."""
    import numpy as np
    import xgboost as xgb
    from sklearn.datasets import load_breast_cancer, make_classification
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import train_test_split

    from fedpeer.ml.evaluation import auc_from_histograms, score_histograms

    bc = load_breast_cancer()
    sets = {"breast_cancer": (bc.data, (bc.target == 0).astype(int), range(5)),
            "synthetic": (*make_classification(20000, 20, n_informative=8, random_state=3), range(2)),
            "synthetic_noisy": (*make_classification(20000, 20, n_informative=4, flip_y=0.2, random_state=4), range(2)),
            "synthetic_3pct_positive": (*make_classification(20000, 20, n_informative=8, weights=[0.97],
                                                             random_state=5), range(2))}
    out = {}
    for name, (X, y, seeds) in sets.items():
        errors: dict[int, list[float]] = {b: [] for b in bins}
        for seed in seeds:
            Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, stratify=y, random_state=seed)
            train, test, booster = xgb.DMatrix(Xtr, ytr), xgb.DMatrix(Xte), None
            for _ in range(rounds):
                booster = xgb.train({"objective": "binary:logistic", "eta": 0.1, "max_depth": 8, "nthread": 1},
                                    train, 1, xgb_model=booster)
                p = booster.predict(test).astype(np.float64)
                exact = roc_auc_score(yte, p)
                for b in bins:
                    errors[b].append(abs(auc_from_histograms(score_histograms(yte.astype(np.int64), p, b)) - exact))
        out[name] = {b: {"median": round(float(np.median(e)), 4), "worst": round(max(e), 4)} for b, e in errors.items()}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--no-cold", action="store_true", help="skip step 1 (cold)")
    ap.add_argument("--variants", nargs="+", default=VARIANTS,
                    help="evaluation settings of the warm jobs: default or KEY=INT[,KEY=INT]")
    ap.add_argument("--auc-errors", action="store_true",
                    help="only measure the AUC error of score histograms by number of bins (no daemons)")
    args = ap.parse_args()
    print(json.dumps(auc_bin_errors() if args.auc_errors else asyncio.run(main(args)), indent=1))
