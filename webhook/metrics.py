"""Prometheus metrics. Under gunicorn every worker writes to a shared multiprocess
directory (``PROMETHEUS_MULTIPROC_DIR``), so ``/metrics`` reports the whole server."""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

REQUESTS = Counter(
    "gpu_webhook_requests",
    "Admission requests answered, by endpoint, object kind and decision.",
    ["endpoint", "kind", "decision"],
)
LATENCY = Histogram(
    "gpu_webhook_request_duration_seconds",
    "Time from request body read to response ready.",
    ["endpoint"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
RELOADS = Counter(
    "gpu_webhook_reloads",
    "Reloads of the policy or the certificate after their files changed, by result.",
    ["what", "result"],
)

# Cluster-aware checks: the node index each worker decides from. "max" over workers: the worst one shows.
NODE_INDEX_NODES = Gauge("gpu_webhook_node_index_nodes", "Nodes in the index.", multiprocess_mode="livemax")
NODE_INDEX_AGE = Gauge(
    "gpu_webhook_node_index_age_seconds",
    "Seconds since the index last heard from the apiserver.",
    multiprocess_mode="livemax",
)
NODE_INDEX_STALE = Gauge(
    "gpu_webhook_node_index_stale",
    "1 while the node watch is down (decisions use the last index).",
    multiprocess_mode="livemax",
)


def record_reload(what: str, ok: bool) -> None:
    RELOADS.labels(what=what, result="success" if ok else "failure").inc()


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
