"""A real control plane on loopback: etcd, kube-apiserver and, on demand, kube-scheduler and
kube-controller-manager (only the controllers a test names), built from upstream sources by
build-control-plane.sh. No kubelet."""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.server import free_port
from webhook.serving import certs

ADMIN_TOKEN = "e2e-admin-token"
# The apiserver's webhook client honours proxy variables; loopback must never go through one.
NO_PROXY_ENV = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}




@dataclass
class Process:
    name: str
    proc: subprocess.Popen
    log: Path

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _start(name: str, args: list[str], workdir: Path) -> Process:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=NO_PROXY_ENV)
    return Process(name, proc, log)


def _wait(url: str, proc: Process, context: ssl.SSLContext | None = None, token: str | None = None,
          timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.proc.returncode}):\n{proc.log.read_text()[-4000:]}")
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with opener.open(request, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError as exc:
            last = str(exc)
        time.sleep(0.25)
    raise RuntimeError(f"{proc.name} not ready at {url} within {timeout}s ({last}):\n{proc.log.read_text()[-4000:]}")


@dataclass
class ControlPlane:
    bin_dir: Path
    workdir: Path
    url: str = ""
    ca_file: Path = Path()
    kubeconfig: Path = Path()
    processes: list[Process] = field(default_factory=list)
    apiserver_args: list[str] = field(default_factory=list)

    def binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    def start(self) -> None:
        w = self.workdir
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd = _start("etcd", [
            self.binary("etcd"), "--name=e2e", f"--data-dir={w / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}", f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}", "--unsafe-no-fsync", "--log-level=warn",
        ], w)
        self.processes.append(etcd)
        _wait(f"http://127.0.0.1:{etcd_port}/health", etcd, timeout=60)

        tls = certs.write(certs.generate(["127.0.0.1", "localhost"], days=2, ca_name="e2e-apiserver-ca"), w / "pki")
        self.ca_file = tls["ca"]
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (w / "sa.key").write_bytes(sa_key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.TraditionalOpenSSL,
                                                        serialization.NoEncryption()))
        (w / "sa.pub").write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                    serialization.PublicFormat.SubjectPublicKeyInfo))
        (w / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        self.apiserver_args = [
            self.binary("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={api_port}", "--advertise-address=127.0.0.1",
            f"--tls-cert-file={tls['cert']}", f"--tls-private-key-file={tls['key']}",
            # A loopback service range: any Service the apiserver dials stays on this machine.
            "--service-cluster-ip-range=127.0.100.0/24", "--authorization-mode=Node,RBAC",
            f"--token-auth-file={w / 'tokens.csv'}", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={w / 'sa.pub'}", f"--service-account-signing-key-file={w / 'sa.key'}",
            "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
        ]
        self.url = f"https://127.0.0.1:{api_port}"
        self._start_apiserver()
        self.kubeconfig = w / "kubeconfig"
        self.kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {{server: "{self.url}", certificate-authority: "{self.ca_file}"}}
users:
- name: admin
  user: {{token: {ADMIN_TOKEN}}}
contexts:
- name: e2e
  context: {{cluster: e2e, user: admin, namespace: default}}
current-context: e2e
""")

    def _start_apiserver(self) -> None:
        apiserver = _start("kube-apiserver", self.apiserver_args, self.workdir)
        self.processes.append(apiserver)
        context = ssl.create_default_context(cafile=str(self.ca_file))
        _wait(f"{self.url}/readyz", apiserver, context, ADMIN_TOKEN, timeout=180)

    def restart_apiserver(self) -> None:
        """Start the apiserver again on the same port and etcd (for tests that stop it)."""
        self._start_apiserver()

    def start_scheduler(self) -> Process:
        scheduler = _start("kube-scheduler", [
            self.binary("kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
        ], self.workdir)
        self.processes.append(scheduler)
        return scheduler

    def ensure_scheduler(self) -> Process:
        """The running scheduler, started if none runs (two would race for every pod)."""
        running = [p for p in self.processes if p.name == "kube-scheduler" and p.proc.poll() is None]
        return running[0] if running else self.start_scheduler()

    def start_controller_manager(self, *controllers: str) -> Process:
        """kube-controller-manager running only ``controllers`` (e.g. resourceclaim-controller)."""
        manager = _start("kube-controller-manager", [
            self.binary("kube-controller-manager"), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--controllers={','.join(controllers)}",
        ], self.workdir)
        self.processes.append(manager)
        return manager

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
        result = subprocess.run([self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                                capture_output=True, text=True, timeout=120, env=NO_PROXY_ENV)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
