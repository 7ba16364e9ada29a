"""Job lifecycle messages (docs/design.md, a job's walk): propose -> accept/reject -> start | abort | cancel.

All travel with the job id in the envelope's `job` field too; the registry checks they agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fedpeer.wire import frame as wire
from fedpeer.wire.frame import NODE_ID, v_bytes, v_int, v_list, v_str

# A job id names a directory under state/jobs: always `fullmatch` (`match` with `$` lets a trailing
# newline through, and the directory name would then hold it).
JOB_ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")


def JOB_ID(value: object, where: str) -> str:   # noqa: N802  (a validator, named like the others)
    text = v_str(64)(value, where)
    if not JOB_ID_RE.fullmatch(text):
        raise wire.RemoteProtocolError("schema",
                                       f"{where}: a job id is 1-64 of [a-z0-9-], starting with a letter or digit")
    return text

REASON = v_str(2048)
MEMBERS_MAX = 128
_PARAM_VALUE = lambda v, where: _param_value(v, where)  # noqa: E731


def _param_value(value: object, where: str) -> object:
    if isinstance(value, bool) or isinstance(value, int) and -2**63 <= value < 2**63:
        return value
    if isinstance(value, float):
        return wire.v_float()(value, where)
    if isinstance(value, str):
        return v_str(1024)(value, where)
    raise wire.RemoteProtocolError("schema", f"{where}: parameters are numbers, strings or booleans")


def _params(value: object, where: str) -> dict:
    if not isinstance(value, dict) or len(value) > 64:
        raise wire.RemoteProtocolError("schema", f"{where}: expected a map of at most 64 parameters")
    return {v_str(64)(k, f"{where} key"): _param_value(v, f"{where}.{k}") for k, v in value.items()}


@dataclass(frozen=True)
class JobPropose:
    job_id: str
    kind: str
    params: dict
    members: list            # NodeIds in ring order, proposer included
    created_ms: int


@dataclass(frozen=True)
class JobAccept:
    job_id: str
    fingerprint: bytes       # schema fingerprint of the member's data (empty when the kind needs none)
    features: list           # ordered feature names, so a mismatch can be explained (names, not data)


@dataclass(frozen=True)
class JobReject:
    job_id: str
    reason: str


@dataclass(frozen=True)
class JobStart:
    job_id: str
    members: list


@dataclass(frozen=True)
class JobAbort:
    job_id: str
    site: bytes              # the member the failure is about (32 bytes), or empty
    reason: str


@dataclass(frozen=True)
class JobCancel:
    """A member's operator cancelled the job: every member ends it `cancelled` (not `failed`)."""

    job_id: str
    reason: str


wire.register("job_propose", JobPropose, {
    "job_id": JOB_ID, "kind": v_str(32), "params": _params,
    "members": v_list(NODE_ID, MEMBERS_MAX), "created_ms": v_int()})
wire.register("job_accept", JobAccept, {
    "job_id": JOB_ID, "fingerprint": v_bytes(max_bytes=64), "features": v_list(v_str(256), 100_000)})
wire.register("job_reject", JobReject, {"job_id": JOB_ID, "reason": REASON})
wire.register("job_start", JobStart, {"job_id": JOB_ID, "members": v_list(NODE_ID, MEMBERS_MAX)})
wire.register("job_abort", JobAbort, {"job_id": JOB_ID, "site": v_bytes(max_bytes=32), "reason": REASON})
wire.register("job_cancel", JobCancel, {"job_id": JOB_ID, "reason": REASON})

LIFECYCLE = (JobPropose, JobAccept, JobReject, JobStart, JobAbort, JobCancel)
