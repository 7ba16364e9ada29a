"""`fedpeer run KIND`'s job parameters: one typed flag per parameter, and `--param NAME=VALUE` beside
them, typed and checked exactly as the flag would be. A name given both ways, an unknown option or
an unknown --param name is a usage error printed with the kind's own usage and the nearest names."""

from __future__ import annotations

import argparse
import difflib
from typing import Any

# Names a data scientist brings from other libraries, and this build's name for the same thing.
ALIASES = {"learning_rate": "eta", "lr": "eta", "n_estimators": "rounds", "num_boost_round": "rounds",
           "num_rounds": "rounds", "n_rounds": "rounds", "depth": "max_depth", "lambda": "reg_lambda",
           "n_clusters": "k", "num_trees": "trees", "n_trees": "trees"}
PARAM_DEST = "run_param_pairs"   # not param_*: those are the typed flags


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_kind_arguments(k: argparse.ArgumentParser, kind: Any) -> None:
    """One flag per parameter of `kind`, and --param. A flag's default is left out of the
    namespace (SUPPRESS), so `resolve` knows which ones the user typed."""
    for name, param in kind.params.items():
        if param.type is bool:
            k.add_argument(flag(name), dest=f"param_{name}", action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=f"{param.help} (default: {param.default})")
        else:
            k.add_argument(flag(name), dest=f"param_{name}", type=param.type, default=argparse.SUPPRESS,
                           choices=param.choices, metavar=None if param.choices else name.upper(),
                           help=f"{param.help} (default: {param.default})")
    k.add_argument("--param", dest=PARAM_DEST, action="append", default=[], metavar="NAME=VALUE",
                   help="a job parameter by its name (as the flags above, with _ for -), typed and checked as "
                   "its flag; repeatable")


def nearest(word: str, kind: Any) -> list[str]:
    """The kind's parameter names closest to `word` (a flag or a name), as flags."""
    key = word.lstrip("-").split("=", 1)[0].replace("-", "_").lower()
    names = list(kind.params)
    found = [ALIASES[key]] if ALIASES.get(key) in kind.params else []
    found += [n for n in difflib.get_close_matches(key, names, n=3, cutoff=0.6) if n not in found]
    return [flag(n) for n in found]


def did_you_mean(word: str, kind: Any) -> str:
    near = nearest(word, kind)
    return f"; did you mean {' or '.join(near)}?" if near else f" ('fedpeer run {kind.name} --help' lists them)"


def unknown_options(parser: argparse.ArgumentParser, kind: Any, extra: list[str]) -> None:
    """Options `run KIND` does not take: the kind's usage, and the nearest names (exits 2)."""
    options = [a for a in extra if a.startswith("-")] or extra
    hints = "".join(f"\n  {a}: not an option of 'fedpeer run {kind.name}'{did_you_mean(a, kind)}" for a in options)
    parser.error(f"unrecognized arguments: {' '.join(extra)}{hints}")


def _typed(parser: argparse.ArgumentParser, name: str, param: Any, text: str) -> Any:
    """`text` as the flag of `name` would take it (type and choices), or a usage error."""
    if param.type is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        parser.error(f"--param {name}={text}: expected true or false (as {flag(name)} / --no-{flag(name)[2:]})")
    try:
        value = param.type(text)
    except ValueError:
        parser.error(f"--param {name}={text}: invalid {param.type.__name__} value: {text!r}")
    if param.choices is not None and value not in param.choices:
        parser.error(f"--param {name}={text}: invalid choice: {value!r} "
                     f"(choose from {', '.join(map(repr, param.choices))})")
    return value


def resolve(parser: argparse.ArgumentParser, kind: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Every parameter of `kind`: from its flag, its --param, or its default. Usage errors exit 2
    with `parser` (the kind's) usage."""
    typed = {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_")}
    given: dict[str, Any] = {}
    for pair in getattr(args, PARAM_DEST, None) or []:
        name, sep, text = pair.partition("=")
        key = name.strip().replace("-", "_")
        if not sep or not key:
            parser.error(f"--param {pair!r}: expected NAME=VALUE")
        if key not in kind.params:
            parser.error(f"--param {pair}: {kind.name} has no parameter {key!r}{did_you_mean(key, kind)}")
        if key in typed:
            parser.error(f"--param {key}= and {flag(key)} both set {key}: give one of them")
        if key in given:
            parser.error(f"--param {key}= is given twice: give it once")
        given[key] = _typed(parser, key, kind.params[key], text)
    return {name: given.get(name, typed.get(name, param.default)) for name, param in kind.params.items()}
