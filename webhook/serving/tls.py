"""The server's TLS context: built once per certificate load, shared by every connection."""

from __future__ import annotations

import ssl
from pathlib import Path


class TLSFileError(ValueError):
    """A certificate, key or CA file that cannot serve; the message names the file and what is wrong."""


def _read(option: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TLSFileError(f"{option} {path}: no such file") from None
    except OSError as exc:
        raise TLSFileError(f"{option} {path}: cannot read: {exc.strerror or exc}") from None


def _looks_like(data: bytes) -> str:
    if b"PRIVATE KEY-----" in data:
        return " (it holds a private key)"
    if b"CERTIFICATE-----" in data:
        return " (it holds a certificate)"
    return ""


def check_files(cert_file: str, key_file: str, client_ca: str | None = None) -> None:
    """Refuse, naming the file, what OpenSSL would refuse with a bare ``[SSL] PEM lib``."""
    check_pair(cert_file, key_file)
    if client_ca:
        check_ca(client_ca)


def check_pair(cert_file: str, key_file: str) -> None:
    # Imported here: cryptography costs a worker about 8 MB, and the happy path never needs it.
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_data = _read("--cert-file", cert_file)
    key_data = _read("--key-file", key_file)
    try:
        chain = x509.load_pem_x509_certificates(cert_data)
    except ValueError:
        raise TLSFileError(f"--cert-file {cert_file} is not a PEM certificate{_looks_like(cert_data)}") from None
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError):
        raise TLSFileError(
            f"--key-file {key_file} is not an unencrypted PEM private key{_looks_like(key_data)}"
        ) from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != chain[0].public_key().public_bytes(
        serialization.Encoding.DER, public
    ):
        raise TLSFileError(f"--key-file {key_file} does not belong to the certificate in --cert-file {cert_file}")


def check_ca(client_ca: str) -> None:
    from cryptography import x509

    ca_data = _read("--client-ca", client_ca)
    try:
        x509.load_pem_x509_certificates(ca_data)
    except ValueError:
        raise TLSFileError(f"--client-ca {client_ca} holds no PEM certificate{_looks_like(ca_data)}") from None


def server_context(cert_file: str, key_file: str, client_ca: str | None = None) -> ssl.SSLContext:
    """TLS 1.2+, HTTP/1.1 only (the apiserver speaks nothing else; no HTTP/2 rapid-reset surface).

    When OpenSSL refuses the files, :func:`check_files` says which file and why instead of ``PEM lib``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(certfile=cert_file, keyfile=key_file)
        if client_ca:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=client_ca)
    except (ssl.SSLError, OSError):
        check_files(cert_file, key_file, client_ca)
        raise
    return context
