"""Structured log lines on stderr: `ts=... level=... logger=... event=... key=value ...` (logfmt).

Callers log an event name and fields: `log.info("peer_state", extra=fields(peer="b", state="dead"))`.

Rules: one record is one line (newlines inside values are escaped). Every warning or error —
aiohttp's and asyncio's included — passes one rate limiter (`RepeatFilter`, on the root handler):
the first of a kind is written in full, then at most one line per LOG_REPEAT_INTERVAL_MS with the
count of those suppressed, so a flood (77 MB of `socket.accept() out of system resource` in 40 s
was seen) costs a few lines. What a stranger's malformed or aborted request makes aiohttp's server
log is their fault, not ours: one warning line, no traceback.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

_FIELDS = "fedpeer_fields"
_SUMMARY = "fedpeer_repeat_summary"
LOG_REPEAT_INTERVAL_MS = 5_000     # a repeated warning/error: at most one line per key this often
LOG_REPEAT_KEYS_MAX = 1_024        # kinds remembered; the least recently seen is forgotten first
LOG_FLUSH_INTERVAL_MS = 1_000      # how often the daemon writes the counts of floods that stopped
LOG_TEMPLATE_CHARS_MAX = 200       # of a message template, in the key (asyncio's carry reprs)
LOG_VALUE_CHARS_MAX = 300          # of a stranger's error text in its one-line warning
_SERVER_LOGGERS = ("aiohttp.server", "aiohttp.web")
# Raised by a request a peer or stranger sent badly or abandoned: nothing for us to fix.
_STRANGER_ERRORS: tuple[type[BaseException], ...] = (HttpProcessingError, ConnectionError, EOFError)


def fields(**values: Any) -> dict[str, Any]:
    return {_FIELDS: values}


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    """One character of a quoted value: a backslash escape for \\ " and the control characters,
    \\xNN, \\uNNNN or \\UNNNNNNNN for any other non-printable one (ESC, U+2028, ...)."""
    if c in _ESCAPES:
        return _ESCAPES[c]
    if c.isprintable():
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _quote(value: Any) -> str:
    """A logfmt value: bare if it is printable and holds no space, quote, = or backslash; else
    quoted, with every non-printable character escaped, so a value (a peer's name, an error text)
    can never move the cursor, clear the terminal, or forge a line of the log."""
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return '"' + "".join(map(_escape, text)) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}",
                 f"event={_quote(record.getMessage())}"]
        parts += [f"{k}={_quote(v)}" for k, v in getattr(record, _FIELDS, {}).items()]
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


@dataclass
class _Seen:
    emitted_ms: int        # when the last line of this kind was written
    suppressed: int = 0    # records of this kind dropped since then
    message: str = ""      # the first dropped one's text and fields, for a summary by `flush`
    values: dict[str, Any] = field(default_factory=dict)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RepeatFilter(logging.Filter):
    """Rate limit for warnings and errors, keyed by (logger, level, message template, exception
    type, `reason` field). A kind quiet for an interval is written in full again; while it
    repeats, one line per interval says how many were suppressed (`suppressed=N`), without the
    traceback. `flush` writes the count a flood left behind when it stopped. Info and debug pass
    untouched: state changes must all be seen."""

    def __init__(self, interval_ms: int = LOG_REPEAT_INTERVAL_MS, keys_max: int = LOG_REPEAT_KEYS_MAX,
                 clock_ms: Callable[[], int] = _monotonic_ms) -> None:
        super().__init__()
        self._interval_ms = interval_ms
        self._keys_max = keys_max
        self._clock_ms = clock_ms
        self._seen: OrderedDict[tuple, _Seen] = OrderedDict()
        self._lock = threading.Lock()   # worker threads log too, and filters run outside handler locks

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _SUMMARY, False):
            return True   # written by flush, already counted
        exc_type = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        _demote_stranger_error(record)
        if record.levelno < logging.WARNING:
            return True
        key = _key(record, exc_type)
        with self._lock:
            now = self._clock_ms()
            seen = self._seen.get(key)
            if seen is None or (seen.suppressed == 0 and now - seen.emitted_ms >= self._interval_ms):
                self._seen[key] = _Seen(emitted_ms=now)
                self._seen.move_to_end(key)
                while len(self._seen) > self._keys_max:
                    self._seen.popitem(last=False)
                return True   # the first of its kind: in full
            self._seen.move_to_end(key)
            if now - seen.emitted_ms < self._interval_ms:
                if seen.suppressed == 0:
                    seen.message, seen.values = _message(record), dict(getattr(record, _FIELDS, {}))
                seen.suppressed += 1
                return False
            suppressed, seen.emitted_ms, seen.suppressed = seen.suppressed, now, 0
        _one_line(record, suppressed=suppressed, interval_ms=self._interval_ms)
        return True

    def flush(self, handler: logging.Handler, *, everything: bool = False) -> None:
        """Write, through `handler`, one line for each kind whose interval is over (or, with
        `everything`, at exit, any) with records still suppressed: a flood that stopped would
        otherwise never report its tail."""
        with self._lock:
            now = self._clock_ms()
            due = [(key, seen.message, {**seen.values, "suppressed": seen.suppressed})
                   for key, seen in self._seen.items()
                   if seen.suppressed and (everything or now - seen.emitted_ms >= self._interval_ms)]
            for key, _, _ in due:
                self._seen[key].emitted_ms, self._seen[key].suppressed = now, 0
        for (name, levelno, _, _, _), message, values in due:
            handler.handle(logging.makeLogRecord({
                "name": name, "levelno": levelno, "levelname": logging.getLevelName(levelno), "msg": message,
                _SUMMARY: True, _FIELDS: {**values, "interval_ms": self._interval_ms}}))


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()[:LOG_VALUE_CHARS_MAX]
    except Exception:   # bad %-args: the formatter reports that; the limiter must not raise
        return str(record.msg)[:LOG_VALUE_CHARS_MAX]


def _key(record: logging.LogRecord, exc_type: str) -> tuple:
    template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
    reason = getattr(record, _FIELDS, {}).get("reason", "")
    return (record.name, record.levelno, template.split("\n", 1)[0][:LOG_TEMPLATE_CHARS_MAX], exc_type, str(reason))


def _one_line(record: logging.LogRecord, **extra: Any) -> None:
    """Drop the traceback, keep its gist as a field. Mutates the record: ours is the only handler."""
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        extra = {"error": f"{type(exc).__name__}: {exc}"[:LOG_VALUE_CHARS_MAX], **extra}
    record.exc_info, record.exc_text, record.stack_info = None, None, None
    setattr(record, _FIELDS, {**getattr(record, _FIELDS, {}), **extra})


def _demote_stranger_error(record: logging.LogRecord) -> None:
    """aiohttp's server logs a malformed or aborted request with a traceback at error level."""
    if record.levelno < logging.WARNING or not record.name.startswith(_SERVER_LOGGERS):
        return
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, _STRANGER_ERRORS):
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        _one_line(record)


_installed: list[tuple[logging.Handler, RepeatFilter]] = []   # what setup made, for flush_repeats


def flush_repeats(everything: bool = False) -> None:
    """Write the counts of floods that have stopped; the daemon calls this about once a second,
    and once with `everything` at exit."""
    for handler, repeat_filter in _installed:
        repeat_filter.flush(handler, everything=everything)


async def flush_repeats_forever(interval_ms: int = LOG_FLUSH_INTERVAL_MS) -> None:
    while True:
        await asyncio.sleep(interval_ms / 1000)
        flush_repeats()


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    repeat_filter = RepeatFilter()
    handler.addFilter(repeat_filter)
    if not _installed:
        atexit.register(flush_repeats, everything=True)   # before logging's own atexit flush (LIFO)
    _installed[:] = [(handler, repeat_filter)]
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python's warnings (a library's, or asyncio's "coroutine ... was never awaited" at exit) as
    # log lines too, not free text on stderr between them
    logging.captureWarnings(True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
