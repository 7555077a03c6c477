"""The connection layer: TLS, HTTP/1.1 framing, deadlines and the body cap, on one asyncio loop per worker.

A connection is a small protocol object and its TLS state, never a thread: a client that trickles its
handshake, its headers or its body holds nothing anybody else needs, and is cut at its deadline. Only a
complete request reaches the WSGI application (Flask): on the loop itself when its body is at most
``Limits.inline_body`` (256 KiB, every pod: a thread hop cost more than the decision), else on a small thread
pool with a time limit, so a slow client never occupies a thread either. The deadlines (one clock each, never
reset by a trickle):

- TLS handshake: ``handshake_timeout`` from accept (the apiserver gives up on its own after 10 s);
- a request: ``request_timeout`` from its first byte to the end of its body;
- an idle kept-alive connection: ``idle_timeout`` between requests, longer than the apiserver's 90 s
  (it does not retry a POST written on a connection the server has just closed).

HTTP parsing is httptools (llhttp, the parser of Node.js). Requests on one connection are answered in
order; while one is handled the connection stops reading, so a pipelining client buffers nothing here.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import ssl
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools

from webhook.telemetry import logs

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class Limits:
    handshake_timeout: float = 10.0
    request_timeout: float = 10.0
    idle_timeout: float = 120.0
    # Bodies up to this size are decided on the loop itself; larger ones on the thread pool, where a
    # handler still running after ``handler_timeout`` is answered 500 (the apiserver applies its
    # failurePolicy) while the loop serves everybody else.
    inline_body: int = 256 * 1024
    handler_timeout: float = 25.0
    max_body: int = 7 * 1024 * 1024
    max_header_bytes: int = 64 * 1024  # request line and headers together
    max_header_field: int = 8190  # one header line (gunicorn's and many proxies' limit)
    max_headers: int = 100
    # Per worker. At the cap a new connection evicts the oldest one that has not completed a request yet
    # (a slow client, most likely), never one that has (the apiserver's kept-alive pool); if every one
    # has, the new one is closed. About 50 KB each once TLS is up: 1024 bound a worker's growth to 50 MB.
    max_connections: int = 1024


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class _Refusal(Exception):
    """A request answered by the connection layer itself (400, 408, 413, 431), then the connection closes."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Request:
    method: str
    target: bytes
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    version: str


# How long a drain waits for connections still in their TLS handshake before closing them.
HANDSHAKE_SETTLE = 1.0


class Front:
    """What every connection of one worker shares: the app, the pool, the limits and the drain state."""

    def __init__(
        self,
        app: WSGIApp,
        pool: Executor,
        limits: Limits,
        server_port: int,
        tls: Callable[[], ssl.SSLContext] | None,
        on_refusal: Callable[[int, str, str], None] = lambda status, reason, peer: None,
    ):
        self.app = app
        self.tls = tls
        self.pool = pool
        self.limits = limits
        self.server_port = str(server_port)
        self.on_refusal = on_refusal
        self.connections: dict[Connection, None] = {}  # an ordered set: oldest first
        self.closing = False
        self.evicted = 0

    def admit(self, connection: Connection) -> bool:
        """Make room for ``connection`` at the cap by evicting the oldest connection still without a request."""
        if self.closing:
            return False
        if len(self.connections) >= self.limits.max_connections:
            victim = next((c for c in self.connections if not c.served and not c.busy), None)
            if victim is None:
                return False
            self.evicted += 1
            victim.close_quietly()
        self.connections[connection] = None
        return True

    def protocol(self) -> Connection:
        return Connection(self)

    async def drain(self, timeout: float) -> int:
        """Stop keeping connections alive and wait for them to end; returns how many were cut at ``timeout``.

        Every answer from now on says ``Connection: close``, so clients learn it from us. An idle
        kept-alive connection is not closed under its client: the apiserver may be writing a POST into it
        right then, and it does not retry those. Connections still open at ``timeout`` are closed.
        """
        self.closing = True
        # A connection accepted just before the listener closed may be mid-handshake: a client's one try, which
        # closing it would fail. It gets a moment to finish (its answer says close); one still shaking hands
        # after that is a slow client, and goes.
        settle = time.monotonic() + min(timeout, HANDSHAKE_SETTLE)
        while any(not c.handshaken for c in self.connections) and time.monotonic() < settle:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            if not connection.handshaken:
                connection.close_quietly()
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = len(self.connections)
        for connection in list(self.connections):
            connection.close_quietly()
        return left


