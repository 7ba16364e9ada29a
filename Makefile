# The two set-up commands of the README. Each does all set-up on a fresh machine:
# it creates .venv, installs fedpeer with its test tools, then runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@# The console's browser test (tests/integration/test_console.py) drives Debian's headless Chromium.
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver; \
	else echo "make: chromium and chromium-driver are not installed and this is not root: run" \
		"'sudo apt-get install chromium chromium-driver' for the console's browser test" \
		"(it fails under CI=true without them, and is skipped otherwise)" >&2; fi
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fedpeer harness --sites 3 --job bofrf --data builtin:sonar --split 0.5,0.3,0.2 \
		--baseline boppid --seed 2 --workdir .demo

test: $(STAMP)
	$(BIN)/ruff check fedpeer tests scripts benchmarks
	$(BIN)/python -m pytest -q -n 2

clean:
	rm -rf $(VENV) .demo
