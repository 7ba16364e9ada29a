"""Loading a site's data: fedpeer's `load_csv` / `load_data` against the readers everyone uses.

1. CSV: a ROWS x COLS file of random doubles (written by pyarrow, shortest round-trip text, ~18
   characters a value) plus a yes/no label column, generated into a temporary directory.
   `load_csv` (pyarrow fast path, every check, the float64 matrix) against `pandas.read_csv` (a
   DataFrame, no checks) if pandas is installed, else against `pyarrow.csv.read_csv` — the output
   says which — and `pyarrow.csv.read_csv` always. Interleaved (A, B, C, A, B, C, ...) in one run,
   --repeats times each; best and median; the ratio of medians and of bests.
2. Peak memory: each reader in a fresh subprocess (imports done first): ru_maxrss after loading,
   the RSS before loading, and the final float64 matrix's bytes (rows x features x 8). The ratio the
   issue asks for is (peak RSS - RSS before loading) / matrix bytes: what loading adds, over what it
   must end with. Linux carries a parent's ru_maxrss across fork + exec, so these children are
   started first, while this process is small; VmHWM (the child's own high-water mark) is shown
   beside it as a cross-check.
3. Parquet: the same table as one Parquet file (snappy): `load_data` against
   `pyarrow.parquet.read_table`, interleaved the same way.
4. Fresh processes: each load of 1. and 3. (ours and its reference, interleaved, --repeats times)
   in a process of its own, timed from after the imports. In one process, repeated, a reader
   that allocates from pyarrow's pool (`read_table`) gets the pages it freed the round before,
   already faulted, while a matrix from numpy pays for fresh pages every round; a fresh process
   is what a job's load meets (the daemon loads the site's rows once per job) and charges both
   for their memory.

Run: .venv/bin/python benchmarks/bench_data.py [--rows 1000000] [--cols 50] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.data.dataset import DataSpec, load_csv, load_data  # noqa: E402

try:
    import pandas
except ImportError:          # the CSV reference is then pyarrow's reader
    pandas = None


def generate(directory: Path, rows: int, cols: int, seed: int = 0) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    names = [f"f{j}" for j in range(cols)]
    csv_path, parquet_path = directory / "site.csv", directory / "site.parquet"
    writer = None
    pwriter = None
    step = 100_000
    for start in range(0, rows, step):
        n = min(step, rows - start)
        table = pa.table({**{name: rng.normal(size=n) for name in names},
                          "label": np.where(rng.random(n) < 0.4, "yes", "no")})
        if writer is None:
            writer = pacsv.CSVWriter(str(csv_path), table.schema,
                                     write_options=pacsv.WriteOptions(quoting_style="none"))
            pwriter = pq.ParquetWriter(str(parquet_path), table.schema)
        writer.write_table(table)
        pwriter.write_table(table)
    writer.close()
    pwriter.close()
    return csv_path, parquet_path


def interleaved(runs: dict[str, callable], repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t)
            del result
    return times


MEMORY_CHILD = r"""
import resource, sys, json
kind, path = sys.argv[1], sys.argv[2]
import numpy as np, pyarrow as pa, pyarrow.csv, pyarrow.parquet
from fedpeer.data.dataset import DataSpec, load_csv, load_data
try:
    import pandas
except ImportError:
    pandas = None
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
import time
before = rss()
t, c = time.perf_counter(), time.process_time()
if kind == "load_csv":
    X = load_csv(DataSpec(path, "label", "yes")).X
elif kind == "load_data(parquet)":
    X = load_data(DataSpec(None, "label", "yes", parquet=path)).X
elif kind == "pandas.read_csv+to_numpy":
    X = pandas.read_csv(path).drop(columns="label").to_numpy(dtype=np.float64)
elif kind == "pandas.read_csv":
    X = pandas.read_csv(path)
elif kind == "pyarrow.csv.read_csv":
    X = pyarrow.csv.read_csv(path)
elif kind == "pyarrow.parquet.read_table":
    X = pyarrow.parquet.read_table(path)
wall, cpu = time.perf_counter() - t, time.process_time() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"before": before, "peak": peak, "vm_hwm": hwm, "matrix": int(getattr(X, "nbytes", 0)),
                  "wall_s": wall, "cpu_s": cpu}))
