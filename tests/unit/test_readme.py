"""The README and docs/ send readers only to files a clone of the repository has, the README stays
short, and docs/design.md's module map names every module there is.

Users get the repository, not the design notes and papers it was built from: a link (or a named
document) that resolves outside the clone is a dead end for them. A module map that misses a
module, or names one that moved, sends a reader to the wrong file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
DESIGN = DOCS / "design.md"
README_LINES_MAX = 450

FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
DOCUMENT = re.compile(r"(?<![\w./-])([\w./-]+\.md)\b")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)
MODULE_MAP = re.compile(r"^## Module map\n(.*?)(?=^## |\Z)", re.DOTALL | re.MULTILINE)
MAP_ROW = re.compile(r"^\|\s*`(fedpeer/[^`]+\.py)`\s*\|", re.MULTILINE)
MAP_PATH = re.compile(r"`(fedpeer/[\w./-]*)`")


def _prose(text: str) -> str:
    """A document without code blocks: `[x](y)` inside code is text, not a link."""
    return FENCE.sub("", text)


def relative_links(text: str) -> list[str]:
    prose = CODE_SPAN.sub("", _prose(text))
    found = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose) + HTML_LINK.findall(prose)
    return [t for t in found if not EXTERNAL.match(t)]


def named_documents(text: str) -> list[str]:
    """Markdown documents named in the prose, linked or not (`ALGORITHMS.md §1`, `DESIGN.md`)."""
    return DOCUMENT.findall(_prose(text))


def unresolved(targets: list[str], base: Path = REPO) -> list[str]:
    """The targets (relative to `base`, the linking document's folder; anchors aside) that are not
    a file in the repository."""
    bad = []
    for target in targets:
        path = (base / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO) or not path.is_file():
            bad.append(target)
    return bad


def docs() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def modules() -> set[str]:
    """Every module under fedpeer/ but the packages' __init__.py, by its path."""
    return {p.relative_to(REPO).as_posix() for p in (REPO / "fedpeer").rglob("*.py") if p.name != "__init__.py"}


def module_map(text: str) -> str:
    """The "## Module map" section of a document ("" without one)."""
    found = MODULE_MAP.search(text)
    return found.group(1) if found else ""


def mapped_modules(text: str) -> set[str]:
    """The modules a module map lists, one per table row (the row's first cell)."""
    return set(MAP_ROW.findall(module_map(text)))


def test_the_link_finder_sees_every_kind_of_link() -> None:
    text = ("see [a](docs/a.md#part) and [b][ref], <a href=\"c.html\">c</a>, [web](https://x.org)\n"
            "[ref]: b.txt \"title\"\n```sh\n[--flag](not-a-link)\n```\n`[x](not-either)`\n")
    assert relative_links(text) == ["docs/a.md#part", "b.txt", "c.html"]
    assert unresolved(["README.md", "README.md#two-commands", "../shared/DESIGN.md", "nope.md"]) == \
        ["../shared/DESIGN.md", "nope.md"]
    assert unresolved(["../README.md", "README.md", "../../outside.md"], base=DOCS) == ["README.md", "../../outside.md"]


def test_the_module_map_reader_sees_rows_of_its_section_only() -> None:
    text = ("# Design\n| `fedpeer/a.py` | not the map |\n## Module map\n\n| module | role |\n|---|---|\n"
            "| `fedpeer/b/c.py` | c |\n### sub\n| `fedpeer/d.py` | d, see `fedpeer/e.py` |\n## Next\n"
            "| `fedpeer/f.py` | after the map |\n")
    assert mapped_modules(text) == {"fedpeer/b/c.py", "fedpeer/d.py"}
    assert set(MAP_PATH.findall(module_map(text))) == {"fedpeer/b/c.py", "fedpeer/d.py", "fedpeer/e.py"}


def test_every_relative_link_in_the_readme_resolves_to_a_file_in_the_repository() -> None:
    links = relative_links(README.read_text(encoding="utf-8"))
    assert links, "the README links to files in the repository (peers.toml, BENCHMARKS.md)"
    assert unresolved(links) == []


def test_every_document_the_readme_names_is_in_the_repository() -> None:
    names = named_documents(README.read_text(encoding="utf-8"))
    assert "BENCHMARKS.md" in names
    assert unresolved(names) == []


def test_the_readme_points_to_the_scripts() -> None:
    links = relative_links(README.read_text(encoding="utf-8"))
    scripts = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "scripts").iterdir() if p.is_file())
    assert scripts and set(scripts) <= set(links)


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES_MAX, f"README.md: {lines} lines; move the detail to docs/"


def test_the_readme_keeps_the_two_commands_and_links_to_every_doc() -> None:
    text = README.read_text(encoding="utf-8")
    assert "## Two commands" in text and "make demo" in text and "make test" in text
    linked = {t.split("#", 1)[0] for t in relative_links(text)}
    expected = {p.relative_to(REPO).as_posix() for p in docs()}
    assert {"docs/operator-guide.md", "docs/security.md", "docs/algorithms.md", "docs/benchmarks.md",
            "docs/design.md"} <= expected
    assert expected - linked == set(), "docs the README does not link to"


@pytest.mark.parametrize("doc", docs(), ids=lambda p: p.name)
def test_every_relative_link_in_the_docs_resolves_to_a_file_in_the_repository(doc: Path) -> None:
    assert unresolved(relative_links(doc.read_text(encoding="utf-8")), base=doc.parent) == []


@pytest.mark.parametrize("doc", docs(), ids=lambda p: p.name)
def test_every_document_the_docs_name_is_in_the_repository(doc: Path) -> None:
    """A document named in prose is found beside the naming document or at the repository's top."""
    names = named_documents(doc.read_text(encoding="utf-8"))
    assert [n for n in names if unresolved([n], base=doc.parent) and unresolved([n])] == []


def test_every_module_is_in_the_module_map() -> None:
    mapped = mapped_modules(DESIGN.read_text(encoding="utf-8"))
    assert mapped, "docs/design.md has a '## Module map' section with a table of modules"
    missing = sorted(modules() - mapped)
    assert missing == [], "modules docs/design.md's module map leaves out: " + ", ".join(missing)


def test_every_path_the_module_map_names_exists() -> None:
    named = set(MAP_PATH.findall(module_map(DESIGN.read_text(encoding="utf-8"))))
    assert named
    gone = sorted(p for p in named if not (REPO / p).exists())
    assert gone == [], "paths in docs/design.md's module map that do not exist: " + ", ".join(gone)
