"""scripts/: every tool has a header and --help, and does its job on a small real run.

The scripts are run as an operator runs them (subprocesses, from another directory), so a
script that only works from the top of the clone, or only with fedpeer on PATH, fails here.
"""

from __future__ import annotations

import csv
import itertools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import split_csv
from fedpeer.config import load as cfg
from fedpeer.identity import encode_public_key, load_key_file

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SONAR = REPO / "fedpeer" / "app" / "harness" / "data" / "sonar.csv"      # 208 rows: 111 M (mines), 97 R (rocks)
FEDPEER = Path(sys.executable).with_name("fedpeer")
TOOLS = ["split_csv.py", "sites_by_hand.sh", "run_benchmarks.sh", "lint.sh"]


def run(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPTS / script)] if script.endswith(".py") else [str(SCRIPTS / script)]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("script", TOOLS)
def test_every_script_has_a_header_and_help(script: str, tmp_path: Path) -> None:
    text = (SCRIPTS / script).read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env "), "runs as ./scripts/NAME"
    assert (SCRIPTS / script).stat().st_mode & stat.S_IXUSR
    header = text.split("\n", 2)[1]
    assert header.startswith(('"""', "# ")) and len(header) > 20, "the second line says what the script does"
    r = run(script, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower() and "--help" in r.stdout
    assert list(tmp_path.iterdir()) == [], "--help does nothing else"


def test_split_csv_gives_the_harness_split_of_the_bundled_data(tmp_path: Path) -> None:
    r = run("split_csv.py", str(SONAR), "--label", "Class", "--split", "0.5,0.3,0.2", "--seed", "4",
            "--out-dir", "shares", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    parts = [tmp_path / "shares" / f"part-{k}.csv" for k in (1, 2, 3)]
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == [str(Path("shares") / p.name) for p in parts]
    shares = [rows(p) for p in parts]
    assert all(s[0] == rows(SONAR)[0] for s in shares), "every share keeps the header"
    shared_rows = itertools.chain.from_iterable(s[1:] for s in shares)
    assert sorted(map(tuple, shared_rows)) == sorted(map(tuple, rows(SONAR)[1:]))
    for label, count in (("M", 111), ("R", 97)):   # each class is cut at the same fractions
        cuts = [0, round(count * 0.5), round(count * 0.8), count]
        assert [sum(row[-1] == label for row in s[1:]) for s in shares] == [b - a for a, b in itertools.pairwise(cuts)]
    # the very split the harness gives its sites, not a second implementation of it
    reference = split_csv(SONAR, "Class", 3, "0.5,0.3,0.2", 4, tmp_path / "reference")
    assert [p.read_bytes() for p in parts] == [p.read_bytes() for p in reference]


def test_split_csv_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    for args, says in ((["--label", "Class", "--split", "0.5,0.6"], "add up to 1"),
                       (["--label", "Nope"], "no column 'Nope'"),
                       (["--label", "Class", "--sites", "2", "--split", "0.5,0.3,0.2"], "--sites 2")):
        r = run("split_csv.py", str(SONAR), *args, "--out-dir", "shares", cwd=tmp_path)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.splitlines()) == 1, (args, r.stderr)


def test_two_sites_by_hand_list_each_other_with_the_right_keys(tmp_path: Path) -> None:
    r = run("sites_by_hand.sh", "--sites", "2", "--dir", "fed", "--base-port", "17500",
            "--data", str(SONAR), "--label", "Class", "--positive", "M", "--fedpeer", str(FEDPEER), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sites = [tmp_path / "fed" / name for name in ("site-1", "site-2")]
    configs = [cfg.load(site / "peers.toml") for site in sites]
    keys = [load_key_file(c.node.key_file, c.path).public_key for c in configs]
    for me, other in ((0, 1), (1, 0)):
        (peer,) = configs[me].peers
        assert peer.name == f"site-{other + 1}" and str(peer.address) == f"127.0.0.1:{17500 + other}"
        assert encode_public_key(peer.public_key) == encode_public_key(keys[other])
        assert Path(configs[me].data.csv).is_file() and configs[me].data.label == "Class"
    assert sum(len(rows(Path(c.data.csv))) - 1 for c in configs) == 208, "each site has its share of the rows"
    for site in sites:
        assert f"{FEDPEER} start --config {site / 'peers.toml'}" in r.stdout
    assert f"{FEDPEER} peer add --config {sites[0] / 'peers.toml'} --name site-2" in r.stderr, \
        "the operator sees the real commands"


def test_sites_by_hand_stops_at_the_first_refusal(tmp_path: Path) -> None:
    first = run("sites_by_hand.sh", "--sites", "2", "--dir", "fed", "--fedpeer", str(FEDPEER), cwd=tmp_path)
    assert first.returncode == 0
    again = run("sites_by_hand.sh", "--sites", "2", "--dir", "fed", "--fedpeer", str(FEDPEER), cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr, "init never overwrites a site"
    assert run("sites_by_hand.sh", "--sites", "1", cwd=tmp_path).returncode == 2


def test_run_benchmarks_lists_every_benchmark_in_the_repository(tmp_path: Path) -> None:
    r = run("run_benchmarks.sh", "--list", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runnable = sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                      if 'if __name__ == "__main__"' in p.read_text(encoding="utf-8"))
    assert len(runnable) >= 8
    assert sorted(Path(line.split()[1]).name for line in r.stdout.splitlines()) == runnable
    assert list(tmp_path.iterdir()) == [], "--list runs nothing and writes nothing"


def test_run_benchmarks_keeps_each_output_and_says_where(tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "bench_fast.py").write_text("print('fedpeer 1.0 ms, reference 0.5 ms: 2.00x')\n")
    (bench / "small_experiment.py").write_text("import sys\nprint('partial')\nsys.exit('broke')\n")
    (bench / "helper.py").write_text("raise SystemExit('helpers are not benchmarks')\n")
    r = run("run_benchmarks.sh", "--bench-dir", str(bench), "--out", "out", cwd=tmp_path)
    assert r.returncode == 1, "one benchmark failed"
    out = tmp_path / "out"
    assert (out / "bench_fast.txt").read_text() == "fedpeer 1.0 ms, reference 0.5 ms: 2.00x\n"
    assert (out / "small_experiment.txt").read_text() == "partial\n"
    assert (out / "small_experiment.err").read_text() == "broke\n"
    assert not (out / "helper.txt").exists()
    summary = r.stdout.split("Benchmark outputs", 1)[1]
    assert f"{out / 'bench_fast.txt'}" in summary and f"{out / 'small_experiment.txt'}" in summary
    assert "exit 0" in summary and "exit 1" in summary
    only = run("run_benchmarks.sh", "--bench-dir", str(bench), "--out", "only", "--only", "bench_fast", cwd=tmp_path)
    assert only.returncode == 0 and sorted(p.name for p in (tmp_path / "only").iterdir()) == \
        ["bench_fast.err", "bench_fast.txt"]


def test_lint_runs_ruff_check_over_the_project_from_the_top_of_the_clone(tmp_path: Path) -> None:
    fake = tmp_path / "ruff"
    fake.write_text('#!/bin/sh\necho "$PWD"\necho "$@"\nexit 1\n')
    fake.chmod(0o755)
    r = run("lint.sh", "--statistics", cwd=tmp_path, env={"RUFF": str(fake)})
    assert r.returncode == 1, "ruff's findings are the script's exit code"
    assert r.stdout.splitlines() == [str(REPO), "check fedpeer tests scripts benchmarks --statistics"]
