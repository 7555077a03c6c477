"""A real control plane on loopback: etcd, kube-apiserver and, on demand, kube-scheduler and
kube-controller-manager (only the controllers a test names), built from upstream sources by
build-control-plane.sh. No kubelet.

The same class runs the beds of the apiserver version matrix (``Bed``, ``matrix_beds``): an apiserver of another
Kubernetes version (build-apiserver-matrix.sh) with the flags that version needs, on its own etcd."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.server import free_port
from tests.tools import apiserver_bin, versions
from webhook.serving import certs

ADMIN_TOKEN = "e2e-admin-token"
# The apiserver's webhook client honours proxy variables; loopback must never go through one.
NO_PROXY_ENV = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}

# What a bed does with MutatingAdmissionPolicy: whatever its version does by default (v1 from 1.36, nothing before),
# turn the v1beta1 API on (1.34 and 1.35 only; off by default there, as on EKS), or turn the v1 API off (1.36 on:
# stands in for a cluster that does not serve it).
MAP_DEFAULT, MAP_BETA, MAP_OFF = "default", "beta", "off"
MAP_RESOURCES = ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
POLICY_GROUP = "admissionregistration.k8s.io"


def minor_of(version: str) -> int:
    """18 for v1.18.3 (or 1.18): the minor of a Kubernetes version, ValueError for anything else."""
    match = re.fullmatch(r"v?1\.(\d+)(\.\d+(-[0-9A-Za-z.-]+)?)?", version)
    if not match:
        raise ValueError(f"not a Kubernetes 1.x version: {version!r}")
    return int(match.group(1))


def version_args(minor: int, mutating_policy: str = MAP_DEFAULT,
                 disabled_plugins: tuple[str, ...] = ("ServiceAccount",)) -> list[str]:
    """The kube-apiserver flags of a bed that depend on its minor version and what it does with
    MutatingAdmissionPolicy (the others are the same from 1.30 to 1.37). ``disabled_plugins`` are the admission
    plugins the bed turns off anyway: ServiceAccount on the control-plane beds (nothing creates default service
    accounts there); none on the node bed (tests/e2e/node.py), whose controller-manager does."""
    disabled = list(disabled_plugins)
    gates: list[str] = []
    runtime: list[str] = []
    if mutating_policy == MAP_BETA:
        if minor not in (34, 35):
            raise ValueError(f"MutatingAdmissionPolicy v1beta1 is a 1.34 and 1.35 API, not 1.{minor}'s")
        # Both are needed (seen on v1.34.4): the gate alone makes the apiserver fail its post-start hooks and exit;
        # the API alone (these resources, or the group-version) is served and stores policies, but mutates nothing.
        gates.append("MutatingAdmissionPolicy=true")
        runtime += [f"{POLICY_GROUP}/v1beta1/{resource}=true" for resource in MAP_RESOURCES]
    elif mutating_policy == MAP_OFF:
        if minor < 36:
            raise ValueError(f"1.{minor} serves no MutatingAdmissionPolicy by default: nothing to turn off")
        # Without the admission plugin off too, the apiserver fails its post-start hooks and exits.
        runtime += [f"{POLICY_GROUP}/v1/{resource}=false" for resource in MAP_RESOURCES]
        disabled.append("MutatingAdmissionPolicy")
    elif mutating_policy != MAP_DEFAULT:
        raise ValueError(f"mutating_policy must be {MAP_DEFAULT!r}, {MAP_BETA!r} or {MAP_OFF!r}, "
                         f"got {mutating_policy!r}")
    args = [f"--disable-admission-plugins={','.join(disabled)}"] if disabled else []
    if gates:
        args.append(f"--feature-gates={','.join(gates)}")
    if runtime:
        args.append(f"--runtime-config={','.join(runtime)}")
    return args


@dataclass(frozen=True)
class Bed:
    """One kube-apiserver of the version matrix: its Kubernetes version and what it does with
    MutatingAdmissionPolicy (``MAP_DEFAULT``, ``MAP_BETA``, ``MAP_OFF``)."""

    version: str
    mutating_policy: str = MAP_DEFAULT

    @property
    def minor(self) -> int:
        return minor_of(self.version)

    @property
    def id(self) -> str:
        """The test id: "1.34", "1.34-map-beta", "1.36-map-off"."""
        suffix = {MAP_DEFAULT: "", MAP_BETA: "-map-beta", MAP_OFF: "-map-off"}[self.mutating_policy]
        return f"1.{self.minor}{suffix}"

    def args(self) -> list[str]:
        return version_args(self.minor, self.mutating_policy)


def main_bed() -> Bed:
    """The main bed's apiserver: KUBERNETES_VERSION of versions.env, as it comes."""
    return Bed(versions()["KUBERNETES_VERSION"])


def matrix_beds(kubernetes_versions: list[str]) -> list[Bed]:
    """The beds for these Kubernetes versions, oldest first: every version as it comes; 1.34 and 1.35 also with
    MutatingAdmissionPolicy v1beta1 turned on; 1.36 and later also with it turned off. At most one version per
    minor (two would give two beds the same id)."""
    ordered = sorted(set(kubernetes_versions), key=lambda v: tuple(int(n) for n in re.findall(r"\d+", v)[:3]))
    minors = [minor_of(v) for v in ordered]
    if len(set(minors)) != len(minors):
        raise ValueError(f"one version per minor, got {ordered}")
    beds = []
    for version, minor in zip(ordered, minors, strict=True):
        beds.append(Bed(version))
        if minor in (34, 35):
            beds.append(Bed(version, MAP_BETA))
        elif minor >= 36:
            beds.append(Bed(version, MAP_OFF))
    return beds


