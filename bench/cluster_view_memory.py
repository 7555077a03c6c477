"""Memory and rebuild time of the cluster view for a large generated cluster: Nodes, and a ResourceSlice
of 8 GPUs per DRA node, selected by the NVIDIA driver's DeviceClass selector (evaluated with cel-python).

    .venv/bin/python bench/cluster_view_memory.py [--nodes 5000] [--dra-share 0.5]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

from webhook.core.cluster import ClusterState

MODELS = ["nvidia-l4", "nvidia-tesla-t4", "nvidia-a100", "nvidia-h100", None]
SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def generated_node(i: int, dra: bool) -> dict:
    model = MODELS[i % len(MODELS)]
    labels = {"kubernetes.io/hostname": f"node-{i:05d}", "topology.kubernetes.io/zone": f"zone-{i % 3}"}
    if model:
        labels["accelerator"] = model
    allocatable = {"cpu": "95", "memory": "380Gi", "pods": "110", "ephemeral-storage": "900Gi"}
    if model and not dra:
        allocatable["nvidia.com/gpu"] = str(8 if i % 2 else 4)
    # Shaped like `kubectl get node -o json`, status conditions and images included, as a watch delivers it.
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}", "labels": labels, "resourceVersion": str(1000 + i)},
            "status": {"allocatable": allocatable, "capacity": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "images": [{"names": [f"image-{j}"], "sizeBytes": 1 << 20} for j in range(20)]}}


def generated_slice(i: int, generation: int = 1) -> dict:
    node = f"node-{i:05d}"
    devices = [{"name": f"gpu-{j}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{i:05d}-{j}"}, "productName": {"string": "NVIDIA L4"},
        "architecture": {"string": "Ada Lovelace"}, "driverVersion": {"version": "580.65.6"},
        "cudaComputeCapability": {"version": "8.9.0"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{j:02x}:00.0"},
    }, "capacity": {"memory": {"value": "23034Mi"}}} for j in range(8)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-abcde", "resourceVersion": str(9000 + i)},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "devices": devices}}


DEVICE_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "gpu.nvidia.com", "creationTimestamp": "2026-12-01T00:00:00Z"},
                "spec": {"selectors": [{"cel": {"expression": SELECTOR}}], "extendedResourceName": "nvidia.com/gpu"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--dra-share", type=float, default=0.5, help="share of GPU nodes whose GPUs are in slices")
    args = parser.parse_args()
    dra = {i for i in range(args.nodes) if MODELS[i % len(MODELS)] and (i * 7919 % 100) < args.dra_share * 100}
    wire = json.dumps({"nodes": [generated_node(i, i in dra) for i in range(args.nodes)],
                       "slices": [generated_slice(i) for i in sorted(dra)]})
    # Timed without tracemalloc (it slows allocation-heavy code several times over)...
    objects = json.loads(wire)
    started = time.perf_counter()
    timed = ClusterState("accelerator")
    timed.load(objects["nodes"] + objects["slices"] + [DEVICE_CLASS])
    timed.view()
    first_ms = (time.perf_counter() - started) * 1000
    del objects, timed
    gc.collect()
    # ... and measured with it: decode inside the traced window and drop the objects after, so what stays
    # is what the view keeps.
    tracemalloc.start()
    objects = json.loads(wire)
    state = ClusterState("accelerator")
    state.load(objects["nodes"] + objects["slices"] + [DEVICE_CLASS])
    state.known = frozenset(state.indices)
    view = state.view()
    del objects
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert view is not None
    started = time.perf_counter()
    some = min(dra)
    state.indices["resourceslices"].apply("MODIFIED", generated_slice(some, generation=2))
    state.view()
    slice_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    state.indices["resourceclaimtemplates"].apply("ADDED", {"metadata": {"namespace": "a", "name": "t"},
                                                            "spec": {"spec": {}}})
    state.view()
    claim_ms = (time.perf_counter() - started) * 1000
    devices = view.class_devices["gpu.nvidia.com"]
    print(json.dumps({"nodes": args.nodes, "resourceslices": len(dra), "devices": 8 * len(dra),
                      "view_mib": round(held / 2**20, 2), "peak_while_loading_mib": round(peak / 2**20, 1),
                      "first_build_ms": round(first_ms), "rebuild_after_slice_change_ms": round(slice_ms),
                      "rebuild_after_template_change_ms": round(claim_ms, 2),
                      "largest_gpu_on_a_node": view.nodes.total.largest.get("nvidia.com/gpu"),
                      "class_counted_by": devices.counted_by}))


if __name__ == "__main__":
    main()
