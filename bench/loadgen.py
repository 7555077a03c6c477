"""The load generator: vegeta (Go's net/http client, as the apiserver uses) driven from Python.

One :func:`attack` is one vegeta run against one endpoint: a fixed rate (``rate > 0``) or as fast as
``workers`` concurrent requests allow (``rate == 0``), keep-alive over a pool of connections or a new
connection (and TLS handshake) per request. Results come back per request, decoded from vegeta's CSV,
with the generator's own CPU time (from ``wait4``) so a run can show the generator was not the bottleneck.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

VEGETA_VERSION = "v12.13.0"
csv.field_size_limit(sys.maxsize)


class LoadToolMissing(RuntimeError):
    pass


def bin_dir() -> Path:
    if os.environ.get("GPU_WEBHOOK_BENCH_BIN"):
        return Path(os.environ["GPU_WEBHOOK_BENCH_BIN"])
    # The one cache root of the project's build steps (tests/prepare): GPU_WEBHOOK_CACHE.
    cache = Path(os.environ.get("GPU_WEBHOOK_CACHE") or Path.home() / ".cache" / "gpu-webhook")
    return cache / "bench" / "bin"


def find_vegeta() -> Path:
    """The vegeta binary: the one bench/install-vegeta builds, else one on PATH."""
    built = bin_dir() / "vegeta"
    if built.is_file() and os.access(built, os.X_OK):
        return built
    on_path = shutil.which("vegeta")
    if on_path:
        return Path(on_path)
    raise LoadToolMissing(
        f"vegeta not found in {bin_dir()} or on PATH"
    )


def write_targets(path: Path, url: str, bodies: list[bytes]) -> Path:
    """vegeta's JSON target format, one target per body; vegeta cycles through them in order."""
    with path.open("w") as out:
        for body in bodies:
            target = {
                "method": "POST",
                "url": url,
                "body": base64.b64encode(body).decode(),
                "header": {"Content-Type": ["application/json"]},
            }
            out.write(json.dumps(target) + "\n")
    return path


@dataclass
class Attack:
    """Settings of one run. ``max_connections`` caps the client's pool, like the server's thread count."""

    targets: Path
    rate: int  # requests per second; 0 = as fast as ``workers`` allow
    duration: float  # seconds
    workers: int = 8
    keepalive: bool = True
    idle_connections: int = 25  # the apiserver's MaxIdleConnsPerHost
    max_connections: int = 8
    timeout: float = 10.0  # the apiserver's default webhook timeout


@dataclass
class Results:
    timestamps_ns: list[int] = field(default_factory=list)
    latencies_ns: list[int] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    bodies: list[bytes] = field(default_factory=list)
    loadgen_cpu_s: float = 0.0
    wall_s: float = 0.0

    @property
    def count(self) -> int:
        return len(self.codes)

    @property
    def span_s(self) -> float:
        """From the first request sent to the last answer received."""
        if not self.timestamps_ns:
            return 0.0
        end = max(t + lat for t, lat in zip(self.timestamps_ns, self.latencies_ns, strict=True))
        return (end - min(self.timestamps_ns)) / 1e9


def command(vegeta: Path, attack: Attack, ca: Path, output: Path) -> list[str]:
    args = [
        str(vegeta), "attack",
        "-format=json", f"-targets={attack.targets}",
        f"-duration={attack.duration}s",
        f"-timeout={attack.timeout}s",
        f"-root-certs={ca}",
        "-http2=false",  # the apiserver speaks HTTP/1.1 to webhooks
        f"-keepalive={'true' if attack.keepalive else 'false'}",
        f"-connections={attack.idle_connections}",
        f"-max-connections={attack.max_connections}",
        f"-output={output}",
    ]
    if attack.rate > 0:
        args += [f"-rate={attack.rate}/1s", f"-workers={attack.workers}"]
    else:
        args += ["-rate=0", f"-workers={attack.workers}", f"-max-workers={attack.workers}"]
    return args


def attack(vegeta: Path, spec: Attack, ca: Path, workdir: Path, pin: list[str] | None = None) -> Results:
    out = workdir / "results.bin"
    started = time.monotonic()
    proc = subprocess.Popen([*(pin or []), *command(vegeta, spec, ca, out)], stderr=subprocess.PIPE)
    assert proc.stderr is not None
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"vegeta attack failed ({proc.returncode}): {stderr.strip()}")
    results = decode(vegeta, out)
    results.loadgen_cpu_s = usage.ru_utime + usage.ru_stime
    results.wall_s = time.monotonic() - started
    out.unlink()
    return results


def decode(vegeta: Path, path: Path) -> Results:
    text = subprocess.run([str(vegeta), "encode", "--to", "csv", str(path)], check=True, capture_output=True).stdout
    results = Results()
    for row in csv.reader(text.decode().splitlines()):
        results.timestamps_ns.append(int(row[0]))
        results.codes.append(int(row[1]))
        results.latencies_ns.append(int(row[2]))
        if row[5]:
            results.errors[row[5]] = results.errors.get(row[5], 0) + 1
        results.bodies.append(base64.b64decode(row[6]) if row[6] else b"")
    return results