def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))


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
          timeout: float = 120, every: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    opener = _opener(context)
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
        time.sleep(every)
    raise RuntimeError(f"{proc.name} not ready at {url} within {timeout}s ({last}):\n{proc.log.read_text()[-4000:]}")


@dataclass
class Peer:
    """A second kube-apiserver of a ControlPlane (``start_peer_apiserver``): its URL and a kubeconfig for it."""

    plane: ControlPlane
    process: Process
    url: str
    kubeconfig: Path

    def stop(self) -> None:
        self.process.stop()
        if self.process in self.plane.processes:
            self.plane.processes.remove(self.process)


@dataclass
class ControlPlane:
    """``bin_dir`` holds etcd, kubectl and the rest of the main bed; ``bed`` (default: the main bed's version as it
    comes) picks the kube-apiserver binary (``tests.tools.apiserver_bin``) and its version-dependent flags."""

    bin_dir: Path
    workdir: Path
    bed: Bed | None = None
    url: str = ""
    ca_file: Path = Path()
    kubeconfig: Path = Path()
    processes: list[Process] = field(default_factory=list)
    apiserver_args: list[str] = field(default_factory=list)

    def binary(self, name: str) -> str:
        if name == "kube-apiserver" and self.bed is not None:
            return str(apiserver_bin(self.bed.version))
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
            "--allow-privileged=true",
            # 1.37 refuses a loopback --advertise-address with the default reconciler; the others log an error
            # every 10 s ("may not be in the loopback range").
            "--endpoint-reconciler-type=none",
            *(self.bed or main_bed()).args(),
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
        _wait(f"{self.url}/readyz", apiserver, context, ADMIN_TOKEN, timeout=180, every=0.05)

    def restart_apiserver(self) -> None:
        """Start the apiserver again on the same port and etcd (for tests that stop it). Returns once ``/readyz``
        answers 200 (polled every 50 ms)."""
        self._start_apiserver()

    def stop_apiserver(self) -> None:
        """SIGTERM the main kube-apiserver (not a peer) and forget it; etcd and the rest keep running."""
        for process in [p for p in self.processes if p.name == "kube-apiserver"]:
            process.stop()
            self.processes.remove(process)

    def start_peer_apiserver(self, name: str = "peer") -> Peer:
        """A second kube-apiserver on the same etcd, with the same flags, certificate, tokens and service-account
        keys, on a port of its own: what an HA control plane runs. Each apiserver has its own caches (the param
        informers of admission policies among them). Stopped with the plane, or by ``Peer.stop()``."""
        port = free_port()
        args = [f"--secure-port={port}" if a.startswith("--secure-port=") else a for a in self.apiserver_args]
        process = _start(f"kube-apiserver-{name}", args, self.workdir)
        self.processes.append(process)
        url = f"https://127.0.0.1:{port}"
        _wait(f"{url}/readyz", process, ssl.create_default_context(cafile=str(self.ca_file)), ADMIN_TOKEN,
              timeout=180, every=0.05)
        kubeconfig = self.workdir / f"kubeconfig-{name}"
        kubeconfig.write_text(self.kubeconfig.read_text().replace(self.url, url))
        return Peer(self, process, url, kubeconfig)

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

    def get(self, path: str) -> dict | None:
        """GET ``path`` from the apiserver as admin: the decoded JSON, None on 404; any other error raises."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        try:
            with _opener(context).open(request, timeout=30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 404:
                return None
            raise

    def version(self) -> str:
        """The gitVersion /version reports, e.g. v1.36.3."""
        answer = self.get("/version")
        assert answer is not None, "/version answered 404"
        return answer["gitVersion"]

    def admission_policy_apis(self) -> dict[str, frozenset[str]]:
        """What discovery says the apiserver serves of admissionregistration.k8s.io: for each version it serves
        (v1, v1beta1, v1alpha1), the kinds (ValidatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ...)."""
        group = self.get(f"/apis/{POLICY_GROUP}")
        served: dict[str, frozenset[str]] = {}
        for entry in group["versions"] if group else []:
            resources = self.get(f"/apis/{entry['groupVersion']}")
            if resources is not None:
                served[entry["version"]] = frozenset(
                    r["kind"] for r in resources["resources"] if "/" not in r["name"])  # no subresources
        return served

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = False) -> subprocess.CompletedProcess:
        result = subprocess.run([self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                                capture_output=True, text=True, timeout=120, env=NO_PROXY_ENV)
        if check and result.returncode != 0:  # with the last words of a process of the bed that died, if one did
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}{self.exited()}")
        return result

    def exited(self) -> str:
        """The bed's processes that have exited, each with its last words ("" while all run): from a Go runtime's
        fatal error or panic when there is one (the goroutine dump after it would push it out of a tail), else the
        end of its log."""
        out = []
        for process in self.processes:
            if process.proc.poll() is None:
                continue
            log = process.log.read_text(errors="replace")
            cause = re.search(r"^(fatal error|panic): ", log, re.MULTILINE)
            words = log[cause.start():][:6000] if cause else log[-6000:]
            out.append(f"--- {process.name} exited ({process.proc.returncode}):\n{words}\n")
        return "".join(out)

    def stop(self) -> None:
        if dead := self.exited():  # died under a test: its last words go to the test's report
            print(dead, file=sys.stderr)
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        if not os.environ.get("GPU_WEBHOOK_E2E_KEEP"):  # set it to read a bed's logs after the run
            shutil.rmtree(self.workdir, ignore_errors=True)
