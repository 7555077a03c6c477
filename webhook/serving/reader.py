"""Reading HTTP/1.1 requests off one connection with httptools: complete requests out, the header and body caps.

A :class:`RequestReader` turns bytes into :class:`Request` objects, one per request, and refuses what it will not
read (:class:`Refusal`: 400 for what does not parse, 431 for headers over the caps, 413 for a body over the cap).
It knows nothing of TLS, deadlines or the application: it tells its connection when a request begins and when it
is complete. HTTP parsing is httptools (llhttp, the parser of Node.js).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools


class Refusal(Exception):
    """A request answered by the connection layer itself (400, 408, 413, 431), then the connection closes."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    target: bytes
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool
    version: str


class _Partial:
    """A request being read: what its callbacks have delivered so far."""

    __slots__ = ("url", "headers", "header_bytes", "body", "body_size")

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.header_bytes = 0
        self.body = io.BytesIO()
        self.body_size = 0


class RequestReader:
    """httptools' callbacks for one connection: each complete request goes to ``complete``, in order.

    ``begun`` is called at a request's first byte, ``complete`` with the whole request, ``send`` with an interim
    ``100 Continue``. All three may raise :class:`Refusal`, which :meth:`feed` passes on.
    """

    __slots__ = ("max_body", "max_header_bytes", "max_header_field", "max_headers", "begun", "complete", "send",
                 "parser", "partial")

    def __init__(self, caps: Any, begun: Callable[[], None], complete: Callable[[Request], None],
                 send: Callable[[bytes], None]):
        self.max_body: int = caps.max_body
        self.max_header_bytes: int = caps.max_header_bytes
        self.max_header_field: int = caps.max_header_field
        self.max_headers: int = caps.max_headers
        self.begun = begun
        self.complete = complete
        self.send = send
        self.parser: Any = httptools.HttpRequestParser(self)
        self.partial: _Partial | None = None  # the request being read, if one has begun

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises :class:`Refusal` for a request that is not to be read further."""
        try:
            self.parser.feed_data(data)
        except Refusal:
            raise
        except httptools.HttpParserCallbackError as exc:
            # httptools wraps what a callback raised; ours raise only refusals.
            cause = exc.__context__
            raise cause if isinstance(cause, Refusal) else Refusal(400, "malformed HTTP request") from None
        except httptools.HttpParserUpgrade:
            raise Refusal(400, "protocol upgrades are not served") from None
        except httptools.HttpParserError as exc:
            raise Refusal(400, f"malformed HTTP request: {exc}") from None

    def release(self) -> None:
        """Break the cycle through the parser, which holds our callbacks where the collector cannot see."""
        self.parser = None
        self.partial = None
        self.begun = self.complete = self.send = _dropped  # type: ignore[assignment]

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self.partial = _Partial()
        self.begun()

    def on_url(self, url: bytes) -> None:
        partial = self.partial
        assert partial is not None
        partial.url += url
        self._count(partial, len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        partial = self.partial
        assert partial is not None
        if len(name) + len(value) + 2 > self.max_header_field:
            raise Refusal(431, f"a request header line over {self.max_header_field} bytes")
        self._count(partial, len(name) + len(value) + 4)
        if len(partial.headers) >= self.max_headers:
            raise Refusal(431, f"more than {self.max_headers} request headers")
        partial.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def _count(self, partial: _Partial, n: int) -> None:
        partial.header_bytes += n
        if partial.header_bytes > self.max_header_bytes:
            raise Refusal(431, f"request line and headers over {self.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        assert self.partial is not None
        length = None
        expect = False
        for name, value in self.partial.headers:
            lowered = name.lower()
            if lowered == "content-length":
                length = int(value) if value.strip().isdigit() else None
            elif lowered == "expect" and value.lower() == "100-continue":
                expect = True
        if length is not None and length > self.max_body:
            raise Refusal(413, f"the body is over {self.max_body} bytes")
        if expect:
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        partial = self.partial
        assert partial is not None
        partial.body_size += len(body)
        if partial.body_size > self.max_body:  # chunked: no length to refuse up front
            raise Refusal(413, f"the body is over {self.max_body} bytes")
        partial.body.write(body)

    def on_message_complete(self) -> None:
        partial = self.partial
        assert partial is not None
        parser = self.parser
        request = Request(
            method=parser.get_method().decode("latin-1"),
            target=partial.url,
            headers=partial.headers,
            body=partial.body.getvalue(),
            keep_alive=bool(parser.should_keep_alive()),
            version=parser.get_http_version(),
        )
        self.partial = None
        self.complete(request)


def _dropped(*args: Any) -> None:
    """What a released reader's callbacks become: a parser still mid-feed reports into nothing."""
