"""What people read of a bofrf job: `job show` lines and the harness table (the shape of the
thesis' tables 7.1–7.6)."""

from __future__ import annotations

import textwrap

from collections.abc import Mapping, Sequence
from typing import Any

from fedpeer.jobs.report import class_names, rows_text, score, table

SHOWN = ("auc", "accuracy", "sensitivity", "specificity", "mcc")
MODELS = (("local_rf", "local random forest (this site's trees, unweighted)"),
          ("bofrf_local", "BOFRF local (this site's trees, weighted)"),
          ("bofrf_global", "BOFRF global (every site's trees, weighted)"),
          ("boppid", "BOPPID baseline"))


def describe(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines: the model this site kept, every model's scores on this site's
    test part (with its rows), and the forests left out."""
    rows = result.get("rows") or {}
    final = result["final"]
    lines = [f"  kept: the {final['model']} model, {result['trees_kept']} of {result['trees_total']} trees "
             f"(τ {result['tau']:.2f}: {result['trees_weighted']} trees' MCC above it) over "
             f"{', '.join(result.get('participants') or [])}",
             f"  scores on this site's test part ({rows_text(rows.get('test'))}; trained on "
             f"{rows_text(rows.get('train'))}):"]
    table_rows = [("MODEL", "AUC", "ACCURACY", "SENSITIVITY", "SPECIFICITY", "MCC")]
    for key, what in MODELS:
        block = result.get(key)
        if block:
            table_rows.append((what + (" — kept" if key == f"bofrf_{final['model']}" else ""),
                               *(score(block.get(k)) for k in SHOWN)))
    lines.append(table(table_rows, indent="    "))
    if result.get("cluster"):
        c = result["cluster"]
        lines.append(f"  cluster {c['cluster']}: {', '.join(c['members'])}")
    for key, what in (("forests_refused", "refused the forest of"), ("forests_undelivered", "never got the forest of"),
                      ("own_forest_refused_by", "this site's forest was refused by")):
        for site, why in (result.get(key) or {}).items():
            lines.append(f"  {what} {site}: {why}")
    if result.get("forests_left_out"):
        lines.append(f"  forests left out at every site: {', '.join(result['forests_left_out'])}")
    boppid = result.get("boppid") or {}
    if boppid.get("models_refused"):
        lines += [f"  BOPPID refused the model of {site}: {why}" for site, why in boppid["models_refused"].items()]
    lines.append(f"  model file {result.get('model_file', '-')}; `fedpeer predict` gives P({class_names(result)[1]}) "
                 "as the weighted vote share, and the vote sum")
    return lines


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """Per-site table in the shape of the thesis' tables 7.1–7.6, with the test rows each AUC rests on."""
    def auc(block: Mapping[str, Any] | None) -> str:
        return "-" if not block or block.get("auc") is None else f"{block['auc']:.3f}"
    rows = [("SITE", "ROWS", "TEST ROWS", "LOCAL RF AUC", "BOFRF AUC", "CHANGE", "BOPPID AUC", "MODEL", "TAU",
             "TREES KEPT")]
    for s in sites:
        r = s.get("result") or {}
        if not r:
            rows.append((s["name"], s.get("rows") or "-", "-", s.get("state", "-"), "-", "-", "-", "-", "-", "-"))
            continue
        base, final = r["local_rf"].get("auc"), r["final"].get("auc")
        change = f"{100 * (final - base) / base:+.1f} %" if base and final is not None else "-"
        rows.append((s["name"], s.get("rows") or "-", (r.get("rows") or {}).get("test", "-"), auc(r["local_rf"]),
                     auc(r["final"]), change, auc(r.get("boppid")), r["final"]["model"], f"{r['tau']:.2f}",
                     f"{r['trees_kept']}/{r['trees_total']}"))
    return table(rows) + "\n" + "\n".join(textwrap.wrap(LEGEND, LEGEND_WIDTH))


LEGEND_WIDTH = 100      # characters a line of the legend
# What the table's columns mean, printed under it (the harness and `make demo` show it to people
# who have not read docs/algorithms.md)
LEGEND = ("AUCs on each site's own test rows (TEST ROWS). LOCAL RF: the site's own random forest; BOFRF: the model "
          "it kept; MODEL: which, local (its own trees, weighted by their federation-wide MCC) or global (every "
          "site's trees, weighted); CHANGE: BOFRF against LOCAL RF; BOPPID: the baseline, every site's boosted stumps "
          "weighted by their error on this site's rows; TAU: the MCC a tree must pass to get a weight; TREES "
          "KEPT: trees with a weight, of all.")

