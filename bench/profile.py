"""Where a request's time goes: py-spy samples the worker (GIL holder only, so it is CPU, not waiting)
while vegeta drives each endpoint at max throughput. Writes bench/results/profile-<endpoint>.txt."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import bodies, harness, loadgen

RESULTS = harness.REPO / "bench" / "results"
SECONDS = 8


def py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("bench --profile needs py-spy (pip install py-spy, in the bench extra)")
    return found


def collapse(raw: Path, top: int = 40) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        count = int(n)
        total += count
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += count
        own[frames[-1]] += count
    skip = re.compile(r"threading\.py|concurrent/futures/thread\.py|runpy|bench/server\.py|arbiter\.py|app/base\.py")
    lines = [f"{total} samples of the thread holding the GIL", "", "inclusive:"]
    lines += [f"{100 * v / total:5.1f}%  {k}" for k, v in inclusive.most_common() if not skip.search(k)][:top]
    lines += ["", "self:"] + [f"{100 * v / total:5.1f}%  {k}" for k, v in own.most_common(top)]
    return "\n".join(lines) + "\n"


def main(source: Path | None = None) -> int:
    spy = py_spy()
    vegeta = loadgen.find_vegeta()
    pins = harness.pinning()
    server_pin, loadgen_pin, pinning = pins.server, pins.loadgen, pins.description
    with tempfile.TemporaryDirectory(prefix="gpu-webhook-profile-") as tmp:
        work = Path(tmp)
        certs = harness.make_certs(work, source)
        server = harness.start_server(work, certs, server_pin, source)
        try:
            worker = server.workers()[0]
            seed = bodies.bodies()["seed"]
            for endpoint in ("noop", "validate", "mutate"):
                targets = loadgen.write_targets(work / f"{endpoint}.json",
                                                f"https://127.0.0.1:{server.port}/{endpoint}", seed)
                spec = loadgen.Attack(targets, rate=0, duration=SECONDS + 3, workers=8,
                                      max_connections=server.threads)
                load = subprocess.Popen([*loadgen_pin, *loadgen.command(vegeta, spec, server.ca, work / "out.bin")])
                time.sleep(1.5)
                raw = work / f"{endpoint}.raw"
                subprocess.run([*loadgen_pin, spy, "record", "--pid", str(worker), "--duration", str(SECONDS),
                                "--rate", "250", "--gil", "--nonblocking", "--format", "raw", "--output", str(raw)],
                               check=True, capture_output=True)
                load.wait()
                out = RESULTS / f"profile-{endpoint}.txt"
                out.write_text(f"/{endpoint}, seed pod, max throughput; {pinning}\n" + collapse(raw))
                print(f"wrote {out}", file=sys.stderr)
        finally:
            server.stop()
    return 0