class Connection(asyncio.Protocol):
    """One client connection: TLS, parsing, the limits, and complete requests handed to the app in order.

    TLS runs over memory buffers (``SSLContext.wrap_bio``) rather than the loop's TLS transport: each
    connection takes the certificate loaded last when it is accepted, a failed handshake still sends
    its alert (a TLS 1.1 client learns why it is refused), and the handshake deadline is ours.
    """

    def __init__(self, front: Front):
        self.front = front
        self.limits = front.limits
        self.transport: Any = None  # asyncio's or uvloop's TCP transport (uvloop's is no asyncio.Transport)
        self.peer = ""
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.tls: ssl.SSLObject | None = None
        self.hello = b""  # the ClientHello record as it trickles in, before OpenSSL sees any of it
        self.handshaken = False
        self.served = 0
        self.parser = httptools.HttpRequestParser(self)
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False
        self.closed = False
        self.queue: list[_Request] = []
        self.peer_done = False
        self._reset()

    # ------------------------------------------------------------------ lifecycle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        if not self.front.admit(self):
            self.transport.abort()
            self.closed = True
            return
        if self.front.tls is None:  # the plain-HTTP operations port (probes, metrics)
            self.handshaken = True
            self._arm(self.limits.idle_timeout)
            return
        self._arm(self.limits.handshake_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        self.front.connections.pop(self, None)
        # The parser holds our callbacks (a cycle through an object the collector cannot see into), and
        # the TLS state is tens of KB: let go of both now, not whenever a collection finds them.
        self.parser = None  # type: ignore[assignment]
        self.tls = None
        self.queue.clear()

    def close_quietly(self) -> None:
        self._close()

    def _close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self._disarm()
            if self.handshaken and self.tls is not None:
                try:
                    self.tls.unwrap()  # queues our close_notify; the peer's is not awaited
                except (ssl.SSLError, OSError):
                    pass
            self._flush()
            self.transport.close()
        self.front.connections.pop(self, None)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        if self.closed:
            return  # a pipelined request parsed after the close must not keep the connection alive
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if not self.handshaken:
            self._close()  # a handshake still unfinished after handshake_timeout
        elif self.in_request and not self.busy:
            self._refuse(_Refusal(408, "the request did not arrive in time"))
        elif not self.busy:
            self._close()  # idle for longer than any client keeps a connection

    # ------------------------------------------------------------------ TLS

    def _flush(self) -> None:
        if self.outgoing.pending and self.transport is not None:
            self.transport.write(self.outgoing.read())

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.front.tls is None:
            self._parse(data)
            return
        if self.tls is None:
            data = self._gather_hello(data)
            if self.tls is None:
                return
        self.incoming.write(data)
        if not self.handshaken:
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                self._flush()
                return
            except (ssl.SSLError, OSError) as exc:
                self._flush()  # the alert that says why: protocol version, unknown CA, not TLS at all
                self.closed = True
                self.front.connections.pop(self, None)
                self._disarm()
                self.transport.close()
                logs.event("handshake_failed", logging.DEBUG, remote=self.peer, error=str(exc))
                return
            self.handshaken = True
            self._flush()
            self._arm(self.limits.idle_timeout)
        chunks = []
        ended = False  # the peer's close_notify (read gives b"") or a broken record
        while True:
            try:
                chunk = self.tls.read(65536)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLError, OSError):
                ended = True
                break
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
        self._flush()  # TLS 1.3 tickets and key updates
        if chunks:
            self._parse(b"".join(chunks) if len(chunks) > 1 else chunks[0])
        if ended:
            self._close_after_answers()

    def _gather_hello(self, data: bytes) -> bytes:
        """Hold the first TLS record until it is whole, then start TLS with the certificate in force.

        OpenSSL allocates its record buffers (about 36 KB) at the first byte it reads; a client trickling
        its ClientHello a byte a second would hold them for the whole handshake timeout. Gathered here,
        the record costs what it weighs (a few hundred bytes). Anything but a handshake record goes to
        OpenSSL at once, which answers it with the right alert (plain HTTP on this port, say).
        """
        self.hello += data
        if len(self.hello) >= 5 and self.hello[0] == 0x16:  # TLS record header: type, version, length
            length = int.from_bytes(self.hello[3:5], "big")
            if len(self.hello) < 5 + length and length <= 16384:
                return b""
        elif len(self.hello) < 5 and self.hello[:1] in (b"", b"\x16"):
            return b""
        context = self.front.tls
        assert context is not None  # only the TLS port gathers a ClientHello
        self.tls = context().wrap_bio(self.incoming, self.outgoing, server_side=True)
        data, self.hello = self.hello, b""
        return data

    def eof_received(self) -> bool | None:
        self._close_after_answers()
        return True

    def _close_after_answers(self) -> None:
        """The peer is done sending: answer what is queued, then close."""
        if not self.busy and not self.queue:
            self._close()
        else:
            self.peer_done = True

    def _send(self, data: bytes) -> None:
        if self.closed:
            return
        if self.tls is None:
            self.transport.write(data)
            return
        try:
            self.tls.write(data)
        except (ssl.SSLError, OSError):
            self._close()
            return
        self._flush()

    # ------------------------------------------------------------------ parsing

    def _reset(self) -> None:
        self.in_request = False
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.header_bytes = 0
        self.body = io.BytesIO()
        self.body_size = 0

    def _parse(self, data: bytes) -> None:
        if self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except _Refusal as refusal:
            self._refuse(refusal)
        except httptools.HttpParserCallbackError as exc:
            # httptools wraps what a callback raised; our callbacks raise only refusals.
            cause = exc.__context__
            self._refuse(cause if isinstance(cause, _Refusal) else _Refusal(400, "malformed HTTP request"))
        except httptools.HttpParserUpgrade:
            self._refuse(_Refusal(400, "protocol upgrades are not served"))
        except httptools.HttpParserError as exc:
            self._refuse(_Refusal(400, f"malformed HTTP request: {exc}"))

    def on_message_begin(self) -> None:
        self._reset()
        self.in_request = True
        if not self.busy:
            self._arm(self.limits.request_timeout)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) + 2 > self.limits.max_header_field:
            raise _Refusal(431, f"a request header line over {self.limits.max_header_field} bytes")
        self._count(len(name) + len(value) + 4)
        if len(self.headers) >= self.limits.max_headers:
            raise _Refusal(431, f"more than {self.limits.max_headers} request headers")
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def _count(self, n: int) -> None:
        self.header_bytes += n
        if self.header_bytes > self.limits.max_header_bytes:
            raise _Refusal(431, f"request line and headers over {self.limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        length = None
        expect = False
        for name, value in self.headers:
            lowered = name.lower()
            if lowered == "content-length":
                length = int(value) if value.strip().isdigit() else None
            elif lowered == "expect" and value.lower() == "100-continue":
                expect = True
        if length is not None and length > self.limits.max_body:
            raise _Refusal(413, f"the body is over {self.limits.max_body} bytes")
        if expect:
            self._send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.limits.max_body:  # chunked: no length to refuse up front
            raise _Refusal(413, f"the body is over {self.limits.max_body} bytes")
        self.body.write(body)

    def on_message_complete(self) -> None:
        request = _Request(
            method=self.parser.get_method().decode("latin-1"),
            target=self.url,
            headers=self.headers,
            body=self.body.getvalue(),
            keep_alive=bool(self.parser.should_keep_alive()),
            version=self.parser.get_http_version(),
        )
        self._reset()
        self.queue.append(request)
        if len(self.queue) > 16:
            raise _Refusal(400, "too many pipelined requests")
        if not self.busy:
            self._next()

    # ------------------------------------------------------------------ answering

    def _next(self) -> None:
        if self.closed or not self.queue:
            return
        request = self.queue.pop(0)
        self.busy = True
        self._disarm()
        self.transport.pause_reading()
        environ = self._environ(request)
        if len(request.body) <= self.limits.inline_body:
            # The common case (a pod is a few KiB): decided right here, no thread hop. Its cost is bounded
            # by its size, so the loop is held for about a millisecond at most.
            self._finish(request, call_wsgi(self.front.app, environ))
        else:
            asyncio.get_running_loop().create_task(self._offload(request, environ))

    async def _offload(self, request: _Request, environ: dict[str, Any]) -> None:
        """A large body is decided on the pool, so the loop goes on serving everybody else meanwhile."""
        loop = asyncio.get_running_loop()
        try:
            answer = await asyncio.wait_for(
                loop.run_in_executor(self.front.pool, call_wsgi, self.front.app, environ),
                self.limits.handler_timeout,
            )
        except TimeoutError:
            logs.event("handler_timeout", logging.ERROR, path=environ["PATH_INFO"], seconds=self.limits.handler_timeout)
            answer = 500, [("Content-Type", "application/json")], b'{"error":"handler timed out"}'
        except Exception:  # call_wsgi turns app errors into 500s; this is a bug of ours
            logs.event("connection_failed", logging.ERROR, exc_info=True)
            answer = 500, [("Content-Type", "application/json")], b'{"error":"internal error"}'
        self._finish(request, answer)

    def _finish(self, request: _Request, answer: tuple[int, list[tuple[str, str]], bytes]) -> None:
        status, headers, body = answer
        self.served += 1
        keep = request.keep_alive and not self.front.closing and not self.peer_done
        self._write(request.version, status, headers, body, keep)
        self.busy = False
        if not keep:
            self._close()
            return
        if self.queue:
            self._next()
            return
        if not self.closed:
            self.transport.resume_reading()
            self._arm(self.limits.request_timeout if self.in_request else self.limits.idle_timeout)

    def _write(self, version: str, status: int, headers: list[tuple[str, str]], body: bytes, keep: bool) -> None:
        lines = [f"HTTP/{version if version in ('1.0', '1.1') else '1.1'} {status} ".encode() + _reason(status)]
        for name, value in headers:
            lowered = name.lower()
            if lowered not in ("content-length", "connection", "transfer-encoding"):
                lines.append(f"{name}: {value}".encode("latin-1"))
        lines.append(b"Content-Length: %d" % len(body))
        lines.append(b"Connection: keep-alive" if keep else b"Connection: close")
        self._send(b"\r\n".join(lines) + b"\r\n\r\n" + body)

    def _refuse(self, refusal: _Refusal) -> None:
        """Answer a request the connection layer will not pass on, and close the connection."""
        self.front.on_refusal(refusal.status, refusal.message, self.peer)
        body = json.dumps({"error": refusal.message, "code": refusal.status}, separators=(",", ":")).encode()
        self._write("1.1", refusal.status, [("Content-Type", "application/json")], body, keep=False)
        self._close()

    def _environ(self, request: _Request) -> dict[str, Any]:
        path, _, query = request.target.partition(b"?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path.decode("latin-1"),
            "QUERY_STRING": query.decode("latin-1"),
            "SERVER_NAME": "gpu-webhook",
            "SERVER_PORT": self.front.server_port,
            "SERVER_PROTOCOL": f"HTTP/{request.version}",
            "REMOTE_ADDR": self.peer.rsplit(":", 1)[0],
            "CONTENT_LENGTH": str(len(request.body)),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https" if self.front.tls is not None else "http",
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
                environ["CONTENT_TYPE"] = value
                continue
            key = "HTTP_" + key
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ


def call_wsgi(app: WSGIApp, environ: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
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
        return 500, [("Content-Type", "application/json")], b'{"error":"internal error"}'
    status_line, headers = started
    return int(status_line.split(" ", 1)[0]), headers, body
