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
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fedpeer harness --sites 3 --job bofrf --data builtin:sonar --split 0.5,0.3,0.2 \
		--baseline boppid --seed 2 --workdir .demo

test: $(STAMP)
	$(BIN)/ruff check fedpeer tests scripts benchmarks
	$(BIN)/python -m pytest -q -n 2

clean:
	rm -rf $(VENV) .demo
