"""What people read of a tree job: `job show` lines (the tree as if-then rules) and the harness table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import re

from fedpeer.jobs.report import DEFAULT_CLASS_NAMES, class_names, score, table

RULES_SHOWN_MAX = 64       # rules `job show` prints; the rest are in the result and `fedpeer export`


def metric(result: Mapping[str, Any]) -> tuple[str, float | None]:
    """The figure a tree result leads with: ("AUC", auc) or ("RMSE", rmse)."""
    return ("RMSE", result.get("rmse")) if result.get("criterion") == "squared_error" else ("AUC", result.get("auc"))


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines: the tree's shape, its score, how exact its thresholds are, its rules."""
    name, value = metric(result)
    lost = ", ".join(result.get("lost") or []) or "none"
    lines = [f"  tree: {result['criterion']}, depth {result['depth']}, {result['n_leaves']} leaves, "
             f"{result['federation_rows']} training rows{' (noised)' * ('privacy' in result)}; "
             f"{result['secure_sums']} secure sums over "
             f"{', '.join(result['members'])}; members lost: {lost}",
             f"  {name} {score(value)} ({result.get('score_source') or '-'}); model file "
             f"{result.get('model_file', '-')}"]
    p = result.get("privacy")
    if isinstance(p, dict):      # a DP job (fedpeer/kinds/tree/dp.py): noised counts, no federated evaluation
        lines.append(f"  differential privacy: ε {p['epsilon']:.3g} (asked {p['epsilon_asked']:g}), "
                     f"δ {p['delta']:.2g}, {p['releases']} noised levels of class counts, {p['bins']} uniform "
                     "bins per feature from the public dp_bounds; rows and class mixes below are noised; "
                     f"split rule: {p['split_rule']}")
        return lines + _rules_lines(result)
    exact, features = result["exact_features"], len(result["features"])
    lines.append(f"  thresholds: scikit-learn's midpoints on {exact} of {features} features" +
                 ("" if exact == features else f"; the others' cut points hold several values (max_bin "
                  f"{result['max_bin']} is not above the federation's {result['federation_rows']} rows)"))
    return lines + _rules_lines(result)


def _rules_lines(result: Mapping[str, Any]) -> list[str]:
    lines = []
    rules = list(result.get("rules") or [])
    lines.append(f"  rules ({len(rules) + result.get('rules_omitted', 0)}; a leaf's share is of the federation's "
                 "training rows):")
    lines += rule_lines(result, rules[:RULES_SHOWN_MAX])
    more = len(rules) - RULES_SHOWN_MAX + result.get("rules_omitted", 0)
    if more > 0:
        lines.append(f"    ... and {more} more (the job's result, `fedpeer export`)")
    return lines


_HIDDEN_MIX = re.compile(r"; class mix not shown: a class has fewer than (\d+) rows here\)$")


def rule_lines(result: Mapping[str, Any], rules: Sequence[str]) -> list[str]:
    """The rules as `job show` prints them: a binary tree's classes by the names people use (the
    site's [data] positive class and the other one, `class_names`), and the reason a leaf's class mix
    is not shown said once under the rules instead of on every such rule (marked *)."""
    binary = list(result.get("classes") or []) == list(DEFAULT_CLASS_NAMES)
    names = dict(zip(DEFAULT_CLASS_NAMES, class_names(result))) if binary else {}
    out, hidden = [], None
    for rule in rules:
        path, then, tail = rule.rpartition(" then ") if " then " in rule else ("", "", rule)
        if names:
            tail = re.sub(r"\b(negative|positive)\b(?= \(| \d)", lambda m: names[m.group(1)], tail)
        found = _HIDDEN_MIX.search(tail)
        if found:
            hidden = found.group(1)
            tail = tail[:found.start()] + ")*"
        out.append(f"    {path}{then}{tail}")
    if hidden is not None:
        out.append(f"    * class mix not shown: a class has fewer than {hidden} rows in that leaf (min_leaf_rows), "
                   "which its total would give away")
    return out


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """One row per site: its rows, state, the tree's size and score, the model's SHA-256."""
    rows = [("SITE", "ROWS", "STATE", "LEAVES", "DEPTH", "SCORE", "SCORE OF", "MODEL SHA-256")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), *["-"] * 5))
            continue
        name, value = metric(r)
        rows.append((s["name"], s.get("rows") or "-", s.get("state", "-"), r["n_leaves"], r["depth"],
                     f"{name} {score(value)}", r.get("score_source") or "-", r["model_sha256"][:16]))
    return table(rows)
