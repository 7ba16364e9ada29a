"""Every error fedpeer raises on purpose.

Rule: operating conditions (bad config, bad data, a peer misbehaving) are exceptions from this
module, caught at the edge (CLI, node) and reported in one line. Broken invariants of our own
code are `assert`s: they mean a bug, not a condition to handle.
"""

from __future__ import annotations


class FedpeerError(Exception):
    """Base of every deliberate fedpeer error."""


class ConfigError(FedpeerError):
    """peers.toml or the key file is unusable. The message names file, key and problem."""

    def __init__(self, path: object, key: str, problem: str) -> None:
        self.path, self.key, self.problem = str(path), key, problem
        super().__init__(f"{self.path}: {key}: {problem}" if key else f"{self.path}: {problem}")


class DataError(FedpeerError):
    """A site's local data cannot be used for the job asked for.

    Its message is for this site's operator: the file, the column, the row, the value, the fix.
    `public` is what the other sites of a job may be told instead: what failed and how to fix
    it, naming at most a column or a setting, never a path, a cell's value, a row number or a
    count (their data is theirs; a small cohort's size is private too). Without one, the other
    sites hear PUBLIC_DEFAULT."""

    PUBLIC_DEFAULT = ("its data failed a check; its operator sees which and how to fix it in "
                      "`fedpeer job show` and the daemon's log there")

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public or self.PUBLIC_DEFAULT


def public_reason(exc: BaseException) -> str:
    """What other sites may be told of a failure at this site: the public text of the DataError
    behind it, if one is (raised, or caught and re-raised as another error, even `from None`),
    else the failure's own words (a job error that holds no data of this site)."""
    seen: BaseException | None = exc
    for _ in range(16):        # a chain of causes is short; never loop on a cycle
        if seen is None:
            break
        if isinstance(seen, DataError):
            return seen.public
        seen = seen.__cause__ or seen.__context__
    return str(exc)


class JobError(FedpeerError):
    """A job could not start, or ended without a result."""


class ProtocolError(FedpeerError):
    """A message broke the protocol. `reason` is a short stable code used for counting."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class RemoteProtocolError(ProtocolError):
    """The peer sent something invalid: reject it, count it, keep serving others."""


class LocalProtocolError(ProtocolError):
    """We were asked to send something the protocol forbids: a bug or misuse on our side."""


class NoDaemonError(FedpeerError):
    """The local daemon's admin endpoint did not answer."""


class StateError(ConfigError):
    """A state file lies (wrong type, out of range, not JSON) or the state directory cannot hold
    this boot's facts: the node must not start. The message names the file and the fix; the CLI
    prints it in one line and exits 2 (a configuration error: the operator has to act)."""


class StateWriteError(FedpeerError):
    """A write under the state directory did not happen (disk full, I/O error, too many open files,
    read-only, or a value the store refuses to record). One line naming the state_dir and the fix.
    The daemon keeps running: the caller fails only what depended on the write, and retries later.
    `errno` is the OSError's errno, None for a refused value."""

    def __init__(self, message: str, *, path: object = None, errno: int | None = None) -> None:
        self.path, self.errno = path, errno
        super().__init__(message)
