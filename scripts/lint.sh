#!/usr/bin/env bash
# Lint the whole project: `ruff check fedpeer tests scripts benchmarks`, run from the top of this
# clone so ruff finds the project's configuration in pyproject.toml. Any further arguments go to
# ruff after the paths (e.g. --fix, --statistics, --output-format concise).
#
# ruff comes with the dev extra: .venv/bin/pip install -e '.[dev]'. The script uses this clone's
# .venv/bin/ruff, else the ruff on PATH; RUFF=/path/to/ruff picks another one.
#
# Usage: scripts/lint.sh [RUFF-OPTIONS...]
#   -h, --help   print this text
# Exit codes: ruff's own (0 no findings, 1 findings, 2 ruff's usage error); 127 no ruff installed.
set -euo pipefail

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
ruff=${RUFF:-}
if [ -z "$ruff" ]; then
    if [ -x "$repo/.venv/bin/ruff" ]; then ruff="$repo/.venv/bin/ruff"; else ruff=$(command -v ruff || true); fi
fi
if [ -z "$ruff" ]; then
    echo "lint.sh: ruff is not installed; install the dev extra: .venv/bin/pip install -e '.[dev]'" >&2
    exit 127
fi
cd "$repo"
exec "$ruff" check fedpeer tests scripts benchmarks "$@"
