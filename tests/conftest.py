"""Shared fixtures: sites made with the real `fedpeer init` code in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedpeer.app.sitefiles import add_peers, init_site
from fedpeer.identity import encode_public_key


@pytest.fixture
def two_sites(tmp_path: Path) -> tuple[Path, Path]:
    """Two sites that list each other; returns their peers.toml paths."""
    a, ida = init_site(tmp_path / "a", "a", "127.0.0.1:17401")
    b, idb = init_site(tmp_path / "b", "b", "127.0.0.1:17402")
    add_peers(a, [("b", "127.0.0.1:17402", encode_public_key(idb.public_key))])
    add_peers(b, [("a", "127.0.0.1:17401", encode_public_key(ida.public_key))])
    return a, b
