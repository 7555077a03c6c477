"""One JSON object per line on stderr, for every log line the server writes.

Our events are written by ``event(name, level, **fields)`` as ``{"time", "level", "event", ...fields}``,
a traceback as one ``traceback`` string. Lines from elsewhere (gunicorn's own, asyncio's, a library's) go
through :class:`JsonFormatter` into the same shape, ``{"event": "log", "logger", "message"}``. Never log
an object's body: Secrets and env values pass through admission.

``event`` writes the line itself, without building a ``logging.LogRecord``: the decision line is written
once per request, and the logging module's per-record machinery was a quarter of a request's Python time
(py-spy, bench/README.md).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Any

import orjson

_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning", logging.ERROR: "error"}
_lock = threading.Lock()


def _timestamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def _write(line: dict[str, Any]) -> None:
    data = orjson.dumps(line, default=str) + b"\n"
    stream = sys.stderr
    with _lock:
        try:
            stream.flush()  # whatever a text-mode writer left buffered goes first
            stream.buffer.write(data) if hasattr(stream, "buffer") else stream.write(data.decode())
            stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or full: a log line is never worth a failed admission


def event(name: str, level: int = logging.INFO, /, exc_info: bool = False, **fields: Any) -> None:
    """Write one event with its fields (plain JSON values; others are written with ``str``)."""
    if level < threshold:
        return
    line: dict[str, Any] = {"time": _timestamp(time.time()), "level": _LEVELS.get(level, "info"), "event": name}
    line.update(fields)
    if exc_info:
        line["traceback"] = traceback.format_exc().rstrip()
    _write(line)


threshold = logging.INFO


def record_line(record: logging.LogRecord) -> dict[str, Any]:
    """Another logger's record in the shape of our events."""
    try:
        message = record.getMessage()
    except Exception:  # a record whose arguments do not fit its format
        message = str(record.msg)
    line: dict[str, Any] = {
        "time": _timestamp(record.created),
        "level": record.levelname.lower(),
        "event": "log",
        "logger": record.name,
        "message": message,
    }
    if record.exc_info:
        line["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
    return line


class JsonHandler(logging.Handler):
    """Writes other loggers' records through the same lock and stream as ``event``."""

    def emit(self, record: logging.LogRecord) -> None:
        _write(record_line(record))


def configure(*loggers: logging.Logger) -> None:
    """Send these loggers' records (default: the root logger's) to stderr as JSON lines, idempotent."""
    for target in loggers or (logging.getLogger(),):
        if not any(isinstance(h, JsonHandler) for h in target.handlers):
            target.addHandler(JsonHandler())
