"""The privacy ledger: the (ε, δ) each dataset of this site has released through DP jobs, against
the site's [privacy] budget (docs/security.md, differential privacy).

Rules:
- One JSON file, state/privacy.json, replaced whole and durably at every charge (fedpeer/base/store.py
  `write_json`: temp, fsync, rename, fsync directory), so a restart or a kill -9 finds every charge
  made before it. A file that is not what this module writes fails closed (`StateError`): an
  unreadable ledger never reads as an empty one.
- Entries are per dataset fingerprint and per job: a job's charge is its declared (ε, δ), written
  *before* the job's first sum (`reserve`), so a job that fails, is cancelled or whose daemon is
  killed stays charged for everything it could have released; `settle` raises the charge when the
  job's own accountant counted more (a retried sum's second release), never lowers it.
- Jobs compose by adding their ε and δ (basic sequential composition: every job is (ε_j, δ_j)-DP
  on its own, whatever came before); within a job the accountant composes its sums by RDP
  (fedpeer/protocols/dp.py).
- The cost of a job is its proposal's dp_epsilon and dp_delta, public numbers every member reads
  alike, so every member charges the same and refuses the same over-budget job (`refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedpeer.base.store import read_json, write_json
from fedpeer.config.bounds import bounds_difference, bounds_text, parse_bounds_text
from fedpeer.errors import FedpeerError, JobError, StateError

LEDGER_FILE = "privacy.json"
LEDGER_VERSION = 1
JOBS_PER_DATASET_MAX = 100_000      # a bound on the file; beyond it the site refuses DP jobs on that dataset
SPENT_SLACK = 1e-9                  # float rounding of sums of charges (a fraction of the budget)


def job_cost(params: Mapping[str, Any]) -> tuple[float, float]:
    """A job's (ε, δ) from its proposal's public parameters: dp_epsilon, and dp_delta or else
    1/dp_rows_max² (fedpeer/protocols/dp.py `default_delta`); (0, 0) for a job without DP."""
    epsilon = float(params.get("dp_epsilon", 0.0) or 0.0)
    if epsilon <= 0:
        return 0.0, 0.0
    delta = float(params.get("dp_delta", 0.0) or 0.0)
    return epsilon, delta or 1.0 / float(max(int(params.get("dp_rows_max", 1_000_000)), 2)) ** 2


def with_bounds(kind_params: Mapping[str, Any], params: Mapping[str, Any],
                bounds: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """A proposal's parameters with dp_bounds filled from the proposer's [data] `bounds`, for a DP
    job of a kind that takes them and a proposal that leaves them out (the bounds are public, and
    carrying their values lets every member compare them with its own and name a column that differs)."""
    out = dict(params)
    if "dp_bounds" in kind_params and job_cost(params)[0] > 0 and not out.get("dp_bounds") and bounds:
        out["dp_bounds"] = bounds_text(dict(bounds))
    return out


def bounds_refusal(params: Mapping[str, Any], bounds: Mapping[str, tuple[float, float]],
                   features: Sequence[str]) -> str | None:
    """Why this site refuses a DP job whose dp_bounds differ from its own [data] bounds for one of
    the job's features (None: they agree, or the job carries none): every member must cut its
    rows at the same public points, and a site's bounds are what it declared public."""
    if job_cost(params)[0] <= 0 or "dp_bounds" not in params:
        return None
    if not params["dp_bounds"]:
        return ("this DP job needs dp_bounds, the public bounds of every feature: set [data] bounds in the "
                "proposer's peers.toml (the proposal carries them) or give --dp-bounds")
    try:
        job = parse_bounds_text(str(params["dp_bounds"]))
    except ValueError as exc:
        return str(exc)
    return bounds_difference(job, dict(bounds), features)


@dataclass(frozen=True)
class Spent:
    epsilon: float
    delta: float
    jobs: int


