"""Daemons forked from a process that has already imported them: `fedpeer start` without the
interpreter's start-up and the imports (~1 s of CPU a daemon) nor, at its first job, the training
libraries' (~3-4 s: scikit-learn, xgboost, the compiled kernels).

A test run starts some 150 daemons on a 2-core machine, most for a job or two: a third of the
suite's CPU went to importing the same modules again in every one of them. `Zygote` starts one
process (`python -m fedpeer.app.harness.zygote`) that imports the daemon and the training libraries
once, freezes them out of the collector, and then forks on request; each child detaches (its own
session, like `Popen(start_new_session=True)`), points its standard streams at the site's log,
takes the caller's environment and runs `python -m fedpeer start ...` in itself (`runpy`): the
same entry point as the command line. The daemon is a real process with its own sockets, signals and exit:
kill -9, SIGSTOP and SIGHUP work on it as on any other. What differs from a fresh interpreter:
environment variables read when a module is imported are the zygote's (fedpeer reads its own at
run time), and a site that runs another build (`Site.env`) or under a wrapper (`ip netns exec`)
is started by `Popen`, never forked (`Harness.start`).

The request pipe carries one JSON line each way: {"op": "spawn", "argv", "log", "env", "cwd"} ->
{"pid"}; {"op": "poll", "pid"} -> {"rc": int | null} (the zygote reaps its children, so their exit
status comes from it). The zygote exits when its request pipe closes; its children live on
until stopped, as Popen's do.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from typing import Any

WAIT_POLL_S = 0.02

_shared: Zygote | None = None
_sharing = False


def shared_zygote() -> Zygote | None:
    """The zygote every new `Harness` of this process forks its daemons from, started at the
    first call once `share(True)` (None: each daemon is `python -m fedpeer start`)."""
    global _shared
    if _sharing and _shared is None:
        _shared = Zygote()
    return _shared


def share(on: bool) -> None:
    """Fork the daemons of every later `Harness` from one zygote (started when first needed), or
    stop doing so and stop that zygote (its daemons live on until their harness stops them)."""
    global _shared, _sharing
    _sharing = on
    if not on and _shared is not None:
        _shared.close()
        _shared = None


class ZygoteError(RuntimeError):
    pass


class Zygote:
    """The caller's side: starts the zygote process, forks daemons from it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([sys.executable, "-m", "fedpeer.app.harness.zygote"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        if self._ask({"op": "ready"}).get("ready") is not True:
            raise ZygoteError("the zygote did not start")

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._proc.poll() is not None:
                raise ZygoteError(f"the zygote exited ({self._proc.returncode})")
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise ZygoteError("the zygote closed its pipe")
        return json.loads(line)

    def spawn(self, argv: list[str], log_path: str, cwd: str | None = None) -> Forked:
        pid = self._ask({"op": "spawn", "argv": argv, "log": log_path, "env": dict(os.environ), "cwd": cwd})["pid"]
        return Forked(self, pid)

    def returncode(self, pid: int) -> int | None:
        return self._ask({"op": "poll", "pid": pid})["rc"]

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class Forked:
    """A forked daemon, with the part of `subprocess.Popen`'s interface the harness and tests use."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote, self.pid = zygote, pid
        self.returncode: int | None = None
        self.args = ["fedpeer", "start"]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(WAIT_POLL_S)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# -- the zygote process ----------------------------------------------------------------------------

def _preload() -> None:
    """Everything a daemon imports, at start and for its jobs, and the compiled kernels."""
    from fedpeer.daemon import node  # noqa: F401
    from fedpeer.daemon.warmup import preload_ml
    from fedpeer.kinds.catalog import job_kinds
    job_kinds()
    preload_ml()           # ends with gc.freeze(): the children share these pages and never walk them


def _child(request: dict[str, Any]) -> None:
    """In the forked child: detach, take the site's streams and the caller's environment, run."""
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)     # KeyboardInterrupt, as python starts
        # as a fresh interpreter has them: a write to a socket its peer closed is an error
        # (EPIPE), not the death of the daemon (under load, 24 of 110 forked daemons died so)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the child's streams live as long as it does
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        sys.argv = ["fedpeer", *request["argv"]]
        runpy.run_module("fedpeer", run_name="__main__", alter_sys=True)   # `python -m fedpeer ARGV`
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    _preload()
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "ready":
            answer: dict[str, Any] = {"ready": True}
        elif op == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(request)
            answer = {"pid": pid}
        elif op == "poll":
            try:
                done, status = os.waitpid(request["pid"], os.WNOHANG)
            except ChildProcessError:
                done, status = request["pid"], 0       # reaped already; never ours again
            answer = {"rc": None if done == 0 else os.waitstatus_to_exitcode(status)}
        else:
            answer = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
