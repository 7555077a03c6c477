"""One JSON object per line on stderr, for every log line the server writes.

Events are logged as ``event(name, **fields)``; the formatter turns a record into
``{"time", "level", "event", ...fields}``, a traceback into one ``traceback`` string, and any other
record (gunicorn's own lines, a library's) into ``{"event": "log", "logger", "message"}``. Never log an
object's body: Secrets and env values pass through admission.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOGGER = "gpu_webhook"
log = logging.getLogger(LOGGER)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line["event"] = record.msg
            line.update(fields)
        else:
            line["event"] = "log"
            line["logger"] = record.name
            line["message"] = record.getMessage()
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def event(name: str, level: int = logging.INFO, /, exc_info: bool = False, **fields: Any) -> None:
    """Log one event with its fields (plain JSON values; others are written with ``str``)."""
    if log.isEnabledFor(level):
        log.log(level, name, extra={"fields": fields}, exc_info=exc_info)


def configure(logger: logging.Logger | None = None) -> None:
    """JSON lines on stderr for ``logger`` (default: ours), idempotent."""
    target = logger or log
    if not any(getattr(h, "_gpu_webhook", False) for h in target.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        handler._gpu_webhook = True  # type: ignore[attr-defined]
        target.addHandler(handler)
    if target is log:
        target.setLevel(logging.INFO)
        target.propagate = False
