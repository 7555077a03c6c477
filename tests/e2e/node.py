"""A real one-node cluster in its own network namespace: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd (with Debian's runc and the bridge CNI plugin), kubelet and kube-proxy, all built
by build-control-plane.sh and build-node.sh (never here: this module only finds what they built).

Layout (one bed; ``<id>`` is random, ``X`` a free number):

- network namespace ``gw-e2e-<id>`` with ``lo`` up, no default route and a veth pair to the host:
  ``gwh<id>`` = 10.250.X.1/30 on the host (forwarding off on it: nothing from the bed is routed anywhere),
  ``gwn<id>`` = 10.250.X.2/30 inside (the node IP, the apiserver's advertise and bind address);
  pods on the bridge ``gw-br0`` in 10.244.0.0/24; Services in 10.96.0.0/24 (kube-proxy, iptables mode),
  routed to a veth whose peer is down, so that a ClusterIP is routable before kube-proxy's DNAT and goes
  nowhere after a miss.
- one mount namespace for every process of the bed (held by a ``sleep``), with the host's ``/run``,
  ``/var/lib`` and ``/var/log`` replaced by directories of the workdir (kubelet and containerd write a few fixed
  paths there) and the six kernel sysctls the kubelet insists on shown to it at its values (bind-mounted
  files), so that it does not change them on the host. Mounts made by kubelet, containerd and runc stay in it.
- cgroups under ``/gw-e2e-<id>`` in every cgroup hierarchy: the kubelet's ``cgroupRoot``; the bed's own
  processes sit in ``/gw-e2e-<id>/node`` of the pids hierarchy, so teardown can find and kill every process
  the bed started, containers included.

The pytest process stays on the host: it talks to the apiserver at https://10.250.X.2:6443 through the veth
and runs commands inside with ``nsenter``. ``stop()`` kills everything, unmounts, removes the cgroups, the
namespace and the veth, and deletes the workdir.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.e2e.cluster import MAP_DEFAULT, NO_PROXY_ENV, Process, minor_of, version_args
from tests.tools import cache_root, control_plane_bin, versions

HERE = Path(__file__).resolve().parent
IMAGES_SRC = HERE / "images"

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr",
                 "cni/bridge", "cni/host-local", "cni/loopback")
HOST_TOOLS = ("runc", "iptables", "iptables-restore", "ip", "nsenter", "unshare", "mount", "umount", "sleep")
IMAGES = ("pause", "agent")
PAUSE_IMAGE = "gw-e2e.invalid/pause:1"
AGENT_IMAGE = "gw-e2e.invalid/agent:1"
NODE_NAME = "gw-e2e-node"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
API_PORT = 6443
# The kubelet's syncFrequency (see _write_kubelet_config).
SYNC_FREQUENCY = "10s"
# What the kubelet sets these to (pkg/kubelet/cm: setupKernelTunables); it writes any that differ.
KUBELET_SYSCTLS = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                   "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}

T = TypeVar("T")
# One JSON file per live bed (owner pid and start time, workdir), so a later run can clean up after a killed one.
REGISTRY = Path("/run/gw-e2e-beds")


def _process_start(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat), to tell a live owner from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


# --- where build-node.sh put things ------------------------------------------------------------------

def control_plane_bin_dir() -> Path:
    return control_plane_bin()


def node_bin_dir() -> Path:
    v = versions()
    key = f"{v['KUBERNETES_VERSION']}-{v['CONTAINERD_VERSION']}-{v['CNI_PLUGINS_VERSION']}"
    return cache_root() / "node" / key / "bin"


def images_hash() -> str:
    """The same key as build-node.sh: sha256 over ``sha256sum`` lines of the image sources, sorted by path."""
    paths = sorted("./" + str(p.relative_to(IMAGES_SRC)) for p in IMAGES_SRC.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts
                   and (p.suffix in (".go", ".py") or p.name == "go.mod"))
    lines = "".join(f"{hashlib.sha256((IMAGES_SRC / p).read_bytes()).hexdigest()}  {p}\n" for p in paths)
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def images_dir() -> Path:
    return cache_root() / "node" / "images" / images_hash()


def missing() -> list[str]:
    """What the bed needs and does not find (empty when it can start)."""
    gaps = []
    if os.geteuid() != 0:
        gaps.append("root (network namespaces, mounts, cgroups)")
    tools = [name for name in HOST_TOOLS if not shutil.which(name)]
    if tools:
        gaps.append(f"{', '.join(tools)} (Debian packages: tests/install-packages)")
    for directory, names, step in ((control_plane_bin_dir(), CONTROL_PLANE_BINARIES, "control-plane"),
                                   (node_bin_dir(), NODE_BINARIES, "node")):
        absent = [n for n in names if not os.access(directory / n, os.X_OK)]
        if absent:
            gaps.append(f"{', '.join(absent)} in {directory} (tests/prepare {step})")
    absent = [f"{n}.oci.tar" for n in IMAGES if not (images_dir() / f"{n}.oci.tar").is_file()]
    if absent:
        gaps.append(f"{', '.join(absent)} in {images_dir()} (tests/prepare node)")
    return gaps


# Default paths of kubelet, containerd, CNI and kube-controller-manager on the host. The bed points all of
# them into its workdir (or hides them in its mount namespace); stop() reports any that appeared meanwhile.
HOST_PATHS = ("/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/lib/etcd", "/var/log/pods",
              "/var/log/containers", "/run/containerd", "/run/netns/cni-", "/opt/cni", "/opt/containerd",
              "/etc/kubernetes", "/etc/containerd", "/usr/libexec/kubernetes", "/etc/cni/net.d/10-gw-e2e.conflist")


def host_paths() -> set[str]:
    found = set()
    for path in HOST_PATHS:
        parent, _, prefix = path.rpartition("/")
        if path.endswith("-"):  # a name prefix
            found |= {f"{parent}/{p.name}" for p in Path(parent or "/").glob(prefix + "*")}
        elif Path(path).exists():
            found.add(path)
    return found


# --- small helpers ------------------------------------------------------------------------------------

def run(args: list[str], timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=NO_PROXY_ENV, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def until(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.25,
          diagnose: Callable[[], str] = lambda: "") -> T:
    """Call ``probe`` until it returns something truthy; fail after ``timeout`` seconds with ``diagnose()``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except Exception as exc:  # noqa: BLE001 - a probe that fails is retried until the deadline
            last = repr(exc)  # not the exception: its traceback would keep sockets open until collected
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s (last: {last})\n{diagnose()}")
        time.sleep(interval)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


