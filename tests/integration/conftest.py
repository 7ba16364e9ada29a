"""Real daemon processes on loopback, started through the harness; always stopped afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from fedpeer.harness import Harness

pytestmark = pytest.mark.integration


@pytest.fixture
def make_federation(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(n: int, settings: dict[str, dict[str, Any]] | None = None, start: bool = True) -> Harness:
        h = Harness(tmp_path / f"fed{len(made)}", n, settings or {})
        made.append(h)
        h.create()
        if start:
            h.start()
        return h
    yield make
    for h in made:
        h.stop()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
