"""Many slow clients at once, on one asyncio loop in a child process (threads could not hold thousands).

    python -m tests.hardening.swarm PORT CA_FILE KIND COUNT SECONDS

KIND is ``hello`` (a ClientHello trickled a byte a second), ``headers`` (TLS done, header lines trickled),
``body`` (complete headers, the body trickled) or ``idle`` (a finished handshake, then nothing). Each of the
COUNT attackers reconnects when the server cuts it, until SECONDS pass; then one JSON line on stdout:
{"kind", "opened", "cut", "failed", "open_at_end"}.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import ssl
import sys
import time


def client_hello(context: ssl.SSLContext) -> bytes:
    """The bytes of a real ClientHello, to trickle in one at a time."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def pieces(kind: str, hello: bytes):
    if kind == "hello":
        return (hello[i:i + 1] for i in range(len(hello)))
    if kind == "headers":
        lines = (f"X-Slow-{i}: x\r\n".encode() for i in itertools.count())
        return itertools.chain([b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\n"], lines)
    if kind == "body":
        head = (b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n{")
        return itertools.chain([head], itertools.repeat(b" "))
    return iter(())


class Stats:
    opened = cut = failed = open_now = 0


async def attacker(port: int, context: ssl.SSLContext, kind: str, until: float, stats: Stats, hello: bytes) -> None:
    while time.monotonic() < until:
        writer = None
        try:
            if kind == "hello":
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            else:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"), 30)
            stats.opened += 1
            stats.open_now += 1
            try:
                for piece in pieces(kind, hello):
                    if piece:
                        writer.write(piece)
                        await writer.drain()
                    try:
                        data = await asyncio.wait_for(reader.read(65536), 1.0)
                    except TimeoutError:
                        data = None
                    if data is not None:  # the server answered or closed: it cut us off
                        stats.cut += 1
                        break
                    if time.monotonic() >= until:
                        break
                else:
                    while time.monotonic() < until:  # idle: a handshake, then nothing
                        try:
                            data = await asyncio.wait_for(reader.read(65536), 1.0)
                        except TimeoutError:
                            continue
                        stats.cut += 1
                        break
            finally:
                stats.open_now -= 1
        except (OSError, TimeoutError, ssl.SSLError):
            stats.failed += 1
            await asyncio.sleep(0.5)
        finally:
            if writer is not None:
                writer.close()
        await asyncio.sleep(0.2)


async def main(port: int, ca: str, kind: str, count: int, seconds: float) -> dict:
    context = ssl.create_default_context(cafile=ca)
    hello = client_hello(context)
    until = time.monotonic() + seconds
    stats = Stats()
    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(attacker(port, context, kind, until, stats, hello)))
        await asyncio.sleep(0.001)  # spread the handshakes a little
    await asyncio.sleep(max(0.0, until - time.monotonic() - 1))
    open_at_end = stats.open_now
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"kind": kind, "opened": stats.opened, "cut": stats.cut, "failed": stats.failed,
            "open_at_end": open_at_end}


if __name__ == "__main__":
    port, ca, kind, count, seconds = sys.argv[1:6]
    print(json.dumps(asyncio.run(main(int(port), ca, kind, int(count), float(seconds)))), flush=True)