@dataclass
class CA:
    """A throwaway CA that issues the bed's serving and client certificates."""
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str) -> CA:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, hosts: tuple[str, ...] = (), groups: tuple[str, ...] = (),
              client: bool = False) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM): a serving certificate for ``hosts`` or a client one for CN/O."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                         else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


# --- cgroups ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CgroupMount:
    path: Path
    version: int  # 1 or 2
    options: frozenset[str]  # v1 super options (controllers, name=...)


def cgroup_mounts() -> list[CgroupMount]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype, _source, super_options = after.split(" ", 2)
        if fstype in ("cgroup", "cgroup2"):
            mount_point = before.split(" ")[4].replace("\\040", " ")
            mounts.append(CgroupMount(Path(mount_point), 2 if fstype == "cgroup2" else 1,
                                      frozenset(super_options.split(","))))
    return mounts


class Cgroups:
    """``/<name>`` in every cgroup hierarchy: the kubelet's cgroupRoot, plus ``/<name>/node`` for the bed."""

    def __init__(self, name: str):
        self.name = name
        self.mounts = cgroup_mounts()
        v1 = [m for m in self.mounts if m.version == 1]
        pids = [m for m in v1 if "pids" in m.options]
        unified = [m for m in self.mounts if m.version == 2]
        if pids:
            self.tracking = pids[0].path / name / "node"
        elif unified and (unified[0].path / "cgroup.controllers").exists():
            self.tracking = unified[0].path / name / "node"
        else:
            raise RuntimeError(f"no pids cgroup hierarchy to track the bed's processes in: {self.mounts}")
        self.version = 1 if v1 else 2

    def create(self) -> None:
        for mount in self.mounts:
            root = mount.path / self.name
            root.mkdir(exist_ok=True)
            if "cpuset" in mount.options:  # a new v1 cpuset is empty: give it its parent's CPUs and memory nodes
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (root / knob).write_text((mount.path / knob).read_text())
            if mount.version == 2 and self.version == 2:
                wanted = set((mount.path / "cgroup.subtree_control").read_text().split())
                (root / "node").mkdir(exist_ok=True)
                for controller in sorted(wanted):
                    try:
                        (root / "cgroup.subtree_control").write_text(f"+{controller}")
                    except OSError:
                        pass
        self.tracking.mkdir(exist_ok=True)

    def pids(self, sub: str = "") -> set[int]:
        """Every process in the tree (or in its subtree ``sub``, e.g. ``kubepods``)."""
        top = self.tracking.parent / sub
        if not top.is_dir():
            return set()
        found = set()
        for directory in [top, *top.rglob("*")]:
            procs = directory / "cgroup.procs"
            if directory.is_dir() and procs.exists():
                try:
                    found |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    pass
        return found

    def kill_all(self, sub: str = "", timeout: float = 30) -> None:
        """SIGKILL every process left in the tree (or subtree ``sub``) until it is empty."""
        deadline = time.monotonic() + timeout
        while pids := self.pids(sub):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes left in cgroup {self.name}: {sorted(pids)}")
            time.sleep(0.1)

    def remove(self, timeout: float = 20) -> list[str]:
        """rmdir the tree bottom-up in every hierarchy; returns what could not be removed."""
        left = []
        for mount in self.mounts:
            root = mount.path / self.name
            if not root.exists():
                continue
            dirs = sorted([root, *(d for d in root.rglob("*") if d.is_dir())], key=lambda d: len(d.parts),
                          reverse=True)
            for directory in dirs:
                deadline = time.monotonic() + timeout
                while directory.exists():
                    try:
                        directory.rmdir()
                    except FileNotFoundError:
                        break
                    except OSError as exc:
                        if time.monotonic() > deadline:
                            left.append(f"{directory}: {exc}")
                            break
                        time.sleep(0.1)
        return left


