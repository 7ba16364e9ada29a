#!/usr/bin/env bash
# Run every benchmark in benchmarks/ (bench_*.py and *_experiment.py), one after the other, each
# the way its header says (`.venv/bin/python benchmarks/NAME.py`, default arguments), and keep
# each one's output in a file; at the end print where every output went and how each run ended.
#
# Each benchmark measures fedpeer and its reference side by side and prints ratios (most end
# with one JSON line). BENCHMARKS.md is written by hand from these outputs: compare the new
# files with its tables and update the figures that moved. Running all of them takes a long
# time (real daemons, many seeds) and wants a quiet machine: the ratios are only fair then.
#
# Usage: scripts/run_benchmarks.sh [--out DIR] [--only NAME]... [--data-dir DIR] [--bench-dir DIR] [--list]
#   --out DIR        where the outputs go (default: .bench/<UTC time>/ in this clone)
#   --only NAME      run only this benchmark (file name with or without .py); repeatable
#   --data-dir DIR   the CSVs bofrf_experiment.py reads (Sonar.csv, Ionosphere.csv,
#                    BreastCancer.csv); without it, and without the benchmark's own default
#                    (../shared/data beside the clone), it runs on the bundled Sonar data and
#                    scikit-learn's breast cancer data only
#   --bench-dir DIR  the benchmarks to run (default: benchmarks/ in this clone)
#   --list           print the command each benchmark would run with, and run nothing
#   -h, --help       print this text
# Exit codes: 0 every benchmark exited 0; 1 one or more failed (see the summary); 2 a usage error.
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
fail() { echo "run_benchmarks.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "$0")/.." && pwd)
out="" data_dir="" bench_dir="$repo/benchmarks" only=() list=0
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --list) list=1; shift ;;
        --out|--only|--data-dir|--bench-dir)
            [ $# -ge 2 ] || fail "$1 needs a value"
            case "$1" in
                --out) out=$2 ;; --only) only+=("${2%.py}") ;;
                --data-dir) data_dir=$2 ;; --bench-dir) bench_dir=$2 ;;
            esac
            shift 2 ;;
        *) fail "unknown argument '$1' (see --help)" ;;
    esac
done
[ -d "$bench_dir" ] || fail "--bench-dir $bench_dir is not a directory"
python=python3; [ -x "$repo/.venv/bin/python" ] && python="$repo/.venv/bin/python"
out=${out:-"$repo/.bench/$(date -u +%Y%m%dT%H%M%SZ)"}
if [ "$list" -eq 0 ]; then
    mkdir -p "$out" || fail "cannot create $out"
    out=$(cd "$out" && pwd)
fi

benchmarks=()
for path in "$bench_dir"/bench_*.py "$bench_dir"/*_experiment.py; do
    [ -e "$path" ] || continue
    name=$(basename "$path" .py)
    if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " == *" $name "* ]]; then continue; fi
    benchmarks+=("$path")
done
[ ${#benchmarks[@]} -gt 0 ] || fail "no benchmark matches in $bench_dir"
for name in "${only[@]}"; do   # a typo in --only must not pass as "nothing to run"
    [ -e "$bench_dir/$name.py" ] || fail "--only $name: no benchmarks/$name.py"
done

# bofrf_experiment.py reads CSVs that live outside the repository (its default: ../shared/data).
# Without them, run it on what ships with fedpeer, so the script works in any clone.
experiment_args() {
    [ "$1" = bofrf_experiment ] || return 0
    if [ -n "$data_dir" ]; then printf '%s\n' --data-dir "$data_dir"; return 0; fi
    [ -d "$repo/../shared/data" ] && return 0
    if [ "$list" -eq 0 ]; then
        mkdir -p "$out/data" && cp "$repo/fedpeer/data/sonar.csv" "$out/data/Sonar.csv"
    fi
    printf '%s\n' --data-dir "$out/data" --datasets sonar sklearn_breast_cancer
}

summary=() failed=0
for path in "${benchmarks[@]}"; do
    name=$(basename "$path" .py)
    mapfile -t extra < <(experiment_args "$name")
    if [ "$list" -eq 1 ]; then echo "$python $path ${extra[*]}"; continue; fi
    echo "== $name $(date -u +%H:%M:%S) -> $out/$name.txt" >&2
    started=$SECONDS
    # Benchmarks import fedpeer from the clone and siblings from their own directory.
    (cd "$repo" && "$python" "$path" "${extra[@]}") 2> "$out/$name.err" | tee "$out/$name.txt"
    code=${PIPESTATUS[0]}
    [ "$code" -eq 0 ] || failed=1
    summary+=("$(printf '%-22s exit %-3s %5ss  %s' "$name" "$code" $((SECONDS - started)) "$out/$name.txt")")
done

[ "$list" -eq 0 ] || exit 0
echo "Benchmark outputs (stdout in NAME.txt, stderr in NAME.err) are in $out:"
printf '  %s\n' "${summary[@]}"
exit "$failed"
