"""A connection's state machine, as a spec: in state S, event E leads to state S' with action A.

The first table is ``webhook.serving.lifecycle.TRANSITIONS`` written out by hand, so a change to the machine is a
change to this spec. The second drives a real ``Connection`` through each row that a client can cause (bytes, an
EOF, a deadline, a slow decision, a drain) over a recording transport on a real loop, and checks what it did: the
state it is in, what went on the wire, which deadline runs, whether reading is paused, whether it closed.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from webhook.serving import certs, lifecycle
from webhook.serving.connections import Connection, Front, Limits
from webhook.serving.lifecycle import Action, Event, State
from webhook.serving.tls import server_context

S, E, A = State, Event, Action
LIVE = (S.HANDSHAKING, S.IDLE, S.READING, S.DISPATCHED, S.LAST_ANSWER)

# state, event -> next state, action
SPEC: list[tuple[State, Event, State, Action]] = [
    (S.NEW, E.ACCEPTED_TLS, S.HANDSHAKING, A.NONE),
    (S.NEW, E.ACCEPTED_PLAIN, S.IDLE, A.NONE),
    (S.NEW, E.TURNED_AWAY, S.CLOSED, A.ABORT),
    (S.HANDSHAKING, E.HANDSHAKE_DONE, S.IDLE, A.NONE),
    (S.HANDSHAKING, E.HANDSHAKE_FAILED, S.CLOSED, A.CLOSE),
    (S.HANDSHAKING, E.PEER_DONE, S.CLOSED, A.CLOSE),
    (S.HANDSHAKING, E.DEADLINE, S.CLOSED, A.CLOSE),
    (S.IDLE, E.REQUEST_BEGUN, S.READING, A.NONE),
    (S.IDLE, E.PEER_DONE, S.CLOSED, A.CLOSE),
    (S.IDLE, E.DEADLINE, S.CLOSED, A.CLOSE),
    (S.READING, E.REQUEST_COMPLETE, S.DISPATCHED, A.DISPATCH),
    (S.READING, E.PEER_DONE, S.CLOSED, A.CLOSE),
    (S.READING, E.DEADLINE, S.CLOSED, A.ANSWER_408_AND_CLOSE),
    (S.DISPATCHED, E.REQUEST_BEGUN, S.DISPATCHED, A.NONE),
    (S.DISPATCHED, E.REQUEST_COMPLETE, S.DISPATCHED, A.NONE),
    (S.DISPATCHED, E.ANSWERED, S.IDLE, A.NONE),
    (S.DISPATCHED, E.ANSWERED_NEXT_BEGUN, S.READING, A.NONE),
    (S.DISPATCHED, E.ANSWERED_NEXT_QUEUED, S.DISPATCHED, A.DISPATCH),
    (S.DISPATCHED, E.ANSWERED_LAST, S.CLOSED, A.CLOSE),
    (S.DISPATCHED, E.PEER_DONE, S.LAST_ANSWER, A.NONE),
    (S.LAST_ANSWER, E.ANSWERED_LAST, S.CLOSED, A.CLOSE),
    *[(state, E.REFUSED, S.CLOSED, A.CLOSE) for state in LIVE],
    *[(state, E.CUT, S.CLOSED, A.CLOSE) for state in LIVE],
    *[(state, E.LOST, S.CLOSED, A.RELEASE) for state in State],
]


def test_the_transition_table_is_the_spec():
    assert {(s, e): (n, a) for s, e, n, a in SPEC} == lifecycle.TRANSITIONS
    assert len(SPEC) == len(lifecycle.TRANSITIONS)  # no row written twice


def test_the_plain_names_are_the_members_of_the_same_name():
    for member in (*State, *Event, *Action):
        assert getattr(lifecycle, member.name) is member


def test_a_deadline_runs_exactly_in_handshaking_idle_and_reading():
    assert lifecycle.DEADLINES == {S.HANDSHAKING: "handshake_timeout", S.IDLE: "idle_timeout",
                                   S.READING: "request_timeout"}
    assert all(hasattr(Limits(), field) for field in lifecycle.DEADLINES.values())
    # A state with a deadline has a row for it; the others have none (their timer never runs).
    for state in State:
        assert (lifecycle.step(state, E.DEADLINE) is not None) == (state in lifecycle.DEADLINES)


def test_nothing_moves_a_closed_connection_but_its_release():
    assert [e for e in Event if lifecycle.step(S.CLOSED, e) is not None] == [E.LOST]


# ---------------------------------------------------------------------------------------------- behaviour


class Wire:
    """A transport that records: what was written, reading paused or not, closed, aborted."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.paused = False
        self.closed = False
        self.aborted = False

    def get_extra_info(self, name: str) -> Any:
        return ("10.0.0.1", 40000) if name == "peername" else None

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True


@pytest.fixture(scope="module")
def server_tls(tmp_path_factory) -> ssl.SSLContext:
    paths = certs.write(certs.generate(["127.0.0.1"]), tmp_path_factory.mktemp("tls"))
    return server_context(str(paths["cert"]), str(paths["key"]))


