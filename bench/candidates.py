"""Which server should carry the Flask app? Each candidate serves the same app (``bench.candidate_app``),
the same certificate and bodies, one worker pinned to the server core, measured on the same scenarios:

- ``max``: /mutate with the seed pod, 8 keep-alive connections, as fast as they go (rounds interleaved);
- ``slow``: 1,000 connections of each kind trickling a ClientHello, headers or a body (reconnecting when
  cut, ``tests/hardening/swarm.py``), then 20 normal requests on fresh connections: how many were answered
  within 5 s, and their p50;
- ``idle``: one kept-alive connection left idle for 95 s (the apiserver keeps idle connections 90 s and
  does not retry a POST it wrote into a connection the server just closed): is it still served?

    python -m bench.candidates [--only ours,gevent] [--rounds 4] [--skip-idle]

Candidates need the ``bench-candidates`` extra (gevent, hypercorn, granian). Results go to
bench/results/candidates.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench import bodies, harness, loadgen

REPO = harness.REPO
RESULTS = REPO / "bench" / "results"
PY = sys.executable


def commands(port: int, certs: dict[str, Path]) -> dict[str, list[str]]:
    cert, key = str(certs["cert"]), str(certs["key"])
    app = "bench.candidate_app:app"
    return {
        # The production server: gunicorn's master, asyncio workers (webhook/connections.py).
        "ours": [PY, "-m", "webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert-file", cert,
                 "--key-file", key],
        # What served the webhook before: gunicorn's threaded worker, 8 threads.
        "gthread": [PY, "-m", "gunicorn", "-k", "gthread", "--threads", "8", "-w", "1", "-b", f"127.0.0.1:{port}",
                    "--certfile", cert, "--keyfile", key, "--keep-alive", "120", "--no-control-socket", app],
        "gevent": [PY, "-m", "gunicorn", "-k", "gevent", "-w", "1", "-b", f"127.0.0.1:{port}", "--certfile", cert,
                   "--keyfile", key, "--keep-alive", "120", "--no-control-socket", app],
        "hypercorn": [PY, "-m", "hypercorn", "-w", "1", "-b", f"127.0.0.1:{port}", "--certfile", cert, "--keyfile",
                      key, "--keep-alive", "120", "--read-timeout", "10", app],
        "granian": [PY, "-m", "granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", str(port),
                    "--workers", "1", "--http", "1", "--ssl-certificate", cert, "--ssl-keyfile", key,
                    "--ssl-protocol-min", "tls1.2", "--http1-header-read-timeout", "10000", app],
    }


@dataclass
class Candidate:
    name: str
    proc: subprocess.Popen
    port: int
    ca: Path
    log: Path

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def get(self, path: str, conn: http.client.HTTPSConnection | None = None, timeout: float = 5) -> int:
        own = conn is None
        conn = conn or http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(), timeout=timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            if own:
                conn.close()

    def worker_pids(self) -> list[int]:
        kids = harness.children(self.proc.pid)
        return kids or [self.proc.pid]

    def cpu_seconds(self) -> float:
        return sum(harness.runtime_seconds(p) for p in [self.proc.pid, *harness.children(self.proc.pid)])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start(name: str, work: Path, pin: list[str]) -> Candidate:
    directory = work / name
    directory.mkdir()
    certs = harness.make_certs(directory)
    port = harness.free_port()
    log = directory / "server.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        proc = subprocess.Popen([*pin, *commands(port, certs)[name]], stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env=env)
    candidate = Candidate(name, proc, port, certs["ca"], log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            if candidate.get("/healthz") == 200:
                return candidate
        except OSError:
            time.sleep(0.2)
    candidate.stop()
    raise RuntimeError(f"{name} did not answer within 30 s: {log.read_text()[-2000:]}")


def max_throughput(candidate: Candidate, vegeta: Path, work: Path, pin: list[str], seconds: float) -> dict:
    targets = loadgen.write_targets(work / f"{candidate.name}-targets.json",
                                    f"https://127.0.0.1:{candidate.port}/mutate", bodies.bodies()["seed"])
    before = candidate.cpu_seconds()
    result = loadgen.attack(vegeta, loadgen.Attack(targets, 0, seconds, max_connections=8), candidate.ca, work, pin)
    ok = sum(1 for code in result.codes if code == 200)
    return {"rps": ok / result.span_s, "errors": len(result.codes) - ok,
            "cpu_us_per_request": (candidate.cpu_seconds() - before) / max(ok, 1) * 1e6}


def slow_clients(candidate: Candidate, count: int, seconds: float, pin: list[str]) -> dict:
    """The attackers and the 20 normal requests run on the load generator's core, the server on its own: the
    attackers' TLS handshakes (a server that cuts them makes them reconnect) must not starve the measuring
    client, or the p50 measures the client's wait for a CPU, not the server."""
    swarms = {kind: subprocess.Popen([*pin, PY, "-m", "tests.hardening.swarm", str(candidate.port), str(candidate.ca),
                                      kind, str(count), str(seconds)], stdout=subprocess.PIPE, text=True, cwd=REPO)
              for kind in ("hello", "headers", "body")}
    time.sleep(15)
    busy_before = candidate.cpu_seconds()
    measured_from = time.monotonic()
    latencies, failures = [], []
    for _ in range(20):
        started = time.monotonic()
        try:
            status = candidate.get("/healthz", timeout=5)
            latencies.append(time.monotonic() - started)
            if status != 200:
                failures.append(str(status))
        except Exception as exc:  # noqa: BLE001 - every failure counts
            failures.append(type(exc).__name__)
        time.sleep(max(0.0, 0.5 - (time.monotonic() - started)))
    server_busy = (candidate.cpu_seconds() - busy_before) / (time.monotonic() - measured_from)
    rss = harness.memory_mb(candidate.worker_pids()[0]).get("VmRSS")
    attackers = {}
    for kind, proc in swarms.items():
        try:
            out, _ = proc.communicate(timeout=seconds + 60)
            attackers[kind] = json.loads(out.strip().splitlines()[-1])
        except Exception as exc:  # noqa: BLE001
            proc.kill()
            attackers[kind] = {"error": str(exc)}
    latencies.sort()
    return {"answered": len(latencies) - sum(1 for f in failures if f.isdigit()), "of": 20,
            "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1) if latencies else None,
            "failures": failures[:5], "attackers": attackers, "server_cpu_share": round(server_busy, 2),
            "rss_mb_under_attack": rss}


