"""A connection's lifecycle: its states, the events that move it, the action each move asks for, each state's deadline.

Everything that decides where a connection goes next is here, and nothing else: no socket, no TLS, no parser
(the shape of h11's state machine, which does no I/O either). ``webhook.serving.connections`` reports what
happened as an :class:`Event`, gets the next :class:`State` and an :class:`Action` from :data:`TRANSITIONS`, and
does the I/O. A timer means what the state it was started in says (:data:`DEADLINES`): it is started on entering
a state with a deadline and stopped on leaving it, never restarted by a trickle of bytes.

Requests on one connection are answered in order, one at a time; while one is decided, reading stops
(:data:`READING_PAUSED`), so the next request of a pipelining client is read only as far as the bytes already
received.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable


class State(enum.Enum):
    __hash__ = object.__hash__  # members are singletons: hashed by identity, in C (Enum's hashes its name in Python)

    NEW = "new"  # created by the listener, not yet admitted
    HANDSHAKING = "handshaking"  # TLS: gathering the ClientHello, then the handshake
    IDLE = "idle"  # waiting for a request: a new connection, or a kept-alive one between requests
    READING = "reading"  # a request has begun and is not complete yet
    DISPATCHED = "dispatched"  # a complete request is being decided; reading is paused
    LAST_ANSWER = "last answer"  # as DISPATCHED, but the peer is done sending: its answer says close, then we do
    CLOSED = "closed"


class Event(enum.Enum):
    __hash__ = object.__hash__

    ACCEPTED_TLS = "accepted on the TLS port"
    ACCEPTED_PLAIN = "accepted on the plain-HTTP port"
    TURNED_AWAY = "turned away at the connection cap or while draining"
    HANDSHAKE_DONE = "handshake done"
    HANDSHAKE_FAILED = "handshake failed"
    REQUEST_BEGUN = "a request's first byte parsed"
    REQUEST_COMPLETE = "a request's last byte parsed"
    ANSWERED = "answered, kept alive, nothing more read"
    ANSWERED_NEXT_BEGUN = "answered, kept alive, the next request begun"
    ANSWERED_NEXT_QUEUED = "answered, kept alive, the next request complete"
    ANSWERED_LAST = "answered with Connection: close"
    PEER_DONE = "the peer is done sending (EOF or close_notify)"
    DEADLINE = "the state's deadline passed"
    REFUSED = "answered by the connection layer itself (400, 413, 431)"
    CUT = "closed by us: evicted, drained, a failed write"
    LOST = "the transport is gone"


class Action(enum.Enum):
    NONE = "none"
    ABORT = "abort the transport"
    DISPATCH = "decide the first complete request waiting"
    CLOSE = "close: our close_notify if TLS is up, then the transport"
    ANSWER_408_AND_CLOSE = "answer 408, then close"
    RELEASE = "let go of the parser and the TLS state"


# The members by plain name, for the code that runs on every request: on Python 3.11 (the image's) ``State.CLOSED``
# is a descriptor call, several times the cost of a module global. In definition order (tests check each name).
NEW, HANDSHAKING, IDLE, READING, DISPATCHED, LAST_ANSWER, CLOSED = State
(ACCEPTED_TLS, ACCEPTED_PLAIN, TURNED_AWAY, HANDSHAKE_DONE, HANDSHAKE_FAILED, REQUEST_BEGUN, REQUEST_COMPLETE, ANSWERED,
 ANSWERED_NEXT_BEGUN, ANSWERED_NEXT_QUEUED, ANSWERED_LAST, PEER_DONE, DEADLINE, REFUSED, CUT, LOST) = Event
NONE, ABORT, DISPATCH, CLOSE, ANSWER_408_AND_CLOSE, RELEASE = Action

# What each event does in each state: (next state, action). A pair not listed leaves the state as it is and does
# nothing: a timer cannot fire while a request is decided (there is none), and whatever a parser still reports
# after the close, or a decision still finishing, is of no consequence.
TRANSITIONS: dict[tuple[State, Event], tuple[State, Action]] = {
    (NEW, ACCEPTED_TLS): (HANDSHAKING, NONE),
    (NEW, ACCEPTED_PLAIN): (IDLE, NONE),
    (NEW, TURNED_AWAY): (CLOSED, ABORT),

    (HANDSHAKING, HANDSHAKE_DONE): (IDLE, NONE),
    (HANDSHAKING, HANDSHAKE_FAILED): (CLOSED, CLOSE),  # the alert that says why is sent first
    (HANDSHAKING, PEER_DONE): (CLOSED, CLOSE),
    (HANDSHAKING, DEADLINE): (CLOSED, CLOSE),

    (IDLE, REQUEST_BEGUN): (READING, NONE),
    (IDLE, PEER_DONE): (CLOSED, CLOSE),
    (IDLE, DEADLINE): (CLOSED, CLOSE),  # idle for longer than any client keeps a connection

    (READING, REQUEST_COMPLETE): (DISPATCHED, DISPATCH),
    (READING, PEER_DONE): (CLOSED, CLOSE),
    (READING, DEADLINE): (CLOSED, ANSWER_408_AND_CLOSE),

    # The next request is read while this one is decided, as far as the bytes already received go. It waits its
    # turn; its own deadline starts when it becomes the one being read (ANSWERED_NEXT_BEGUN).
    (DISPATCHED, REQUEST_BEGUN): (DISPATCHED, NONE),
    (DISPATCHED, REQUEST_COMPLETE): (DISPATCHED, NONE),
    (DISPATCHED, ANSWERED): (IDLE, NONE),
    (DISPATCHED, ANSWERED_NEXT_BEGUN): (READING, NONE),
    (DISPATCHED, ANSWERED_NEXT_QUEUED): (DISPATCHED, DISPATCH),
    (DISPATCHED, ANSWERED_LAST): (CLOSED, CLOSE),
    (DISPATCHED, PEER_DONE): (LAST_ANSWER, NONE),

    (LAST_ANSWER, ANSWERED_LAST): (CLOSED, CLOSE),
}
for _state in (HANDSHAKING, IDLE, READING, DISPATCHED, LAST_ANSWER):
    TRANSITIONS[(_state, REFUSED)] = (CLOSED, CLOSE)  # the refusal is written before the event
    TRANSITIONS[(_state, CUT)] = (CLOSED, CLOSE)
for _state in State:
    TRANSITIONS[(_state, LOST)] = (CLOSED, RELEASE)
del _state

# The states with a deadline, by the ``Limits`` field that gives it. DEADLINE in HANDSHAKING and IDLE closes,
# in READING answers 408 (TRANSITIONS).
DEADLINES: dict[State, str] = {
    HANDSHAKING: "handshake_timeout",  # from accept (the apiserver gives up on its own after 10 s)
    IDLE: "idle_timeout",  # between requests: longer than the apiserver's 90 s
    READING: "request_timeout",  # from a request's first byte to the end of its body
}

# The states in which the transport is not read: one request is decided at a time.
READING_PAUSED = frozenset({DISPATCHED, LAST_ANSWER})

# The states of a connection that has not sent a request to decide yet, or is reading one: at the connection
# cap, the oldest of these that has never been answered is evicted.
UNDECIDED = frozenset({HANDSHAKING, IDLE, READING})


def step(state: State, event: Event) -> tuple[State, Action] | None:
    """Where ``event`` takes a connection in ``state``, and what to do on the way; None when it changes nothing."""
    return TRANSITIONS.get((state, event))


class Deadline:
    """One timer on the running loop: set for a state with a deadline, stopped when the state is left."""

    __slots__ = ("handle",)

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle | None = None

    def set(self, seconds: float | None, expired: Callable[[], None]) -> None:
        """Stop the timer running, if any, and start one of ``seconds`` (None: none); ``expired`` calls
        :meth:`fired` first."""
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if seconds is not None:
            self.handle = asyncio.get_running_loop().call_later(seconds, expired)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def fired(self) -> None:
        self.handle = None
