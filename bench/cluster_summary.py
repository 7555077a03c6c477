"""status.cluster for a large generated cluster (bench/cluster_view_memory.py's Nodes, ResourceSlices and
DeviceClass, and two RuntimeClasses): the summary's size, the time to make it, the memory the status writer's
facts hold, and how many status writes a churn of node add and remove events causes under the rate bound.

    .venv/bin/python bench/cluster_summary.py [--nodes 5000 15000] [--dra-share 0.5] [--events 1200 --rate 10]

The writer is the real one (``serving.policystatus.StatusWriter`` over ``serving.clusterfacts.ClusterFacts``),
its informers listed from an in-memory source and its clock simulated; the churn's events are applied as the
watch applies them, and the writer takes a turn every half second of simulated time.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

from bench.cluster_view_memory import DEVICE_CLASS, MODELS, generated_node, generated_slice
from webhook.core import clustersummary, clusterview
from webhook.core.policyfile import parse_policy
from webhook.serving.clusterfacts import KINDS, ClusterFacts
from webhook.serving.policyobject import PolicyObject, StatusSettings
from webhook.serving.policystatus import StatusWriter
from webhook.telemetry import logs

POLICY = parse_policy("cluster: {enabled: true}\n", "bench")
RUNTIME_CLASSES = [
    {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia",
     "scheduling": {"nodeSelector": {"nvidia.com/gpu.present": "true"}}},
    {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc"}, "handler": "runc"},
]


class Source:
    def __init__(self, objects: list[Mapping[str, Any]]):
        self.by_path = {k.path: [o for o in objects if o.get("kind") == k.kind] for k in KINDS}

    def list(self, path: str) -> tuple[list[Mapping[str, Any]], str]:
        return self.by_path.pop(path, []), "1"  # listed once; kept by the indices alone after

    def watch(self, path: str, resource_version: str, timeout: int) -> Any:
        return iter(())


class Lease:
    namespace, name, identity = "bench", "gpu-webhook-status", "bench-writer"

    def acquire(self, now: float) -> bool:
        return True

    def renew(self, now: float) -> bool:
        return True

    def release(self, now: float, finished: bool) -> None:
        pass


def _apply(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _apply(out.get(key), value)
    return out


class Kube:
    """The status subresource of one object: a PATCH is merged into it and its watch brings it back."""

    def __init__(self, obj: PolicyObject):
        self.obj = obj
        self.writes: list[int] = []  # the size of each status.cluster patch
        self.version = 1

    def get(self, path: str, query: Any = None) -> dict[str, Any]:
        if path == "/version":
            return {"major": "1", "minor": "34"}
        return {"items": [], "resources": []}

    def request(self, method: str, path: str, query: Any, body: Mapping[str, Any], content_type: str) -> Any:
        current = dict(self.obj.snapshot().obj or {})
        status = body["status"]
        if "cluster" in status:
            self.writes.append(len(json.dumps(status["cluster"])))
        self.version += 1
        merged = _apply(current.get("status"), status)
        self.obj.apply("MODIFIED", {**current, "status": merged,
                                    "metadata": {**current["metadata"], "resourceVersion": str(self.version)}})
        return {}


def objects_of(nodes: int, dra_share: float) -> tuple[str, set[int]]:
    dra = {i for i in range(nodes) if MODELS[i % len(MODELS)] and (i * 7919 % 100) < dra_share * 100}
    wire = json.dumps([generated_node(i, i in dra) for i in range(nodes)]
                      + [generated_slice(i) for i in sorted(dra)] + [DEVICE_CLASS] + RUNTIME_CLASSES)
    return wire, dra


def loaded_facts(wire: str, every: float) -> ClusterFacts:
    facts = ClusterFacts(Source(json.loads(wire)), every, start=False)
    facts.follow(POLICY)
    for informer in facts.informers:
        informer.relist()
    return facts


def measure(nodes: int, dra_share: float, events: int, rate: float, every: float) -> dict[str, Any]:
    wire, dra = objects_of(nodes, dra_share)
    facts = loaded_facts(wire, every)
    known = facts.known()
    assert facts.state is not None and known is not None
    # The time to make it: the view's capacity counted again (the selectors evaluated on every device) and the
    # summary; cel-python's caches cleared first, so the first build pays what a new writer pays.
    clusterview._evaluate.cache_clear()
    clusterview._mentioned.cache_clear()
    started, cpu = time.perf_counter(), time.process_time()
    summary = clustersummary.summarize(clustersummary.view_of(facts.state, known), known, POLICY.default.is_gpu)
    wall_ms, cpu_ms = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
    written = {**summary, "writtenAt": "2026-01-01T00:00:00Z", "writer": "gpu-webhook-7d9f8b6c5-x2x4z_0123abcd"}
    size = len(json.dumps(written, separators=(",", ":")))
    del facts
    gc.collect()

    # Memory: what the writer's facts hold once listed (the decoded objects dropped), and the peak while the
    # summary is made from them.
    tracemalloc.start()
    facts = loaded_facts(wire, every)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    known = facts.known()
    assert facts.state is not None and known is not None
    clustersummary.summarize(clustersummary.view_of(facts.state, known), known, POLICY.default.is_gpu)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del facts
    gc.collect()

    # The churn, through the real writer: a GPU node added, then one removed, ``rate`` events a second.
    obj = PolicyObject("default", lambda: POLICY, check=lambda text, source: parse_policy(text, source),
                       publish=False)
    obj.replace([{"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy",
                  "metadata": {"name": "default", "generation": 1, "resourceVersion": "1"},
                  "spec": {"cluster": {"enabled": True}}}])
    kube = Kube(obj)
    facts = ClusterFacts(Source(json.loads(wire)), every, start=False)
    writer = StatusWriter(kube, StatusSettings(cluster_interval=every), obj, Lease(),  # type: ignore[arg-type]
                          facts=facts)
    now = 1000.0
    writer.step(now)  # the Lease, the informers
    for informer in facts.informers:
        informer.relist()
    writer.step(now + 3)  # the first summary written (the status was written at ``now``: 2 s between writes)
    first_writes = len(kube.writes)
    assert first_writes == 1
    index = facts.state.indices["nodes"] if facts.state is not None else None
    assert index is not None
    gpu_nodes = [i for i in range(nodes) if MODELS[i % len(MODELS)]]
    now += 3
    step_every, next_step, made = 0.5, now + 0.5, facts.computations
    started, cpu = time.perf_counter(), time.process_time()
    for n in range(events):
        t = now + n / rate
        if n % 2 == 0:
            index.apply("ADDED", generated_node(nodes + n, False))
        else:
            gone = gpu_nodes[(n * 7919) % len(gpu_nodes)]
            index.apply("DELETED", {"metadata": {"name": f"node-{gone:05d}"}})
        while next_step <= t:
            writer.step(next_step)
            next_step += step_every
    churn_s = events / rate
    while next_step <= now + churn_s + every:  # then quiet: the churn's last state is written within the bound
        writer.step(next_step)
        next_step += step_every
    churn_wall = time.perf_counter() - started
    churn_cpu = time.process_time() - cpu
    writes = kube.writes[first_writes:]
    return {
        "nodes": nodes, "resourceslices": len(dra), "devices": 8 * len(dra),
        "summary_bytes": size, "models": len(summary["models"]), "truncated": summary.get("truncated", []),
        "make_ms": round(wall_ms), "make_cpu_ms": round(cpu_ms),
        "facts_held_mib": round(held / 2**20, 1), "peak_while_making_mib": round(peak / 2**20, 1),
        "churn_events": events, "churn_seconds": churn_s, "churn_summaries_made": facts.computations - made,
        "churn_cluster_writes": len(writes), "bound_writes": int((churn_s + every) // every) + 1,
        "remake_cpu_ms": round(churn_cpu * 1000 / max(1, facts.computations - made)),
        "churn_patch_bytes_max": max(writes, default=0),
        "churn_cpu_s": round(churn_cpu, 2), "churn_wall_s": round(churn_wall, 2),
        "core_share": round(churn_cpu / (churn_s + every), 3),  # CPU seconds per second of the churn and the quiet
        "last_gap_s": round(facts.gap, 2),  # the least time after the last make before the next
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 15000])
    parser.add_argument("--dra-share", type=float, default=0.5)
    parser.add_argument("--events", type=int, default=1200, help="node add and remove events of the churn")
    parser.add_argument("--rate", type=float, default=10.0, help="events per second of simulated time")
    parser.add_argument("--every", type=float, default=StatusSettings().cluster_interval)
    args = parser.parse_args()
    logs.threshold = logging.WARNING
    for nodes in args.nodes:
        print(json.dumps(measure(nodes, args.dra_share, args.events, args.rate, args.every)), flush=True)


if __name__ == "__main__":
    main()
