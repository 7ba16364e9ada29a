"""A site bigger than one machine: histogram XGBoost over rows kept on a Dask cluster
([data] engine = "dask", fedpeer/data/dask.py; issue 15 part 4).

Setup: --rows x --features synthetic rows (default 5,000,000 x 50: a 2 GB float64 matrix),
generated on the fly as --parts Parquet part files (never held whole in this process), read by a
2-worker LocalCluster (worker processes, one thread each); a binary label from a noisy linear
score. This process plays the daemon: it opens the site (`open_site`) and runs one member's
side of histogram mode (`DaskHistSite` through `histrun.train_members`, plain sums in place of
the secure sum): label sum, the 33 sketch sums, then --rounds trees of depth --max-depth.

Measured, side by side in one run:
(1) peak RSS of this process (the daemon) while the Dask site is opened and trained, sampled
    every 10 ms, against the matrix size (rows x features x 8 bytes);
(2) time per tree level on the Dask site (level histograms summed on the workers + the split
    decision + routing the rows, waited for: one round trip to the scheduler more than a job
    makes, which lets the routing overlap the next level's sum), against the memory engine
    (HistSite, numpy in this process) on the first --memory-rows rows of the same data, scaled
    by rows (x rows / memory_rows).
    Best-of and median over the levels of every tree. Workers and this process share the
    machine's cores.
Last line: one JSON object.

Run: .venv/bin/python benchmarks/bench_dask.py [--rows 5000000] [--memory-rows 1000000] [--parts 20]
     [--workdir DIR: keep the parts there and reuse them on the next run]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.config.load import DataSection, JobLimits  # noqa: E402
from fedpeer.data.dask import open_site  # noqa: E402
from fedpeer.kinds.xgboost.target import site_labels  # noqa: E402
from fedpeer.ml.xgb import histrun  # noqa: E402
from fedpeer.ml.xgb.histboost import HistParams  # noqa: E402


def write_parts(root: Path, rows: int, features: int, parts: int) -> list[Path]:
    """Part i: rows of a seeded generator of its own; y = [x . w + noise > 0]."""
    w = np.random.default_rng(0).normal(size=features)
    bounds = np.linspace(0, rows, parts + 1).astype(np.int64)
    files = []
    for i in range(parts):
        rng = np.random.default_rng(1000 + i)
        n = int(bounds[i + 1] - bounds[i])
        X = rng.normal(size=(n, features))
        y = np.where(X @ w + rng.normal(scale=2.0, size=n) > 0, "yes", "no")
        table = pa.table({**{f"f{j}": X[:, j] for j in range(features)}, "label": y})
        files.append(root / f"part-{i:03d}.parquet")
        pq.write_table(table, files[-1], row_group_size=256 * 1024)
        del X, table
    return files


class PeakRss:
    """This process's peak RSS, sampled every 10 ms in a thread."""

    def __init__(self) -> None:
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()


class Timed:
    """A member wrapper timing each level (level_vector + the split decision + after_level)."""

    def __init__(self, member: object) -> None:
        self.m, self.levels, self.phases = member, [], {}
        self._t = None

    def __getattr__(self, name: str):
        return getattr(self.m, name)

    def start_tree(self, k, tree=0):
        self.m.start_tree(k, tree)
        self._settle()                   # the tree's g, h: not part of its first level

    def level_vector(self, growth):
        self._t = time.perf_counter()
        return self.m.level_vector(growth)

    def after_level(self, growth):
        self.m.after_level(growth)
        self._settle()                   # the rows routed: part of this level (one round trip more than a job)
        self.levels.append(time.perf_counter() - self._t)

    def _settle(self) -> None:
        if hasattr(self.m, "states"):
            self.m.d.settle(self.m.states)