class Answered:
    evictable = False


# Each deadline its own length, so the one running can be told from the time it has left.
LIMITS = Limits(handshake_timeout=0.1, request_timeout=0.2, idle_timeout=0.3, inline_body=10, max_connections=4)


class Client:
    """One connection under test, and what the client side can do to it."""

    def __init__(self, tls: ssl.SSLContext | None, limits: Limits) -> None:
        self.gate = threading.Event()  # a slow decision holds until the test opens it
        self.tls = tls
        self.front = Front(self.app, ThreadPoolExecutor(1), limits, 8443, (lambda: tls) if tls else None)
        self.wire = Wire()
        self.connection = Connection(self.front)

    def app(self, environ, start_response):
        if environ["PATH_INFO"] == "/slow":
            assert self.gate.wait(5)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [environ["PATH_INFO"].encode()]

    async def do(self, step: str) -> None:
        c = self.connection
        if step == "accept":
            c.connection_made(self.wire)
        elif step == "accept at the cap":  # every other connection has been answered: none to evict
            self.front.connections.update({Answered(): None for _ in range(self.front.limits.max_connections)})
            c.connection_made(self.wire)
        elif step == "not TLS":
            c.data_received(b"GET / HTTP/1.1\r\n\r\n")
        elif step == "handshake":
            client = ssl.create_default_context()
            client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            session = client.wrap_bio(incoming, outgoing)
            for _ in range(4):
                try:
                    session.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                c.data_received(outgoing.read())
                incoming.write(bytes(self.wire.written))
                self.wire.written.clear()  # the server's flight, then its tickets
                if done:
                    break
        elif step == "a TLS 1.1 hello":
            client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
            client.set_ciphers("DEFAULT:@SECLEVEL=0")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                client.minimum_version, client.maximum_version = ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1
            outgoing = ssl.MemoryBIO()
            with pytest.raises(ssl.SSLWantReadError):
                client.wrap_bio(ssl.MemoryBIO(), outgoing).do_handshake()
            c.data_received(outgoing.read())
        elif step == "eof":
            c.eof_received()
        elif step == "deadline":
            assert c.deadline.handle is not None, "no deadline runs"
            await asyncio.sleep(LIMITS.idle_timeout + 0.1)  # the longest deadline of these tests
        elif step == "answer the slow one":
            self.gate.set()
            for _ in range(100):
                if c.state not in (S.DISPATCHED, S.LAST_ANSWER):
                    break
                await asyncio.sleep(0.01)
        elif step == "drain":
            self.front.closing = True
        elif step == "lost":
            c.connection_lost(None)
        else:  # bytes of a request
            c.data_received(REQUESTS[step])


REQUESTS = {
    "half a request": b"GET /one HTTP/1.1\r\nHost: x\r\n",
    "the rest of it": b"\r\n",
    "a request": b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n",
    "a request saying close": b"GET /one HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    "a slow request": b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + b"x" * 20,
    "a header over the cap": b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
    "a body over the cap": b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
    "garbage": b"\x00\x01 nonsense\r\n\r\n",
}
HANDSHAKING = ("tls", "accept")
IDLE = ("accept",)
READING = ("accept", "half a request")
DISPATCHED = ("accept", "a slow request")

