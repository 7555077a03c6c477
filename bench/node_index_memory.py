"""Memory and rebuild time of the node index for a large generated cluster.

    .venv/bin/python bench/node_index_memory.py [--nodes 5000]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc

from webhook.nodes import NodeIndex

MODELS = ["nvidia-l4", "nvidia-tesla-t4", "nvidia-a100", "nvidia-h100", None]


def generated_node(i: int) -> dict:
    model = MODELS[i % len(MODELS)]
    labels = {"kubernetes.io/hostname": f"node-{i:05d}", "topology.kubernetes.io/zone": f"zone-{i % 3}"}
    if model:
        labels["accelerator"] = model
    allocatable = {"cpu": "95", "memory": "380Gi", "pods": "110", "ephemeral-storage": "900Gi"}
    if model:
        allocatable["nvidia.com/gpu"] = str(8 if i % 2 else 4)
    # Shaped like `kubectl get node -o json`, status conditions and images included, as a watch delivers it.
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{i:05d}", "labels": labels, "resourceVersion": str(1000 + i)},
            "status": {"allocatable": allocatable, "capacity": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "images": [{"names": [f"image-{j}"], "sizeBytes": 1 << 20} for j in range(20)]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    args = parser.parse_args()
    wire = json.dumps([generated_node(i) for i in range(args.nodes)])
    gc.collect()
    tracemalloc.start()
    # Decode inside the traced window and drop the objects after: what stays is what the index keeps.
    nodes = json.loads(wire)
    index = NodeIndex("accelerator")
    index.replace(nodes)
    summary = index.summary()
    del nodes
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    started = time.perf_counter()
    index.apply("MODIFIED", generated_node(7) | {"metadata": {"name": "node-00007", "labels": {}}})
    index.summary()
    rebuild_ms = (time.perf_counter() - started) * 1000
    assert summary is not None
    print(json.dumps({"nodes": len(index), "index_bytes": held, "index_mib": round(held / 2**20, 2),
                      "bytes_per_node": round(held / len(index)),
                      "peak_while_loading_mib": round(peak / 2**20, 1), "summary_rebuild_ms": round(rebuild_ms, 2)}))


if __name__ == "__main__":
    main()
