"""The server's TLS context: built once per certificate load, shared by every connection."""

from __future__ import annotations

import ssl


def server_context(cert_file: str, key_file: str, client_ca: str | None = None) -> ssl.SSLContext:
    """TLS 1.2+, HTTP/1.1 only (the apiserver speaks nothing else; no HTTP/2 rapid-reset surface)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    context.set_alpn_protocols(["http/1.1"])
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    return context
