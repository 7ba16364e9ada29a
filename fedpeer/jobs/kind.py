"""What a job kind declares: its parameters (typed, with defaults and help), whether it needs the
site's data, and the coroutine every member runs over its Channel.

One declaration serves three places: the CLI builds `fedpeer run KIND --param ...` from it, the
proposer validates what the operator typed, and every member validates what arrived on the wire.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeer.errors import JobError
from fedpeer.jobs import report


class JobFailsEverywhere(JobError):
    """A failure that ends the job for every member, even of a kind whose members may fail alone
    (`member_failure_aborts=False`): e.g. no site could train at all. It names no site — every
    member meets the same condition, and the member that noticed first is not to blame — unless
    `here`: this site's own data or state is the cause (its own evidence), and it is named."""

    def __init__(self, reason: str, *, here: bool = False) -> None:
        super().__init__(reason)
        self.here = here


class ImplausibleTotal(JobFailsEverywhere):
    """A secure sum's total that no honest members could give: some member's contribution is
    wrong (a lie or a bug). Every member checks the same total the same way, so every member
    fails, and the failure names no site: the secure sum hides whose contribution it was, and
    the member that noticed first is not to blame. `of` words it in one line."""

    @classmethod
    def of(cls, sum_name: str, check: str) -> ImplausibleTotal:
        return cls(f"secure sum '{sum_name}': check '{check}' failed — a member's contribution is implausible; "
                   "no model is kept")


def checked_total(sum_name: str, check: Callable[..., Any], *args: Any) -> Any:
    """check(*args) on what secure sum `sum_name` gave: its ValueError (the check it failed, in
    words) ends the job everywhere as an ImplausibleTotal, naming no site."""
    try:
        return check(*args)
    except ValueError as exc:
        raise ImplausibleTotal.of(sum_name, str(exc)) from None


