"""One connection's TLS over memory buffers: the ClientHello gathered whole, the handshake, records in and out.

No socket here: bytes from the wire go in, plaintext and bytes for the wire come out
(``SSLContext.wrap_bio``), so each connection takes the certificate loaded last when its ClientHello is whole, a
failed handshake still sends its alert (a TLS 1.1 client learns why it is refused), and the deadlines are the
connection's (``webhook.serving.lifecycle``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable


class HandshakeFailed(Exception):
    """The handshake cannot complete: a protocol version, an unknown CA, not TLS at all. The alert, if OpenSSL
    sends one, is in ``TLSBuffer.outgoing``."""


class TLSBuffer:
    """The server side of one TLS session, fed and drained by the connection that owns it."""

    __slots__ = ("context", "incoming", "outgoing", "ssl", "hello")

    def __init__(self, context: Callable[[], ssl.SSLContext]):
        self.context = context
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()  # what waits for the wire: handshake records, alerts, tickets, our records
        self.ssl: ssl.SSLObject | None = None  # None while the ClientHello is gathered
        self.hello = b""  # the ClientHello record as it trickles in, before OpenSSL sees any of it

    def handshake(self, data: bytes) -> bool:
        """Take ``data`` during the handshake: True once it is done (what follows it stays for :meth:`decrypt`),
        False while more is needed. Raises :class:`HandshakeFailed`."""
        if self.ssl is None:
            data = self._gather_hello(data)
            if self.ssl is None:
                return False
        self.incoming.write(data)
        try:
            self.ssl.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except (ssl.SSLError, OSError) as exc:
            raise HandshakeFailed(str(exc)) from exc
        return True

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
        self.ssl = self.context().wrap_bio(self.incoming, self.outgoing, server_side=True)
        data, self.hello = self.hello, b""
        return data

    def decrypt(self, data: bytes) -> tuple[bytes, bool]:
        """The plaintext ``data`` completes (with what the handshake left), and whether the peer is done: its
        close_notify, or a record that does not decrypt."""
        assert self.ssl is not None  # only after the handshake
        if data:
            self.incoming.write(data)
        chunks = []
        ended = False
        while True:
            try:
                chunk = self.ssl.read(65536)
            except ssl.SSLWantReadError:
                break
            except (ssl.SSLError, OSError):
                ended = True
                break
            if not chunk:
                ended = True
                break
            chunks.append(chunk)
        return b"".join(chunks) if len(chunks) > 1 else chunks[0] if chunks else b"", ended

    def encrypt(self, data: bytes) -> None:
        """Queue ``data`` as records in ``outgoing``. Raises ssl.SSLError or OSError when it cannot."""
        assert self.ssl is not None
        self.ssl.write(data)

    def close_notify(self) -> None:
        """Queue our close_notify (the peer's is not awaited); a session that cannot send one is closed anyway."""
        if self.ssl is None:
            return
        try:
            self.ssl.unwrap()
        except (ssl.SSLError, OSError):
            pass

    def release(self) -> None:
        """Let go of the OpenSSL state (tens of KB) now, not whenever a collection finds it."""
        self.ssl = None
