"""Beside a Go controller-runtime peer: our server (A) and ``bench/peer`` (B, the same rules written the
idiomatic controller-runtime way) up at once on the same core with the same certificate, driven alternately
(A B B A ...) with the same AdmissionReview bodies, at max throughput and at a fixed rate.

    python -m bench.peer              # about 6 minutes -> bench/results/peer.json, a section of bench/README.md
    python -m bench.peer --smoke      # ~15 s; fails unless every answer of both sides was right
    python -m bench --peer            # the same as the first

Before any load both are asked the same questions (the bench's bodies and a set of rule cases) and must give
the same decisions; a patch is compared by its effect (applied to the object, then normalised). Under load
every answer is judged as the rest of the bench judges them, and every distinct patch by its effect.
The peer is built by ``bench/install-peer`` (``tests/prepare bench-peer``).
"""

from __future__ import annotations

import argparse
import base64
import copy
import datetime
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonpatch

from bench import bodies as bodies_mod
from bench import harness, loadgen, report, runner
from bench.stats import latency_summary, spread
from tests import manifests

RESULTS = harness.REPO / "bench" / "results"
README = harness.REPO / "bench" / "README.md"
PEER_DIR = harness.REPO / "bench" / "peer"
START, END = "<!-- bench:peer:start -->", "<!-- bench:peer:end -->"
BINARY = "gpu-webhook-peer"
SIDES = ("ours", "peer")
GPU = "nvidia.com/gpu"
ANNOTATION = "gpu-webhook/accelerator"


class PeerMissing(RuntimeError):
    pass


def find_peer() -> Path:
    """The binary ``bench/install-peer`` builds (never one on PATH: it must be built from bench/peer)."""
    built = loadgen.bin_dir() / BINARY
    if built.is_file() and os.access(built, os.X_OK):
        return built
    raise PeerMissing(f"{BINARY} not found in {loadgen.bin_dir()}")


@dataclass(frozen=True)
class PeerPlan:
    rounds: int = 6  # each round: both sides, order flipped every round (A B, B A, ...)
    rate: int = 500
    fixed_duration: float = 6.0
    max_duration: float = 3.0
    warmup: float = 2.0
    endpoints: tuple[str, ...] = ("noop", "validate", "mutate")
    connections: int = 8  # vegeta's connection cap and its concurrency at max throughput
    timeout: float = 10.0

    def estimate_s(self) -> float:
        return len(SIDES) * len(self.endpoints) * (self.warmup + self.rounds * (self.fixed_duration
                                                                                + self.max_duration))


# A run counts as quiet when other processes took at most this share of the server's core, and the hypervisor
# at most that: the machine is shared, and a run that got half a core measures the neighbours.
QUIET_OTHERS, QUIET_STEAL = 0.10, 0.05

FULL = PeerPlan()
SMOKE = PeerPlan(rounds=1, fixed_duration=1.0, max_duration=1.0, warmup=0.5, endpoints=("validate", "mutate"))


