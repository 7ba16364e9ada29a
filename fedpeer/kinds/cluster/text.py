"""What people read of a clustering result (kmeans and fuzzy c-means, horizontal, vertical or
with differential privacy; gmm; dbscan): `fedpeer job show` lines and the harness table. Centres
are printed with their column names, one column per cluster; sizes in bytes as KiB / MiB."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedpeer.jobs.report import size, table

CLUSTERS_PER_BLOCK = 8       # clusters side by side in one block of the centre table (more: further blocks)
COLUMNS_SHOWN_MAX = 64       # a centre table's rows (columns of the data); the rest: `job show --json`


def describe(kind: str, result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines for a kmeans, gmm or dbscan result: rounds, the fit per round,
    sizes and the centres (means) by column."""
    if kind == "dbscan":
        return [f"  federation: {result['rows']} rows over {', '.join(result['participants'])}; "
                f"{result['clusters']} cluster{'' if result['clusters'] == 1 else 's'} from "
                f"{result['local_clusters']} shared local-cluster descriptions "
                f"({result['synthetic_rows']} synthetic points); noise {result['noise_fraction']:.3f} of the rows",
                f"  cluster sizes: {' '.join(str(c) for c in result['cluster_sizes']) or '-'}; "
                f"{result.get('eps_chosen') or 'eps ' + str(result['eps'])}, "
                f"min_samples {result['min_samples']}"] + [f"  warning: {w}" for w in result.get("warnings", [])]
    if kind == "kmeans" and "privacy" in result:
        return describe_dp(result)
    fit = "inertia" if kind == "kmeans" else "log_likelihood"
    lines = [f"  federation: {result['rows']} rows over {', '.join(result['participants'])}; k = {result['k']}; "
             f"{result['iterations']} rounds ({'converged' if result['converged'] else 'max_iter reached'}); "
             f"{result['secure_sums']} secure sums ({result['secure_sum']}), "
             f"{size(result['bytes_sent_per_site'])} sent per site"]
    if kind == "gmm":
        lines.append(f"  log-likelihood {result['log_likelihood']:.6g}; BIC {result['bic']:.6g} "
                     f"({result['parameters']} parameters, covariance {result['covariance']})")
    else:
        what = "inertia" if result.get("fuzziness", 1.0) == 1.0 else "fuzzy objective (sum of u^m d^2)"
        lines.append(f"  {what} {result['inertia']:.6g} ({result['inertia_units']}); kept restart "
                     f"{result['kept_restart'] + 1} of {result['restarts']}")
    lines += [f"  {result['k_chosen']}"] if "k_chosen" in result else []
    lines += [f"  warning: {w}" for w in result.get("warnings", [])]
    lines.append("  " + fit.replace("_", "-") + " per round: "
                 + ", ".join(f"{h[fit]:.6g}" for h in result["history"]))
    if kind == "gmm":
        weights = [("weight", [f"{w:.4f}" for w in result["weights"]])]
        return lines + centre_lines("means", result.get("features") or [], result["means"], result["cluster_sizes"],
                                    weights)
    return lines + centre_lines("centres", result.get("features") or [], result["centers"], result["cluster_sizes"])


def describe_dp(result: Mapping[str, Any]) -> list[str]:
    """`fedpeer job show` lines for a DP kmeans result: what was spent, the noised sizes, the centres."""
    p = result["privacy"]
    lines = [f"  federation: about {result['rows']} rows (noised) over {', '.join(result['participants'])}; "
             f"k = {result['k']}; {result['iterations']} rounds; differential privacy ε {p['epsilon']:.3g}, "
             f"δ {p['delta']:.2g} (values clipped to ±{p['clip']:g}); no inertia released"]
    return lines + centre_lines("centres (noised sums)", result.get("features") or [], result["centers"],
                                [f"~{c}" if isinstance(c, int) else c for c in result["cluster_sizes"]])


def centre_lines(what: str, features: Sequence[str], centres: Sequence[Sequence[float]], sizes: Sequence[Any],
                 extra: Sequence[tuple[str, Sequence[str]]] = ()) -> list[str]:
    """The centres as a table, one row per column of the data (by its name) and one column per
    cluster, under its rows (and `extra` rows, gmm's weights); CLUSTERS_PER_BLOCK clusters side by
    side, then the next block; at most COLUMNS_SHOWN_MAX data columns."""
    d = len(centres[0]) if len(centres) else 0
    names = list(features) if len(features) == d else [f"column {j + 1}" for j in range(d)]
    shown = min(d, COLUMNS_SHOWN_MAX)
    lines = [f"  {what}, in the data's original units (one column per cluster):"]
    for first in range(0, len(centres), CLUSTERS_PER_BLOCK):
        block = range(first, min(first + CLUSTERS_PER_BLOCK, len(centres)))
        rows = [("COLUMN", *(f"CLUSTER {c}" for c in block)), ("rows", *(str(sizes[c]) for c in block))]
        rows += [(label, *(values[c] for c in block)) for label, values in extra]
        rows += [(names[j], *(f"{centres[c][j]:.6g}" for c in block)) for j in range(shown)]
        lines.append(table(rows, indent="  "))
    if shown < d:
        lines.append(f"  ({d - shown} more columns: fedpeer job show --json)")
    return lines


def site_table(sites: Sequence[Mapping[str, Any]]) -> str:
    """kmeans / gmm / dbscan: every site holds the same model; sizes are federation-wide ("< N": too few)."""
    rows = [("SITE", "STATE", "LOCAL ROWS", "FEDERATION ROWS", "ROUNDS", "INERTIA / LOG-LIKELIHOOD", "CLUSTER SIZES")]
    for s in sites:
        r = s.get("result") or {}
        fit = r.get("inertia", r.get("log_likelihood"))
        rows.append((s["name"], s.get("state", "-"), s.get("rows") if s.get("rows") is not None else "-",
                     r.get("rows", "-"), r.get("iterations", "-"), "-" if fit is None else f"{fit:.6g}",
                     " ".join(str(c) for c in r.get("cluster_sizes", [])) or "-"))
    return table(rows)
