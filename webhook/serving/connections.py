"""The connection layer of one worker: its limits, what its connections share, and each connection on the loop.

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

A :class:`Connection` puts four parts together and does the I/O they ask for: ``webhook.serving.lifecycle`` (its
state, what each event does, each state's deadline), ``webhook.serving.tlsbuffer`` (TLS over memory BIOs),
``webhook.serving.reader`` (httptools, the header and body caps) and ``webhook.serving.dispatch`` (the WSGI call
and the answer's bytes). Requests on one connection are answered in order; while one is decided the connection
stops reading, so a pipelining client buffers nothing here.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from webhook.serving import dispatch
from webhook.serving.dispatch import WSGIApp
from webhook.serving.lifecycle import (
    ABORT,
    ACCEPTED_PLAIN,
    ACCEPTED_TLS,
    ANSWER_408_AND_CLOSE,
    ANSWERED,
    ANSWERED_LAST,
    ANSWERED_NEXT_BEGUN,
    ANSWERED_NEXT_QUEUED,
    CLOSE,
    CLOSED,
    CUT,
    DEADLINE,
    DEADLINES,
    DISPATCH,
    DISPATCHED,
    HANDSHAKE_DONE,
    HANDSHAKE_FAILED,
    HANDSHAKING,
    LOST,
    NEW,
    NONE,
    PEER_DONE,
    READING_PAUSED,
    REFUSED,
    RELEASE,
    REQUEST_BEGUN,
    REQUEST_COMPLETE,
    TRANSITIONS,
    TURNED_AWAY,
    UNDECIDED,
    Deadline,
    Event,
    State,
)
from webhook.serving.reader import Refusal, Request, RequestReader
from webhook.serving.tlsbuffer import HandshakeFailed, TLSBuffer
from webhook.telemetry import logs

__all__ = ["HANDSHAKE_SETTLE", "Connection", "Front", "Limits", "WSGIApp"]


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


# How long a drain waits for connections still in their TLS handshake before closing them.
HANDSHAKE_SETTLE = 1.0

# More complete requests than this waiting behind the one being decided is a client to refuse (400).
MAX_PIPELINED = 16

# The 408 of a request still incomplete at its deadline.
LATE = Refusal(408, "the request did not arrive in time")


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
        self.scheme = "https" if tls is not None else "http"
        self.on_refusal = on_refusal
        self.deadlines = {state: getattr(limits, field) for state, field in DEADLINES.items()}
        self.connections: dict[Connection, None] = {}  # an ordered set: oldest first
        self.closing = False
        self.evicted = 0

    def admit(self, connection: Connection) -> bool:
        """Make room for ``connection`` at the cap by evicting the oldest connection still without a request."""
        if self.closing:
            return False
        if len(self.connections) >= self.limits.max_connections:
            victim = next((c for c in self.connections if c.evictable), None)
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
    """One client connection: its state (``webhook.serving.lifecycle``) and the I/O each move asks for.

    Every change of state goes through :meth:`_on`, which looks the event up in ``lifecycle.TRANSITIONS``; the
    deadline running is the one of the state entered, so a timer means what the state says.
    """

    __slots__ = ("front", "limits", "state", "transport", "peer", "buffer", "reader", "waiting", "deadline", "served")

    def __init__(self, front: Front):
        self.front = front
        self.limits = front.limits
        self.state = NEW
        self.transport: Any = None  # asyncio's or uvloop's TCP transport (uvloop's is no asyncio.Transport)
        self.peer = ""
        self.buffer: TLSBuffer | None = TLSBuffer(front.tls) if front.tls is not None else None
        begun = functools.partial(self._on, REQUEST_BEGUN)
        self.reader: RequestReader | None = RequestReader(self.limits, begun, self._complete, self._send)
        self.waiting: list[Request] = []  # complete requests behind the one being decided (a deque weighs 600 B)
        self.deadline = Deadline()
        self.served = 0  # requests answered

    @property
    def tls(self) -> ssl.SSLObject | None:
        """The OpenSSL session: None on the plain port, while the ClientHello is gathered, and once released."""
        return self.buffer.ssl if self.buffer is not None else None

    @property
    def handshaken(self) -> bool:
        """Past the TLS handshake (the plain port has none)."""
        return self.state not in (NEW, HANDSHAKING)

    @property
    def evictable(self) -> bool:
        """Never answered, and not deciding a request: at the cap, the oldest such connection makes room."""
        return not self.served and self.state in UNDECIDED

    # ------------------------------------------------------------------ the state machine

    def _on(self, event: Event) -> None:
        """Move on ``event`` as ``lifecycle.TRANSITIONS`` says: the state, its deadline and reading, then the action."""
        prior = self.state
        step = TRANSITIONS.get((prior, event))
        if step is None:
            return
        following, action = step
        self.state = following
        if following is not prior:
            self.deadline.set(self.front.deadlines.get(following), self._expired)
            if following in READING_PAUSED:
                if prior not in READING_PAUSED:
                    self.transport.pause_reading()
            elif prior in READING_PAUSED and following is not CLOSED:
                self.transport.resume_reading()
        if action is NONE:
            return
        if action is DISPATCH:
            self._dispatch()
        elif action is CLOSE:
            self._shut(prior)
        elif action is ANSWER_408_AND_CLOSE:
            self._emit_refusal(LATE)
            self._shut(prior)
        elif action is ABORT:
            self.transport.abort()
        elif action is RELEASE:
            self._release()

    def _expired(self) -> None:
        self.deadline.fired()
        self._on(DEADLINE)

    def _shut(self, prior: State) -> None:
        """Close the transport: our close_notify first if TLS is up, then whatever is queued for the wire."""
        if self.buffer is not None and prior is not HANDSHAKING:
            self.buffer.close_notify()
        self._flush()
        self.transport.close()
        self.front.connections.pop(self, None)

    def _release(self) -> None:
        self.deadline.stop()
        self.front.connections.pop(self, None)
        # The parser holds the reader's callbacks (a cycle through an object the collector cannot see into), and
        # the TLS state is tens of KB: let go of both now, not whenever a collection finds them.
        if self.reader is not None:
            self.reader.release()
            self.reader = None
        if self.buffer is not None:
            self.buffer.release()
        self.waiting.clear()

    # ------------------------------------------------------------------ asyncio's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        if not self.front.admit(self):
            self._on(TURNED_AWAY)
        elif self.buffer is None:  # the plain-HTTP operations port (probes, metrics)
            self._on(ACCEPTED_PLAIN)
        else:
            self._on(ACCEPTED_TLS)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on(LOST)

    def close_quietly(self) -> None:
        self._on(CUT)
        self.front.connections.pop(self, None)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state is CLOSED:
            return
        buffer = self.buffer
        if buffer is None:
            self._parse(data)
            return
        if state is HANDSHAKING:
            try:
                done = buffer.handshake(data)
            except HandshakeFailed as exc:
                self._flush()  # the alert that says why: protocol version, unknown CA, not TLS at all
                self._on(HANDSHAKE_FAILED)
                logs.event("handshake_failed", logging.DEBUG, remote=self.peer, error=str(exc))
                return
            self._flush()
            if not done:
                return
            self._on(HANDSHAKE_DONE)
            data = b""
        plain, ended = buffer.decrypt(data)
        self._flush()  # TLS 1.3 tickets and key updates
        if plain:
            self._parse(plain)
        if ended:
            self._on(PEER_DONE)

    def eof_received(self) -> bool | None:
        self._on(PEER_DONE)
        return True

    # ------------------------------------------------------------------ bytes in and out

    def _flush(self) -> None:
        if self.buffer is not None:
            outgoing = self.buffer.outgoing
            if outgoing.pending:
                self.transport.write(outgoing.read())

    def _send(self, data: bytes) -> None:
        if self.state is CLOSED:
            return
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        buffer = self.buffer
        if buffer is None:
            self.transport.write(data)
            return
        try:
            buffer.encrypt(data)
        except (ssl.SSLError, OSError):
            self._on(CUT)
            return
        self._flush()

    def _parse(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            return
        try:
            reader.feed(data)
        except Refusal as refusal:
            self._refuse(refusal)

    # ------------------------------------------------------------------ the reader's callbacks

    def _complete(self, request: Request) -> None:
        if self.state is CLOSED:
            return  # a pipelined request parsed after the close
        self.waiting.append(request)
        if len(self.waiting) > MAX_PIPELINED:
            raise Refusal(400, "too many pipelined requests")
        self._on(REQUEST_COMPLETE)

    # ------------------------------------------------------------------ answering

    def _dispatch(self) -> None:
        request = self.waiting.pop(0)
        front = self.front
        environ = dispatch.environ(request, front.server_port, front.scheme, self.peer)
        if len(request.body) <= self.limits.inline_body:
            # The common case (a pod is a few KiB): decided right here, no thread hop. Its cost is bounded
            # by its size, so the loop is held for about a millisecond at most.
            self._answer(request, dispatch.call_wsgi(front.app, environ))
        else:
            asyncio.get_running_loop().create_task(self._offload(request, environ))

    async def _offload(self, request: Request, environ: dict[str, Any]) -> None:
        """A large body is decided on the pool, so the loop goes on serving everybody else meanwhile."""
        front = self.front
        self._answer(request, await dispatch.decide_on_pool(front.app, front.pool, environ,
                                                            self.limits.handler_timeout))

    def _answer(self, request: Request, answer: dispatch.Answer) -> None:
        self.served += 1
        keep = request.keep_alive and not self.front.closing and self.state is DISPATCHED
        self._send(dispatch.encode(request.version, answer, keep))
        if not keep:
            self._on(ANSWERED_LAST)
        elif self.waiting:
            self._on(ANSWERED_NEXT_QUEUED)
        elif self.reader is not None and self.reader.partial is not None:
            self._on(ANSWERED_NEXT_BEGUN)
        else:
            self._on(ANSWERED)

    def _refuse(self, refusal: Refusal) -> None:
        """Answer a request the connection layer will not pass on, and close the connection."""
        if self.state is CLOSED:
            return
        self._emit_refusal(refusal)
        self._on(REFUSED)

    def _emit_refusal(self, refusal: Refusal) -> None:
        self.front.on_refusal(refusal.status, refusal.message, self.peer)
        self._emit(dispatch.encode_refusal(refusal))
