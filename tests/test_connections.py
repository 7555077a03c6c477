"""The connection layer in process: a real loop (uvloop), real TLS clients, a stub WSGI app.

What is checked here is what the hardening tests cannot see from outside: that a closed connection leaves
nothing behind (the parser holds the connection's callbacks in a cycle the collector cannot see into, so a
connection used to live on with its TLS state: 50 KB each, RSS grew by 30 MB per round of 1,000 slow
clients), how connections are evicted at the cap, and that a ClientHello trickled a byte at a time still
completes once whole.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor

import pytest
import uvloop

from tests.server import make_certs
from webhook.serving.connections import Connection, Front, Limits
from webhook.serving.tls import server_context


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    paths = make_certs(tmp_path_factory.mktemp("tls"))
    return server_context(str(paths["cert"]), str(paths["key"])), ssl.create_default_context(cafile=str(paths["ca"]))


def run(coroutine_function, tls, limits: Limits):
    """Serve on a loopback port for the duration of ``coroutine_function(port, client_context, front)``."""
    server_tls, client_tls = tls

    async def main():
        front = Front(app, ThreadPoolExecutor(1), limits, 0, lambda: server_tls)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        server = await asyncio.get_running_loop().create_server(front.protocol, sock=sock)
        try:
            return await coroutine_function(sock.getsockname()[1], client_tls, front)
        finally:
            server.close()

    return uvloop.run(main())


async def request(port: int, context: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(2)  # the body, "ok"
    writer.close()
    await writer.wait_closed()
    return head


def living_connections() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Connection))


@pytest.mark.process
def test_closed_connections_are_freed(tls):
    """Answered, cut by the request deadline, closed by the client mid-request: none outlives its close."""

    async def scenario(port, context, front):
        for _ in range(20):
            assert (await request(port, context)).startswith(b"HTTP/1.1 200")
        for _ in range(10):  # cut with a 408 after the request deadline
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                           server_hostname="127.0.0.1")
            writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            assert (await reader.read()).startswith(b"HTTP/1.1 408")
            writer.close()
            await writer.wait_closed()
        for _ in range(10):  # the client leaves halfway through its headers
            _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
            writer.write(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        for _ in range(50):
            if not front.connections:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        return len(front.connections), living_connections()

    still_open, alive = run(scenario, tls, Limits(request_timeout=0.3, handshake_timeout=1))
    assert (still_open, alive) == (0, 0)


@pytest.mark.process
def test_at_the_cap_the_oldest_connection_without_a_request_is_evicted(tls):
    async def scenario(port, context, front):
        kept_reader, kept = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                          server_hostname="127.0.0.1")
        kept.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # has been served: never evicted
        await kept.drain()
        await kept_reader.readuntil(b"\r\n\r\n")
        await kept_reader.readexactly(2)
        idle = []
        for _ in range(3):  # handshaken, silent: the slow-client shape
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                          server_hostname="127.0.0.1")
            idle.append((reader, writer))
        for _ in range(100):  # until the server holds all four (the cap), at most 10 s
            if len(front.connections) >= 4:
                break
            await asyncio.sleep(0.1)
        evicted_before = front.evicted
        head = await request(port, context)  # a fifth connection at a cap of four
        first_closed = await asyncio.wait_for(idle[0][0].read(), 2)
        kept.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await kept.drain()
        kept_answer = await kept_reader.readuntil(b"\r\n\r\n")
        for _, writer in idle:
            writer.close()
        kept.close()
        return head, front.evicted - evicted_before, first_closed, kept_answer

    head, evicted, first_closed, kept_answer = run(scenario, tls, Limits(max_connections=4))
    assert head.startswith(b"HTTP/1.1 200")
    assert evicted >= 1 and first_closed == b""  # the oldest silent connection was closed
    assert kept_answer.startswith(b"HTTP/1.1 200")  # the one that had been served was kept


@pytest.mark.process
def test_a_client_hello_trickled_a_byte_at_a_time_completes_once_whole(tls):
    async def scenario(port, context, front):
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        with pytest.raises(ssl.SSLWantReadError):
            client.do_handshake()
        hello = outgoing.read()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(len(hello) - 1):
            writer.write(hello[i:i + 1])
            await writer.drain()
        await asyncio.sleep(0.2)
        gathering = [c.tls is None for c in front.connections]  # no OpenSSL state yet
        writer.write(hello[-1:])
        answer = await asyncio.wait_for(reader.read(65536), 2)  # the ServerHello
        started = [c.tls is not None for c in front.connections]
        writer.close()
        return gathering, started, answer[:1]

    gathering, started, first = run(scenario, tls, Limits())
    assert gathering == [True] and started == [True]
    assert first == b"\x16"  # answered with a handshake record


def test_a_drain_lets_a_connection_mid_handshake_finish_and_closes_one_that_never_does():
    """A connection accepted just before the listener closed was failing its client's one try (SSLEOFError under
    load in the worker-respawn test): now it may finish its handshake; a client that never does is still cut."""
    from webhook.serving import connections as conn_mod

    class Fake:
        def __init__(self, front, finishes_after):
            self.front, self.finishes_after, self.handshaken, self.closed = front, finishes_after, False, False

        def close_quietly(self):
            self.closed = True
            self.front.connections.discard(self)

    async def scenario():
        front = object.__new__(conn_mod.Front)
        front.connections = set()
        arriving, stuck = Fake(front, 0.2), Fake(front, None)
        front.connections.update({arriving, stuck})

        async def finish():
            await asyncio.sleep(arriving.finishes_after)
            arriving.handshaken = True
            await asyncio.sleep(0.1)  # its request answered with Connection: close
            front.connections.discard(arriving)

        task = asyncio.create_task(finish())
        cut = await front.drain(5.0)
        await task
        return arriving.closed, stuck.closed, cut

    arriving_closed, stuck_closed, cut = asyncio.run(scenario())
    assert not arriving_closed and stuck_closed and cut == 0
