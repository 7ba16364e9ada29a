#!/usr/bin/env python3
"""Split one CSV into site shares: one file per site, stratified by the label, seeded.

The same split the harness gives its sites (`fedpeer.app.harness.federation.split_csv`), for an operator who
sets sites up by hand or wants to hand each partner a share of a public data set. Each share
keeps the header row; every class is spread over the shares in the given fractions.

    .venv/bin/python scripts/split_csv.py DATA.csv --label Class --split 0.5,0.3,0.2 --out-dir shares
    .venv/bin/python scripts/split_csv.py builtin:sonar --sites 3 --out-dir shares

builtin:sonar and builtin:breast_cancer name the bundled data sets (their label is known).
Exit codes: 0 written; 2 a usage error (bad --split, no such label or file).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

# Run from a clone without installing: the package sits beside this directory.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

EXIT_OK, EXIT_USAGE = 0, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="split_csv.py", description=__doc__.split("\n\n")[0],
                                epilog="Output: OUT_DIR/part-1.csv ... part-N.csv, one per site, in site order.")
    p.add_argument("csv", help="the CSV to split (header row), or builtin:sonar / builtin:breast_cancer")
    p.add_argument("--label", help="the label column to stratify by (known for builtin: data)")
    p.add_argument("--sites", type=int, help="number of equal shares (default: one per --split fraction, else 3)")
    p.add_argument("--split", default="stratified",
                   help="'stratified' (equal shares) or comma-separated fractions adding up to 1, e.g. 0.5,0.3,0.2")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle (default: 0)")
    p.add_argument("--out-dir", type=Path, default=Path("shares"), help="where the shares go (default: ./shares)")
    return p


def _sites(args: argparse.Namespace) -> int:
    from fedpeer.errors import FedpeerError

    if args.split == "stratified":
        if args.sites is not None and args.sites < 1:
            raise FedpeerError(f"--sites {args.sites}: need at least one share")
        return args.sites or 3
    fractions = len(args.split.split(","))
    if args.sites is not None and args.sites != fractions:
        raise FedpeerError(f"--sites {args.sites} but --split names {fractions} fractions")
    return fractions


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # imported here, after sys.path names this clone (and so --help stays quick)
    from fedpeer.app.harness.federation import BUILTIN, builtin_csv, split_csv
    from fedpeer.errors import FedpeerError

    try:
        sites = _sites(args)
        label = args.label or BUILTIN.get(args.csv, (None,))[0]
        if label is None:
            raise FedpeerError("--label is required (the column to stratify by)")
        with tempfile.TemporaryDirectory() as tmp:
            source = builtin_csv(args.csv, Path(tmp) / "data.csv") if args.csv in BUILTIN else Path(args.csv)
            paths = split_csv(source, label, sites, args.split, args.seed, args.out_dir)
    except (FedpeerError, OSError, ValueError) as exc:
        print(f"split_csv.py: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for path in paths:
        with open(path, newline="", encoding="utf-8") as f:
            rows = sum(1 for _ in csv.reader(f)) - 1   # a quoted field may hold a newline
        print(f"{path}\t{rows} rows")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
