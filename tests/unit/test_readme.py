"""The README sends readers only to files a clone of the repository has.

Users get the repository, not the design notes and papers it was built from: a link (or a named
document) that resolves outside the clone is a dead end for them.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
DOCUMENT = re.compile(r"(?<![\w./-])([\w./-]+\.md)\b")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)


def _prose(text: str) -> str:
    """The README without code blocks: `[x](y)` inside code is text, not a link."""
    return FENCE.sub("", text)


def relative_links(text: str) -> list[str]:
    prose = CODE_SPAN.sub("", _prose(text))
    found = INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose) + HTML_LINK.findall(prose)
    return [t for t in found if not EXTERNAL.match(t)]


def named_documents(text: str) -> list[str]:
    """Markdown documents named in the prose, linked or not (`ALGORITHMS.md §1`, `DESIGN.md`)."""
    return DOCUMENT.findall(_prose(text))


def unresolved(targets: list[str]) -> list[str]:
    bad = []
    for target in targets:
        path = (REPO / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(REPO) or not path.is_file():
            bad.append(target)
    return bad


def test_the_link_finder_sees_every_kind_of_link() -> None:
    text = ("see [a](docs/a.md#part) and [b][ref], <a href=\"c.html\">c</a>, [web](https://x.org)\n"
            "[ref]: b.txt \"title\"\n```sh\n[--flag](not-a-link)\n```\n`[x](not-either)`\n")
    assert relative_links(text) == ["docs/a.md#part", "b.txt", "c.html"]
    assert unresolved(["README.md", "README.md#two-commands", "../shared/DESIGN.md", "nope.md"]) == \
        ["../shared/DESIGN.md", "nope.md"]


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
