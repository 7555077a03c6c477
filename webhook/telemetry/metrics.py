"""Prometheus metrics. Under gunicorn every worker writes to a shared multiprocess
directory (``PROMETHEUS_MULTIPROC_DIR``), so ``/metrics`` reports the whole server."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

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

from webhook.telemetry import logs

REQUESTS = Counter(
    "gpu_webhook_requests",
    "Admission requests answered, by endpoint, object kind and decision.",
    ["endpoint", "kind", "decision"],
)
LATENCY = Histogram(
    "gpu_webhook_request_duration_seconds",
    "Time from request body read to response ready.",
    ["endpoint"],
    # Up to 10 s: the apiserver's webhook timeouts range from 1 to 30 s (default 10).
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
REFUSED = Counter(
    "gpu_webhook_connection_refusals",
    "Requests the connection layer answered itself (400 malformed, 408 too slow, 413 too large, 431 headers).",
    ["status"],
)
RELOADS = Counter(
    "gpu_webhook_reloads",
    "Reloads of the policy or the certificate after their files changed, by result.",
    ["what", "result"],
)
VIOLATIONS = Counter(
    "gpu_webhook_violations",
    "Violations found in answered admission requests, by endpoint, rule and action (deny or warn).",
    ["endpoint", "rule", "action"],
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
# The same, per resource the cluster view watches (nodes, resourceslices, deviceclasses, ...).
INFORMER_OBJECTS = Gauge(
    "gpu_webhook_informer_objects", "Objects of this resource in the cluster view.", ["resource"],
    multiprocess_mode="livemax",
)
INFORMER_AGE = Gauge(
    "gpu_webhook_informer_age_seconds",
    "Seconds since the watch of this resource last heard from the apiserver.",
    ["resource"],
    multiprocess_mode="livemax",
)
INFORMER_STALE = Gauge(
    "gpu_webhook_informer_stale",
    "1 while the watch of this resource is down or its first list has not loaded.",
    ["resource"],
    multiprocess_mode="livemax",
)

# The periodic audit (serve --audit): set by the audit process, one per replica, after each run it made.
# Violations are "live": they leave /metrics with the process that set them (a restarted audit process
# publishes its own after its first run). The run's time, duration and size are "mostrecent", so they
# outlive a restart; across replicas take the max of the timestamp.
AUDIT_VIOLATIONS = Gauge(
    "gpu_webhook_audit_violations",
    "Violations the last audit found, by namespace, rule and action (deny or warn).",
    ["namespace", "rule", "action"],
    multiprocess_mode="livemostrecent",
)
AUDIT_LAST_RUN = Gauge(
    "gpu_webhook_audit_last_run_timestamp_seconds",
    "Unix time the last audit this replica ran finished.",
    multiprocess_mode="mostrecent",
)
AUDIT_DURATION = Gauge(
    "gpu_webhook_audit_last_run_duration_seconds",
    "Wall time of the last audit this replica ran.",
    multiprocess_mode="mostrecent",
)
AUDIT_OBJECTS = Gauge(
    "gpu_webhook_audit_objects",
    "Objects the last audit this replica ran examined.",
    multiprocess_mode="mostrecent",
)
AUDIT_REQUESTS = Gauge(
    "gpu_webhook_audit_api_requests",
    "Requests to the apiserver the last audit this replica ran made (discovery, list pages, report writes).",
    multiprocess_mode="mostrecent",
)
AUDIT_RUNS = Counter("gpu_webhook_audit_runs", "Audit runs by result (success or failure).", ["result"])

# The live policy (serve --policy-object): each worker's view of GPUPolicy/default. "max" over the live processes
# (every process that imports this module holds a 0 for an unlabelled gauge, so "min" would always read 0).
POLICY_OBJECT_PRESENT = Gauge(
    "gpu_webhook_policy_object_present",
    "1 while the GPUPolicy the webhook reads exists; 0 while it is missing or not listed yet (the webhook then "
    "serves the last good policy, or the fallback).",
    multiprocess_mode="livemax",
)
POLICY_REJECTED = Gauge(
    "gpu_webhook_policy_rejected",
    "1 while the last reload of the policy failed (the GPUPolicy's spec, or the policy file, refused): the webhook "
    "enforces the last good policy; 0 once one loads.",
    multiprocess_mode="livemax",
)
POLICY_GENERATION = Gauge(
    "gpu_webhook_policy_generation",
    "metadata.generation of the GPUPolicy whose spec the webhook enforces; 0 while it enforces the fallback.",
    multiprocess_mode="livemax",
)
# Set by the replica holding the status Lease (the others hold 0), after it reads the generated policies' bindings.
NATIVE_POLICIES_STALE = Gauge(
    "gpu_webhook_native_policies_stale",
    "1 while the generated admission policies read the GPUPolicy live but were generated from other values of its "
    "compiled keys (its NativePolicies condition says CompiledKeysChanged): they need generating again.",
    multiprocess_mode="livemax",
)
NATIVE_POLICY_GENERATION = Gauge(
    "gpu_webhook_native_policy_generation",
    "metadata.generation of the GPUPolicy the generated admission policies enforce (its status.native"
    ".observedGeneration); 0 when unknown or none are installed. Set by the replica holding the status Lease.",
    multiprocess_mode="livemax",
)
# Set in every replica, from the GPUPolicy as it sees it (webhook.core.clustersummary has the bounds).
CLUSTER_FACTS_AGE = Gauge(
    "gpu_webhook_cluster_facts_age_seconds",
    "Seconds since status.cluster.writtenAt of the GPUPolicy (the cluster's facts the generated policies read); -1 "
    "when it has none. The writer stamps it at least every 120 s.",
    multiprocess_mode="livemin",
)
CLUSTER_FACTS_STALE = Gauge(
    "gpu_webhook_cluster_facts_stale",
    "1 while cluster.enabled is on and status.cluster is missing or over 300 s old: the generated policies' cluster "
    "rules refuse nothing until it is written again.",
    multiprocess_mode="livemax",
)
POLICY_STATUS_WRITES = Counter(
    "gpu_webhook_policy_status_writes",
    "Writes of the GPUPolicy's status by this replica (the one holding the status Lease), by result.",
    ["result"],
)

# Counters whose first event matters start at 0: Prometheus' increase() needs two samples, so a series that
# appeared at 1 (the first failed reload) would go unseen by the chart's alerts.
for _what in ("policy", "certificate"):
    for _result in ("success", "failure"):
        RELOADS.labels(what=_what, result=_result)
for _result in ("success", "failure"):
    AUDIT_RUNS.labels(result=_result)
    POLICY_STATUS_WRITES.labels(result=_result)


def record_reload(what: str, ok: bool) -> None:
    RELOADS.labels(what=what, result="success" if ok else "failure").inc()
    if what == "policy":
        POLICY_REJECTED.set(0 if ok else 1)


def count_request(endpoint: str, kind: str, decision: str) -> None:
    REQUESTS.labels(endpoint=endpoint, kind=kind, decision=decision).inc()


def count_violations(endpoint: str, found: Iterable[tuple[str, str]]) -> None:
    """One count per violation of an answered request: ``found`` holds its rule and the action taken on it."""
    for rule, action in found:
        VIOLATIONS.labels(endpoint=endpoint, rule=rule, action=action).inc()


def observe_latency(endpoint: str, seconds: float) -> None:
    LATENCY.labels(endpoint=endpoint).observe(seconds)


def count_refusal(status: int) -> None:
    safely(lambda: REFUSED.labels(status=str(status)).inc())


_failed_once = False


def safely(record: Callable[..., None], *args: object) -> None:
    """Record a metric; a metrics failure (say, its directory is gone) never fails an admission."""
    global _failed_once
    try:
        record(*args)
    except (OSError, ValueError) as exc:
        if not _failed_once:
            _failed_once = True
            logs.event("metrics_failed", logging.ERROR, error=str(exc))


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