@dataclass(frozen=True)
class Param:
    type: type                      # int, float, str or bool
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None       # str: the most characters
    # What a member needs to take this parameter (fedpeer/jobs/capabilities.py): None for those
    # every release knows; one added later names the capability of the builds that know it (at its
    # default it is then left out of proposals to members without it: they use the same default).
    capability: str | None = None
    # With `capability`: what a member without it computes, where that is not `default` (a parameter
    # added with a new default behaviour, e.g. dbscan's `standardize`, True here and absent, so False,
    # at 0.1.0). The capability is then needed at every value but this one, and the parameter is
    # left out of a proposal only at this value.
    before: Any = None
    # With `capability` and `before`: a member without the capability still takes part, and the job
    # runs at `before` for every member (a measure that only some builds send, e.g. xgboost's
    # `train_loss`), instead of leaving that member out (capabilities.settled).
    optional: bool = False
    # (value, capability) pairs: values that only builds with that capability run (secure-sum modes)
    value_capabilities: tuple[tuple[Any, str], ...] = ()

    @property
    def without_capability(self) -> Any:
        """The value a member that lacks this parameter's capability acts on."""
        return self.default if self.before is None else self.before

    def check(self, name: str, value: Any) -> Any:
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise JobError(f"parameter {name}: expected {self.type.__name__}, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise JobError(f"parameter {name}: expected one of {list(self.choices)}, got {value!r}")
        if self.type is str:   # high: the most characters
            if self.high is not None and len(value) > self.high:
                raise JobError(f"parameter {name}: {len(value)} characters, more than {self.high:g}")
            return value
        if self.low is not None and value < self.low or self.high is not None and value > self.high:
            raise JobError(f"parameter {name}: {value!r} outside [{self.low}, {self.high}]")
        return value


@dataclass(frozen=True)
class Limit:
    """One [policy.<kind>] limit: the parameter it bounds, its default (the kind's own bound, so an
    unset limit refuses nothing the kind accepts) and what it means. A limit named `*_max` is the
    largest value a site accepts, one named `*_min` the smallest."""

    param: str
    default: int
    help: str


@dataclass(frozen=True)
class JobContext:
    """What a running job may know about its site besides the channel."""

    site_name: str
    names: Mapping[bytes, str]      # member key -> this site's name for it
    hop_timeout_ms: int
    data: Any = None                # fedpeer.data.dataset.Dataset when the kind needs data
    test_data: Any = None           # Dataset of [data] test_csv, if the site has one
    workdir: Path | None = None     # state/jobs/<id>: where a job keeps what must survive its steps
    noise_rng: Any = None           # DP noise (numpy Generator): seeded in simulations; None: from the OS


@dataclass(frozen=True)
class Finished:
    """A job that ended `done` at this site, as a kind's `serve_done` sees it: enough to answer a
    member that missed the end (cut off by a partition) from what this site stored."""

    me: bytes
    members: tuple[bytes, ...]
    workdir: Path
    leadership: tuple[int, bytes | None]    # (term, leader) of this site's election now


@dataclass(frozen=True)
class JobKind:
    name: str
    help: str
    params: Mapping[str, Param]
    run: Callable[[Any, Mapping[str, Any], JobContext], Awaitable[dict]]   # (channel, params, ctx) -> result
    needs_data: bool = True
    binary_label: bool = True
    # False (clustering): [data] label may be unset; features are all columns but the ignored ones
    # and the label column, when one is set (it is never clustered on)
    needs_label: bool = True
    members_min: int = 2
    save_model: Callable[[Any, Any], None] | None = None   # (path, model) -> None; model = result.pop("_model")
    model_file: str = "model.npz"
    member_failure_aborts: bool = True     # False: a member that fails leaves; the others go on
    # [policy.<name>] limit -> what it bounds (fedpeer/config/load.py reads the tables as numbers)
    limits: Mapping[str, Limit] = field(default_factory=dict)
    # params -> the values the job really uses, where they differ from what was asked for
    # (bofrf: max_depth 0 is 64): a site's limits apply to what the job will do
    in_effect: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    # (finished job, member, its message) -> the answer to send it, or None: how a site that is
    # done answers a member still running the job (runs in a worker thread: it may read files)
    serve_done: Callable[[Finished, bytes, Any], Any] | None = None
    serve_done_kinds: tuple[type, ...] = ()     # the messages it answers; others meet a done job as before
    # [data] engine = "dask" (the rows stay on the site's Dask cluster): what of this kind runs there,
    # named for messages ('xgboost with mode = "histogram"'; "": nothing does), and, where only some
    # parameters do, the name of what `params` ask for when it does not run there (None: it does)
    dask_support: str = ""
    dask_refused: Callable[[Mapping[str, Any]], str | None] | None = None
    # [data] partition = "vertical": whether the kind runs over sites holding other columns of the same
    # entities (its run then gets a VerticalBlock, fedpeer/data/vertical.py, as ctx.data)
    vertical: bool = False
    messages: tuple[Any, ...] = ()   # its wire messages (wire.declare), registered by the job catalogue
    # the capability a member needs to run this kind at all ("" : "kind-<name>"; capabilities.py)
    capability: str = ""
    # What people read of a done job (`job show`, `run --wait`): lines under the job's header
    describe: Callable[[Mapping[str, Any]], list[str]] = report.raw
    # `fedpeer harness`: every site's result ({name, rows, state, result}) as one table
    site_table: Callable[[Sequence[Mapping[str, Any]]], str] = report.plain_sites
    # `fedpeer predict`: (model file, the job's result, rows) -> one dict per row, its first key "row"
    # (the row's number from 1; `--id-column` puts the row's ID in its place), where rows(features)
    # reads the operator's CSV's values of those columns; None: the kind stores no model to score with
    predict: Callable[[Path, Mapping[str, Any], Callable[[Sequence[str]], Any]], list[dict]] | None = None
    # `fedpeer export`: (model file, the job's result) -> the model as JSON-able arrays; None: no export
    export: Callable[[Path, Mapping[str, Any]], dict] | None = None
    # (the job's result) -> one line on what `export` wrote and how to load it; None: a plain line
    export_note: Callable[[Mapping[str, Any]], str] | None = None
    # the per-round (or per-iteration) series of a result, for curves: series name -> [(step, value)]
    history: Callable[[Mapping[str, Any]], dict[str, list[tuple[float, float]]]] | None = None
    rounds_metric: bool = False     # its rounds are timed in /metrics (fedpeer_round_duration_seconds)
    # whether a job with these parameters runs under the federation's elected leader (what
    # `fedpeer harness --kill-leader-at-round` kills); None: never
    led: Callable[[Mapping[str, Any]], bool] | None = None
    # A member restarted mid-job (fedpeer/jobs/lifecycle/rejoin.py): (channel, params, ctx) -> result,
    # run instead of `run` to ask the others to take it back; None: the kind does not take members back
    rejoin: Callable[[Any, Mapping[str, Any], JobContext], Awaitable[dict]] | None = None
    # checked params -> why a job with them does not take a restarted member back (one line), or None
    rejoin_refused: Callable[[Mapping[str, Any]], str | None] | None = None
    # checked params -> why they cannot run together (one line), or None: refused wherever they are
    # checked (the CLI, the proposer, every member), before any data is read or privacy charged
    refused: Callable[[Mapping[str, Any]], str | None] | None = None

    def __post_init__(self) -> None:
        for name, limit in self.limits.items():
            assert name.endswith(("_max", "_min")) and limit.param in self.params, f"{self.name}: limit {name}"

    def check_params(self, given: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(given) - set(self.params)
        private = sorted(name for name in unknown if name.startswith("dp_"))
        if private:      # a kind without differential privacy: its totals are released as they are
            raise JobError(f"{self.name} does not take differential privacy ({', '.join(private)}): its sums are "
                           "released without noise; run it without dp_* parameters")
        if unknown:
            raise JobError(f"{self.name}: unknown parameter(s) {sorted(unknown)}; known: {sorted(self.params)}")
        checked = {name: p.check(name, given.get(name, p.default)) for name, p in self.params.items()}
        why = self.refused(checked) if self.refused is not None else None
        if why is not None:
            raise JobError(why)
        return checked

    def policy_limits(self, table: Mapping[str, int]) -> dict[str, int]:
        """A site's [policy.<kind>] table (as written, checked by `check_table`) with every limit
        it leaves out at its default."""
        return {name: table.get(name, limit.default) for name, limit in self.limits.items()}

    def check_table(self, table: Mapping[str, int]) -> str | None:
        """The first key of a [policy.<kind>] table this kind has no limit for, or None."""
        return next((key for key in table if key not in self.limits), None)

    def check_policy(self, params: Mapping[str, Any], table: Mapping[str, int]) -> None:
        """JobError naming the first of a site's [policy.<kind>] limits (its table as written;
        defaults for the rest) that checked `params` break: "rounds 500 > [policy.xgboost]
        rounds_max 200"."""
        bounds = self.policy_limits(table)
        used = {**params, **(self.in_effect(params) if self.in_effect else {})}
        for name, limit in self.limits.items():
            bound, value = bounds[name], used[limit.param]
            shown = f"{limit.param} {params[limit.param]}" + (
                f" (in effect {value})" if value != params[limit.param] else "")
            if name.endswith("_max") and value > bound:
                raise JobError(f"{shown} > [policy.{self.name}] {name} {bound}")
            if name.endswith("_min") and value < bound:
                raise JobError(f"{shown} < [policy.{self.name}] {name} {bound}")


def dask_refusal(kind: JobKind, params: Mapping[str, Any], kinds: Mapping[str, JobKind]) -> str | None:
    """Why a job of `kind` with `params` cannot run on a site whose rows are on its Dask cluster
    (None: it can), naming what the engine supports among `kinds`."""
    if kind.dask_support:
        what = kind.dask_refused(params) if kind.dask_refused is not None else None
        if what is None:
            return None
    else:
        what = kind.name
    names = [k.dask_support for k in kinds.values() if k.dask_support]
    supported = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
    return (f"[data] engine = \"dask\" supports {supported} jobs, not {what}: the rows stay on the "
            "site's Dask cluster; run this job at a site with engine = \"memory\"")


def vertical_refusal(kind: JobKind, kinds: Mapping[str, JobKind]) -> str:
    """Why a job of `kind` cannot run on a site whose data is vertical ([data] partition = "vertical")."""
    names = [k.name for k in kinds.values() if k.vertical]
    return (f"[data] partition = \"vertical\": a {kind.name} job needs every site to hold the same columns of "
            f"other rows; vertical sites run {' and '.join(names)} jobs: run it among horizontal sites")


def site_seed(seed: int, member: bytes) -> int:
    """A site's own seed: derived from the job seed and its key (the same in in-process references)."""
    return int.from_bytes(hashlib.sha256(seed.to_bytes(8, "big") + member).digest()[:4], "big")
