"""Real daemon processes on loopback, started through the harness; always stopped afterwards."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedpeer.app.harness.federation import Harness

pytestmark = pytest.mark.integration


@pytest.fixture
def make_federation(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(n: int, settings: dict[str, dict[str, Any]] | None = None, start: bool = True) -> Harness:
        # The daemons of a test import the training libraries when a job needs them, not at start
        # (~4 s of CPU each: 150 daemons in a run, 2 cores); a test may ask for the preload.
        settings = {**(settings or {})}
        settings["jobs"] = {"preload_ml": False, **settings.get("jobs", {})}
        h = Harness(tmp_path / f"fed{len(made)}", n, settings)
        made.append(h)
        h.create()
        if start:
            h.start()
        return h
    yield make
    for h in made:
        h.stop()


def predict_scores(config_path: Path, job_id: str, data: Path, out: Path, column: str = "score") -> np.ndarray:
    """`fedpeer predict` as an operator runs it; the CSV's score column (or another)."""
    r = subprocess.run([sys.executable, "-m", "fedpeer", "predict", "--config", str(config_path),
                        "--job", job_id, "--data", str(data), "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(out) as f:
        return np.array([float(row[column]) for row in csv.DictReader(f)])


def ml_loaded(site, timeout_s: float = 60) -> None:
    """Wait until the daemon has imported its training libraries (it does so in the background
    after start, ~240 MiB): RSS measured before that would count the import as growth."""
    deadline = time.monotonic() + timeout_s
    while not site.ml_loaded():
        assert time.monotonic() < deadline, f"{site.name} did not load its ML libraries"
        time.sleep(0.1)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
