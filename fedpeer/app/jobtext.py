"""What `fedpeer jobs`, `fedpeer job show` and `fedpeer run --wait` print of a job record.

One phase text for all three (`phase_text`): a running job's phase with its step where the phase
does not count for itself ("round 3 of 20" does), a finished job's state. The parameters are
shown where they differ from the kind's defaults. What a done job computed is the kind's own
`describe` (fedpeer/kinds/): lines of text, never a JSON dump (`--json` prints the record whole).

The kinds are imported only when a record is formatted: `fedpeer status` imports this module's
caller without numpy or the job kinds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TERMINAL = ("done", "failed", "cancelled")
_COUNTS_ITSELF = re.compile(r"\b\d+ of \d+\b")     # "round 3 of 20": the step would say it again


def phase_text(record: Mapping[str, Any]) -> str:
    """Where a job is, in one phrase: its state once it ended; else its phase, with "step S of T"
    where the phase does not count for itself."""
    if record["state"] in TERMINAL:
        return record["state"]
    phase = record.get("phase") or "-"
    progress = record.get("progress") or {}
    if progress.get("total") and not _COUNTS_ITSELF.search(phase):
        phase += f" (step {progress['step']} of {progress['total']})"
    return phase


def params_text(record: Mapping[str, Any]) -> str:
    """The job's parameters that differ from its kind's defaults: "parameters: rounds=50,
    objective=reg:squarederror (the others at their defaults)", or "parameters: the defaults"."""
    from fedpeer.kinds.catalog import job_kinds

    kind = job_kinds().get(record["kind"])
    params = record.get("params") or {}
    declared = kind.params if kind is not None else {}
    changed = {k: v for k, v in params.items() if k not in declared or v != declared[k].default}
    if not changed:
        return "parameters: the defaults"
    shown = ", ".join(f"{k}={_value(v)}" for k, v in sorted(changed.items()))
    return f"parameters: {shown}" + (" (the others at their defaults)" if len(changed) < len(declared) else "")


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if v and not any(c in v for c in " ,=") else repr(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


def site_class_names(config: Any) -> tuple[str, str] | None:
    """(other class, positive class) of this site's [data]: `positive` and the label column's first
    other value (read from its CSV; "not <positive>" where it cannot be), or None without a
    positive class. Text views say these where a binary job's result says negative / positive."""
    data = getattr(config, "data", None)
    if data is None or not data.positive or not data.label:
        return None
    from pathlib import Path

    from fedpeer.data.header import other_class

    other = other_class(Path(data.csv), data.label, data.positive) if data.csv else None
    return (other or f"not {data.positive}", data.positive)


def format_job(record: Mapping[str, Any], class_names: tuple[str, str] | None = None) -> str:
    """`fedpeer job show` (and `run --wait` once the job ended): the job in lines of text; a binary
    job's classes by `class_names` (other, positive: `site_class_names`) where given."""
    from fedpeer.jobs.report import raw
    from fedpeer.kinds.catalog import job_kinds

    kind = job_kinds().get(record["kind"])
    lines = [f"job {record['id']} ({record['kind']}): {record['state']}",
             f"  proposed by {record['proposer']}; members: {', '.join(m['name'] for m in record['members'])}"]
    if record["state"] not in TERMINAL:
        lines.append(f"  phase: {phase_text(record)}")
    lines.append("  " + params_text(record))
    lines += [f"  waiting for {wait}" for wait in record.get("waiting_for") or ()]   # "forest from site-3 since 12.4 s"
    if record.get("elapsed_s") is not None:
        rows = record.get("rows")
        where = ("; reads no data" if kind is not None and not kind.needs_data else
                 "" if rows is None else f"; rows at this site: {rows}")
        lines.append(f"  elapsed: {record['elapsed_s']:.1f} s{where}")
    if record.get("error"):
        lines.append(f"  error: {record['error']}")
    result = record.get("result")
    if result and class_names is not None and isinstance(result, Mapping):
        result = {**result, "class_names": list(class_names)}
    if result:
        lines += kind.describe(result) if kind is not None else raw(result)
    return "\n".join(lines)


def jobs_table(jobs: list[Mapping[str, Any]]) -> str:
    """`fedpeer jobs`: one row per job, its phase as `job show` words it."""
    from fedpeer.jobs.report import table

    rows = [("JOB", "KIND", "STATE", "PHASE", "ELAPSED")]
    rows += [(j["id"], j["kind"], j["state"], phase_text(j),
              "-" if j["elapsed_s"] is None else f"{j['elapsed_s']:.1f} s") for j in jobs]
    if any(j.get("privacy_spent") for j in jobs):       # DP jobs: what this site's ledger charges each
        rows = [(*rows[0], "ε SPENT HERE")] + [(*r, epsilon_text(j.get("privacy_spent")))
                                              for r, j in zip(rows[1:], jobs)]
    return table(rows) if jobs else "no jobs"


def epsilon_text(spent: Mapping[str, float] | None) -> str:
    """A job's charge in this site's privacy ledger, as `fedpeer jobs` and the console show it."""
    return "-" if not spent else f"{spent['epsilon']:.3g} (δ {spent['delta']:.2g})"


def progress_text(record: Mapping[str, Any]) -> str:
    """One line of `run --wait`'s progress: "JOB: running — round 3 of 20 (12 s)"."""
    elapsed = "" if record.get("elapsed_s") is None else f" ({record['elapsed_s']:.0f} s)"
    where = record["state"] if record["state"] in TERMINAL else f"{record['state']} — {phase_text(record)}"
    return f"{record['id']}: {where}{elapsed}"
