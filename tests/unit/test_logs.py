"""The log rate limiter: a flood of one error costs a few lines that say how many were dropped."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import socket
from collections.abc import Iterator

import pytest
from aiohttp.http_exceptions import BadStatusLine

from fedpeer.base import logs
from fedpeer.base.logs import LOG_REPEAT_INTERVAL_MS, LogfmtFormatter, RepeatFilter, fields


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, FakeClock]]:
    """A logger whose one handler has the formatter and the filter of `logs.setup`, on a fake clock."""
    out, clock = io.StringIO(), FakeClock()
    handler = logging.StreamHandler(out)
    handler.setFormatter(LogfmtFormatter())
    handler.addFilter(RepeatFilter(clock_ms=clock))
    logger = logging.getLogger("test.logs.flood")
    logger.handlers[:] = [handler]
    logger.propagate, logger.level = False, logging.DEBUG
    yield logger, out, clock
    logger.handlers[:] = []


@pytest.fixture
def root_setup() -> Iterator[None]:
    """Run logs.setup on the real root logger, and put the root back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, logs._installed[:]
    logging.captureWarnings(False)      # (setup turns it on; pytest restores warnings.showwarning per test)
    yield
    logging.captureWarnings(False)
    root.handlers[:], root.level, logs._installed[:] = saved


def _raise_and_log(logger: logging.Logger) -> None:
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        logger.exception("state_write_failed", extra=fields(path="/state/node.json"))


def test_thousand_identical_errors_become_a_few_lines_with_the_count(logged) -> None:
    logger, out, clock = logged
    for i in range(1_000):
        clock.now_ms = i * 12   # 1,000 errors over 12 s: the first, then one line per 5 s
        _raise_and_log(logger)
    clock.now_ms += LOG_REPEAT_INTERVAL_MS
    logger.handlers[0].filters[0].flush(logger.handlers[0])   # the flood stopped: its tail is counted
    lines = out.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert "exc=" in lines[0] and "No space left" in lines[0], "the first is written in full"
    assert all("exc=" not in line and "interval_ms=5000" in line and "path=/state/node.json" in line
               for line in lines[1:])
    suppressed = [int(re.search(r"suppressed=(\d+)", line).group(1)) for line in lines[1:]]
    assert sum(suppressed) + len(lines) - 1 == 1_000, "every error is either written or counted"
    assert all(n > 100 for n in suppressed)
    logger.handlers[0].filters[0].flush(logger.handlers[0])
    assert len(out.getvalue().splitlines()) == 4, "a count is written once"


def test_a_kind_quiet_for_an_interval_is_written_in_full_again(logged) -> None:
    logger, out, clock = logged
    _raise_and_log(logger)
    clock.now_ms = LOG_REPEAT_INTERVAL_MS + 1
    _raise_and_log(logger)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all("exc=" in line for line in lines)


def test_kinds_are_limited_separately_and_info_is_never_limited(logged) -> None:
    logger, out, _ = logged
    for reason in ("signature", "replay", "oversize"):     # daemon/node.py's `rejected`, one per reason
        for _ in range(10):
            logger.warning("rejected", extra=fields(reason=reason))
    for i in range(50):
        logger.info("peer_state", extra=fields(peer=f"p{i}", state="alive"))
    lines = out.getvalue().splitlines()
    reasons = [line.split("reason=")[1] for line in lines if "event=rejected" in line]
    assert reasons == ["signature", "replay", "oversize"]
    assert sum("event=peer_state" in line for line in lines) == 50


def test_a_strangers_malformed_request_is_one_warning_line_without_traceback(logged) -> None:
    logger, out, _ = logged
    server_log = logging.getLogger("aiohttp.server")
    server_log.handlers[:], server_log.propagate = logger.handlers[:], False
    try:
        exc = BadStatusLine("GARBAGE\r\n")
        server_log.error("Error handling request from %s", "10.0.0.9", exc_info=exc)
        server_log.error("Error handling request from %s", "10.0.0.10",
                         exc_info=ConnectionResetError("Connection lost"))
    finally:
        server_log.handlers[:], server_log.propagate = [], True
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert all("level=warning" in line and "exc=" not in line for line in lines)
    assert "error=\"BadStatusLine" in lines[0] and "10.0.0.9" in lines[0]
    assert "ConnectionResetError" in lines[1]


def test_setup_limits_asyncio_and_aiohttp_floods(root_setup, capsys) -> None:
    """The flood seen in the audit, through the real root handler that `logs.setup` installs."""
    logs.setup("info")
    loop = asyncio.new_event_loop()
    try:
        with socket.socket() as listener:
            for _ in range(1_000):
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(24, "Too many open files"), "socket": listener})
    finally:
        loop.close()
    for i in range(1_000):
        logging.getLogger("aiohttp.server").error("Error handling request from %s", f"10.0.{i // 250}.{i % 250}",
                                                  exc_info=BadStatusLine(f"junk {i}"))
    lines = capsys.readouterr().err.splitlines()
    accept = [line for line in lines if "socket.accept() out of system resource" in line]
    bad = [line for line in lines if "Error handling request" in line]
    assert len(accept) == 1 and "Too many open files" in accept[0], lines[:3]
    assert len(bad) == 1 and "level=warning" in bad[0], bad
    assert len(lines) == 2, lines
    logs.flush_repeats(everything=True)   # as at exit: the counts of both floods, one line each
    counts = re.findall(r"suppressed=(\d+)", capsys.readouterr().err)
    assert sorted(int(n) for n in counts) == [999, 999]


def test_a_python_warning_after_setup_is_one_structured_line(root_setup, capsys) -> None:
    """A library's warning, or asyncio's 'coroutine ... was never awaited' at a quick stop, is a
    log line like any other, not free text between them (an operator's log parser, test_cli)."""
    import warnings
    logs.setup("info")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("coroutine 'to_thread' was never awaited", RuntimeWarning, stacklevel=1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ts=") and "logger=py.warnings" in lines[0], lines
    assert "never awaited" in lines[0]


def test_remembered_kinds_are_bounded() -> None:
    clock = FakeClock()
    limiter = RepeatFilter(clock_ms=clock, keys_max=8)
    for i in range(100):
        record = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, f"Exception in callback <Handle {i}>",
                                   None, None)
        assert limiter.filter(record)
    assert len(limiter._seen) == 8


def test_logfmt_escapes_every_non_printable_character() -> None:
    """A value a peer or a file chose (a name, an error text) never writes a control character to
    the log or the terminal: ESC, CR, U+2028, zero-width and other non-printables come out escaped."""
    record = logging.LogRecord("fedpeer.test", logging.WARNING, __file__, 1, "peer_seen", None, None)
    record.__dict__.update(fields(name="evil\x1b[2J\rok\u2028x\u200b\x00", plain="site-1", empty=""))
    line = LogfmtFormatter().format(record)
    assert line.isprintable(), repr(line)
    assert 'name="evil\\x1b[2J\\rok\\u2028x\\u200b\\x00"' in line
    assert " plain=site-1" in line and ' empty=""' in line