# --- network ------------------------------------------------------------------------------------------------

class Network:
    """The bed's network namespace and its veth pair to the host."""

    def __init__(self, bed_id: str):
        self.netns = f"gw-e2e-{bed_id}"
        self.host_if, self.inner_if = f"gwh{bed_id}", f"gwn{bed_id}"
        self.host_ip = self.node_ip = ""

    def _free_subnet(self) -> int:
        used = run(["ip", "-4", "-o", "addr", "show"]).stdout
        used += run(["ip", "-4", "route", "show", "table", "all"]).stdout
        for _ in range(50):
            x = secrets.randbelow(254) + 1
            if f"10.250.{x}." not in used:
                return x
        raise RuntimeError("no free 10.250.X.0/30 for the bed's veth")

    def create(self) -> None:
        x = self._free_subnet()
        self.host_ip, self.node_ip = f"10.250.{x}.1", f"10.250.{x}.2"
        ns = self.netns
        run(["ip", "netns", "add", ns])
        run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if, "netns", ns])
        # Nothing that comes in from the bed is forwarded by the host (ip_forward may be on there), and no IPv6.
        Path(f"/proc/sys/net/ipv6/conf/{self.host_if}/disable_ipv6").write_text("1\n")
        Path(f"/proc/sys/net/ipv4/conf/{self.host_if}/forwarding").write_text("0\n")
        run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
        run(["ip", "link", "set", self.host_if, "up"])
        inside = ["ip", "-n", ns]
        run([*inside, "link", "set", "lo", "up"])
        # /proc/sys/net is the namespace of whoever opens it, hence the shell inside. bridge-nf-call-iptables
        # (br_netfilter) only matters for a pod reaching a Service backed by a pod on the same bridge.
        settings = {f"net/ipv6/conf/{self.inner_if}/disable_ipv6": 1, "net/ipv4/ip_forward": 1}
        script = [f"echo {v} > /proc/sys/{k}" for k, v in settings.items()]
        script.append("if [ -e /proc/sys/net/bridge ]; then echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables; fi")
        run(self.exec(["sh", "-c", " && ".join(script)]))
        run([*inside, "addr", "add", f"{self.node_ip}/30", "dev", self.inner_if])
        run([*inside, "link", "set", self.inner_if, "up"])
        # ClusterIPs need a route, or connect() fails before kube-proxy's DNAT in OUTPUT is reached. It goes
        # to one end of a veth pair whose other end stays down: whatever no Service rule rewrites is dropped
        # there (a dummy device would do, but this kernel has no dummy driver).
        run([*inside, "link", "add", "gw-svc", "type", "veth", "peer", "name", "gw-svc-sink"])
        run([*inside, "link", "set", "gw-svc", "up"])
        run([*inside, "route", "add", SERVICE_CIDR, "dev", "gw-svc"])

    def exec(self, args: list[str]) -> list[str]:
        """``args`` run in the namespace (without ``ip netns exec``'s /sys remount)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *args]

    def delete(self) -> list[str]:
        problems = []
        if Path(f"/run/netns/{self.netns}").exists():
            result = run(["ip", "netns", "del", self.netns], check=False)
            if result.returncode:
                problems.append(f"ip netns del {self.netns}: {result.stderr.strip()}")
        if Path(f"/sys/class/net/{self.host_if}").exists():
            result = run(["ip", "link", "del", self.host_if], check=False)
            if result.returncode and Path(f"/sys/class/net/{self.host_if}").exists():
                problems.append(f"ip link del {self.host_if}: {result.stderr.strip()}")
        return problems


# --- the bed -------------------------------------------------------------------------------------------------

@dataclass
class NodeBed:
    cp_bin: Path
    node_bin: Path
    images: Path
    workdir: Path
    bed_id: str = field(default_factory=lambda: secrets.token_hex(3))
    processes: list[Process] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    holder: subprocess.Popen | None = None
    host_paths_before: set[str] = field(default_factory=set)
    # What the kube-apiserver does with MutatingAdmissionPolicy: MAP_DEFAULT (v1, served from 1.36) or MAP_OFF (the
    # API and its admission plugin off, the flags of tests/e2e/cluster.py's MAP-off beds): a cluster that serves
    # no MutatingAdmissionPolicy, on the same node build. restart_apiserver() switches a running bed.
    mutating_policy: str = MAP_DEFAULT

    def __post_init__(self) -> None:
        self.network = Network(self.bed_id)
        self.cgroups = Cgroups(f"gw-e2e-{self.bed_id}")
        self.ca: CA | None = None
        self.tokens = {user: secrets.token_hex(16) for user in
                       ("admin", "kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler")}

    # paths and addresses
    @property
    def node_ip(self) -> str:
        return self.network.node_ip

    @property
    def url(self) -> str:
        return f"https://{self.node_ip}:{API_PORT}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig" / "admin"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def binary(self, name: str) -> str:
        path = self.node_bin / name
        return str(path if path.exists() else self.cp_bin / name)

    # running things
    def in_node(self, args: list[str]) -> list[str]:
        """``args`` in the bed's network and mount namespaces."""
        assert self.holder is not None
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", "--", *args]

    def spawn(self, name: str, args: list[str]) -> Process:
        """Start a process of the bed: in its namespaces and in its tracking cgroup, output to <name>.log."""
        log = self.workdir / "logs" / f"{name}.log"
        procs = self.cgroups.tracking / "cgroup.procs"
        wrapper = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *self.in_node(args)]
        with log.open("wb") as out:
            proc = subprocess.Popen(wrapper, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=NO_PROXY_ENV)
        process = Process(name, proc, log)
        self.processes.append(process)
        return process

    def netns_run(self, args: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """``args`` inside the bed (its mount namespace too once it has one: iptables shares kube-proxy's lock)."""
        alive = self.holder is not None and self.holder.poll() is None
        return run(self.in_node(args) if alive else self.network.exec(args), timeout=timeout, check=check)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = False,
                timeout: float = 60) -> subprocess.CompletedProcess:
        result = subprocess.run([self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                                capture_output=True, text=True, timeout=timeout, env=NO_PROXY_ENV)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json", check=True).stdout)

    def helm(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.cp_bin / "helm"), f"--kubeconfig={self.kubeconfig}", *args],
                              capture_output=True, text=True, timeout=timeout, env=NO_PROXY_ENV)

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return run([self.binary("ctr"), f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
                   timeout=timeout)

    def http_in_netns(self, url: str, timeout: float = 10) -> tuple[int, str]:
        """GET ``url`` from inside the bed's network namespace (host processes cannot reach pods or ClusterIPs)."""
        code = ("import sys, urllib.request, urllib.error\n"
                "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
                "try:\n"
                f"    r = opener.open({url!r}, timeout={timeout})\n"
                "    print(r.status); print(r.read().decode(), end='')\n"
                "except urllib.error.HTTPError as e:\n"
                "    print(e.code); print(e.read().decode(), end='')\n")
        result = self.netns_run([sys.executable, "-c", code], timeout=timeout + 10)
        status, _, body = result.stdout.partition("\n")
        return int(status), body

    def logs(self, *names: str, tail: int = 3000) -> str:
        parts = []
        for process in self.processes:
            if (not names or process.name in names) and process.log.exists():
                parts.append(f"--- {process.name} (exit {process.proc.poll()})\n"
                             f"{process.log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def import_image(self, archive: Path) -> list[str]:
        """Import an OCI (or docker) image archive into the node's containerd (namespace k8s.io): the names
        it got. Pods use it with ``imagePullPolicy: Never`` (nothing can be pulled in the bed)."""
        before = set(self.image_names())
        self.ctr("images", "import", "--local", "--platform=linux/amd64", str(archive), timeout=300)
        names = (set(self.image_names()) - before) or (before & self._archive_names(archive))
        return sorted(n for n in names if not n.startswith("sha256:"))  # the CRI also names each image by ID

    @staticmethod
    def _archive_names(archive: Path) -> set[str]:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            index = json.load(member) if member else {}
        keys = ("io.containerd.image.name", "org.opencontainers.image.ref.name")
        return {m.get("annotations", {}).get(k, "") for m in index.get("manifests", []) for k in keys}

    def image_names(self) -> list[str]:
        return self.ctr("images", "list", "--quiet").stdout.split()

    # start
    def start(self) -> None:
        t0 = time.monotonic()
        self.host_paths_before = host_paths()
        w = self.workdir
        for sub in ("logs", "pki", "kubeconfig", "etcd", "host/run", "host/var-lib", "host/var-log", "sysctl",
                    "containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "volume-plugins"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        self._register()
        self.network.create()
        self.cgroups.create()
        self._start_holder()
        self._write_pki()
        self.timings["namespaces"] = time.monotonic() - t0

        etcd = self.spawn("etcd", [
            self.binary("etcd"), "--name=gw-e2e", f"--data-dir={w / 'etcd'}",
            "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=gw-e2e=http://127.0.0.1:2380", "--unsafe-no-fsync", "--log-level=warn",
            "--listen-metrics-urls=", "--metrics=basic"])
        until("etcd healthy", lambda: self._alive(etcd) and b"true" in self.netns_run(
            [sys.executable, "-c", "import urllib.request as u; print(u.build_opener(u.ProxyHandler({}))"
             ".open('http://127.0.0.1:2379/health', timeout=2).read().decode())"], check=False).stdout.encode(),
              60, diagnose=lambda: self.logs("etcd"))

        self._start_apiserver()
        self.timings["apiserver ready"] = time.monotonic() - t0

        self.spawn("kube-controller-manager", [
            self.binary("kube-controller-manager"), f"--kubeconfig={w / 'kubeconfig/kube-controller-manager'}",
            "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={w / 'pki/sa.key'}", f"--root-ca-file={w / 'pki/ca.crt'}",
            f"--cluster-signing-cert-file={w / 'pki/ca.crt'}", f"--cluster-signing-key-file={w / 'pki/ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--controllers=*",
            # Its default, /usr/libexec/kubernetes/..., is created on the host otherwise.
            f"--flex-volume-plugin-dir={w / 'volume-plugins'}"])
        self.spawn("kube-scheduler", [
            self.binary("kube-scheduler"), f"--kubeconfig={w / 'kubeconfig/kube-scheduler'}",
            "--leader-elect=false", "--secure-port=0"])

        self._write_containerd_config()
        containerd = self.spawn("containerd", [self.binary("containerd"), f"--config={w / 'containerd/config.toml'}"])
        until("containerd socket", lambda: self._alive(containerd) and self.containerd_socket.exists()
              and run([self.binary("ctr"), f"--address={self.containerd_socket}", "version"], check=False,
                      timeout=10).returncode == 0, 60, diagnose=lambda: self.logs("containerd"))
        for name in IMAGES:
            self.import_image(self.images / f"{name}.oci.tar")
        self.timings["containerd ready, images imported"] = time.monotonic() - t0

        self._write_kubelet_config()
        kubelet = self.spawn("kubelet", [
            self.binary("kubelet"), f"--config={w / 'kubelet/config.yaml'}",
            f"--kubeconfig={w / 'kubeconfig/kubelet'}", f"--root-dir={w / 'kubelet/root'}",
            f"--cert-dir={w / 'kubelet/pki'}", f"--hostname-override={NODE_NAME}", f"--node-ip={self.node_ip}",
            "--v=1"])
        self._write_kube_proxy_config()
        proxy = self.spawn("kube-proxy", [self.binary("kube-proxy"), f"--config={w / 'kube-proxy.yaml'}", "--v=1"])

        def node_ready() -> bool:
            return self._alive(kubelet) and self._node_ready()

        until("node Ready", node_ready, 180, interval=0.5,
              diagnose=lambda: self.logs("kubelet", "containerd") + self.kubectl("describe", "node").stdout)
        self.timings["node Ready"] = time.monotonic() - t0

        def proxy_synced() -> bool:
            self._alive(proxy)
            rules = self.netns_run(["iptables", "-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"], check=False).stdout
            return "default/kubernetes:https" in rules

        until("kube-proxy rules for the kubernetes Service", proxy_synced, 90, interval=0.5,
              diagnose=lambda: self.logs("kube-proxy"))
        until("default ServiceAccount and kube-root-ca.crt",
              lambda: self.kubectl("get", "serviceaccount/default", "configmap/kube-root-ca.crt").returncode == 0,
              90, interval=0.5, diagnose=lambda: self.logs("kube-controller-manager"))
        self.timings["ready for pods"] = time.monotonic() - t0

    def apiserver_args(self) -> list[str]:
        w = self.workdir
        return [
            self.binary("kube-apiserver"), "--etcd-servers=http://127.0.0.1:2379",
            f"--bind-address={self.node_ip}", f"--secure-port={API_PORT}", f"--advertise-address={self.node_ip}",
            f"--tls-cert-file={w / 'pki/apiserver.crt'}", f"--tls-private-key-file={w / 'pki/apiserver.key'}",
            f"--client-ca-file={w / 'pki/ca.crt'}",
            f"--kubelet-client-certificate={w / 'pki/apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={w / 'pki/apiserver-kubelet-client.key'}",
            # The node's name resolves nowhere (no DNS in the bed): reach the kubelet (kubectl logs, exec) by IP.
            "--kubelet-preferred-address-types=InternalIP",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", f"--token-auth-file={w / 'pki/tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={w / 'pki/sa.pub'}", f"--service-account-signing-key-file={w / 'pki/sa.key'}",
            "--allow-privileged=true", "--profiling=false",
            *version_args(minor_of(versions()["KUBERNETES_VERSION"]), self.mutating_policy, disabled_plugins=())]

    def _start_apiserver(self) -> None:
        apiserver = self.spawn("kube-apiserver", self.apiserver_args())
        context = ssl.create_default_context(cafile=str(self.ca_file))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))

        def ready() -> bool:
            self._alive(apiserver)
            with opener.open(f"{self.url}/readyz", timeout=5) as response:
                return response.status == 200

        until("kube-apiserver /readyz", ready, 180, diagnose=lambda: self.logs("kube-apiserver"))

    def restart_apiserver(self, mutating_policy: str) -> float:
        """Stop the kube-apiserver and start it again with ``mutating_policy`` (same etcd, address and
        credentials: the node, its pods and every stored object stay); returns the seconds until /readyz and
        the node Ready again. The kubelet, kube-proxy and the controllers reconnect by themselves."""
        start = time.monotonic()
        (old,) = [p for p in self.processes if p.name == "kube-apiserver"]
        old.stop(timeout=30)
        self.processes.remove(old)
        old.log.rename(old.log.with_name(f"kube-apiserver.{self.mutating_policy}.{int(time.time())}.log"))
        self.mutating_policy = mutating_policy
        self._start_apiserver()
        until("node Ready after the apiserver restart", self._node_ready, 120, interval=0.5,
              diagnose=lambda: self.logs("kubelet", "kube-apiserver"))
        self._watching_services()
        return time.monotonic() - start

    def _watching_services(self) -> None:
        """Wait until the controllers and kube-proxy act on a new Service with a Ready pod behind it (their watches
        are back after an apiserver restart). Each informer reconnects on its own backoff: a Service's
        EndpointSlice can appear while the EndpointSlice controller's pod informer is still away, and then a
        release installed meanwhile gets no endpoints and is answered "connection refused" through its Service
        although its pods are Ready. So the probe is a pause pod selected by a throwaway Service, done when its
        EndpointSlice lists the pod ready and kube-proxy jumps to the Service's chain (nat table)."""
        name = "gw-e2e-watch-probe"
        labels = {"gw-e2e/probe": name}
        self.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
             "spec": {"terminationGracePeriodSeconds": 0,
                      "containers": [{"name": "pause", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
             "spec": {"selector": labels, "ports": [{"port": 9, "protocol": "TCP"}]}}]}))

        def acted() -> bool:
            slices = self.kubectl_json("get", "endpointslices", "-n", "default",
                                       "-l", f"kubernetes.io/service-name={name}")["items"]
            ready = any((e.get("conditions") or {}).get("ready") for s in slices for e in s.get("endpoints") or ())
            return ready and f"default/{name}" in self.kube_services("nat")

        try:
            until("the EndpointSlice controller and kube-proxy acting on a new Service and its Ready pod", acted, 150,
                  interval=0.5, diagnose=lambda: self.kubectl("get", "pod", name, "-n", "default", "-o", "wide").stdout
                  + self.logs("kube-proxy", "kube-controller-manager"))
        finally:
            self.kubectl("delete", "service,pod", name, "-n", "default", "--ignore-not-found", "--wait=false")

    def kube_services(self, table: str) -> str:
        """kube-proxy's KUBE-SERVICES chain in ``table``, a rule per line: in ``filter`` the REJECT of each Service
        without endpoints ("connection refused"), in ``nat`` the jump to each Service with endpoints."""
        return self.netns_run(["iptables", "-w", "5", "-t", table, "-S", "KUBE-SERVICES"], check=False).stdout

    def _node_ready(self) -> bool:
        node = self.kubectl("get", "node", NODE_NAME, "-o", "json")
        if node.returncode:
            return False
        conditions = {c["type"]: c["status"] for c in json.loads(node.stdout)["status"].get("conditions", [])}
        return conditions.get("Ready") == "True"

    def _alive(self, process: Process) -> bool:
        if process.proc.poll() is not None:
            raise RuntimeError(f"{process.name} exited ({process.proc.returncode}):\n"
                               f"{process.log.read_text(errors='replace')[-4000:]}")
        return True

    def _start_holder(self) -> None:
        """A process that owns the bed's mount namespace (inside its network namespace)."""
        w = self.workdir
        lines = ["set -e", f"mount --bind {w}/host/run /run", f"mount --bind {w}/host/var-lib /var/lib",
                 f"mount --bind {w}/host/var-log /var/log"]
        for name, value in KUBELET_SYSCTLS.items():
            current = Path("/proc/sys", name)
            if current.exists() and current.read_text().strip() != str(value):
                shown = w / "sysctl" / name.replace("/", ".")
                shown.write_text(f"{value}\n")
                lines.append(f"mount --bind {shown} {current}")
        lines += ["echo ready", "exec sleep infinity"]
        procs = self.cgroups.tracking / "cgroup.procs"
        self.holder = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs),
             *self.network.exec(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                                 "\n".join(lines)])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=NO_PROXY_ENV)
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline().strip()  # bounded: the script either prints or exits
        if line != "ready":
            self.holder.kill()
            _, err = self.holder.communicate(timeout=10)
            raise RuntimeError(f"the mount namespace holder failed: {line} {err}")

    def _write_pki(self) -> None:
        w = self.workdir / "pki"
        self.ca = ca = CA.create(f"gw-e2e-{self.bed_id}")
        (w / "ca.crt").write_bytes(ca.pem)
        (w / "ca.key").write_bytes(_pem_key(ca.key))
        cert, key = ca.issue("kube-apiserver", hosts=(
            self.node_ip, KUBERNETES_SERVICE_IP, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local"))
        (w / "apiserver.crt").write_bytes(cert)
        (w / "apiserver.key").write_bytes(key)
        cert, key = ca.issue("kube-apiserver-kubelet-client", groups=("system:masters",), client=True)
        (w / "apiserver-kubelet-client.crt").write_bytes(cert)
        (w / "apiserver-kubelet-client.key").write_bytes(key)
        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (w / "sa.key").write_bytes(_pem_key(sa))
        (w / "sa.pub").write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))
        users = {"admin": ("admin", "system:masters"),
                 "kubelet": (f"system:node:{NODE_NAME}", "system:nodes"),
                 "kube-proxy": ("system:kube-proxy", ""),
                 "kube-controller-manager": ("system:kube-controller-manager", ""),
                 "kube-scheduler": ("system:kube-scheduler", "")}
        (w / "tokens.csv").write_text("".join(f'{self.tokens[u]},{name},uid-{u},"{groups}"\n'
                                              for u, (name, groups) in users.items()))
        for user in users:
            (self.workdir / "kubeconfig" / user).write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "gw-e2e", "cluster": {"server": self.url,
                                                            "certificate-authority": str(w / "ca.crt")}}],
                "users": [{"name": user, "user": {"token": self.tokens[user]}}],
                "contexts": [{"name": "gw-e2e", "context": {"cluster": "gw-e2e", "user": user,
                                                            "namespace": "default"}}],
                "current-context": "gw-e2e"}, indent=1))

    def _write_containerd_config(self) -> None:
        w = self.workdir
        runc = shutil.which("runc")
        (w / "containerd/certs.d").mkdir(exist_ok=True)
        (w / "cni/net.d/10-gw-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "gw-e2e",
            "plugins": [{"type": "bridge", "bridge": "gw-br0", "isGateway": True, "ipMasq": False,
                         "hairpinMode": True,
                         "ipam": {"type": "host-local", "dataDir": str(w / "cni/ipam"),
                                  "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}]}}],
        }, indent=1))
        (w / "containerd/config.toml").write_text(f"""\
# containerd for the e2e node bed (tests/e2e/node.py): everything under the bed's workdir.
version = 3
root = "{w}/containerd/root"
state = "{w}/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{w}/containerd/containerd.sock.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{w}/containerd/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  # Nothing is ever pulled: the sandbox image is imported from an archive before the kubelet starts, and
  # the namespace has no route out anyway.
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{w}/containerd/certs.d"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # Root here lacks CAP_SYS_RESOURCE, so runc cannot lower oom_score_adj (the kubelet asks -998 for
  # sandboxes): never below containerd's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = []
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{self.node_bin / 'cni'}"]
    conf_dir = "{w}/cni/net.d"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
""")

    def _write_kubelet_config(self) -> None:
        w = self.workdir
        (w / "kubelet/config.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "failSwapOn": False, "oomScoreAdj": 0,
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroups.name}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.node_ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(w / "pki/ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(w / "pod-logs"), "volumePluginDir": str(w / "volume-plugins"),
            "resolvConf": "", "clusterDomain": "cluster.local",
            "maxPods": 30, "serializeImagePulls": False,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                             "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "registerNode": True, "rotateCertificates": False, "serverTLSBootstrap": False,
            "shutdownGracePeriod": "0s", "localStorageCapacityIsolation": True,
            # How often each pod is synced, and so how soon a changed ConfigMap or Secret reaches its volume
            # (the Watch strategy, the default, sees the change at once; the volume follows at the pod's next
            # sync, 1-1.5x this period). The default, 1m, would make test_node_release.py wait up to 90 s
            # twice; 10s bounds it to about 15 s.
            "syncFrequency": SYNC_FREQUENCY, "configMapAndSecretChangeDetectionStrategy": "Watch",
        }, indent=1))

    def _write_kube_proxy_config(self) -> None:
        w = self.workdir
        (w / "kube-proxy.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(w / "kubeconfig/kube-proxy")},
            "mode": "iptables", "hostnameOverride": NODE_NAME, "oomScoreAdj": 0, "clusterCIDR": POD_CIDR,
            "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
            # nf_conntrack_max is not writable from a network namespace: leave conntrack settings alone.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            "nodePortAddresses": ["primary"],
        }, indent=1))

    # stop
    def stop(self) -> list[str]:
        """Tear everything down; returns what could not be cleaned (empty when all went)."""
        problems: list[str] = []
        by_name = {p.name: p for p in self.processes}
        for name in ("kube-proxy", "kubelet"):
            if name in by_name:
                by_name[name].stop(timeout=15)
        # Containers (and their shims) die with a SIGKILL; then containerd and the control plane, newest first.
        try:
            self.cgroups.kill_all("kubepods")
        except Exception as exc:  # noqa: BLE001
            problems.append(str(exc))
        for process in reversed(self.processes):
            process.stop(timeout=15)
        self.processes.clear()
        if self.holder is not None:
            problems += self._unmount_in_holder()
            self.holder.kill()
            self.holder.communicate(timeout=10)  # reaps it and closes its pipes
        try:
            self.cgroups.kill_all()
        except Exception as exc:  # noqa: BLE001
            problems.append(str(exc))
        problems += self._unmount_on_host()
        problems += self.cgroups.remove()
        problems += self.network.delete()
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.workdir.exists():
            problems.append(f"{self.workdir} not fully removed")
        problems += [f"{path} appeared on the host" for path in sorted(host_paths() - self.host_paths_before)]
        problems += self.leftovers()
        if not problems:
            (REGISTRY / f"{self.bed_id}.json").unlink(missing_ok=True)
        return problems

    # beds whose pytest died (SIGKILL, a CI job ended) leave processes, cgroups and a namespace behind
    def _register(self) -> None:
        REGISTRY.mkdir(parents=True, exist_ok=True)
        (REGISTRY / f"{self.bed_id}.json").write_text(json.dumps(
            {"pid": os.getpid(), "start": _process_start(os.getpid()), "workdir": str(self.workdir)}))

    @classmethod
    def sweep_stale(cls) -> list[str]:
        """Clean up every bed registered by a process that is gone; returns what was swept."""
        swept = []
        for record in sorted(REGISTRY.glob("*.json")) if REGISTRY.is_dir() else []:
            try:
                owner = json.loads(record.read_text())
            except (OSError, ValueError):
                continue
            if _process_start(owner["pid"]) == owner.get("start"):
                continue  # its pytest is still running: another bed, not ours to touch
            bed = cls(Path(), Path(), Path(), Path(owner["workdir"]), bed_id=record.stem)
            bed.host_paths_before = host_paths()  # what its run may have left is not this check's business
            problems = bed.stop()
            swept.append(f"{record.stem}: {problems or 'clean'}")
            if not problems:
                record.unlink(missing_ok=True)
        return swept

    def leftovers(self) -> list[str]:
        """What of the bed is still there (checked after stop())."""
        found = []
        if Path(f"/run/netns/{self.network.netns}").exists():
            found.append(f"network namespace {self.network.netns}")
        if Path(f"/sys/class/net/{self.network.host_if}").exists():
            found.append(f"host interface {self.network.host_if}")
        found += [f"cgroup {m.path / self.cgroups.name}" for m in self.cgroups.mounts
                  if (m.path / self.cgroups.name).exists()]
        found += [f"mount {p}" for p in self._mounts_under(Path("/proc/self/mountinfo"))
                  if p.startswith(str(self.workdir))]
        found += [f"process {p.name} ({p.proc.pid})" for p in self.processes if p.proc.poll() is None]
        return found

    def _mounts_under(self, mountinfo: Path) -> list[str]:
        prefix = str(self.workdir) + "/"
        points = []
        for line in mountinfo.read_text().splitlines():
            point = line.split(" ")[4].replace("\\040", " ")
            if point.startswith(prefix) or point in ("/run", "/var/lib", "/var/log") or point.startswith("/proc/sys/"):
                points.append(point)
        return points

    def _unmount_in_holder(self) -> list[str]:
        assert self.holder is not None
        if self.holder.poll() is not None:
            return []
        points = self._mounts_under(Path(f"/proc/{self.holder.pid}/mountinfo"))
        problems = []
        for point in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
            result = run(["nsenter", f"--target={self.holder.pid}", "--mount", "--", "umount", "-l", point],
                         check=False, timeout=30)
            if result.returncode and "not mounted" not in result.stderr:
                problems.append(f"umount {point} in the bed: {result.stderr.strip()}")
        return problems

    def _unmount_on_host(self) -> list[str]:
        prefix = str(self.workdir) + "/"
        problems = []
        points = [line.split(" ")[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if line.split(" ")[4].startswith(prefix)]
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            result = run(["umount", "-l", point], check=False)
            if result.returncode:
                problems.append(f"umount {point}: {result.stderr.strip()}")
        return problems
