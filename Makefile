# The two set-up commands of the README. Each does all set-up on a fresh machine: it creates
# .venv, installs what it uses, then runs. `make demo` installs fedpeer alone (the core every
# site needs); `make test` installs it with every extra and the test tools (and, as root,
# Debian's Chromium for the console's browser test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# On Linux x86_64 and aarch64 fedpeer takes xgboost-cpu (pyproject.toml), which installs the same
# `xgboost` module as the full build: a venv made before holds the full build, which goes first.
DROP_FULL_XGBOOST = $(BIN)/python -c "import platform, sys; sys.exit(not (sys.platform == 'linux' and \
	platform.machine() in ('x86_64', 'aarch64')))" && $(BIN)/pip uninstall --quiet --yes xgboost 2>/dev/null || true

$(DEMO_STAMP): pyproject.toml $(BIN)/python
	@echo "make: installing fedpeer into $(VENV) (a minute or two on a fresh machine)"
	@$(DROP_FULL_XGBOOST)
	$(BIN)/pip install --quiet -e .
	touch $(DEMO_STAMP)

$(TEST_STAMP): pyproject.toml $(BIN)/python
	@echo "make: installing fedpeer with every extra and its test tools into $(VENV) (a few minutes on a fresh machine)"
	@$(DROP_FULL_XGBOOST)
	$(BIN)/pip install --quiet -e '.[test]'
	@# The console's browser test (tests/integration/test_console.py) drives Debian's headless Chromium;
	@# the site-network tests (tests/integration/test_netns.py) put firewalls (iptables) and an HTTP
	@# CONNECT proxy (tinyproxy) between daemons in network namespaces.
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null \
		&& command -v iptables >/dev/null && command -v tinyproxy >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y --no-install-recommends \
		chromium chromium-driver iptables tinyproxy; \
	else echo "make: chromium, chromium-driver, iptables or tinyproxy is not installed and this is not root:" \
		"run 'sudo apt-get install chromium chromium-driver iptables tinyproxy' for the console's browser" \
		"test and the site-network tests (skipped, saying why, without them)" >&2; fi
	touch $(TEST_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/fedpeer harness --sites 3 --job bofrf --data builtin:sonar --split 0.5,0.3,0.2 \
		--baseline boppid --seed 2 --workdir .demo

test: $(TEST_STAMP)
	$(BIN)/ruff check fedpeer tests scripts benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist worksteal

clean:
	rm -rf $(VENV) .demo
