"""What the parts of the job lifecycle (admission, proposer, member, runner, the node channel) may
use of the registry that holds them, and what the registry needs from the node.

The parts are handed the registry and call back into it; they know it only as `Host`, so none of
them imports the registry (which imports them all). The registry satisfies `Host` as it is.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from fedpeer.config.load import Config
from fedpeer.jobs.kind import JobKind
from fedpeer.jobs.records import JobRecord, RecordFiles


class Transport(Protocol):
    """What the registry and job channels need from the node."""

    me: bytes

    def now_ms(self) -> int: ...
    def alive(self, peer: bytes) -> bool: ...
    def leadership(self) -> tuple[int, bytes | None]: ...    # (term, leader) of the federation's election
    def pairwise_seed(self, peer: bytes, label: bytes) -> bytes: ...
    async def send(self, dst: bytes, msg: object, job_id: str, timeout_ms: int) -> None: ...
    # delivered within timeout_ms (retries included) or raises PeerUnreachable (PeerRefused when
    # the peer proved it refused the message); the registry never passes a dst not in `names`


class Host(Protocol):
    """The registry as its parts see it."""

    config: Config
    transport: Transport
    names: Mapping[bytes, str]              # every member key, me included -> local name
    kinds: Mapping[str, JobKind]
    spawn: Callable[..., Any]
    root: Path                              # state/jobs
    jobs: dict[str, JobRecord]
    unstored: OrderedDict[str, JobRecord]   # peers' proposals that never ran
    records: RecordFiles
    deaths: Any                             # nodechannel.DeathWatch
    admission: Any                          # the sibling parts, each reached through the host
    as_proposer: Any
    as_member: Any
    runner: Any
    versions: Any                           # fedpeer/jobs/versions.py PeerVersions, or None
    privacy: Any                            # fedpeer/jobs/privacy.py PrivacyLedger

    def find(self, job_id: str) -> JobRecord | None: ...
    def finish(self, record: JobRecord, state: str, error: str | None, result: dict | None = None) -> None: ...
    def interrupt(self, record: JobRecord) -> None: ...
    def running(self) -> int: ...
    def pending_of(self, proposer: bytes) -> int: ...
    def retry_unsaved(self) -> int: ...
