"""Persistence under the state directory.

Rules: whole files are replaced atomically (write temp -> fsync -> rename -> fsync directory), so a
crash leaves either the old or the new content, never a torn one. Nothing here is pickled: JSON for
documents, raw little-endian integers for counters.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from .errors import FedpeerError


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json(path: Path, doc: Any) -> None:
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=True).encode("utf-8") + b"\n")


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise FedpeerError(f"{path}: unreadable state file: {exc}") from None


class Counter:
    """One unsigned 64-bit counter in its own 8-byte file, updated in place with pwrite.

    An 8-byte aligned pwrite inside one page is not torn by a process crash, and costs one syscall,
    so a receiver can record every accepted sequence number (replay protection survives kill -9).
    `sync()` fsyncs for power loss; call it periodically, not per message.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        raw = os.pread(self._fd, 8, 0)
        self.value: int = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
        self._dirty = False

    def set(self, value: int) -> None:
        self.value = value
        os.pwrite(self._fd, struct.pack("<Q", value), 0)
        self._dirty = True

    def sync(self) -> None:
        if self._dirty:
            os.fsync(self._fd)
            self._dirty = False

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
            os.close(self._fd)
            self._fd = -1


class StateDir:
    """The node's state directory: node facts, replay high-water marks, later job records."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def next_incarnation(self) -> int:
        """SWIM incarnation for this boot: strictly above every earlier boot's (persisted first)."""
        doc = read_json(self.root / "node.json", {}) or {}
        incarnation = int(doc.get("incarnation", 0)) + 1
        self.save_incarnation(incarnation)
        return incarnation

    def save_incarnation(self, incarnation: int) -> None:
        write_json(self.root / "node.json", {"incarnation": incarnation})

    def load_vote(self) -> tuple[int, bytes | None]:
        """The election's hard state (term, voted_for): must survive restarts (one vote per term)."""
        doc = read_json(self.root / "election.json", {}) or {}
        voted = doc.get("voted_for")
        return int(doc.get("term", 0)), bytes.fromhex(voted) if voted else None

    def save_vote(self, term: int, voted_for: bytes | None) -> None:
        write_json(self.root / "election.json", {"term": term, "voted_for": voted_for.hex() if voted_for else None})

    def counter(self, *parts: str) -> Counter:
        return Counter(self.root.joinpath(*parts))
