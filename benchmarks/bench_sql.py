"""[data] sql throughput: rows/s through fedpeer's sql source against `psql \\copy` to a CSV file.

A throwaway PostgreSQL (tests/integration/pg.py: initdb on PATH, Debian's, or pip's pgserver) gets a
table of ROWS x COLS random doubles plus a text label, built server-side (generate_series). Then,
interleaved (A, B, C, A, B, C, ...), --repeats times each:
  A. `load_data` of `[data] sql = "SELECT * FROM big"` (connect, read-only transaction, result
     description, COPY ... TO STDOUT csv, pyarrow parse, every CSV check, the float64 matrix);
  B. `psql -c "\\copy (SELECT * FROM big) TO 'out.csv' CSV"` (if psql is on PATH): the rows as a CSV
     file, no parsing;
  C. psycopg's `COPY (SELECT * FROM big) TO STDOUT (FORMAT csv)` into memory (the transfer alone).
Best and median seconds, rows/s, and A's time over B's (or C's) — ratio of medians.

Run: .venv/bin/python benchmarks/bench_sql.py [--rows 500000] [--cols 50] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fedpeer.data.dataset import DataSpec, load_data  # noqa: E402
from tests.integration import pg  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=500_000)
    ap.add_argument("--cols", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bindir = pg._bindir()
    if bindir is None:
        sys.exit("no PostgreSQL binaries (initdb on PATH, /usr/lib/postgresql/*/bin or pip's pgserver)")
    base = Path(tempfile.mkdtemp(prefix="fedpeer-pg-bench-"))
    work = Path(tempfile.mkdtemp(prefix="fedpeer-sql-bench-"))
    try:
        server = pg._start(base, bindir)
        try:
            out = run(server, work, args)
        finally:
            pg._stop(base, bindir)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))


def run(server: pg.PgServer, work: Path, args) -> dict:
    import psycopg
    from psycopg import sql

    with psycopg.connect(host=str(server.sockdir), port=server.port, user="postgres", dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {pg.DBNAME}")
    started = time.perf_counter()
    with server.admin() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(pg.ROLE),
                                                                        sql.Literal(pg.PASSWORD)))
        cols = sql.SQL(", ").join(sql.SQL("random() AS {}").format(sql.Identifier(f"c{j}")) for j in range(args.cols))
        conn.execute(sql.SQL("CREATE TABLE big AS SELECT {}, CASE WHEN random() < 0.5 THEN 'yes' ELSE 'no' END AS y "
                             "FROM generate_series(1, {})").format(cols, sql.Literal(args.rows)))
        conn.execute("VACUUM ANALYZE big")
        conn.execute(sql.SQL("GRANT SELECT ON big TO {}").format(sql.Identifier(pg.ROLE)))
    print(f"table big: {args.rows} rows x {args.cols} doubles + label, built in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    dsn = work / "pg.dsn"
    dsn.write_text(server.dsn())
    dsn.chmod(0o600)
    spec = DataSpec(csv=None, sql="SELECT * FROM big", dsn_file=dsn, label="y", positive="yes")
    psql = shutil.which("psql")
    import pyarrow.csv  # noqa: F401 - imports outside the timings

    def a() -> None:
        ds = load_data(spec)
        assert ds.X.shape == (args.rows, args.cols)

    def b() -> None:
        target = work / "out.csv"
        subprocess.run([psql, server.dsn(), "-q", "-c", f"\\copy (SELECT * FROM big) TO '{target}' CSV"],
                       check=True, capture_output=True)
        target.unlink()

    def c() -> None:
        size = 0
        with psycopg.connect(server.dsn()) as conn, conn.cursor() as cur:
            with cur.copy("COPY (SELECT * FROM big) TO STDOUT (FORMAT csv)") as copy:
                parts = []
                for chunk in copy:
                    parts.append(bytes(chunk))
                    size += len(chunk)
                data = b"".join(parts)
        assert len(data) == size > 0

    readers = {"sql source (load_data)": a, "psql \\copy to CSV": b, "psycopg COPY TO STDOUT (bytes)": c}
    if psql is None:
        del readers["psql \\copy to CSV"]
    times: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(args.repeats):
        for name, fn in readers.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    out = {"rows": args.rows, "cols": args.cols, "repeats": args.repeats, "readers": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        out["readers"][name] = {"best_s": min(ts), "median_s": med, "rows_per_s": args.rows / med}
        print(f"{name:34s} best {min(ts):7.3f} s  median {med:7.3f} s  {args.rows / med:12,.0f} rows/s")
    ref = "psql \\copy to CSV" if psql else "psycopg COPY TO STDOUT (bytes)"
    ratio = statistics.median(times["sql source (load_data)"]) / statistics.median(times[ref])
    out["ratio_vs"], out["ratio"] = ref, ratio
    print(f"sql source / {ref}: {ratio:.2f}x (medians)")
    return out


if __name__ == "__main__":
    main()
