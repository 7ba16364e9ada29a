"""The package's shape, checked from its source (docs/design.md, "Layout"): each folder is one
idea, imports only go down the layers, the job kinds' families and the maths' families do not
import each other, there is no import circle, and nothing outside fedpeer/kinds/ names a kind.

Every import counts, at module level or inside a function, TYPE_CHECKING ones too: a circle that
only a function-level import closes is still a circle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fedpeer"

# Top to bottom: a module may import its own layer and the layers below it, never one above.
LAYERS = [
    ("fedpeer.testing",),           # what tests, simulations and benchmarks build on; the daemon never imports it
    ("fedpeer.__main__",),
    ("fedpeer.app",),
    ("fedpeer.daemon",),
    ("fedpeer.kinds",),
    ("fedpeer.jobs",),
    ("fedpeer.ml",),
    ("fedpeer.data",),
    ("fedpeer.protocols",),
    ("fedpeer.runtime",),
    ("fedpeer.net",),
    ("fedpeer.wire",),
    ("fedpeer.config",),
    ("fedpeer.identity",),
    ("fedpeer.core",),
    ("fedpeer.base",),
    ("fedpeer.errors", "fedpeer"),
]
# Packages whose sub-packages are families that must not import each other (their shared modules
# sit directly in the package: fedpeer/ml/evaluation.py, fedpeer/kinds/catalog.py).
FAMILIES = ("fedpeer.kinds", "fedpeer.ml", "fedpeer.core")
CATALOG = "fedpeer.kinds.catalog"      # the one module that lists every kind
MODULE_LINES_MAX = 650
FOLDER_MODULES_MAX = 15


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The fedpeer modules `name` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES and target != name and target.split(".")[0] == "fedpeer":
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes if p != "fedpeer") or name in prefixes:
            return i
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS (and to docs/design.md)")


def test_every_module_is_in_a_layer() -> None:
    for name in MODULES:
        _layer(name)


def test_imports_only_go_down() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets if _layer(b) < _layer(a))
    assert upward == [], "imports that go up a layer:\n" + "\n".join(upward)


def _family(name: str) -> str | None:
    for package in FAMILIES:
        rest = name[len(package) + 1:].split(".") if name.startswith(package + ".") else []
        if len(rest) > 1 or (rest and f"{package}.{rest[0]}" in MODULES and MODULES[f"{package}.{rest[0]}"].name
                             == "__init__.py"):
            return f"{package}.{rest[0]}"
    return None


def test_families_do_not_import_each_other() -> None:
    crossing = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                      if a != CATALOG and _family(a) and _family(b) and _family(a) != _family(b)
                      and _family(a).rpartition(".")[0] == _family(b).rpartition(".")[0])
    assert crossing == [], "one family imports another:\n" + "\n".join(crossing)


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert _circles() == [], "modules that import each other in a loop: " + str(_circles())


def test_the_layer_check_sees_a_circle_and_an_upward_import() -> None:
    """The checks can fail: an edge added to the graph is caught."""
    saved = {k: set(v) for k, v in GRAPH.items()}
    try:
        GRAPH["fedpeer.errors"].add("fedpeer.app.cli")
        assert _circles() != []
        assert _layer("fedpeer.app.cli") < _layer("fedpeer.errors")
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_size(name: str) -> None:
    lines = MODULES[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MODULE_LINES_MAX, f"{name}: {lines} lines; split it along its seam"


def test_folder_size() -> None:
    folders: dict[Path, int] = defaultdict(int)
    for path in MODULES.values():
        if path.name != "__init__.py":
            folders[path.parent] += 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in folders.items() if n > FOLDER_MODULES_MAX}
    assert crowded == {}, f"folders with more than {FOLDER_MODULES_MAX} modules: {crowded}"


def _declared_kinds() -> set[str]:
    """Every `JobKind(name="...")` under fedpeer/kinds/."""
    names = set()
    for path in (PACKAGE / "kinds").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "JobKind":
                names |= {k.value.value for k in node.keywords
                          if k.arg == "name" and isinstance(k.value, ast.Constant)}
    return names


def test_nothing_outside_kinds_branches_on_a_kind_name() -> None:
    """A kind's name may appear outside fedpeer/kinds/ in text (help, docstrings), never as a value
    code compares with, looks up or lists: that is the kind's own business (its JobKind)."""
    kinds = _declared_kinds()
    assert {"stats", "xgboost", "kmeans"} <= kinds, kinds
    found = []
    for name, path in MODULES.items():
        if name.startswith("fedpeer.kinds"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            values: list[ast.AST] = []
            if isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                values = list(node.elts)
            elif isinstance(node, ast.Dict):
                values = [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Subscript):
                values = [node.slice]
            for v in values:
                if isinstance(v, ast.Constant) and v.value in kinds:
                    found.append(f"{path.relative_to(ROOT)}:{v.lineno}: {v.value!r}")
    assert found == [], "kind names used as values outside fedpeer/kinds/:\n" + "\n".join(found)


def test_docstrings_point_only_to_files_in_the_repository() -> None:
    """A comment or docstring that names a file names one a clone has (docs/..., fedpeer/...,
    scripts/..., benchmarks/...); none points to the steering documents, source papers or issues."""
    import re

    elsewhere = re.compile(r"ALGORITHMS\.md|DESIGN §|DESIGN\.md|seeds/\d|\bissue \d+|shared/")
    named = re.compile(r"(?<![\w/.])((?:docs|fedpeer|scripts|benchmarks|tests|systemd)/[\w./-]+"
                       r"\.(?:md|py|sh|toml|service))")
    problems = []
    for path in MODULES.values():
        text = path.read_text(encoding="utf-8")
        problems += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in elsewhere.finditer(text)]
        problems += [f"{path.relative_to(ROOT)}: {m.group(1)} does not exist" for m in named.finditer(text)
                     if not (ROOT / m.group(1)).exists()]
    assert problems == [], "\n".join(problems)
