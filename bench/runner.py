"""The benchmark: one server, every scenario, endpoints interleaved in rounds; a JSON result.

Scenarios (each one vegeta run per endpoint, order rotated every round so machine noise hits all):

* ``fixed`` -- the seed pod at fixed rates (200 and 500 rps), keep-alive: latency percentiles, CPU per request.
* ``max`` -- the seed pod as fast as ``workers`` concurrent requests allow: throughput, ratio to ``/noop``.
* ``sweep`` -- every body (seed, Deployment, 10 and 50 containers, no GPU) at a light fixed rate: how
  latency grows with the object, away from queueing.
* ``newconn`` -- a new connection, and TLS handshake, per request: at a fixed rate and at max throughput.
* ``idle`` -- ``threads`` handshaken TLS connections left idle (as Go's pool keeps them), then one request.
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import bodies as bodies_mod
from bench import harness, loadgen
from bench.stats import latency_summary, spread

ENDPOINTS = ("noop", "validate", "mutate")
# Which (endpoint, body) answers carry a patch: /mutate patches new GPU pods only.
PATCHED = {("mutate", "seed"), ("mutate", "pod10"), ("mutate", "pod50")}


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    fixed_rates: tuple[int, ...] = (200, 500)
    fixed_duration: float = 8.0
    max_rounds: int = 6  # short and many: the ratio to /noop compares runs seconds apart
    max_duration: float = 3.0
    workers: int = 8  # concurrent requests in max mode; also the client's connection cap (= server threads)
    sweep_rate: int = 50
    sweep_duration: float = 4.0
    sweep_rounds: int = 2
    sweep_bodies: tuple[str, ...] = tuple(bodies_mod.BODIES)
    newconn_rate: int = 200
    newconn_duration: float = 6.0
    newconn_max_duration: float = 4.0
    newconn_rounds: int = 2
    warmup: float = 2.0
    timeout: float = 10.0
    idle_probe: bool = True

    def estimate_s(self) -> float:
        n = len(ENDPOINTS)
        return (
            n * self.warmup
            + self.rounds * n * len(self.fixed_rates) * self.fixed_duration
            + self.max_rounds * n * self.max_duration
            + self.sweep_rounds * n * len(self.sweep_bodies) * self.sweep_duration
            + self.newconn_rounds * n * (self.newconn_duration + self.newconn_max_duration)
        )


FULL = Plan()
QUICK = Plan(rounds=1, max_rounds=2, sweep_rounds=1, newconn_rounds=1)
SMOKE = Plan(
    rounds=1, fixed_rates=(50,), fixed_duration=1.0, max_rounds=1, max_duration=1.0, sweep_rate=20, sweep_duration=0.5,
    sweep_rounds=1, newconn_rate=20, newconn_duration=0.5, newconn_max_duration=0.5, newconn_rounds=1,
    warmup=0.5, timeout=5.0, idle_probe=False,
)


@dataclass
class Run:
    scenario: str
    endpoint: str
    body: str
    round: int
    rate: int
    keepalive: bool
    requests: int = 0
    ok: int = 0
    non_200: int = 0
    bad_answers: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    throughput_rps: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    server_cpu_s: float = 0.0
    server_cpu_us_per_request: float = 0.0
    server_cpu_util: float = 0.0
    server_cpu_us_per_request_ticks: float = 0.0  # the same from /proc/<pid>/stat clock ticks
    server_core_steal: float = 0.0  # share of the server's core the hypervisor took during the run
    server_core_others: float = 0.0  # share of the server's core other processes used
    loadgen_cpu_s: float = 0.0
    loadgen_cpu_us_per_request: float = 0.0
    loadgen_cpu_util: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)  # ms; pooled, not written out


def check_answer(endpoint: str, body: str, raw: bytes, uids: set[str]) -> bool:
    """An AdmissionReview answering one of our uids, allowed, with a patch exactly when one is due."""
    try:
        response = json.loads(raw)["response"]
    except (ValueError, KeyError, TypeError):
        return False
    if response.get("uid") not in uids or response.get("allowed") is not True:
        return False
    return ("patch" in response) == ((endpoint, body) in PATCHED)


class Bench:
    def __init__(self, plan: Plan, workdir: Path, source: Path | None, log: Callable[[str], None]):
        self.plan = plan
        self.workdir = workdir
        self.source = source
        self.log = log
        self.vegeta = loadgen.find_vegeta()
        self.pins = harness.pinning()
        self.server_pin, self.loadgen_pin, self.pinning = self.pins.server, self.pins.loadgen, self.pins.description
        self.bodies = bodies_mod.bodies()
        self.uids = {name: {json.loads(b)["request"]["uid"] for b in variants}
                     for name, variants in self.bodies.items()}
        self.runs: list[Run] = []
        self.server: harness.Server | None = None

    def judge(self, endpoint: str, body: str, raw: bytes, uids: set[str]) -> bool:
        """Whether one answer (of a 200) is right; a subclass may look further (``bench.peer``: the patch's effect)."""
        return check_answer(endpoint, body, raw, uids)

    def targets(self, endpoint: str, body: str) -> Path:
        path = self.workdir / f"targets-{endpoint}-{body}.json"
        if not path.exists():
            assert self.server is not None
            # The apiserver appends the webhook's timeout to the URL it calls.
            url = f"https://127.0.0.1:{self.server.port}/{endpoint}?timeout={int(self.plan.timeout)}s"
            loadgen.write_targets(path, url, self.bodies[body])
        return path

    def run(self, scenario: str, endpoint: str, body: str, rnd: int, rate: int, duration: float,
            keepalive: bool = True, record: bool = True) -> Run:
        assert self.server is not None
        spec = loadgen.Attack(
            targets=self.targets(endpoint, body), rate=rate, duration=duration, workers=self.plan.workers,
            keepalive=keepalive, max_connections=self.server.threads, timeout=self.plan.timeout,
        )
        core = self.pins.server_cpu
        core_before = harness.cpu_times(core) if core is not None else (0, 0)
        before, before_ticks = self.server.cpu_seconds(), self.server.cpu_seconds_ticks()
        results = loadgen.attack(self.vegeta, spec, self.server.ca, self.workdir, self.loadgen_pin)
        server_cpu = self.server.cpu_seconds() - before
        server_cpu_ticks = self.server.cpu_seconds_ticks() - before_ticks
        core_after = harness.cpu_times(core) if core is not None else (0, 0)
        run = Run(scenario, endpoint, body, rnd, rate, keepalive)
        run.requests = results.count
        run.non_200 = sum(1 for c in results.codes if c != 200)
        uids = self.uids[body]
        good = [c == 200 and self.judge(endpoint, body, b, uids) for c, b in zip(results.codes, results.bodies,
                                                                                  strict=True)]
        run.ok = sum(good)
        run.bad_answers = sum(1 for c, g in zip(results.codes, good, strict=True) if c == 200 and not g)
        run.errors = results.errors
        span = results.span_s or duration
        run.throughput_rps = round(run.ok / span, 1)
        run.latencies = [ns / 1e6 for ns in results.latencies_ns]
        run.latency_ms = latency_summary(run.latencies)
        run.server_cpu_s = round(server_cpu, 3)
        run.loadgen_cpu_s = round(results.loadgen_cpu_s, 3)
        if run.requests:
            run.server_cpu_us_per_request = round(server_cpu / run.requests * 1e6, 1)
            run.loadgen_cpu_us_per_request = round(results.loadgen_cpu_s / run.requests * 1e6, 1)
        run.server_cpu_util = round(server_cpu / span, 3)
        if run.requests:
            run.server_cpu_us_per_request_ticks = round(server_cpu_ticks / run.requests * 1e6, 1)
        if core is not None and results.wall_s:
            ticks = harness.CLOCK_TICKS * results.wall_s
            busy, steal = core_after[0] - core_before[0], core_after[1] - core_before[1]
            run.server_core_steal = round(steal / ticks, 3)
            run.server_core_others = round(max(0.0, busy / harness.CLOCK_TICKS - server_cpu) / results.wall_s, 3)
        run.loadgen_cpu_util = round(results.loadgen_cpu_s / span, 3)
        mode = f"{rate} rps" if rate else f"max x{self.plan.workers}"
        conn = "keep-alive" if keepalive else "new conn"
        self.log(
            f"  {scenario:11s} r{rnd} {endpoint:8s} {body:10s} {mode:8s} {conn:10s}"
            f" {run.requests:6d} req {run.throughput_rps:7.1f} rps  p50 {run.latency_ms['p50']:7.2f}"
            f"  p99 {run.latency_ms['p99']:7.2f} ms  cpu {run.server_cpu_us_per_request:6.0f} us/req"
            + f"  steal {run.server_core_steal:.0%} others {run.server_core_others:.0%}"
            + (f"  NOT OK: {run.requests - run.ok}" if run.ok != run.requests else "")
        )
        if record:
            self.runs.append(run)
        return run

    def execute(self) -> dict:
        plan = self.plan
        started = datetime.datetime.now(datetime.UTC)
        info = harness.machine()
        self.code = code_version(self.source)  # now: the checkout may move on while the run goes
        certs = harness.make_certs(self.workdir, self.source)
        self.server = harness.start_server(self.workdir, certs, self.server_pin, self.source)
        self.log(f"server pid {self.server.pid}, worker {self.server.workers()}, {self.pinning}; "
                 f"about {plan.estimate_s():.0f} s of load")
        memory_start = harness.memory_mb(self.server.workers()[0])
        idle: dict | None = None
        try:
            for endpoint in ENDPOINTS:  # warm the worker: imports, caches, connection pool
                self.run("warmup", endpoint, "seed", 0, 100, plan.warmup, record=False)
            for rnd in range(max(plan.rounds, plan.max_rounds)):
                if rnd < plan.rounds:
                    for endpoint in rotate(ENDPOINTS, rnd):
                        for rate in plan.fixed_rates:
                            self.run("fixed", endpoint, "seed", rnd, rate, plan.fixed_duration)
                if rnd < plan.max_rounds:
                    for endpoint in rotate(ENDPOINTS, rnd):
                        self.run("max", endpoint, "seed", rnd, 0, plan.max_duration)
            for rnd in range(plan.sweep_rounds):
                for body in plan.sweep_bodies:
                    for endpoint in rotate(ENDPOINTS, rnd):
                        self.run("sweep", endpoint, body, rnd, plan.sweep_rate, plan.sweep_duration)
            for rnd in range(plan.newconn_rounds):
                for endpoint in rotate(ENDPOINTS, rnd):
                    self.run("newconn", endpoint, "seed", rnd, plan.newconn_rate, plan.newconn_duration, False)
                    self.run("newconn-max", endpoint, "seed", rnd, 0, plan.newconn_max_duration, False)
            worker = self.server.workers()[0]
            memory_end = harness.memory_mb(worker)
            memory_master = harness.memory_mb(self.server.pid)
            self.gc = self.server.full_collections()
            self.log(f"  full garbage collections in the worker: {self.gc}")
            if plan.idle_probe:
                idle = harness.idle_connection_probe(self.server, self.server.threads)
                self.log(f"  idle TLS connections: {idle}")
        finally:
            self.server.stop()
        info["loadavg_end"] = harness._loadavg()
        return self.summarise(info, started, memory_start, memory_end, memory_master, idle)

    def summarise(self, info: dict, started: datetime.datetime, memory_start: dict, memory_end: dict,
                  memory_master: dict, idle: dict | None) -> dict:
        plan = self.plan

        def runs(scenario: str, endpoint: str, body: str = "seed", rate: int | None = None) -> list[Run]:
            return [r for r in self.runs if r.scenario == scenario and r.endpoint == endpoint and r.body == body
                    and (rate is None or r.rate == rate)]

        def pooled(selected: list[Run]) -> dict:
            latencies = [x for r in selected for x in r.latencies]
            return {
                "requests": sum(r.requests for r in selected),
                "ok": sum(r.ok for r in selected),
                "latency_ms": latency_summary(latencies),
                "p99_ms_by_round": spread([r.latency_ms["p99"] for r in selected]),
                "throughput_rps": spread([r.throughput_rps for r in selected], 1),
                "server_cpu_us_per_request": spread([r.server_cpu_us_per_request for r in selected], 1),
                "server_cpu_util": spread([r.server_cpu_util for r in selected]),
                "loadgen_cpu_util": spread([r.loadgen_cpu_util for r in selected]),
                "loadgen_cpu_us_per_request": spread([r.loadgen_cpu_us_per_request for r in selected], 1),
                "server_core_steal": spread([r.server_core_steal for r in selected]),
                "server_core_others": spread([r.server_core_others for r in selected]),
            }

        fixed = {str(rate): {e: pooled(runs("fixed", e, rate=rate)) for e in ENDPOINTS} for rate in plan.fixed_rates}
        maxed = {e: pooled(runs("max", e)) for e in ENDPOINTS}
        for e in ENDPOINTS:
            ratios = [r.throughput_rps / n.throughput_rps for r, n in zip(runs("max", e), runs("max", "noop"),
                                                                             strict=True) if n.throughput_rps]
            maxed[e]["ratio_to_noop"] = spread(ratios)
        sweep = {e: {b: pooled(runs("sweep", e, b)) for b in plan.sweep_bodies} for e in ENDPOINTS}
        growth = {}
        for e in ENDPOINTS:
            one, fifty = sweep[e].get("seed"), sweep[e].get("pod50")
            if one and fifty:
                growth[e] = {q: round(fifty["latency_ms"][q] / one["latency_ms"][q], 2) for q in ("p50", "p99")}
        newconn = {e: pooled(runs("newconn", e)) for e in ENDPOINTS}
        newconn_max = {e: pooled(runs("newconn-max", e)) for e in ENDPOINTS}
        handshake = {}
        keepalive_rate = str(plan.newconn_rate)
        for e in ENDPOINTS:
            reference = fixed.get(keepalive_rate, {}).get(e)
            if reference:
                handshake[e] = {
                    "p50_ms_added": round(newconn[e]["latency_ms"]["p50"] - reference["latency_ms"]["p50"], 3),
                    "server_cpu_us_added": round(newconn[e]["server_cpu_us_per_request"]["median"]
                                                 - reference["server_cpu_us_per_request"]["median"], 1),
                }
        all_runs = self.runs
        timed = [r for r in all_runs if r.scenario != "warmup"]
        interference = {
            "server_core_steal": spread([r.server_core_steal for r in timed]),
            "server_core_others": spread([r.server_core_others for r in timed]),
        }
        summary = {
            "schema": 1,
            "started": started.isoformat(timespec="seconds"),
            "seconds": round((datetime.datetime.now(datetime.UTC) - started).total_seconds(), 1),
            "machine": {**info, "pinning": self.pinning, "interference": interference},
            "code": self.code,
            "server": {"workers": 1, "threads": self.server.threads if self.server else None,
                       "stack": "webhook.serving.server.serve: gunicorn master, AsyncWorker on uvloop, TLS, metrics, "
                                "decision logs"},
            "loadgen": {"tool": f"vegeta {loadgen.VEGETA_VERSION}", "http": "HTTP/1.1 (http2=false)",
                        "idle_connections": 25, "max_connections": self.server.threads if self.server else None,
                        "max_mode_workers": plan.workers, "timeout_s": plan.timeout},
            "plan": asdict(plan),
            "bodies": {name: {"bytes": len(v[0]), "what": bodies_mod.BODIES[name]} for name, v in self.bodies.items()},
            "all_ok": all(r.ok == r.requests and r.requests > 0 for r in all_runs),
            "requests": sum(r.requests for r in all_runs),
            "fixed_rate": fixed,
            "max_throughput": maxed,
            "sweep": {"rate": plan.sweep_rate, "by_endpoint": sweep, "growth_1_to_50": growth},
            "new_connection": {"rate": plan.newconn_rate, "fixed": newconn, "max": newconn_max,
                               "handshake_cost": handshake},
            "idle_connection_probe": idle,
            "full_gc": getattr(self, "gc", None),
            "memory_mb": {"worker_start": memory_start, "worker_end": memory_end, "master_end": memory_master},
            "runs": [{k: v for k, v in asdict(r).items() if k != "latencies"} for r in all_runs],
        }
        summary["generator"] = generator_verdict(all_runs)
        summary["targets"] = targets(summary)
        return summary


def rotate(items: tuple[str, ...], n: int) -> tuple[str, ...]:
    n %= len(items)
    return items[n:] + items[:n]


def generator_verdict(runs: list[Run]) -> dict:
    """The generator is not the bottleneck when the server's core is saturated and the generator's is not.

    The server's core counts as busy with the server's own time plus what the hypervisor stole and other
    processes took: on a shared machine those, not the generator, are what leave the server idle."""
    maxed = [r for r in runs if r.scenario == "max"]
    if not maxed:
        return {}
    server = statistics.median(r.server_cpu_util for r in maxed)
    busy = statistics.median(r.server_cpu_util + r.server_core_steal + r.server_core_others for r in maxed)
    gen = max(r.loadgen_cpu_util for r in maxed)
    return {
        "server_cpu_util_median": round(server, 3),
        "server_core_busy_median": round(busy, 3),
        "loadgen_cpu_util_max": round(gen, 3),
        "loadgen_cpu_us_per_request_median": statistics.median(r.loadgen_cpu_us_per_request for r in maxed),
        "not_the_bottleneck": bool(busy >= 0.9 and gen <= 0.7),
        "how": "in max-throughput runs the server's core was busy (server + steal + other processes) >= 90% "
               "of the time while vegeta, pinned to the other core, used <= 70% of its core "
               "(server time from /proc/<pid>/task/*/schedstat, vegeta's from wait4, over each run's span)",
    }


def targets(s: dict) -> list[dict]:
    out = []

    def add(name: str, value: float, limit: float, unit: str, ok: bool) -> None:
        out.append({"target": name, "value": value, "limit": limit, "unit": unit, "met": bool(ok)})

    m = s["max_throughput"]["mutate"]["ratio_to_noop"]["median"]
    add("/mutate throughput >= 0.85x no-op", m, 0.85, "x", m >= 0.85)
    if "500" in s["fixed_rate"]:
        p99 = s["fixed_rate"]["500"]["mutate"]["latency_ms"]["p99"]
        add("/mutate p99 <= 5 ms at 500 rps", p99, 5.0, "ms", p99 <= 5.0)
    rss = s["memory_mb"]["worker_end"].get("VmRSS", float("nan"))
    add("RSS <= 40 MB per worker", rss, 40.0, "MB", rss <= 40.0)
    for e in ("validate", "mutate"):
        g = s["sweep"]["growth_1_to_50"].get(e, {}).get("p50")
        if g is not None:
            add(f"/{e} p50 latency at 50 containers <= 2x at 1", g, 2.0, "x", g <= 2.0)
    return out


def code_version(source: Path | None) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=harness.REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", "webhook"))
    return {"commit": commit, "webhook_dirty": dirty, "source": str(source) if source else "webhook/ of this checkout"}


def apply_patches(patches: list[Path], into: Path) -> Path:
    """A copy of this checkout's webhook/ with ``patches`` applied (git apply), to measure proposed fixes."""
    import shutil

    shutil.copytree(harness.REPO / "webhook", into / "webhook", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in patches:
        subprocess.run(["git", "apply", str(patch.resolve())], cwd=into, check=True)
    return into


def run(plan: Plan, source: Path | None = None, patches: list[Path] | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpu-webhook-bench-") as tmp:
        workdir = Path(tmp)
        if patches:
            source = apply_patches(patches, workdir / "src")
        summary = Bench(plan, workdir, source, log).execute()
        if patches:
            summary["code"]["source"] = "webhook/ of this checkout with " + ", ".join(p.name for p in patches)
            summary["code"]["patches"] = [str(p) for p in patches]
        return summary