def normalised(value: Any) -> Any:
    """A JSON value as its effect is compared: numbers as text (``1`` and ``"1"`` are one quantity to the
    apiserver), and nulls, empty objects and empty lists dropped from objects (``status: {}`` changes nothing)."""
    if isinstance(value, dict):
        kept = {k: normalised(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {} and v != []}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def answer(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)["response"]


def effect(obj: dict[str, Any], response: dict[str, Any]) -> Any:
    """The object as the apiserver would store it after the response's patch (normalised); the object if none."""
    patch = response.get("patch")
    if patch is None:
        return normalised(obj)
    return normalised(jsonpatch.apply_patch(obj, json.loads(base64.b64decode(patch))))


def intended(obj: dict[str, Any]) -> Any:
    """What /mutate should make of ``obj`` under the default policy: our own rules, in process."""
    from webhook.core.policyfile import load_policy
    from webhook.rules.mutate import mutated_pod

    if obj.get("kind") != "Pod" or obj.get("apiVersion") != "v1":
        return normalised(obj)
    return normalised(mutated_pod(obj, load_policy(None).default))


class PeerBench(runner.Bench):
    """One side: the bench's runs against one server; a /mutate answer is right only if its patch, applied to
    the object sent, gives what our rules intend (each distinct patch is checked once)."""

    def __init__(self, plan: runner.Plan, workdir: Path, log: Callable[[str], None]):
        super().__init__(plan, workdir, None, log)
        self.objects = {name: json.loads(v[0])["request"]["object"] for name, v in self.bodies.items()}
        self.expected = {name: intended(obj) for name, obj in self.objects.items()}
        self.patches: dict[tuple[str, str], bool] = {}

    def judge(self, endpoint: str, body: str, raw: bytes, uids: set[str]) -> bool:
        if not runner.check_answer(endpoint, body, raw, uids):
            return False
        if endpoint != "mutate":
            return True
        response = answer(raw)
        key = (body, response.get("patch", ""))
        if key not in self.patches:
            self.patches[key] = effect(self.objects[body], response) == self.expected[body]
        return self.patches[key]


# ---------------------------------------------------------------------------------------------- parity


def _pod(*containers: dict, annotations: dict | None = None, **spec: Any) -> dict:
    return manifests.pod(*containers, name="p", annotations=annotations, **spec)


def _gpu(limits: dict | None = None, requests: dict | None = None, name: str = "main") -> dict:
    return manifests.container(name, limits=limits, requests=requests)


def _dressed(obj: dict) -> dict:
    """``obj`` as the apiserver sends it (bench/bodies.py; a CronJob's template is one level deeper)."""
    if obj["kind"] != "CronJob":
        return bodies_mod.apiserver_object(obj)
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = "default"
    template = obj["spec"]["jobTemplate"]["spec"]["template"]
    template["spec"] = bodies_mod.apiserver_pod_spec(template["spec"])
    return obj


def parity_cases() -> list[tuple[str, dict, bool]]:
    """(what, AdmissionReview, whether both must agree): the bench's bodies, then one case per rule."""
    a100 = {ANNOTATION: "nvidia-a100"}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["nvidia-a100"]}]}]}}}
    debug = {"name": "debug", "image": "busybox", "resources": {"limits": {GPU: "1"}}}
    rules: list[tuple[str, dict, bool]] = [
        ("requests without limits", _pod(_gpu(requests={GPU: "1"})), True),
        ("fractional limit", _pod(_gpu({GPU: "0.5"})), True),
        ("negative limit", _pod(_gpu({GPU: "-1"})), True),
        ("count over the ceiling (2M)", _pod(_gpu({GPU: "2M"})), True),
        ("requests differ from limits", _pod(_gpu({GPU: "2"}, {GPU: "1"})), True),
        ("requests equal limits spelt 1000m", _pod(_gpu({GPU: "1"}, {GPU: "1000m"})), True),
        ("amd.com/gpu, requests = limits", _pod(_gpu({"amd.com/gpu": "2"}, {"amd.com/gpu": "2"})), True),
        ("gpu.intel.com/i915 in limits", _pod(_gpu({"gpu.intel.com/i915": "1"})), True),
        ("nvidia.com/mig-1g.5gb in limits", _pod(_gpu({"nvidia.com/mig-1g.5gb": "2"})), True),
        # Ours warns by default (checks.mixedGpuAndMig: warn, a policy choice, not a Kubernetes rule); the peer,
        # which has no warnings, still denies it.
        ("whole GPU and MIG slice in one container", _pod(_gpu({GPU: "1", "nvidia.com/mig-1g.5gb": "1"})), False),
        ("annotation, no nodeSelector", _pod(_gpu({GPU: "1"}), annotations=a100), True),
        ("annotation conflicts with nodeSelector",
         _pod(_gpu({GPU: "1"}), annotations=a100, nodeSelector={"accelerator": "nvidia-t4"}), True),
        ("annotation agrees with nodeSelector",
         _pod(_gpu({GPU: "1"}), annotations=a100, nodeSelector={"accelerator": "nvidia-a100"}), True),
        ("annotation, accelerator in required node affinity",
         _pod(_gpu({GPU: "1"}), annotations=a100, affinity=affinity), True),
        ("annotation on a pod without GPUs", _pod(_gpu({"cpu": "1"}), annotations=a100), True),
        ("GPU in an init container", _pod(_gpu(), initContainers=[_gpu({GPU: "1"}, name="init")]), True),
        ("GPU in an ephemeral container", _pod(_gpu(), ephemeralContainers=[debug]), True),
        ("GPU in pod-level resources", _pod(_gpu(), resources={"limits": {GPU: "1"}}), True),
        ("Deployment: requests without limits",
         manifests.workload("Deployment", _pod(_gpu(requests={GPU: "1"}))), True),
        ("Job: fractional limit", manifests.workload("Job", _pod(_gpu({GPU: "0.5"}))), True),
        ("CronJob: annotation conflicts with nodeSelector", manifests.workload(
            "CronJob", _pod(_gpu({GPU: "1"}), annotations=a100, nodeSelector={"accelerator": "nvidia-t4"})), True),
        # Known differences (README.md): recorded, not required to agree.
        ("not a quantity (\"lots\")", _pod(_gpu({GPU: "lots"})), False),
    ]
    objects = [(f"bench body {n}", o, True) for n, o in bodies_mod.objects().items()]  # dressed already
    objects += [(what, _dressed(obj), same) for what, obj, same in rules]
    cases = [(what, bodies_mod.review(obj, f"00000000-0000-4000-8000-{i:012d}"), same)
             for i, (what, obj, same) in enumerate(objects)]
    old = bodies_mod.apiserver_object(_pod(_gpu({GPU: "1"})))
    new = bodies_mod.apiserver_object(_pod(_gpu({GPU: "1"}, {GPU: "2"})))
    update = bodies_mod.review(new, "00000000-0000-4000-8000-999999999999")
    update["request"].update(operation="UPDATE", oldObject=old,
                             options={"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"})
    cases.append(("UPDATE that introduces requests != limits", update, False))
    return cases


