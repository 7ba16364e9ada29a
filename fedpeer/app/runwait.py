"""`fedpeer run KIND --wait`: follow the job until it ends, showing its progress, and what Ctrl-C does.

Progress goes to standard error (standard output keeps the result, or `--json`'s record): on a
terminal one line rewritten in place; anywhere else (a pipe, a log file, a CI job) one line every
PROGRESS_PIPE_INTERVAL_S, each the job's state, phase and elapsed time as `fedpeer jobs` words it.

Ctrl-C stops the waiting, not the job: the job runs at every member. On a terminal the command
asks whether to cancel it at every site (`fedpeer job cancel`'s path); elsewhere it says in one
line that the job continues and how to cancel it. Either way it exits 130.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from fedpeer.app.jobtext import TERMINAL, progress_text
from fedpeer.errors import ConfigError, FedpeerError

PROGRESS_PIPE_INTERVAL_S = 5.0    # not a terminal: one progress line this often
POLL_S = 0.5                      # how often the job's record is asked for
EXIT_INTERRUPTED = 130            # 128 + SIGINT, as shells report it


class Progress:
    """A job's progress on `stream`: `live` (a terminal) one line rewritten in place, else one
    line every `interval_s`."""

    def __init__(self, stream: TextIO, live: bool, interval_s: float = PROGRESS_PIPE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.live, self.interval_s, self.clock = stream, live, interval_s, clock
        self._last: float | None = None       # when the last pipe line was written
        self._open = False                    # a live line is on the screen

    def show(self, record: dict) -> None:
        text = progress_text(record)
        if self.live:
            width = max(20, shutil.get_terminal_size().columns - 1)
            print("\r" + text[:width].ljust(width), end="", file=self.stream, flush=True)
            self._open = True
        elif record["state"] not in TERMINAL:
            now = self.clock()
            if self._last is None or now - self._last >= self.interval_s:
                print(text, file=self.stream, flush=True)
                self._last = now

    def end(self) -> None:
        if self._open:
            print(file=self.stream, flush=True)
            self._open = False


async def follow(config: Any, job_id: str, progress: Progress, poll_s: float = POLL_S) -> dict:
    """Ask for the job's record until it ends, showing each one; the last record."""
    from fedpeer.daemon.adminclient import request

    try:
        while True:
            record = await request(config, "GET", f"/v1/jobs/{job_id}")
            progress.show(record)
            if record["state"] in TERMINAL:
                return record
            await asyncio.sleep(poll_s)
    finally:
        progress.end()


def wait(config: Any, job_id: str) -> tuple[dict | None, int]:
    """Follow the job (progress on standard error): (its last record, 0) once it ended, or (None,
    130) after Ctrl-C, having asked whether to cancel it (a terminal) or said how to (else)."""
    progress = Progress(sys.stderr, live=sys.stderr.isatty())
    try:
        return asyncio.run(follow(config, job_id, progress)), 0
    except KeyboardInterrupt:
        progress.end()
        return None, interrupted(config, job_id, sys.stdin, sys.stderr,
                                 ask=sys.stdin.isatty() and sys.stderr.isatty())


def interrupted(config: Any, job_id: str, stdin: TextIO, err: TextIO, ask: bool) -> int:
    """After Ctrl-C: ask whether to cancel the job at every site (`ask`), or say in one line that
    it continues and how to cancel it. Exit code 130."""
    command = cancel_command(job_id, getattr(config, "path", None))
    if not ask:
        print(f"fedpeer: stopped waiting; job {job_id} continues at every site; cancel it with `{command}`",
              file=err, flush=True)
        return EXIT_INTERRUPTED
    print(f"cancel job {job_id} at every site? [y/N] ", end="", file=err, flush=True)
    try:
        answer = stdin.readline().strip().lower()
    except KeyboardInterrupt:
        answer = ""
        print(file=err)
    if answer not in ("y", "yes"):
        print(f"job {job_id} continues at every site; `{command}` cancels it", file=err, flush=True)
        return EXIT_INTERRUPTED
    from fedpeer.daemon.adminclient import request

    try:
        record = asyncio.run(request(config, "POST", f"/v1/jobs/{job_id}/cancel"))
    except FedpeerError as exc:
        print(f"fedpeer: {exc}", file=err, flush=True)
        return EXIT_INTERRUPTED
    print(f"job {job_id} {record['state']} at every site", file=err, flush=True)
    return EXIT_INTERRUPTED


def cancel_command(job_id: str, config_path: Path | None) -> str:
    """`fedpeer job cancel ID`, with `--config FILE` unless the command finds that file without it."""
    from fedpeer.config.locate import find

    if config_path is None:
        return f"fedpeer job cancel {job_id}"
    try:
        found = find(None)
    except ConfigError:
        found = None
    same = found is not None and Path(found).resolve() == Path(config_path).resolve()
    return f"fedpeer job cancel {job_id}" + ("" if same else f" --config {config_path}")
