"""Which build of fedpeer this is: its software version and the git commit it was built from.

`fedpeer --version`, `fedpeer status` and the SiteInfo a site sends its peers
(fedpeer/jobs/versions.py) all say it, so two builds of the same version can be told apart.

Rules: nothing runs at import. The commit is looked up once, when first asked, by reading the
checkout's `.git` files (a worktree's `.git` file and its common dir, loose refs and
packed-refs): no subprocess. A tree without `.git` (an sdist, a wheel, `git archive`) has no
commit to tell: it says COMMIT_UNKNOWN.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SOFTWARE_VERSION = "0.2.0"          # pyproject.toml's version (tests/unit/test_versions.py checks they agree)
COMMIT_UNKNOWN = "unknown"
COMMIT_SHOWN_CHARS = 12             # as `git log --abbrev=12` shows it
GIT_FILE_BYTES_MAX = 1 << 20        # .git/HEAD, a ref, packed-refs: larger is not a file git wrote
_HEX40 = re.compile(r"[0-9a-f]{40}")


@cache
def commit() -> str:
    """The commit of the checkout this package runs from (12 hex digits), or COMMIT_UNKNOWN."""
    try:
        found = _commit_of(Path(__file__).resolve().parents[2])
    except (OSError, ValueError, UnicodeDecodeError):
        found = None
    return found[:COMMIT_SHOWN_CHARS] if found else COMMIT_UNKNOWN


def describe() -> str:
    """One line: "0.2.0 (commit 1a2b3c4d5e6f)"."""
    return f"{SOFTWARE_VERSION} (commit {commit()})"


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        data = f.read(GIT_FILE_BYTES_MAX + 1)
    if len(data) > GIT_FILE_BYTES_MAX:
        raise ValueError(f"{path}: larger than {GIT_FILE_BYTES_MAX} bytes")
    return data.decode("utf-8")


def _commit_of(root: Path) -> str | None:
    """HEAD's commit in the checkout at `root`, from git's files (None: not a checkout)."""
    dot_git = root / ".git"
    if dot_git.is_file():   # a worktree (or submodule): "gitdir: <path>"
        pointer = _read(dot_git).strip()
        if not pointer.startswith("gitdir:"):
            return None
        git_dir = (root / pointer[len("gitdir:"):].strip()).resolve()
    elif dot_git.is_dir():
        git_dir = dot_git
    else:
        return None
    common = git_dir
    if (git_dir / "commondir").is_file():   # a worktree's refs live in the main repository
        common = (git_dir / _read(git_dir / "commondir").strip()).resolve()
    head = _read(git_dir / "HEAD").strip()
    if _HEX40.fullmatch(head):   # detached
        return head
    if not head.startswith("ref: "):
        return None
    return _ref(git_dir, common, head[len("ref: "):].strip())


def _ref(git_dir: Path, common: Path, ref: str) -> str | None:
    if ".." in ref.split("/"):
        return None
    for base in (git_dir, common):
        loose = base / ref
        if loose.is_file():
            value = _read(loose).strip()
            return value if _HEX40.fullmatch(value) else None
    packed = common / "packed-refs"
    if packed.is_file():
        for line in _read(packed).splitlines():
            parts = line.split(" ")
            if len(parts) == 2 and parts[1] == ref and _HEX40.fullmatch(parts[0]):
                return parts[0]
    return None