def post(server: harness.Server, path: str, document: dict) -> dict[str, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=server.context(), timeout=10)
    try:
        conn.request("POST", path, body=json.dumps(document), headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        raw = reply.read()
        if reply.status != 200:
            return {"http": reply.status}
        return answer(raw)
    finally:
        conn.close()


def check_parity(servers: dict[str, harness.Server]) -> list[dict[str, Any]]:
    """Ask both sides every case on /validate and /mutate: same decision, and for /mutate the same effect."""
    out = []
    for what, document, must_agree in parity_cases():
        obj = document["request"]["object"]
        for endpoint in ("validate", "mutate"):
            seen = {}
            for name, server in servers.items():
                response = post(server, f"/{endpoint}", document)
                if "http" in response:
                    seen[name] = {"http": response["http"]}
                    continue
                seen[name] = {
                    "allowed": response.get("allowed"),
                    "code": (response.get("status") or {}).get("code"),
                    "patched": "patch" in response,
                    "effect": effect(obj, response) if endpoint == "mutate" else None,
                }
            ours, peer = seen["ours"], seen["peer"]
            agree = ("http" not in ours and "http" not in peer and ours["allowed"] == peer["allowed"]
                     and (ours["allowed"] or ours["code"] == peer["code"]) and ours["effect"] == peer["effect"])
            out.append({
                "case": what, "endpoint": endpoint, "must_agree": must_agree, "agree": agree,
                **{name: {k: v for k, v in s.items() if k != "effect"} for name, s in seen.items()},
            })
    return out


# ---------------------------------------------------------------------------------------------- the run


def peer_build() -> dict[str, Any]:
    """The peer's pinned modules (from bench/peer/go.mod) and the Go that built it."""
    text = (PEER_DIR / "go.mod").read_text()
    pins = dict(re.findall(r"^\s*(sigs\.k8s\.io/controller-runtime|k8s\.io/api|k8s\.io/apimachinery|"
                           r"k8s\.io/client-go)\s+(v\S+)", text, re.M))
    info: dict[str, Any] = {"modules": pins}
    version = loadgen.bin_dir() / f"{BINARY}.version"
    if version.exists():
        info["source_hash"] = version.read_text().strip()
    go = shutil.which("go")
    if go:
        done = subprocess.run([go, "version", str(find_peer())], capture_output=True, text=True)
        info["go"] = done.stdout.strip().rsplit(" ", 1)[-1]
    return info


def _prefixed(log: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda line: log(prefix + line)


def run(plan: PeerPlan, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    binary = find_peer()
    started = datetime.datetime.now(datetime.UTC)
    info = harness.machine()
    code = runner.code_version(None)
    bench_plan = runner.Plan(workers=plan.connections, timeout=plan.timeout)
    with tempfile.TemporaryDirectory(prefix="gpu-webhook-peer-") as tmp:
        work = Path(tmp)
        certs = harness.make_certs(work)  # one certificate, served by both
        sides: dict[str, PeerBench] = {}
        for name in SIDES:
            (work / name).mkdir()
            sides[name] = PeerBench(bench_plan, work / name, _prefixed(log, f"{name:4s}"))
        pins = sides["ours"].pins
        try:
            sides["ours"].server = harness.start_server(work / "ours", certs, pins.server, threads=plan.connections)
            sides["peer"].server = harness.start_peer(work / "peer", certs, pins.server, binary, plan.connections)
            servers = {name: side.server for name, side in sides.items() if side.server is not None}
            log(f"ours: pid {servers['ours'].pid} (worker {servers['ours'].workers()}), peer: pid "
                f"{servers['peer'].pid}, {pins.description}; about {plan.estimate_s():.0f} s of load")
            memory_start = {name: harness.memory_mb(s.workers()[0]) for name, s in servers.items()}
            parity = check_parity(servers)
            for row in parity:
                if not row["agree"]:
                    log(f"  parity {'DIFFERS' if row['must_agree'] else 'differs (known)'}: {row['case']} "
                        f"/{row['endpoint']}: ours {row['ours']}, peer {row['peer']}")
            for name in SIDES:
                for endpoint in plan.endpoints:
                    sides[name].run("warmup", endpoint, "seed", 0, 100, plan.warmup, record=False)
            for rnd in range(plan.rounds):
                # A B B A per endpoint, and B A A B the next round: each pair of runs compared is adjacent in time.
                first, second = (sides[n] for n in (SIDES if rnd % 2 == 0 else SIDES[::-1]))
                for endpoint in runner.rotate(plan.endpoints, rnd):
                    first.run("max", endpoint, "seed", rnd, 0, plan.max_duration)
                    second.run("max", endpoint, "seed", rnd, 0, plan.max_duration)
                    second.run("fixed", endpoint, "seed", rnd, plan.rate, plan.fixed_duration)
                    first.run("fixed", endpoint, "seed", rnd, plan.rate, plan.fixed_duration)
            memory_end = {name: harness.memory_mb(s.workers()[0]) for name, s in servers.items()}
            memory_end["ours_master"] = harness.memory_mb(servers["ours"].pid)
        finally:
            for side in sides.values():
                if side.server is not None:
                    side.server.stop()
    info["loadavg_end"] = harness._loadavg()
    return summarise(plan, sides, parity, memory_start, memory_end, info, started, code, peer_build())


def summarise(plan: PeerPlan, sides: dict[str, PeerBench], parity: list[dict], memory_start: dict,
              memory_end: dict, info: dict, started: datetime.datetime, code: dict, build: dict) -> dict:
    def runs(side: str, scenario: str, endpoint: str) -> list[runner.Run]:
        return sorted((r for r in sides[side].runs if r.scenario == scenario and r.endpoint == endpoint),
                      key=lambda r: r.round)

    def quiet(selected: list[runner.Run]) -> list[runner.Run]:
        return [r for r in selected if r.server_core_others <= QUIET_OTHERS and r.server_core_steal <= QUIET_STEAL]

    def median(values: list[float], digits: int = 3) -> float | None:
        return round(statistics.median(values), digits) if values else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    by_endpoint: dict[str, Any] = {}
    for e in plan.endpoints:
        block: dict[str, Any] = {}
        for side in SIDES:
            maxed, fixed = runs(side, "max", e), runs(side, "fixed", e)
            calm_max, calm_fixed = quiet(maxed), quiet(fixed)
            block[side] = {
                "quiet": {
                    "max_runs": len(calm_max),
                    "max_rps": median([r.throughput_rps for r in calm_max], 1),
                    "fixed_runs": len(calm_fixed),
                    "fixed_p50_ms": median([r.latency_ms["p50"] for r in calm_fixed]),
                    "fixed_p99_ms": median([r.latency_ms["p99"] for r in calm_fixed]),
                },
                "max_rps": spread([r.throughput_rps for r in maxed], 1),
                "max_cpu_us_per_request": spread([r.server_cpu_us_per_request for r in maxed], 1),
                "max_server_cpu_util": spread([r.server_cpu_util for r in maxed]),
                "fixed_latency_ms": latency_summary([x for r in fixed for x in r.latencies]),
                "fixed_p50_ms_by_round": spread([r.latency_ms["p50"] for r in fixed]),
                "fixed_p99_ms_by_round": spread([r.latency_ms["p99"] for r in fixed]),
                "fixed_rps": spread([r.throughput_rps for r in fixed], 1),
                "fixed_cpu_us_per_request": spread([r.server_cpu_us_per_request for r in fixed], 1),
                "requests": sum(r.requests for r in maxed + fixed),
                "ok": sum(r.ok for r in maxed + fixed),
            }
        ours, peer = block["ours"], block["peer"]
        paired = list(zip(runs("ours", "max", e), runs("peer", "max", e), strict=True))
        paired_fixed = list(zip(runs("ours", "fixed", e), runs("peer", "fixed", e), strict=True))
        block["ours_over_peer"] = {
            "throughput_by_round": spread([o.throughput_rps / p.throughput_rps for o, p in paired
                                           if p.throughput_rps]),
            "p50_by_round": spread([o.latency_ms["p50"] / p.latency_ms["p50"] for o, p in paired_fixed
                                    if p.latency_ms["p50"]], 2),
            "quiet": {
                "max_rps": ratio(ours["quiet"]["max_rps"], peer["quiet"]["max_rps"]),
                "fixed_p50": ratio(ours["quiet"]["fixed_p50_ms"], peer["quiet"]["fixed_p50_ms"]),
                "fixed_p99": ratio(ours["quiet"]["fixed_p99_ms"], peer["quiet"]["fixed_p99_ms"]),
            },
            "p50": round(ours["fixed_latency_ms"]["p50"] / peer["fixed_latency_ms"]["p50"], 3),
            "p99": round(ours["fixed_latency_ms"]["p99"] / peer["fixed_latency_ms"]["p99"], 3),
            "p99_by_round": spread([o.latency_ms["p99"] / p.latency_ms["p99"] for o, p in paired_fixed
                                    if p.latency_ms["p99"]], 2),
            "cpu_us_per_request_fixed": round(ours["fixed_cpu_us_per_request"]["median"]
                                              / peer["fixed_cpu_us_per_request"]["median"], 2),
            # Throughput per second of server CPU: what each would do with the whole core, whatever share of it
            # other processes left in a round (the ratio of CPU per request at max, inverted).
            "throughput_per_cpu_second": round(peer["max_cpu_us_per_request"]["median"]
                                               / ours["max_cpu_us_per_request"]["median"], 2),
        }
        by_endpoint[e] = block
    timed = [r for s in sides.values() for r in s.runs]
    all_runs_ok = all(r.ok == r.requests and r.requests > 0 for r in timed)
    parity_ok = all(row["agree"] for row in parity if row["must_agree"])
    core = {side: {"server_core_others": spread([r.server_core_others for r in sides[side].runs]),
                   "server_core_steal": spread([r.server_core_steal for r in sides[side].runs])} for side in SIDES}
    return {
        "schema": 1,
        "started": started.isoformat(timespec="seconds"),
        "seconds": round((datetime.datetime.now(datetime.UTC) - started).total_seconds(), 1),
        "machine": {**info, "pinning": sides["ours"].pinning, "interference": {
            "server_core_steal": spread([r.server_core_steal for r in timed]),
            "server_core_others": spread([r.server_core_others for r in timed]),
            "by_side": core,
        }},
        "code": code,
        "peer": {"stack": "controller-runtime webhook.NewServer + admission.Webhook, Go net/http, GOMAXPROCS=1",
                 **build},
        "ours": {"stack": "webhook.serving.server.serve, one worker, TLS, metrics, decision logs"},
        "loadgen": {"tool": f"vegeta {loadgen.VEGETA_VERSION}", "http": "HTTP/1.1 (http2=false)",
                    "max_connections": plan.connections, "max_mode_workers": plan.connections},
        "plan": asdict(plan),
        "all_ok": all_runs_ok,
        "parity_ok": parity_ok,
        "requests": sum(r.requests for r in timed),
        "by_endpoint": by_endpoint,
        "memory_mb": {"start": memory_start, "end": memory_end},
        "generator": {side: runner.generator_verdict(sides[side].runs) for side in SIDES},
        "parity": parity,
        "runs": {side: [{k: v for k, v in asdict(r).items() if k != "latencies"} for r in sides[side].runs]
                 for side in SIDES},
    }


# ---------------------------------------------------------------------------------------------- report


def _range(s: dict, fmt: str = ".2f") -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}–{s['max']:{fmt}})"


def section(s: dict) -> str:
    m = s["machine"]
    rate = s["plan"]["rate"]
    steal, others = m["interference"]["server_core_steal"], m["interference"]["server_core_others"]
    peer = s["peer"]
    mods = ", ".join(f"{k} {v}" for k, v in peer.get("modules", {}).items())
    lines = [
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, Linux {m['kernel']}; {m['pinning']} (both servers on the "
        f"same core, one at a time under load); load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_start'])}. On the server's core during runs: hypervisor steal "
        f"{steal['median']:.0%} median ({steal['max']:.0%} max), other processes {others['median']:.0%} "
        f"({others['max']:.0%} max; {_others(s)}). Ours: {s['code']['commit']}, {s['code']['source']}; peer: {mods}, "
        f"{peer.get('go', 'go')}. Run {s['started']}, {s['seconds']:.0f} s, {s['requests']} requests, "
        f"{'every answer of both right' if s['all_ok'] else 'NOT ALL ANSWERS RIGHT'}; rule cases "
        f"{'agree' if s['parity_ok'] else 'DISAGREE'} "
        f"({sum(r['agree'] for r in s['parity'])} of {len(s['parity'])} answers the same).",
        "",
        f"Seed pod, {s['plan']['rounds']} rounds, each endpoint A B B A (B A A B the next round); max = "
        f"{s['plan']['connections']} connections for {s['plan']['max_duration']:.0f} s, fixed = {s['plan']['rate']} "
        f"rps for {s['plan']['fixed_duration']:.0f} s. Ratios are ours ÷ peer. *Quiet* runs are those in which other "
        f"processes took at most {QUIET_OTHERS:.0%} of the server's core (steal at most {QUIET_STEAL:.0%}); n = "
        "how many of ours / the peer's. CPU per request is the measure noise moves least.",
        "",
        "| endpoint | max rps ours / peer, median of rounds | quiet runs: max rps ours / peer (n) | ours ÷ peer "
        "throughput: per CPU-second · by round, median (range) · quiet | CPU µs/req @max ours / peer | "
        f"CPU µs/req @{rate} ours / peer |",
        "|---|---|---|---|---|---|",
    ]
    for e, b in s["by_endpoint"].items():
        o, p, r = b["ours"], b["peer"], b["ours_over_peer"]
        oq, pq = o["quiet"], p["quiet"]
        lines.append(
            f"| /{e} | {o['max_rps']['median']:.0f} / {p['max_rps']['median']:.0f} | "
            f"{_n(oq['max_rps'], '.0f')} / {_n(pq['max_rps'], '.0f')} ({oq['max_runs']} / {pq['max_runs']}) | "
            f"**{r['throughput_per_cpu_second']:.2f}** · {_range(r['throughput_by_round'])} · "
            f"{_n(r['quiet']['max_rps'], '.2f')} | "
            f"{o['max_cpu_us_per_request']['median']:.0f} / {p['max_cpu_us_per_request']['median']:.0f} | "
            f"{o['fixed_cpu_us_per_request']['median']:.0f} / {p['fixed_cpu_us_per_request']['median']:.0f} |"
        )
    lines += [
        "",
        f"| endpoint @{rate} rps | p50 ms ours / peer, pooled (ratio) | p50 ratio by round, median (range) | "
        "p99 ms ours / peer, pooled (ratio) | p99 ratio by round, median (range) | quiet runs: p50 / p99 ms ours ; "
        "peer (ratios) (n) |",
        "|---|---|---|---|---|---|",
    ]
    for e, b in s["by_endpoint"].items():
        o, p, r = b["ours"], b["peer"], b["ours_over_peer"]
        oq, pq, rq = o["quiet"], p["quiet"], r["quiet"]
        lat_o, lat_p = o["fixed_latency_ms"], p["fixed_latency_ms"]
        lines.append(
            f"| /{e} | {lat_o['p50']:.2f} / {lat_p['p50']:.2f} ({_x(r['p50'])}) | {_range(r['p50_by_round'])} | "
            f"{lat_o['p99']:.2f} / {lat_p['p99']:.2f} ({_x(r['p99'])}) | {_range(r['p99_by_round'])} | "
            f"{_n(oq['fixed_p50_ms'])} / {_n(oq['fixed_p99_ms'])} ; {_n(pq['fixed_p50_ms'])} / "
            f"{_n(pq['fixed_p99_ms'])} ({_xn(rq['fixed_p50'])}, {_xn(rq['fixed_p99'])}) "
            f"({oq['fixed_runs']} / {pq['fixed_runs']}) |"
        )
    mem_end, mem_start = s["memory_mb"]["end"], s["memory_mb"]["start"]
    lines += [
        "",
        f"- **Memory** after the run: our worker VmRSS {mem_end['ours'].get('VmRSS')} MB (Pss "
        f"{mem_end['ours'].get('Pss')}; {mem_start['ours'].get('VmRSS')} at start; the gunicorn master beside it "
        f"{mem_end['ours_master'].get('VmRSS')} MB), the peer's VmRSS {mem_end['peer'].get('VmRSS')} MB "
        f"({mem_start['peer'].get('VmRSS')} at start).",
    ]
    gen = s["generator"]
    if all(gen.values()):
        lines.append(
            "- **Load generator** in max runs: at most "
            + ", ".join(f"{gen[x]['loadgen_cpu_util_max']:.0%} of its core against {x}" for x in SIDES)
            + "; the server's core busy (server + steal + others) "
            + ", ".join(f"{gen[x]['server_core_busy_median']:.0%} ({x})" for x in SIDES) + " median."
        )
    differ = [r for r in s["parity"] if not r["agree"]]
    if differ:
        lines.append("- **Answers that differ** (rule cases; each is a difference named below): " + "; ".join(
            f"{r['case']} /{r['endpoint']}: ours {_said(r['ours'])}, peer {_said(r['peer'])}" for r in differ) + ".")
    return "\n".join(lines)


def _n(value: float | None, fmt: str = ".2f") -> str:
    return "–" if value is None else f"{value:{fmt}}"


def _xn(ratio: float | None) -> str:
    return "–" if ratio is None else _x(ratio)


def _x(ratio: float) -> str:
    return f"{ratio:.0f}×" if ratio >= 10 else f"{ratio:.2f}×" if ratio >= 0.1 else f"{ratio:.3f}×"


def _others(s: dict) -> str:
    by_side = s["machine"]["interference"].get("by_side", {})
    return "median " + ", ".join(f"{v['server_core_others']['median']:.0%} during {side}"
                                 for side, v in by_side.items())


def _said(seen: dict) -> str:
    if "http" in seen:
        return f"HTTP {seen['http']}"
    if seen["allowed"]:
        return "allowed" + (" with a patch" if seen["patched"] else "")
    return f"denied ({seen['code']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one short round of /validate and /mutate")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL.rounds})")
    parser.add_argument("--out", type=Path, help="JSON result (default: bench/results/peer.json, or peer-smoke.json)")
    parser.add_argument("--no-readme", action="store_true", help="leave bench/README.md alone")
    args = parser.parse_args(argv)
    try:
        loadgen.find_vegeta()
        find_peer()
    except (loadgen.LoadToolMissing, PeerMissing) as exc:
        print(f"bench.peer: {exc} (build with tests/prepare vegeta bench-peer)", file=sys.stderr)
        return 2
    plan = SMOKE if args.smoke else FULL
    if args.rounds:
        plan = PeerPlan(**{**asdict(plan), "rounds": args.rounds})
    out = args.out or RESULTS / ("peer-smoke.json" if args.smoke else "peer.json")
    summary = run(plan)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    text = section(summary)
    print(text)
    print(f"\nwrote {out}", file=sys.stderr)
    if not args.smoke and not args.no_readme and out.resolve().parent == RESULTS.resolve():
        report.update_readme(README, text, START, END)
    ok = summary["all_ok"] and summary["parity_ok"]
    if not ok:
        for side in SIDES:
            for r in summary["runs"][side]:
                if r["ok"] != r["requests"] or not r["requests"]:
                    print(f"bench.peer: {side} {r['scenario']} /{r['endpoint']}: {r['ok']} of {r['requests']} "
                          f"right, errors {r['errors']}", file=sys.stderr)
        return 1
    print("bench.peer: every answer of both sides right; rule cases agree", file=sys.stderr)
    return 0



if __name__ == "__main__":
    sys.exit(main())