def idle_keepalive(candidates: list[Candidate], idle_s: float) -> dict[str, str]:
    """One connection per candidate, a request, then idle_s of silence, then a second request on it."""
    conns = {}
    for c in candidates:
        conn = http.client.HTTPSConnection("127.0.0.1", c.port, context=c.context(), timeout=10)
        c.get("/healthz", conn)
        conns[c.name] = conn
    time.sleep(idle_s)
    out = {}
    for c in candidates:
        try:
            out[c.name] = f"served ({c.get('/healthz', conns[c.name])})"
        except Exception as exc:  # noqa: BLE001
            out[c.name] = f"closed by the server ({type(exc).__name__})"
        finally:
            conns[c.name].close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.candidates")
    parser.add_argument("--only", default="ours,gthread,gevent,hypercorn,granian")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--slow", type=int, default=1000, help="slow connections per kind")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--skip-slow", action="store_true")
    args = parser.parse_args(argv)
    names = args.only.split(",")
    vegeta = loadgen.find_vegeta()
    pins = harness.pinning()
    work = Path(tempfile.mkdtemp(prefix="gpu-webhook-candidates-"))
    results: dict[str, dict] = {name: {"max": []} for name in names}
    running: list[Candidate] = []
    try:
        running = [start(name, work, pins.server) for name in names]
        idle = threading.Thread(target=lambda: results.update(idle=idle_keepalive(running, 95.0)), daemon=True)
        if not args.skip_idle:
            idle.start()
        for r in range(args.rounds):
            for c in (running if r % 2 == 0 else list(reversed(running))):
                m = max_throughput(c, vegeta, work, pins.loadgen, args.seconds)
                results[c.name]["max"].append(m)
                print(f"round {r + 1} {c.name}: {m['rps']:.0f} rps, {m['cpu_us_per_request']:.0f} us/request, "
                      f"{m['errors']} errors", flush=True)
        for c in running:
            pid = c.worker_pids()[0]
            results[c.name]["rss_mb"] = harness.memory_mb(pid).get("VmRSS")
        if not args.skip_idle:
            idle.join(200)
        if not args.skip_slow:
            gen_cpu = pins.loadgen[-1] if pins.loadgen else None
            if gen_cpu is not None:
                os.sched_setaffinity(0, {int(gen_cpu)})  # the measuring client beside the attackers
            for c in running:  # one at a time: the swarm would otherwise measure the other candidates too
                results[c.name]["slow"] = slow_clients(c, args.slow, 40.0, pins.loadgen)
                print(f"slow clients {c.name}: {results[c.name]['slow']['answered']}/20, "
                      f"p50 {results[c.name]['slow']['p50_ms']} ms", flush=True)
    finally:
        for c in running:
            c.stop()
    RESULTS.mkdir(exist_ok=True)
    results["machine"] = harness.machine()
    (RESULTS / "candidates.json").write_text(json.dumps(results, indent=2))
    print(table(results, names))
    return 0


def table(results: dict, names: list[str]) -> str:
    rows = ["| server | /mutate rps (median, range) | × ours | CPU µs/request | RSS MB | 3,000 slow clients: "
            "answered, p50, server CPU, RSS MB | idle 95 s |", "|---|---|---|---|---|---|---|"]

    def med(values: list[float]) -> float:
        values = sorted(values)
        return values[len(values) // 2] if values else 0.0

    ours = med([m["rps"] for m in results.get("ours", {}).get("max", [])]) or 1.0
    for name in names:
        r = results[name]
        rps = [m["rps"] for m in r["max"]]
        slow = r.get("slow", {})
        spread = f"{min(rps, default=0):.0f}–{max(rps, default=0):.0f}"
        cpu = med([m["cpu_us_per_request"] for m in r["max"]])
        idle = results.get("idle", {}).get(name, "–")
        rows.append(
            f"| {name} | {med(rps):.0f} ({spread}) | {med(rps) / ours:.2f} | {cpu:.0f} | {r.get('rss_mb', 0):.1f} | "
            f"{slow.get('answered', '–')}/20, {slow.get('p50_ms', '–')} ms, {slow.get('server_cpu_share', '–')}, "
            f"{slow.get('rss_mb_under_attack', '–')} | {idle} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
