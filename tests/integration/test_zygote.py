"""Daemons forked from the harness's zygote behave as processes started from the command line:
their own session, their exit code, their signals, their log (fedpeer/app/harness/zygote.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedpeer.app.harness.federation import free_ports
from fedpeer.app.harness.zygote import Forked, Zygote
from fedpeer.app.sitefiles import init_site


@pytest.fixture(scope="module")
def zyg() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def test_a_forked_command_writes_its_log_and_exits_with_its_code(zyg: Zygote, tmp_path: Path) -> None:
    log = tmp_path / "version.log"
    proc = zyg.spawn(["--version"], str(log))
    assert proc.wait(timeout=20) == 0
    assert log.read_text().startswith("fedpeer "), log.read_text()

    missing = zyg.spawn(["start", "--config", str(tmp_path / "none.toml")], str(tmp_path / "bad.log"))
    assert missing.wait(timeout=20) == 2             # the command line's exit code for a configuration error
    assert "configuration error" in (tmp_path / "bad.log").read_text()


def test_a_forked_command_takes_the_callers_environment(zyg: Zygote, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = init_site(tmp_path / "a", "a", f"127.0.0.1:{free_ports(1)[0]}")
    monkeypatch.setenv("FEDPEER_CONFIG", str(config))      # where `fedpeer status` finds the site
    log = tmp_path / "status.log"
    assert zyg.spawn(["status"], str(log)).wait(timeout=20) == 3     # no daemon answers: exit 3
    assert f"is 'fedpeer start --config {config}' running?" in log.read_text(), log.read_text()


def test_a_forked_daemon_runs_until_signalled(zyg: Zygote, tmp_path: Path) -> None:
    config, _ = init_site(tmp_path / "a", "a", f"127.0.0.1:{free_ports(1)[0]}")
    started: list[Forked] = []
    try:
        proc = zyg.spawn(["start", "--config", str(config)], str(tmp_path / "a.log"))
        started.append(proc)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)                       # a daemon runs until told to stop
        assert os.getsid(proc.pid) == proc.pid           # in a session of its own
        ignored = int(next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                           if line.startswith("SigIgn:")).split()[1], 16)
        assert ignored & (1 << (signal.SIGPIPE - 1)), "SIGPIPE must be ignored, as in a fresh interpreter"
        proc.terminate()
        assert proc.wait(timeout=20) == 0                # SIGTERM: a clean exit, as from the command line
        again = zyg.spawn(["start", "--config", str(config)], str(tmp_path / "a.log"))
        started.append(again)
        with pytest.raises(subprocess.TimeoutExpired):
            again.wait(timeout=1.0)
        again.kill()
        assert again.wait(timeout=20) == -signal.SIGKILL
        assert again.poll() == -signal.SIGKILL
    finally:
        for p in started:                                # never leave a daemon behind a failed assertion
            p.kill()
