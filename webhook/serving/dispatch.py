"""Handing a complete request to the WSGI application and turning its answer into HTTP/1.1 bytes.

A request is decided on the loop itself when its body is at most ``Limits.inline_body`` (256 KiB, every pod: a
thread hop cost more than the decision), else on a small thread pool with a time limit (:func:`decide_on_pool`),
so the loop goes on serving everybody else meanwhile. Nothing here knows about sockets, TLS or deadlines.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from http import HTTPStatus
from typing import Any

from webhook.serving.reader import Refusal, Request
from webhook.telemetry import logs

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers, body

_INTERNAL_ERROR: Answer = 500, [("Content-Type", "application/json")], b'{"error":"internal error"}'
_TIMED_OUT: Answer = 500, [("Content-Type", "application/json")], b'{"error":"handler timed out"}'


def environ(request: Request, server_port: str, scheme: str, peer: str) -> dict[str, Any]:
    """The WSGI environ of ``request``, received from ``peer`` (``host:port``)."""
    path, _, query = request.target.partition(b"?")
    env: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path.decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "SERVER_NAME": "gpu-webhook",
        "SERVER_PORT": server_port,
        "SERVER_PROTOCOL": f"HTTP/{request.version}",
        "REMOTE_ADDR": peer.rsplit(":", 1)[0],
        "CONTENT_LENGTH": str(len(request.body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(request.body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for name, value in request.headers:
        key = name.upper().replace("-", "_")
        if key in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
            continue
        if key == "CONTENT_TYPE":
            env["CONTENT_TYPE"] = value
            continue
        key = "HTTP_" + key
        env[key] = f"{env[key]},{value}" if key in env else value
    return env


def call_wsgi(app: WSGIApp, environ: dict[str, Any]) -> Answer:
    """Run a WSGI app to completion: (status, headers, body). An app that raises is a 500."""
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        started[:] = [status, headers]
        return lambda data: None  # the legacy write() callable; Flask never uses it

    try:
        result = app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
    except Exception:
        logs.event("application_failed", logging.ERROR, exc_info=True, path=environ.get("PATH_INFO"))
        return _INTERNAL_ERROR
    status_line, headers = started
    return int(status_line.split(" ", 1)[0]), headers, body


async def decide_on_pool(app: WSGIApp, pool: Executor, environ: dict[str, Any], timeout: float) -> Answer:
    """``call_wsgi`` on ``pool``; a handler still running after ``timeout`` is answered 500 (the apiserver applies
    its failurePolicy) while the loop serves everybody else."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.run_in_executor(pool, call_wsgi, app, environ), timeout)
    except TimeoutError:
        logs.event("handler_timeout", logging.ERROR, path=environ["PATH_INFO"], seconds=timeout)
        return _TIMED_OUT
    except Exception:  # call_wsgi turns app errors into 500s; this is a bug of ours
        logs.event("connection_failed", logging.ERROR, exc_info=True)
        return _INTERNAL_ERROR


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def encode(version: str, answer: Answer, keep: bool) -> bytes:
    """The status line, the headers (ours for framing and Connection) and the body."""
    status, headers, body = answer
    lines = [f"HTTP/{version if version in ('1.0', '1.1') else '1.1'} {status} ".encode() + _reason(status)]
    for name, value in headers:
        lowered = name.lower()
        if lowered not in ("content-length", "connection", "transfer-encoding"):
            lines.append(f"{name}: {value}".encode("latin-1"))
    lines.append(b"Content-Length: %d" % len(body))
    lines.append(b"Connection: keep-alive" if keep else b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def encode_refusal(refusal: Refusal) -> bytes:
    """The answer to a refused request: a JSON error, and the connection closes."""
    body = json.dumps({"error": refusal.message, "code": refusal.status}, separators=(",", ":")).encode()
    return encode("1.1", (refusal.status, [("Content-Type", "application/json")], body), keep=False)
