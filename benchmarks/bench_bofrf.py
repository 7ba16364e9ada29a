"""BOFRF end to end on real daemons vs the in-process reference doing the same computation.

4 daemons, 100 trees each, ~5k synthetic rows per site (make_classification, fixed seed): the
job's wall time (from its start to the last member done, as recorded by the members) against
`fedpeer.kinds.forest.bofrf.reference` on the same per-site data in this process, measured in the same
run. Also each daemon's peak RSS (VmHWM).

Run: .venv/bin/python benchmarks/bench_bofrf.py [--sites 4] [--rows 5000] [--trees 100] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.app.harness.federation import Harness  # noqa: E402
from fedpeer.data.dataset import DataSpec, load_csv  # noqa: E402
from fedpeer.identity import parse_public_key  # noqa: E402
from fedpeer.kinds.forest import bofrf  # noqa: E402


def write_sites(out: Path, sites: int, rows: int, seed: int) -> list[Path]:
    from sklearn.datasets import make_classification
    X, y = make_classification(n_samples=sites * rows, n_features=20, n_informative=8, random_state=seed)
    paths = []
    for k in range(sites):
        path = out / f"site{k}.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([f"f{j}" for j in range(20)] + ["label"])
            for row, t in zip(X[k * rows:(k + 1) * rows], y[k * rows:(k + 1) * rows]):
                w.writerow([repr(float(v)) for v in row] + ["yes" if t else "no"])
        paths.append(path)
    return paths


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main(sites: int, rows: int, trees: int, repeats: int) -> dict:
    params = {"n_estimators": trees, "seed": 1}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_sites(Path(tmp), sites, rows, seed=3)
        h = Harness(Path(tmp) / "fed", sites, site_data=paths,
                    data_settings={"label": "label", "positive": "yes", "ignore": [], "missing": "error"})
        h.create()
        h.start()
        fed_s, ref_s = [], []
        try:
            await h.wait_all_alive(60)
            keys = [parse_public_key(s.public_key) for s in h.sites]
            order = sorted(range(sites), key=lambda i: keys[i])
            datasets = [load_csv(DataSpec(csv=paths[i], label="label", positive="yes")) for i in order]
            full = {k: p.default for k, p in bofrf.PARAMS.items()} | params
            for _ in range(repeats):
                job_id = await h.propose(0, "bofrf", params)
                records = await h.wait_job(job_id, timeout_s=900)
                assert {r["state"] for r in records.values()} == {"done"}, [r["error"] for r in records.values()]
                start = min(r["started_ms"] for r in records.values())
                fed_s.append((max(r["finished_ms"] for r in records.values()) - start) / 1000)
                t0 = time.perf_counter()
                bofrf.reference(datasets, [keys[i] for i in order], full)
                ref_s.append(time.perf_counter() - t0)
            rss = [peak_rss_mib(s.process.pid) for s in h.sites]
        finally:
            h.stop()
    fed, ref = statistics.median(fed_s), statistics.median(ref_s)
    return {"sites": sites, "rows_per_site": rows, "trees_per_site": trees, "fedpeer_s": fed, "reference_s": ref,
            "ratio": fed / ref, "peak_rss_mib": rss, "runs": {"fedpeer": fed_s, "reference": ref_s}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    a = parser.parse_args()
    r = asyncio.run(main(a.sites, a.rows, a.trees, a.repeats))
    print(f"BOFRF, {r['sites']} daemons x {r['trees_per_site']} trees x {r['rows_per_site']} rows: fedpeer "
          f"{r['fedpeer_s']:.2f} s vs in-process reference {r['reference_s']:.2f} s -> ratio {r['ratio']:.2f}x "
          f"(target <= 1.5x); peak RSS per daemon {', '.join(f'{v:.0f}' for v in r['peak_rss_mib'])} MiB")
    print(json.dumps(r))