"""


def memory(kind: str, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, kind, str(path)], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout)


def summary(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"best_s": min(v), "median_s": statistics.median(v), "runs_s": v} for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_data.") as tmp:
        t = time.perf_counter()
        csv_path, parquet_path = generate(Path(tmp), args.rows, args.cols)
        doc: dict = {"rows": args.rows, "cols": args.cols, "repeats": args.repeats, "cpus": os.cpu_count(),
                     "csv_bytes": csv_path.stat().st_size, "parquet_bytes": parquet_path.stat().st_size,
                     "generate_s": time.perf_counter() - t, "pyarrow": pa.__version__,
                     "pandas": pandas.__version__ if pandas else None,
                     "load_average_before": os.getloadavg()}
        matrix = args.rows * args.cols * 8
        doc["matrix_bytes"] = matrix
        kinds = ["load_csv", "load_data(parquet)"] + (["pandas.read_csv+to_numpy"] if pandas is not None else [])
        doc["memory"] = {}
        for kind in kinds:
            m = memory(kind, parquet_path if "parquet" in kind else csv_path)
            m["added_over_matrix"] = (m["peak"] - m["before"]) / matrix
            m["peak_over_matrix"] = m["peak"] / matrix
            doc["memory"][kind] = m
        # Fresh processes, interleaved: each load pays for its own memory, as a daemon's job does.
        fresh_kinds = {"csv": ["load_csv", "pandas.read_csv" if pandas is not None else "pyarrow.csv.read_csv"],
                       "parquet": ["load_data(parquet)", "pyarrow.parquet.read_table"]}
        for section, (ours, ref) in fresh_kinds.items():
            path = parquet_path if section == "parquet" else csv_path
            wall: dict[str, list[float]] = {ours: [], ref: []}
            cpu: dict[str, list[float]] = {ours: [], ref: []}
            for _ in range(args.repeats):
                for kind in (ours, ref):
                    m = memory(kind, path)
                    wall[kind].append(m["wall_s"])
                    cpu[kind].append(m["cpu_s"])
            doc[f"fresh_{section}"] = {"wall": summary(wall), "cpu": summary(cpu), "reference": ref,
                                       "ratio": {"median": statistics.median(wall[ours]) / statistics.median(wall[ref]),
                                                 "best": min(wall[ours]) / min(wall[ref]),
                                                 "cpu_median": statistics.median(cpu[ours])
                                                 / statistics.median(cpu[ref])}}
        spec = DataSpec(csv_path, "label", "yes")
        runs = {"load_csv": lambda: load_csv(spec)}
        if pandas is not None:
            runs["pandas.read_csv"] = lambda: pandas.read_csv(csv_path)
        runs["pyarrow.csv.read_csv"] = lambda: pacsv.read_csv(csv_path)
        csv_times = summary(interleaved(runs, args.repeats))
        reference = "pandas.read_csv" if pandas is not None else "pyarrow.csv.read_csv"
        doc["csv"] = csv_times
        doc["csv_reference"] = reference
        for ref in ("pandas.read_csv", "pyarrow.csv.read_csv"):
            if ref in csv_times:
                doc[f"csv_ratio_vs_{ref}"] = {
                    "median": csv_times["load_csv"]["median_s"] / csv_times[ref]["median_s"],
                    "best": csv_times["load_csv"]["best_s"] / csv_times[ref]["best_s"]}
        pspec = DataSpec(None, "label", "yes", parquet=parquet_path)
        pq_times = summary(interleaved({"load_data(parquet)": lambda: load_data(pspec),
                                        "pyarrow.parquet.read_table": lambda: pq.read_table(parquet_path)},
                                       args.repeats))
        doc["parquet"] = pq_times
        doc["parquet_ratio"] = {
            "median": pq_times["load_data(parquet)"]["median_s"] / pq_times["pyarrow.parquet.read_table"]["median_s"],
            "best": pq_times["load_data(parquet)"]["best_s"] / pq_times["pyarrow.parquet.read_table"]["best_s"]}
        doc["load_average_after"] = os.getloadavg()     # 1 / 5 / 15 minutes: the 2 cores are shared
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    mib = 1 << 20
    print(f"{args.rows} rows x {args.cols} features: CSV {doc['csv_bytes'] / mib:.0f} MiB, Parquet "
          f"{doc['parquet_bytes'] / mib:.0f} MiB, float64 matrix {matrix / mib:.0f} MiB; {doc['cpus']} CPUs; "
          f"pyarrow {doc['pyarrow']}, pandas {doc['pandas']}")
    print("  load average (1 / 5 / 15 min) before: " + " / ".join(f"{x:.2f}" for x in doc["load_average_before"])
          + ", after: " + " / ".join(f"{x:.2f}" for x in doc["load_average_after"]))
    for section in ("csv", "parquet"):
        for name, s in doc[section].items():
            print(f"  {name:28s} best {s['best_s']:6.2f} s  median {s['median_s']:6.2f} s  "
                  f"({', '.join(f'{x:.2f}' for x in s['runs_s'])})")
    for ref in ("pandas.read_csv", "pyarrow.csv.read_csv"):
        if f"csv_ratio_vs_{ref}" in doc:
            r = doc[f"csv_ratio_vs_{ref}"]
            print(f"  load_csv / {ref}: median {r['median']:.2f}x, best {r['best']:.2f}x")
    r = doc["parquet_ratio"]
    print(f"  load_data(parquet) / pyarrow.parquet.read_table: median {r['median']:.2f}x, best {r['best']:.2f}x")
    for section in ("csv", "parquet"):
        f = doc[f"fresh_{section}"]
        for name, w in f["wall"].items():
            print(f"  fresh process: {name:26s} best {w['best_s']:6.2f} s  median {w['median_s']:6.2f} s  "
                  f"CPU median {f['cpu'][name]['median_s']:6.2f} s")
        first = next(iter(f["wall"]))
        print(f"  fresh process: {first} / {f['reference']}: median {f['ratio']['median']:.2f}x, "
              f"best {f['ratio']['best']:.2f}x, CPU median {f['ratio']['cpu_median']:.2f}x")
    for kind, m in doc["memory"].items():
        print(f"  memory {kind:26s} before {m['before'] / mib:5.0f} MiB, peak {m['peak'] / mib:5.0f} MiB: "
              f"VmHWM {m['vm_hwm'] / mib:5.0f} MiB: (peak - before) / matrix = {m['added_over_matrix']:.2f}, "
              f"peak / matrix = {m['peak_over_matrix']:.2f}")


if __name__ == "__main__":
    main()
