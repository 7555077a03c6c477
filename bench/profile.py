"""Where a request's time goes: py-spy samples the worker (GIL holder only, so it is CPU, not waiting)
while vegeta drives each endpoint at max throughput. Writes bench/results/profile-<endpoint>.txt for the seed pod,
profile-<endpoint>-<body>.txt for another body.

    python -m bench --profile                                   # every endpoint, the seed pod
    python -m bench.profile --body pod50 --endpoint validate    # one body, some endpoints
"""

from __future__ import annotations

import argparse
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


def main(source: Path | None = None, body: str = "seed", endpoints: tuple[str, ...] = ("noop", "validate", "mutate"),
         seconds: int = SECONDS) -> int:
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
            variants = bodies.bodies()[body]
            for endpoint in endpoints:
                targets = loadgen.write_targets(work / f"{endpoint}.json",
                                                f"https://127.0.0.1:{server.port}/{endpoint}", variants)
                spec = loadgen.Attack(targets, rate=0, duration=seconds + 3, workers=8,
                                      max_connections=server.threads)
                load = subprocess.Popen([*loadgen_pin, *loadgen.command(vegeta, spec, server.ca, work / "out.bin")])
                time.sleep(1.5)
                raw = work / f"{endpoint}.raw"
                subprocess.run([*loadgen_pin, spy, "record", "--pid", str(worker), "--duration", str(seconds),
                                "--rate", "250", "--gil", "--nonblocking", "--format", "raw", "--output", str(raw)],
                               check=True, capture_output=True)
                load.wait()
                out = RESULTS / (f"profile-{endpoint}.txt" if body == "seed" else f"profile-{endpoint}-{body}.txt")
                out.write_text(f"/{endpoint}, {body} body, max throughput; {pinning}\n" + collapse(raw))
                print(f"wrote {out}", file=sys.stderr)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--body", default="seed", choices=list(bodies.BODIES))
    parser.add_argument("--endpoint", nargs="+", default=["noop", "validate", "mutate"])
    parser.add_argument("--seconds", type=int, default=SECONDS)
    parser.add_argument("--source", type=Path, help="profile the webhook package in this directory instead")
    args = parser.parse_args()
    sys.exit(main(args.source, args.body, tuple(args.endpoint), args.seconds))
