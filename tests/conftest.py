"""Shared fixtures: sites made with the real `fedpeer init` code in a temporary directory, and the
harness's daemons forked from one zygote per test process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedpeer.app.harness import zygote
from fedpeer.app.sitefiles import add_peers, init_site
from fedpeer.identity import encode_public_key


@pytest.fixture(scope="session", autouse=True)
def forked_daemons() -> Iterator[None]:
    """A run starts ~150 harness daemons, most for a job or two: forked from a zygote that imported
    the daemon and its training libraries once (fedpeer/app/harness/zygote.py), each skips ~1 s of
    start-up and ~3 s of imports at its first job. FEDPEER_TEST_FORK=0 starts each with
    `python -m fedpeer start` instead. Sites under a wrapper or another build are never forked."""
    zygote.share(os.environ.get("FEDPEER_TEST_FORK", "1") != "0")
    yield
    zygote.share(False)


@pytest.fixture
def two_sites(tmp_path: Path) -> tuple[Path, Path]:
    """Two sites that list each other; returns their peers.toml paths."""
    a, ida = init_site(tmp_path / "a", "a", "127.0.0.1:17401")
    b, idb = init_site(tmp_path / "b", "b", "127.0.0.1:17402")
    add_peers(a, [("b", "127.0.0.1:17402", encode_public_key(idb.public_key))])
    add_peers(b, [("a", "127.0.0.1:17401", encode_public_key(ida.public_key))])
    return a, b
