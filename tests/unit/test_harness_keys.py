"""A demo federation is reproducible: the harness derives its sites' keys from --seed (every
member's seeds derive from the job's seed and its key), and only when asked to."""

from __future__ import annotations

from pathlib import Path

from fedpeer.app.harness.federation import Harness


def keys(workdir: Path, seed: int | None) -> list[str]:
    h = Harness(workdir, 3, key_seed=seed)
    h.create()
    return [site.public_key for site in h.sites]


def test_sites_keys_repeat_with_a_seed_and_never_without(tmp_path: Path) -> None:
    first, again, other = keys(tmp_path / "a", 2), keys(tmp_path / "b", 2), keys(tmp_path / "c", 3)
    assert first == again and len(set(first)) == 3
    assert not set(first) & set(other)
    assert not set(keys(tmp_path / "d", None)) & set(keys(tmp_path / "e", None))
    assert (tmp_path / "a" / "site-1" / "identity.key").stat().st_mode & 0o777 == 0o600
