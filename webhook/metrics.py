"""Prometheus metrics. Under gunicorn every worker writes to a shared multiprocess
directory (``PROMETHEUS_MULTIPROC_DIR``), so ``/metrics`` reports the whole server."""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
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


def record_reload(what: str, ok: bool) -> None:
    RELOADS.labels(what=what, result="success" if ok else "failure").inc()


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
