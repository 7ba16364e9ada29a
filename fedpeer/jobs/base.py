"""What a job kind declares: its parameters (typed, with defaults and help), whether it needs the
site's data, and the coroutine every member runs over its Channel.

One declaration serves three places: the CLI builds `fedpeer run KIND --param ...` from it, the
proposer validates what the operator typed, and every member validates what arrived on the wire.
"""

from __future__ import annotations

import hashlib

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import JobError


class JobFailsEverywhere(JobError):
    """A failure that ends the job for every member, even of a kind whose members may fail alone
    (`member_failure_aborts=False`): e.g. no site could train at all."""


@dataclass(frozen=True)
class Param:
    type: type                      # int, float, str or bool
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None       # str: the most characters

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
class JobContext:
    """What a running job may know about its site besides the channel."""

    site_name: str
    names: Mapping[bytes, str]      # member key -> this site's name for it
    hop_timeout_ms: int
    data: Any = None                # fedpeer.ml.data.Dataset when the kind needs data
    test_data: Any = None           # Dataset of [data] test_csv, if the site has one
    workdir: Path | None = None     # state/jobs/<id>: where a job keeps what must survive its steps


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
    # [policy.<name>] limit -> the parameter it bounds (config.py declares the limits with units);
    # a limit ending in _max is the largest value a site accepts, one ending in _min the smallest
    limited: Mapping[str, str] = field(default_factory=dict)
    # params -> the values the job really uses, where they differ from what was asked for
    # (bofrf: max_depth 0 is 64): a site's limits apply to what the job will do
    in_effect: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    # (finished job, member, its message) -> the answer to send it, or None: how a site that is
    # done answers a member still running the job (runs in a worker thread: it may read files)
    serve_done: Callable[[Finished, bytes, Any], Any] | None = None
    serve_done_kinds: tuple[type, ...] = ()     # the messages it answers; others meet a done job as before

    def __post_init__(self) -> None:
        for limit, param in self.limited.items():
            assert limit.endswith(("_max", "_min")) and param in self.params, f"{self.name}: limit {limit}"

    def check_params(self, given: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(given) - set(self.params)
        if unknown:
            raise JobError(f"{self.name}: unknown parameter(s) {sorted(unknown)}; known: {sorted(self.params)}")
        return {name: p.check(name, given.get(name, p.default)) for name, p in self.params.items()}

    def check_policy(self, params: Mapping[str, Any], limits: Any) -> None:
        """JobError naming the first of a site's [policy.<kind>] `limits` that checked `params`
        break: "rounds 500 > [policy.xgboost] rounds_max 200"."""
        used = {**params, **(self.in_effect(params) if self.in_effect else {})}
        for limit, param in self.limited.items():
            bound, value = getattr(limits, limit), used[param]
            shown = f"{param} {params[param]}" + (f" (in effect {value})" if value != params[param] else "")
            if limit.endswith("_max") and value > bound:
                raise JobError(f"{shown} > [policy.{self.name}] {limit} {bound}")
            if limit.endswith("_min") and value < bound:
                raise JobError(f"{shown} < [policy.{self.name}] {limit} {bound}")


def site_seed(seed: int, member: bytes) -> int:
    """A site's own seed: derived from the job seed and its key (the same in in-process references)."""
    return int.from_bytes(hashlib.sha256(seed.to_bytes(8, "big") + member).digest()[:4], "big")