def train(member: object, p: HistParams) -> tuple[bytes, list[float], float]:
    timed = Timed(member)
    t = time.perf_counter()
    model = histrun.train_members([timed], p).model
    return model, timed.levels, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--memory-rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=50)
    ap.add_argument("--parts", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-depth", type=int, default=6)
    ap.add_argument("--max-bin", type=int, default=256)
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    from distributed import LocalCluster

    root = Path(args.workdir or tempfile.mkdtemp(prefix="bench-dask-"))
    root.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    files = sorted(root.glob("part-*.parquet"))
    if len(files) != args.parts or sum(pq.read_metadata(f).num_rows for f in files) != args.rows:
        files = write_parts(root, args.rows, args.features, args.parts)     # --workdir keeps them for a rerun
        print(f"wrote {args.parts} Parquet parts of {args.rows:,} x {args.features} in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    p = HistParams(num_round=args.rounds, max_depth=args.max_depth, max_bin=args.max_bin)
    labeller = partial(site_labels, params={"objective": "binary:logistic"})
    matrix = args.rows * args.features * 8
    limits = JobLimits(data_rows_max=max(args.rows, 10_000_000), data_bytes_max=1 << 40)
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                          host="127.0.0.1", memory_limit=0) as cluster:
            data = DataSection(parquet=str(root), label="label", positive="yes", engine="dask",
                               scheduler=cluster.scheduler_address, dask_step_timeout_ms=3_600_000)
            with PeakRss() as rss:
                t = time.perf_counter()
                site = open_site(data, limits, needs_label=True, binary=True)
                opened = time.perf_counter() - t
                member = site.hist_site(p, 1, 0, labeller, None)
                dask_model, dask_levels, dask_total = train(member, p)
                site.close()
            print(f"dask: opened {site.rows:,} rows in {opened:.1f} s, trained in {dask_total:.1f} s; peak daemon "
                  f"RSS {rss.peak / 2**20:.0f} MiB (start {rss.start / 2**20:.0f} MiB), matrix "
                  f"{matrix / 2**20:.0f} MiB", flush=True)
        memory = _memory_rows(files, args.memory_rows)
        with PeakRss() as mem_rss:
            member = histrun.HistSite(memory[0], site_labels(memory[1], {"objective": "binary:logistic"}), p, 1, 0)
            mem_model, mem_levels, mem_total = train(member, p)
        del memory, member
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    scale = args.rows / args.memory_rows
    out = {
        "rows": args.rows, "features": args.features, "parts": args.parts, "memory_rows": args.memory_rows,
        "levels": len(dask_levels), "matrix_mib": round(matrix / 2**20),
        "daemon_peak_rss_mib": round(rss.peak / 2**20), "daemon_rss_start_mib": round(rss.start / 2**20),
        "daemon_peak_over_matrix": round((rss.peak - rss.start) / matrix, 4),
        "dask_open_s": round(opened, 2),
        "dask_level_s_best": round(min(dask_levels), 3),
        "dask_level_s_median": round(statistics.median(dask_levels), 3),
        "memory_level_s_best": round(min(mem_levels), 3),
        "memory_level_s_median": round(statistics.median(mem_levels), 3),
        "memory_scaled_level_s_best": round(min(mem_levels) * scale, 3),
        "memory_scaled_level_s_median": round(statistics.median(mem_levels) * scale, 3),
        "ratio_best": round(min(dask_levels) / (min(mem_levels) * scale), 3),
        "ratio_median": round(statistics.median(dask_levels) / (statistics.median(mem_levels) * scale), 3),
        "dask_train_s": round(dask_total, 1), "memory_train_s": round(mem_total, 1),
        "memory_engine_peak_rss_mib": round(mem_rss.peak / 2**20),
        "cpus": psutil.cpu_count(), "load_avg_1min": round(psutil.getloadavg()[0], 1),
    }
    print(f"level time: dask best {out['dask_level_s_best']} s, median {out['dask_level_s_median']} s; memory engine "
          f"on {args.memory_rows:,} rows x {scale:g}: best {out['memory_scaled_level_s_best']} s, median "
          f"{out['memory_scaled_level_s_median']} s -> ratio best {out['ratio_best']}, median {out['ratio_median']}")
    print(json.dumps(out))


def _memory_rows(files: list[Path], rows: int) -> tuple[np.ndarray, object]:
    """The first `rows` rows of the parts, as the memory engine holds them."""
    from types import SimpleNamespace

    Xs, ys, have = [], [], 0
    for f in files:
        t = pq.read_table(f)
        take = min(rows - have, t.num_rows)
        Xs.append(np.column_stack([t.column(n).to_numpy()[:take] for n in t.column_names if n != "label"]))
        ys.append(np.asarray(t.column("label").to_numpy(zero_copy_only=False)[:take]))
        have += take
        if have >= rows:
            break
    labels = np.concatenate(ys)
    return np.ascontiguousarray(np.concatenate(Xs)), SimpleNamespace(labels=labels,
                                                                      y=(labels == "yes").astype(np.int8))


if __name__ == "__main__":
    main()
