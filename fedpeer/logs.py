"""Structured log lines on stderr: `ts=... level=... logger=... event=... key=value ...` (logfmt).

Callers log an event name and fields: `log.info("peer_state", extra=fields(peer="b", state="dead"))`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

_FIELDS = "fedpeer_fields"


def fields(**values: Any) -> dict[str, Any]:
    return {_FIELDS: values}


def _quote(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' "=\\\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [f"ts={ts}", f"level={record.levelname.lower()}", f"logger={record.name}",
                 f"event={_quote(record.getMessage())}"]
        parts += [f"{k}={_quote(v)}" for k, v in getattr(record, _FIELDS, {}).items()]
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
