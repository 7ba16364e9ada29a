"""Federated XGBoost on real daemons: time per round against training the same trees in one
process, bytes sent per round per member, and failover time (leader kill -> next committed round).

1. Rounds: `--sites` daemons (default 5) on synthetic data (make_classification, `--rows` rows per
   site), an xgboost job of `--rounds` rounds. fedpeer's time per round = median gap between
   consecutive commits in a member's history (commit times come from the member's clock). The
   reference, in this process and the same run: the same loop without any network — every site's
   train_local_round on top of the global model, one after the other, then validate + append —
   timed per round. Bytes: each daemon's reliable (job) bytes sent during the job / rounds.
2. Failover (`--failover-runs`, default 20): on a 5-daemon federation, run a job, kill -9 the
   leader while round 3 runs, time until any survivor commits the next round; restart the killed
   daemon, wait until all are alive, repeat. Median and spread over the runs.

Run: .venv/bin/python benchmarks/bench_xgboost.py [--sites 5] [--rows 20000] [--rounds 10] [--failover-runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_bofrf import write_sites  # noqa: E402

from fedpeer.app.harness.federation import Harness, kill_leader_at_round  # noqa: E402
from fedpeer.data.dataset import DataSpec, load_csv  # noqa: E402
from fedpeer.kinds.xgboost import kind as xj  # noqa: E402
from fedpeer.ml.xgb import boosting  # noqa: E402

PARAMS = {"mode": "bagging", "max_depth": 6, "eta": 0.3, "nthread": 1, "secure_sum": "pairwise", "normalize": "samples"}
DATA = {"label": "label", "positive": "yes", "ignore": [], "missing": "error"}


def local_rounds(paths: list[Path], params: dict) -> list[float]:
    """Seconds per round of the same loop in one process (no network, no secure sums)."""
    p = xj.KIND.check_params(params)
    sites = []
    for path in paths:
        ds = load_csv(DataSpec(csv=path, label="label", positive="yes"))
        sites.append((ds.X, ds.y.astype("int64")))
    total = sum(len(y) for _, y in sites)
    base = boosting.global_base_score(sum(int(y.sum()) for _, y in sites), total, "binary:logistic")
    model, times = None, []
    for r in range(p["rounds"]):
        started = time.perf_counter()
        docs = []
        for i, (X, y) in enumerate(sites):
            eta_i = boosting.normalized_eta(p["eta"], len(y), total, "samples")
            docs.append(boosting.train_local_round(model, X, y, {**xj.train_params(p), "base_score": base},
                                                   p["num_local_round"], eta_i, seed=r + i))
            boosting.validate_trees(docs[-1], num_feature=X.shape[1], num_class=0,
                                    num_local_round=p["num_local_round"], max_depth=p["max_depth"],
                                    max_nodes=2 ** (p["max_depth"] + 1) - 1, leaf_abs_max=p["leaf_abs_max"])
        model = boosting.append_round(model, docs, base, X.shape[1], 0, "binary:logistic")
        times.append(time.perf_counter() - started)
    return times


async def rounds_benchmark(tmp: Path, sites: int, rows: int, rounds: int) -> dict:
    paths = write_sites(tmp, sites, rows, seed=3)
    params = {**PARAMS, "rounds": rounds}
    h = Harness(tmp / "fed", sites, site_data=paths, data_settings=DATA)
    h.create()
    h.start()
    try:
        await h.wait_all_alive(30)
        before = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
        job_id = await h.propose(0, "xgboost", params)
        records = await h.wait_job(job_id, 1800)
        after = {i: d["sent_bytes"]["reliable"] for i, d in (await h.statuses()).items()}
    finally:
        h.stop()
    assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
    history = records[0]["result"]["history"]
    gaps = [(b["committed_ms"] - a["committed_ms"]) / 1000 for a, b in zip(history, history[1:])]
    local = local_rounds(paths, params)
    fed_s, local_s = statistics.median(gaps), statistics.median(local)
    per_member = sorted((after[i] - before[i]) / rounds for i in before)
    leader = history[-1]["leader"]
    return {"sites": sites, "rows_per_site": rows, "rounds": rounds, "params": params,
            "fedpeer_s_per_round": round(fed_s, 4), "local_s_per_round": round(local_s, 4),
            "ratio": round(fed_s / local_s, 2), "job_elapsed_s": records[0]["elapsed_s"],
            "bytes_per_round_per_member": {"min": int(per_member[0]), "median": int(statistics.median(per_member)),
                                           "max": int(per_member[-1])},
            "leader": leader, "model_trees": records[0]["result"]["trees"]}


async def failover_benchmark(tmp: Path, runs: int, rows: int) -> dict:
    paths = write_sites(tmp, 5, rows, seed=4)
    h = Harness(tmp / "fo", 5, site_data=paths, data_settings=DATA)
    h.create()
    h.start()
    samples, elections, ok = [], [], 0
    try:
        for run in range(runs):
            await h.wait_all_alive(60)
            job_id = await h.propose(0 if h._running(0) else 1, "xgboost", {**PARAMS, "rounds": 5, "max_depth": 3})
            failover = await kill_leader_at_round(h, job_id, 3, 300)
            killed = next(i for i, s in enumerate(h.sites) if s.name == failover["killed"])
            survivors = [i for i in range(5) if i != killed]
            records = await h.wait_job(job_id, 300, among=survivors)
            shas = {r["result"]["model_sha256"] for r in records.values() if r["state"] == "done"}
            ok += all(r["state"] == "done" for r in records.values()) and len(shas) == 1
            samples.append(failover["next_commit_after_s"])
            elections.append(failover["elected_after_s"])
            print(f"run {run + 1}: killed {failover['killed']}, new leader {failover['new_leader']} after "
                  f"{failover['elected_after_s']} s, next commit after {failover['next_commit_after_s']} s",
                  file=sys.stderr)
            h.start(killed)
    finally:
        h.stop()
    q = statistics.quantiles(samples, n=10) if len(samples) >= 2 else samples
    return {"runs": runs, "median_s": round(statistics.median(samples), 3), "min_s": min(samples),
            "max_s": max(samples), "p10_s": round(q[0], 3), "p90_s": round(q[-1], 3),
            "median_election_s": round(statistics.median(e for e in elections if e is not None), 3),
            "runs_survivors_identical_and_done": ok}


async def main(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = {"rounds": await rounds_benchmark(Path(tmp), args.sites, args.rows, args.rounds)}
        if args.failover_runs:
            out["failover"] = await failover_benchmark(Path(tmp), args.failover_runs, 2000)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--sites", type=int, default=5)
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--failover-runs", type=int, default=20)
    print(json.dumps(asyncio.run(main(ap.parse_args())), indent=1))
