"""The server under test as a process: certificates, start, readiness, CPU and memory from /proc, stop."""

from __future__ import annotations

import http.client
import os
import platform
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certs(out_dir: Path, source: Path | None = None) -> dict[str, Path]:
    """CA and serving certificate from ``gpu-webhook certs``, as a cluster install would make them."""
    env = _env(source)
    subprocess.run(
        [sys.executable, "-m", "webhook", "certs", "--service", "gpu-webhook", "--namespace", "gpu-system",
         "--host", "127.0.0.1", "--out-dir", str(out_dir)],
        check=True, capture_output=True, timeout=60, cwd=REPO, env=env,
    )
    return {"ca": out_dir / "ca.crt", "cert": out_dir / "tls.crt", "key": out_dir / "tls.key"}


def _env(source: Path | None) -> dict[str, str]:
    paths = [str(source)] if source else []
    paths += [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


@dataclass(frozen=True)
class Pinning:
    server: list[str]
    loadgen: list[str]
    server_cpu: int | None
    description: str


def pinning() -> Pinning:
    """One core for the server, another for the load generator, when taskset and 2+ cores exist."""
    cpus = sorted(os.sched_getaffinity(0))
    if shutil.which("taskset") and len(cpus) >= 2:
        gen, srv = cpus[0], cpus[-1]
        return Pinning(["taskset", "-c", str(srv)], ["taskset", "-c", str(gen)], srv,
                       f"taskset: server on CPU {srv}, load generator on CPU {gen}")
    return Pinning([], [], None, "not pinned (taskset missing or a single CPU)")


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    ca: Path
    log: Path
    threads: int
    gc_log: Path

    def full_collections(self) -> dict[str, object]:
        """Full garbage collections in the workers: how many and how long they stopped the worker."""
        workers = {str(p) for p in self.workers()}
        try:
            lines = self.gc_log.read_text().split("\n")
        except OSError:
            lines = []
        pauses = [float(ms) for pid, _, ms in (line.partition(" ") for line in lines if line) if pid in workers]
        return {"count": len(pauses), "total_ms": round(sum(pauses), 1),
                "max_ms": round(max(pauses), 1) if pauses else 0.0,
                "mean_ms": round(sum(pauses) / len(pauses), 1) if pauses else 0.0}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def workers(self) -> list[int]:
        return children(self.pid)

    def cpu_seconds(self) -> float:
        """Time on CPU of the master and its workers so far, exact (the scheduler's per-thread runtime)."""
        return sum(runtime_seconds(pid) for pid in [self.pid, *self.workers()])

    def cpu_seconds_ticks(self) -> float:
        """User + system time from /proc/<pid>/stat: clock ticks, coarse for short runs at low rates."""
        return sum(cpu_seconds(pid) for pid in [self.pid, *self.workers()])

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def get(self, path: str, timeout: float = 5) -> int:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(), timeout=timeout)
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_server(tmp: Path, certs: dict[str, Path], pin: list[str], source: Path | None = None,
                 workers: int = 1, threads: int = 8) -> Server:
    port = free_port()
    log = tmp / "server.log"
    command = [*pin, sys.executable, "-m", "bench.server", "--cert-file", str(certs["cert"]),
               "--key-file", str(certs["key"]), "--port", str(port), "--workers", str(workers),
               "--threads", str(threads), "--gc-log", str(tmp / "gc.log")]
    if source:
        command += ["--source", str(source)]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=_env(source))
    server = Server(proc, port, certs["ca"], log, threads, tmp / "gc.log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if server.get("/readyz") == 200 and len(server.workers()) == workers:
                return server
        except OSError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server not ready within 60 s:\n{log.read_text()}")


class PeerServer(Server):
    """The Go peer (bench/peer): one process, no workers; CPU and memory are its own."""

    def workers(self) -> list[int]:
        return [self.pid]

    def cpu_seconds(self) -> float:
        return runtime_seconds(self.pid)

    def cpu_seconds_ticks(self) -> float:
        return cpu_seconds(self.pid)

    def full_collections(self) -> dict[str, object]:
        return {}


def start_peer(tmp: Path, certs: dict[str, Path], pin: list[str], binary: Path, threads: int = 8) -> PeerServer:
    """The Go peer on a free port with the same certificate, GOMAXPROCS=1 (one core, as our one worker)."""
    if certs["cert"].parent != certs["key"].parent:
        raise ValueError("the peer reads its certificate and key from one directory (CertDir)")
    port = free_port()
    log = tmp / "peer.log"
    command = [*pin, str(binary), "-host", "127.0.0.1", "-port", str(port), "-cert-dir", str(certs["cert"].parent),
               "-cert-name", certs["cert"].name, "-key-name", certs["key"].name]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
                                env={**os.environ, "GOMAXPROCS": "1"})
    server = PeerServer(proc, port, certs["ca"], log, threads, tmp / "no-gc-log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"peer exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if server.get("/readyz") == 200:
                return server
        except OSError:
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"peer not ready within 30 s:\n{log.read_text()}")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    except OSError:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if _stat_fields(int(entry.name))[1] == str(pid):
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found


def _stat_fields(pid: int) -> list[str]:
    # Fields after the parenthesised command name, which may itself hold spaces: state, ppid, ...
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def runtime_seconds(pid: int) -> float:
    """Sum over the process's threads of the first field of schedstat: nanoseconds spent running."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def cpu_times(cpu: int) -> tuple[int, int]:
    """(busy, steal) clock ticks of one CPU from /proc/stat: busy is user+nice+system+irq+softirq."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            v = [int(x) for x in line.split()[1:]]
            return v[0] + v[1] + v[2] + v[5] + v[6], v[7]
    return 0, 0


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (what the targets name), its peak VmHWM, and Pss (shared pages split with the master)."""
    out: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return {k: round(v, 1) for k, v in out.items()}


def idle_connection_probe(server: Server, idle: int, timeout: float = 3.0) -> dict[str, object]:
    """Open ``idle`` TLS connections that finish their handshake and send nothing, as Go's client pool
    keeps connections it dialled but did not need, then time one request on a fresh connection."""
    context = server.context()
    held = []
    try:
        for _ in range(idle):
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
            held.append(context.wrap_socket(raw, server_hostname="127.0.0.1"))
        time.sleep(0.2)
        started = time.perf_counter()
        try:
            status: int | str = server.get("/healthz", timeout=timeout)
        except OSError as exc:
            status = type(exc).__name__
        ms = (time.perf_counter() - started) * 1000
    finally:
        for s in held:
            s.close()
    return {"idle_connections": idle, "status": status, "ms": round(ms, 1), "stalled": status != 200}


def machine() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_start": _loadavg(),
    }


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []
