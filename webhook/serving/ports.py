"""Whether an address can be listened on, asked before the server starts."""

from __future__ import annotations

import errno
import socket


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, in one line, or None (checked before the master starts,
    which would otherwise retry for seconds and log a hint pointing at whatever holds the port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{host}:{port} is already in use"
            if exc.errno == errno.EACCES:
                return f"{host}:{port}: permission denied (ports below 1024 need privileges)"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"{host} is not an address of this machine"
            return f"{host}:{port}: {exc.strerror or exc}"
    return None