class PrivacyLedger:
    """What each dataset has spent, on disk under `state_dir`; `budget` is [privacy]'s (ε, δ)."""

    def __init__(self, state_dir: Path, epsilon_budget: float, delta_budget: float) -> None:
        self.path = Path(state_dir) / LEDGER_FILE
        self.epsilon_budget, self.delta_budget = float(epsilon_budget), float(delta_budget)
        self._doc = self._load()

    def _load(self) -> dict[str, Any]:
        fix = "restore it from a backup; deleting it forgets what this site's data has released"
        try:
            doc = read_json(self.path, default=None)
        except FedpeerError as exc:
            raise StateError(self.path, "", f"unreadable privacy ledger ({exc}); {fix}") from None
        if doc is None:
            return {"version": LEDGER_VERSION, "datasets": {}}
        if not (isinstance(doc, dict) and doc.get("version") == LEDGER_VERSION
                and isinstance(doc.get("datasets"), dict)
                and all(_valid_jobs(jobs) for jobs in doc["datasets"].values())):
            raise StateError(self.path, "", f"not a privacy ledger of version {LEDGER_VERSION}; {fix}")
        return doc

    def set_budget(self, epsilon_budget: float, delta_budget: float) -> None:
        """[privacy] as peers.toml says now (a reload may change it; what was spent stays)."""
        self.epsilon_budget, self.delta_budget = float(epsilon_budget), float(delta_budget)

    def spent(self, dataset: str) -> Spent:
        jobs = self._doc["datasets"].get(dataset, {})
        return Spent(sum(j["epsilon"] for j in jobs.values()), sum(j["delta"] for j in jobs.values()), len(jobs))

    def refusal(self, site: str, dataset: str, epsilon: float, delta: float, job_id: str = "") -> str | None:
        """The line a member refuses an over-budget job with, or None (a job already charged here,
        e.g. after a restart, is not charged twice)."""
        jobs = self._doc["datasets"].get(dataset, {})
        if job_id and job_id in jobs:
            return None
        spent = self.spent(dataset)
        eps_left, delta_left = self.epsilon_budget - spent.epsilon, self.delta_budget - spent.delta
        if epsilon > eps_left + SPENT_SLACK * self.epsilon_budget:
            return (f"{site}: this job needs ε {epsilon:g}; its budget has {max(eps_left, 0.0):.3g} left "
                    f"of {self.epsilon_budget:g}")
        if delta > delta_left + SPENT_SLACK * self.delta_budget:
            return (f"{site}: this job needs δ {delta:.3g}; its budget has {max(delta_left, 0.0):.3g} left "
                    f"of {self.delta_budget:.3g}")
        if len(jobs) >= JOBS_PER_DATASET_MAX:
            return f"{site}: its privacy ledger holds {len(jobs)} DP jobs on this dataset (JOBS_PER_DATASET_MAX)"
        return None

    def reserve(self, dataset: str, job_id: str, kind: str, epsilon: float, delta: float, at_ms: int) -> None:
        """Charge a job's declared cost before its first sum (durable when this returns)."""
        jobs = self._doc["datasets"].setdefault(dataset, {})
        if job_id in jobs:
            return
        jobs[job_id] = {"kind": kind, "epsilon": float(epsilon), "delta": float(delta), "at_ms": int(at_ms)}
        write_json(self.path, self._doc)

    def settle(self, dataset: str, job_id: str, epsilon: float, delta: float) -> None:
        """The job's accountant's final count (retries included): the charge only goes up."""
        entry = self._doc["datasets"].get(dataset, {}).get(job_id)
        assert entry is not None, "settle without reserve"
        if epsilon > entry["epsilon"] or delta > entry["delta"]:
            entry["epsilon"], entry["delta"] = max(entry["epsilon"], float(epsilon)), max(entry["delta"], float(delta))
            write_json(self.path, self._doc)

    def charged(self, dataset: str, job_id: str) -> dict[str, float] | None:
        """What this job is charged on this dataset (its job record, the console), or None."""
        entry = self._doc["datasets"].get(dataset, {}).get(job_id)
        return None if entry is None else {"epsilon": float(entry["epsilon"]), "delta": float(entry["delta"])}

    def rows(self) -> list[dict[str, Any]]:
        """`fedpeer privacy`: one row per dataset, what it spent and what is left."""
        out = []
        for dataset in sorted(self._doc["datasets"]):
            s = self.spent(dataset)
            out.append({"dataset": dataset, "jobs": s.jobs, "epsilon_spent": s.epsilon, "delta_spent": s.delta,
                        "epsilon_left": max(self.epsilon_budget - s.epsilon, 0.0),
                        "delta_left": max(self.delta_budget - s.delta, 0.0),
                        "epsilon_budget": self.epsilon_budget, "delta_budget": self.delta_budget})
        return out


def _valid_jobs(jobs: object) -> bool:
    return isinstance(jobs, Mapping) and all(
        isinstance(j, Mapping) and all(isinstance(j.get(k), (int, float)) and j[k] >= 0 for k in ("epsilon", "delta"))
        for j in jobs.values())


def show(rows: list[dict[str, Any]]) -> str:
    """The ledger as `fedpeer privacy` prints it."""
    if not rows:
        return "no DP job has run on this site's data"
    lines = ["DATASET           JOBS  ε SPENT  ε LEFT / BUDGET   δ SPENT   δ LEFT / BUDGET"]
    for r in rows:
        lines.append(f"{r['dataset'][:16]:<16}  {r['jobs']:>4}  {r['epsilon_spent']:>7.3g}  "
                     f"{r['epsilon_left']:>6.3g} / {r['epsilon_budget']:<6g}  {r['delta_spent']:>8.2g}  "
                     f"{r['delta_left']:>8.2g} / {r['delta_budget']:.2g}")
    return "\n".join(lines)


def colluders_of(params: Mapping[str, Any], members: int) -> int:
    """A DP job's `dp_colluders` t, refused when it leaves no member's noise (t >= members)."""
    colluders = int(params.get("dp_colluders", 0))
    if colluders >= members:
        raise JobError(f"dp_colluders {colluders} leaves no member's noise for a site among {members} members")
    return colluders


def job_bounds(params: Mapping[str, Any], site: str, features: Sequence[str]) -> dict[str, tuple[float, float]]:
    """A DP job's public bounds (its dp_bounds), refused naming the first of this site's features
    they leave out (the column's name and the fix; no value)."""
    bounds = parse_bounds_text(str(params["dp_bounds"]))
    lacking = [f for f in features if f not in bounds]
    if lacking:
        raise JobError(f"{site}: the job's dp_bounds have no bounds for column {lacking[0]!r}; declare "
                       f"[data] bounds = {{ {lacking[0]} = [low, high] }} at every site")
    return bounds