# given (how the connection got into its state), when (the event, as a client causes it), then: the state, what the
# wire got since ``when`` began (a prefix, or b"" for nothing), the deadline running, reading paused, closed.
ROWS = [
    ("plain port, accepted", (), IDLE, S.IDLE, b"", "idle_timeout", False, False),
    ("TLS port, accepted", ("tls",), ("accept",), S.HANDSHAKING, b"", "handshake_timeout", False, False),
    ("turned away at the cap", ("tls",), ("accept at the cap",), S.CLOSED, b"", None, False, True),
    ("handshake done", HANDSHAKING, ("handshake",), S.IDLE, b"", "idle_timeout", False, False),
    ("handshake failed: not TLS at all", HANDSHAKING, ("not TLS",), S.CLOSED, b"", None, False, True),
    ("handshake failed: the alert says why", HANDSHAKING, ("a TLS 1.1 hello",), S.CLOSED, b"\x15\x03\x02\x00\x02\x02F",
     None, False, True),
    ("handshake too slow", HANDSHAKING, ("deadline",), S.CLOSED, b"", None, False, True),
    ("peer gone mid-handshake", HANDSHAKING, ("eof",), S.CLOSED, b"", None, False, True),
    ("a request begins", IDLE, ("half a request",), S.READING, b"", "request_timeout", False, False),
    ("idle too long", IDLE, ("deadline",), S.CLOSED, b"", None, False, True),
    ("peer gone while idle", IDLE, ("eof",), S.CLOSED, b"", None, False, True),
    ("garbage", IDLE, ("garbage",), S.CLOSED, b"HTTP/1.1 400 ", None, False, True),
    ("a request completes, decided on the loop", READING, ("the rest of it",), S.IDLE,
     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\n/one",
     "idle_timeout", False, False),
    ("request too slow", READING, ("deadline",), S.CLOSED, b"HTTP/1.1 408 ", None, False, True),
    ("peer gone mid-request", READING, ("eof",), S.CLOSED, b"", None, False, True),
    ("headers over the cap", IDLE, ("a header over the cap",), S.CLOSED, b"HTTP/1.1 431 ", None, False, True),
    ("body over the cap", IDLE, ("a body over the cap",), S.CLOSED, b"HTTP/1.1 413 ", None, False, True),
    ("a large body goes to the pool", IDLE, ("a slow request",), S.DISPATCHED, b"", None, True, False),
    ("the next request begins meanwhile: no deadline yet", DISPATCHED, ("half a request",), S.DISPATCHED, b"", None,
     True, False),
    ("answered, the next begun: its deadline starts", (*DISPATCHED, "half a request"), ("answer the slow one",),
     S.READING, b"HTTP/1.1 200 ", "request_timeout", False, False),
    ("answered, the next complete: decided at once", (*DISPATCHED, "a request"), ("answer the slow one",), S.IDLE,
     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n/slow"
     b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nConnection: keep-alive\r\n\r\n/one",
     "idle_timeout", False, False),
    ("answered, kept alive", DISPATCHED, ("answer the slow one",), S.IDLE, b"HTTP/1.1 200 ", "idle_timeout", False,
     False),
    ("the client asked to close", IDLE, ("a request saying close",), S.CLOSED, b"HTTP/1.1 200 ", None, True, True),
    ("draining: the answer says close", DISPATCHED, ("drain", "answer the slow one"), S.CLOSED, b"HTTP/1.1 200 ",
     None, True, True),
    ("peer done while deciding", DISPATCHED, ("eof",), S.LAST_ANSWER, b"", None, True, False),
    ("its answer is the last", (*DISPATCHED, "eof"), ("answer the slow one",), S.CLOSED, b"HTTP/1.1 200 ", None,
     True, True),
    ("a deadline cannot cut a decision", DISPATCHED, (), S.DISPATCHED, b"", None, True, False),
]


@pytest.mark.parametrize(("given", "when", "state", "wire", "deadline", "paused", "closed"),
                         [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_what_a_connection_does(server_tls, given, when, state, wire, deadline, paused, closed):
    async def scenario():
        client = Client(server_tls if "tls" in given + when else None, LIMITS)
        for step in given:
            if step != "tls":
                await client.do(step)
        client.wire.written.clear()
        for step in when:
            if step != "tls":
                await client.do(step)
        c = client.connection
        running = None
        if c.deadline.handle is not None:
            left = c.deadline.handle.when() - asyncio.get_running_loop().time()
            running = min((f for f in lifecycle.DEADLINES.values() if getattr(LIMITS, f) >= left),
                          key=lambda f: getattr(LIMITS, f))
            assert getattr(LIMITS, running) - left < 0.05  # started on entering the state, not before
        seen = (c.state, bytes(client.wire.written[:len(wire)]) if wire else bytes(client.wire.written), running,
                client.wire.paused, client.wire.closed)
        c.connection_lost(None)
        client.gate.set()
        client.front.pool.shutdown(wait=True)
        return seen, client

    seen, client = asyncio.run(scenario())
    assert seen == (state, wire, deadline, paused, closed)
    assert client.connection.state is S.CLOSED and client.connection.reader is None and client.connection.tls is None
    assert client.connection not in client.front.connections


def test_every_transition_a_client_can_cause_has_a_behaviour_row():
    """The rows above walk the machine: all of it but the events only the worker causes (a failed write is a CUT,
    like an eviction; LOST ends every row)."""
    caused = {
        (S.NEW, E.ACCEPTED_TLS), (S.NEW, E.ACCEPTED_PLAIN), (S.NEW, E.TURNED_AWAY),
        (S.HANDSHAKING, E.HANDSHAKE_DONE), (S.HANDSHAKING, E.HANDSHAKE_FAILED), (S.HANDSHAKING, E.PEER_DONE),
        (S.HANDSHAKING, E.DEADLINE), (S.IDLE, E.REQUEST_BEGUN), (S.IDLE, E.PEER_DONE), (S.IDLE, E.DEADLINE),
        (S.READING, E.REQUEST_COMPLETE), (S.READING, E.PEER_DONE), (S.READING, E.DEADLINE),
        (S.DISPATCHED, E.REQUEST_BEGUN), (S.DISPATCHED, E.REQUEST_COMPLETE), (S.DISPATCHED, E.ANSWERED),
        (S.DISPATCHED, E.ANSWERED_NEXT_BEGUN), (S.DISPATCHED, E.ANSWERED_NEXT_QUEUED), (S.DISPATCHED, E.ANSWERED_LAST),
        (S.DISPATCHED, E.PEER_DONE), (S.LAST_ANSWER, E.ANSWERED_LAST),
        (S.IDLE, E.REFUSED), (S.READING, E.REFUSED),
    }
    assert caused <= set(lifecycle.TRANSITIONS)
    assert {(s, e) for s, e in lifecycle.TRANSITIONS if e not in (E.REFUSED, E.CUT, E.LOST)} <= caused
