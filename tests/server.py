"""A real gpu-webhook server process on a loopback port, with certificates from ``gpu-webhook certs``."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

GPU_WEBHOOK = [sys.executable, "-m", "webhook"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(out_dir: Path, *hosts: str) -> dict[str, Path]:
    args = [*GPU_WEBHOOK, "certs", "--service", "gpu-webhook", "--namespace", "gpu-system", "--out-dir", str(out_dir)]
    for host in hosts or ("127.0.0.1",):
        args += ["--host", host]
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    return {"ca": out_dir / "ca.crt", "cert": out_dir / "tls.crt", "key": out_dir / "tls.key"}


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    return context


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the Prometheus sample ``name`` in exposition ``text`` over the series matching ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
    return total


@dataclass
class WebhookProcess:
    port: int
    ca: Path
    cert: Path
    key: Path
    log: Path
    proc: subprocess.Popen
    extra_args: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def connection(self, context: ssl.SSLContext | None = None, timeout: float = 10) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=context or client_context(self.ca), timeout=timeout
        )

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                conn: http.client.HTTPSConnection | None = None, headers: dict | None = None,
                context: ssl.SSLContext | None = None) -> Answer:
        """One request; on its own connection (closed after) unless ``conn`` is given."""
        own = conn is None
        conn = conn or self.connection(context)
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        try:
            conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            return Answer(response.status, dict(response.getheaders()), response.read())
        finally:
            if own:
                conn.close()

    def post(self, path: str, body, **kw) -> Answer:
        return self.request("POST", path, body, **kw)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus sample over series matching ``labels``."""
        return metric_sum(self.request("GET", "/metrics").body.decode(), name, **labels)

    def log_lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_webhook(tmp: Path, *args: str, certs: dict[str, Path] | None = None, wait: bool = True,
                  env: dict | None = None) -> WebhookProcess:
    certs = certs or make_certs(tmp)
    port = free_port()
    log = tmp / f"webhook-{port}.log"
    command = [*GPU_WEBHOOK, "serve", "--host", "127.0.0.1", "--port", str(port),
               "--cert-file", str(certs["cert"]), "--key-file", str(certs["key"]), *args]
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = WebhookProcess(port, certs["ca"], certs["cert"], certs["key"], log, proc, list(args))
    if wait:
        wait_ready(server)
    return server


def wait_ready(server: WebhookProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"webhook exited with {server.proc.returncode}:\n{server.log.read_text()}")
        try:
            if server.request("GET", "/readyz").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"webhook not ready within {timeout}s:\n{server.log.read_text()}")
