"""Machinery shared by the hardening tests: load that judges every answer, readings from /proc,
a volume swapped the way the kubelet swaps a mounted Secret, and certificates for client auth.

Everything here talks to 127.0.0.1 only and every loop has a count or a deadline.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import os
import shutil
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.manifests import admission_review, container, pod, seed_pod, workload
from tests.server import WebhookProcess, start_webhook

GPU = "nvidia.com/gpu"


# ---------------------------------------------------------------- servers

def start_server(tmp: Path, *args: str, attempts: int = 3, **kw) -> WebhookProcess:
    """``tests.server.start_webhook``, tried again when the free port it picked was taken meanwhile
    (load from a test makes many outgoing connections, and any of them may land on that port)."""
    for attempt in range(attempts):
        try:
            return start_webhook(tmp, *args, **kw)
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- /proc

def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the gunicorn workers of a master), from /proc/<pid>/task/*/children."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(set(found))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def thread_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def worker_pids(master: int, count: int = 1, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = children(master)
        if len(pids) >= count:
            return pids
        time.sleep(0.1)
    raise RuntimeError(f"gunicorn master {master} has no {count} worker(s) after {timeout}s")


# ---------------------------------------------------------------- a kubelet-style volume

class AtomicVolume:
    """A directory laid out as the kubelet mounts a Secret or ConfigMap.

    ``..2026_12_02_10_00_00.1234/`` holds the files, ``..data`` links to it and every file name
    links through ``..data``. :meth:`publish` makes a new timestamped directory, points a temporary
    link at it and renames that link onto ``..data`` (one atomic step), then removes the old
    directory and the links of files that are gone, in the kubelet's AtomicWriter order.
    """

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._generation = 0

    def path(self, name: str) -> Path:
        return self.root / name

    def publish(self, files: dict[str, bytes]) -> Path:
        self._generation += 1
        stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S")
        stamp = f"{stamp}.{os.getpid()}{self._generation:04d}"
        new = self.root / stamp
        new.mkdir()
        for name, data in files.items():
            fd = os.open(new / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        data_link = self.root / "..data"
        old = os.readlink(data_link) if data_link.is_symlink() else None
        staged = self.root / "..data_tmp"
        if staged.is_symlink():
            staged.unlink()
        os.symlink(stamp, staged)
        os.replace(staged, data_link)
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)
        if old and old != stamp:
            shutil.rmtree(self.root / old)
        for entry in self.root.iterdir():
            if not entry.name.startswith("..") and entry.name not in files:
                entry.unlink()
        return new


# ---------------------------------------------------------------- certificates

@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes

    @property
    def der(self) -> bytes:
        return x509.load_pem_x509_certificate(self.cert_pem).public_bytes(serialization.Encoding.DER)

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.key_pem)
        return cert, key


class Authority:
    """A throw-away CA that signs client certificates (the apiserver's admission identity)."""

    def __init__(self, name: str):
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Issued(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
        )


def der_of(cert_pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)


def trusting(*ca_files: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A verifying client context that trusts every CA given (old and new ones during a rotation)."""
    context = ssl.create_default_context()
    context.load_verify_locations(cadata="".join(Path(p).read_text() for p in ca_files))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    return context


# ---------------------------------------------------------------- requests and how to judge them

@dataclass(frozen=True)
class Call:
    """One admission request and what a correct answer looks like."""

    path: str
    body: bytes
    uid: str
    allowed: bool | None  # None: either answer is right (a policy is being swapped)
    patched: bool = False

    def judge(self, status: int, data: bytes) -> str | None:
        """None when the answer is right, else what is wrong with it."""
        if status != 200:
            return f"HTTP {status}: {data[:200]!r}"
        try:
            response = json.loads(data)["response"]
        except (ValueError, KeyError, TypeError):
            return f"not an AdmissionReview: {data[:200]!r}"
        if response.get("uid") != self.uid:
            return f"uid {response.get('uid')!r} instead of {self.uid!r}"
        if self.allowed is not None and response.get("allowed") is not self.allowed:
            return f"allowed={response.get('allowed')!r}, expected {self.allowed}: {response.get('status')}"
        if self.patched:
            if response.get("patchType") != "JSONPatch":
                return f"no JSONPatch: {response}"
            json.loads(base64.b64decode(response["patch"]))
        return None


def _review(obj: dict, uid: str, namespace: str = "default") -> bytes:
    return json.dumps(admission_review(obj, namespace=namespace, uid=uid)).encode()


def standard_calls() -> list[Callable[[], Call]]:
    """A mix of what the apiserver sends: good and bad pods, a workload, a mutation; fresh uids each time."""

    def good() -> Call:
        uid = str(uuid.uuid4())
        return Call("/validate", _review(seed_pod(), uid), uid, True)

    def bad() -> Call:
        uid = str(uuid.uuid4())
        return Call("/validate", _review(pod(container(requests={GPU: 1})), uid), uid, False)

    def deployment() -> Call:
        uid = str(uuid.uuid4())
        return Call("/validate", _review(workload("Deployment", pod(container(limits={GPU: "1.5"}))), uid), uid, False)

    def mutation() -> Call:
        uid = str(uuid.uuid4())
        return Call("/mutate", _review(seed_pod(), uid), uid, True, patched=True)

    return [good, bad, deployment, mutation]


@dataclass
class Record:
    at: float
    client: str
    latency: float
    problem: str | None
    fresh_connection: bool


@dataclass
class Tally:
    """Every request sent, with its outcome; thread-safe."""

    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: Record) -> None:
        with self.lock:
            self.records.append(record)

    def snapshot(self) -> list[Record]:
        with self.lock:
            return list(self.records)

    @property
    def sent(self) -> int:
        return len(self.snapshot())

    def failures(self, until: float | None = None) -> list[Record]:
        return [r for r in self.snapshot() if r.problem and (until is None or r.at <= until)]

    def latencies(self) -> list[float]:
        return sorted(r.latency for r in self.snapshot())

    def summary(self) -> dict:
        records = self.snapshot()
        lat = sorted(r.latency for r in records)
        failed = [r for r in records if r.problem]

        def q(p: float) -> float:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else 0.0

        return {
            "sent": len(records),
            "failed": len(failed),
            "new_connections": sum(r.fresh_connection for r in records),
            "p50_ms": q(0.5),
            "p99_ms": q(0.99),
            "max_ms": round(lat[-1] * 1000, 2) if lat else 0.0,
            "first_failures": [f"{r.client}@{r.at:.3f}: {r.problem}" for r in failed[:5]],
        }


class LoadClient(threading.Thread):
    """Sends ``calls`` at ``rate`` per second until ``stop`` is set or ``deadline`` passes.

    ``on_connect(conn, when_the_connection_was_started)`` sees each new connection.
    ``keep_alive`` reuses one connection (reopened when the server closes it, or the thread ends there
    when ``stop_on_close``: an apiserver whose endpoint is gone would not dial this pod again);
    otherwise every request gets a connection of its own. Every answer is judged and recorded.
    """

    def __init__(self, name: str, port: int, context: ssl.SSLContext, calls: Sequence[Callable[[], Call]],
                 tally: Tally, stop: threading.Event, deadline: float, rate: float = 20.0,
                 keep_alive: bool = True, stop_on_close: bool = False, timeout: float = 10.0,
                 on_connect: Callable[[http.client.HTTPSConnection, float], None] | None = None,
                 max_requests: int | None = None):
        super().__init__(name=name, daemon=True)
        self.max_requests = max_requests
        self.port, self.context, self.calls, self.tally = port, context, list(calls), tally
        self.stop, self.deadline, self.period = stop, deadline, 1.0 / rate
        self.keep_alive, self.stop_on_close, self.timeout = keep_alive, stop_on_close, timeout
        self.on_connect = on_connect
        self.closed_by_server = False

    def run(self) -> None:
        conn: http.client.HTTPSConnection | None = None
        due = time.monotonic()
        i = 0
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                if self.max_requests is not None and i >= self.max_requests:
                    return
                call = self.calls[i % len(self.calls)]()
                i += 1
                fresh = conn is None
                started = time.monotonic()
                close = not self.keep_alive
                try:
                    if conn is None:
                        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                                           timeout=self.timeout)
                        conn.connect()
                        if self.on_connect:
                            self.on_connect(conn, started)
                    conn.request("POST", call.path, body=call.body, headers={"Content-Type": "application/json"})
                    response = conn.getresponse()
                    problem = call.judge(response.status, response.read())
                    if response.will_close:
                        close = True
                        self.closed_by_server = self.keep_alive
                except Exception as exc:  # every way a request can fail is a failure to count
                    problem = f"{type(exc).__name__}: {exc}"
                    close = True
                self.tally.add(Record(started, self.name, time.monotonic() - started, problem, fresh))
                if close and conn is not None:
                    conn.close()
                    conn = None
                if self.closed_by_server and self.stop_on_close:
                    return
                due = max(due + self.period, time.monotonic() - 1.0)
                self.stop.wait(max(0.0, due - time.monotonic()))
        finally:
            if conn is not None:
                conn.close()


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def get(port: int, context: ssl.SSLContext, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def served_certificate(port: int, context: ssl.SSLContext, timeout: float = 5.0) -> bytes:
    """DER of the certificate a new connection is served."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    try:
        conn.connect()
        assert conn.sock is not None
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return der
    finally:
        conn.close()
