"""A CA and a serving certificate for the webhook, as the apiserver verifies them.

The apiserver checks the SANs, never the CN, so every name it may dial is a SAN:
``svc``, ``svc.ns``, ``svc.ns.svc``, ``svc.ns.svc.cluster.local`` and any extra host.
ECDSA P-256 keys keep handshakes cheap.

Names are checked before anything is generated: DNS names as RFC 1123 host names (a wildcard only as
the whole leftmost label), Unicode names IDNA-encoded with the ``idna`` package (IDNA 2008 with UTS 46,
as browsers and Go's resolver do; Python's own ``idna`` codec is IDNA 2003 and turns ``ß`` into ``ss``,
a different name).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

import idna
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Bundle:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


FILES = {"ca": "ca.crt", "cert": "tls.crt", "key": "tls.key"}
LAST_DAY = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)  # the last date X.509 can hold

_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")  # RFC 1123, lower-cased
_DNS_1035_LABEL = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")  # Kubernetes Service names


class CertsError(ValueError):
    """A name, a validity or an output directory ``certs`` cannot use; the message is one line."""


def _label_problem(label: str) -> str | None:
    if not label:
        return "an empty label"
    if len(label) > 63:
        return f"label {label[:20]!r}… is longer than 63 characters"
    if not _LABEL.fullmatch(label):
        return f"label {label!r} is not letters, digits and inner '-'"
    if label.startswith("xn--"):
        try:
            idna.decode(label)
        except idna.IDNAError:
            return f"label {label!r} is not a valid IDNA A-label"
    return None


def dns_name(host: str) -> str:
    """``host`` as a DNS SAN: IDNA-encoded, lower case, every label RFC 1123; ``*.`` only in front."""
    wildcard = host.startswith("*.")
    rest = host[2:] if wildcard else host
    if "*" in rest:
        raise CertsError(f"{host!r} is not a valid DNS name: a wildcard '*' may only be the whole leftmost label")
    if not rest.isascii():
        try:
            rest = idna.encode(rest, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise CertsError(f"{host!r} is not a valid internationalized domain name: {exc}") from None
    rest = rest.lower()
    labels = rest.split(".")
    for label in labels:
        problem = _label_problem(label)
        if problem:
            raise CertsError(f"{host!r} is not a valid DNS name or IP address: {problem}")
    if labels[-1].isdigit():
        raise CertsError(f"{host!r} is not a valid IP address, nor a DNS name (its last label is a number)")
    name = f"*.{rest}" if wildcard else rest
    if len(name) > 253:
        raise CertsError(f"{host[:20]!r}… is longer than 253 characters")
    return name


def san_host(host: str) -> str:
    """A ``--host``: an IP address as written, else a DNS name checked by :func:`dns_name`."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return dns_name(host)


def service_names(service: str, namespace: str) -> list[str]:
    """The four names the apiserver may dial for a Service; both parts must be valid Kubernetes names."""
    if not _DNS_1035_LABEL.fullmatch(service):
        raise CertsError(
            f"--service {service!r} is not a valid Service name (at most 63 lower-case letters, digits and "
            "inner '-', starting with a letter)"
        )
    if not _LABEL.fullmatch(namespace):
        raise CertsError(
            f"--namespace {namespace!r} is not a valid namespace (at most 63 lower-case letters, digits and inner '-')"
        )
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def validity(days: int, now: datetime.datetime) -> tuple[datetime.datetime, datetime.datetime]:
    """(not before, not after) for ``days`` of validity from ``now``."""
    if days < 1:
        raise CertsError(f"--days {days}: must be at least 1")
    if days > (LAST_DAY - now).days:
        raise CertsError(
            f"--days {days}: the certificate would end after {LAST_DAY:%Y-%m-%d}, the last date it can hold"
        )
    not_before = now - datetime.timedelta(minutes=5)  # tolerate small clock skew between nodes
    return not_before, now + datetime.timedelta(days=days)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(**enabled: bool) -> x509.KeyUsage:
    """A KeyUsage with only the named uses set (cryptography wants all nine spelled out)."""
    uses = dict.fromkeys(
        [
            "digital_signature",
            "content_commitment",
            "key_encipherment",
            "data_encipherment",
            "key_agreement",
            "key_cert_sign",
            "crl_sign",
            "encipher_only",
            "decipher_only",
        ],
        False,
    )
    return x509.KeyUsage(**{**uses, **enabled})


def generate(hosts: list[str], days: int = 365, ca_name: str = "gpu-webhook-ca") -> Bundle:
    """A fresh CA and a serving certificate it signs for ``hosts`` (DNS names or IP addresses)."""
    if not hosts:
        raise ValueError("at least one host is needed for the serving certificate")
    hosts = [san_host(h) for h in hosts]
    not_before, not_after = validity(days, datetime.datetime.now(datetime.UTC))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in dict.fromkeys(hosts)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            _key_usage(digital_signature=True),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Bundle(
        ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


def targets(out_dir: str | Path, overwrite: bool = False) -> dict[str, Path]:
    """The three paths ``write`` would write; without ``overwrite`` none of them may exist yet."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CertsError(f"--out-dir {out}: not a directory")
    paths = {what: out / name for what, name in FILES.items()}
    if not overwrite:
        for path in paths.values():
            if path.exists() or path.is_symlink():
                raise CertsError(f"{path} exists; --force overwrites it")
    return paths


def write(bundle: Bundle, out_dir: str | Path, overwrite: bool = False) -> dict[str, Path]:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` (the key readable by its owner only).

    Existing files are refused unless ``overwrite``; any failure is a :class:`CertsError`.
    """
    paths = targets(out_dir, overwrite)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for what, data, mode in [
            ("ca", bundle.ca_pem, 0o644),
            ("cert", bundle.cert_pem, 0o644),
            ("key", bundle.key_pem, 0o600),
        ]:
            fd = os.open(paths[what], flags, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if what == "key":
                os.chmod(paths[what], 0o600)  # an overwritten key keeps no looser mode
    except FileExistsError as exc:
        raise CertsError(f"{exc.filename} exists; --force overwrites it") from None
    except OSError as exc:
        raise CertsError(f"--out-dir {out_dir}: cannot write: {exc}") from None
    return paths
