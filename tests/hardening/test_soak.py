"""Soak: a steady rate for a while, zero errors, and a worker whose RSS, threads and descriptors do not grow.

CI runs ``GPU_WEBHOOK_SOAK_SECONDS`` (default 75) at ``GPU_WEBHOOK_SOAK_RATE`` requests per second
(default 40); the 30-minute run is in tests/hardening/README.md.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid

import pytest

from tests.hardening.harness import (
    GPU,
    Call,
    LoadClient,
    Tally,
    _review,
    rss_kib,
    standard_calls,
    start_server,
    thread_count,
    worker_pids,
)
from tests.manifests import container, pod, pytorch_job, ray_cluster, workload
from tests.server import client_context

SECONDS = float(os.environ.get("GPU_WEBHOOK_SOAK_SECONDS", "75"))
RATE = float(os.environ.get("GPU_WEBHOOK_SOAK_RATE", "40"))
WARMUP = min(20.0, SECONDS * 0.25)
WINDOW = min(10.0, SECONDS * 0.15)  # RSS is the median over this long at the start and at the end
SAMPLE_EVERY = 1.0
# Growth allowed between the two windows: allocator noise, not a leak (1 KiB per request would be 70 MiB in 30 min).
RSS_SLACK_KIB = 3 * 1024


def more_calls() -> list:
    def job() -> Call:
        uid = str(uuid.uuid4())
        return Call("/validate", _review(workload("Job", pod(container(limits={GPU: 2}))), uid), uid, True)

    def pytorch() -> Call:
        uid = str(uuid.uuid4())
        bad = pod(container("pytorch", requests={GPU: 1}))
        return Call("/validate", _review(pytorch_job(pod(container(limits={GPU: 1})), bad), uid), uid, False)

    def ray() -> Call:
        uid = str(uuid.uuid4())
        head = pod(container())
        return Call("/validate", _review(ray_cluster(head, [pod(container(limits={GPU: 1}))]), uid), uid, True)

    def warned() -> Call:
        uid = str(uuid.uuid4())
        return Call("/validate", _review(pod(container(requests={GPU: 1})), uid, namespace="research"), uid, True)

    return [*standard_calls(), job, pytorch, ray, warned]


def warm_up(port: int, context, clients: int = 16) -> int:
    """A burst of concurrent clients first, so the thread pool has grown (threads and their malloc arenas)
    before the baseline is taken: a pool filling up later would look like a leak."""
    tally, stop = Tally(), threading.Event()
    burst = [LoadClient(f"burst-{i}", port, context, more_calls(), tally, stop, time.monotonic() + 3, rate=20)
             for i in range(clients)]
    for client in burst:
        client.start()
    for client in burst:
        client.join(10)
    assert not tally.failures(), tally.summary()
    return tally.sent


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
@pytest.mark.timeout(SECONDS + 120)
def test_soak_at_a_steady_rate_has_no_errors_and_no_growth(tmp_path, figures):
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perPod: 4}\nnamespaces: {research: {enforcement: warn}}\n")
    server = start_server(tmp_path, "--policy", str(policy))
    context = client_context(server.ca)
    tally, stop = Tally(), threading.Event()
    samples: list[tuple[float, int, int, int]] = []  # (seconds since start, RSS KiB, threads, fds)
    try:
        worker = worker_pids(server.proc.pid)[0]
        burst = warm_up(server.port, context)
        started = time.monotonic()
        deadline = started + SECONDS
        clients = [
            LoadClient("keepalive-0", server.port, context, more_calls(), tally, stop, deadline, rate=RATE * 0.4),
            LoadClient("keepalive-1", server.port, context, more_calls(), tally, stop, deadline, rate=RATE * 0.4),
            LoadClient("fresh", server.port, context, more_calls(), tally, stop, deadline, rate=RATE * 0.2,
                       keep_alive=False),
        ]
        for client in clients:
            client.start()
        while time.monotonic() < deadline:
            samples.append((time.monotonic() - started, rss_kib(worker), thread_count(worker), fd_count(worker)))
            time.sleep(SAMPLE_EVERY)
        for client in clients:
            client.join(15)
        # Same worker all along: a restarted worker would hide a leak behind a fresh process.
        still = worker_pids(server.proc.pid)
    finally:
        stop.set()
        server.stop()

    first = [s for s in samples if WARMUP <= s[0] < WARMUP + WINDOW]
    last = [s for s in samples if s[0] >= SECONDS - WINDOW]
    rss_before = statistics.median(s[1] for s in first)
    rss_after = statistics.median(s[1] for s in last)
    summary = tally.summary()
    figures.update(
        seconds=SECONDS, rate_per_s=RATE, worker_pid=worker, warm_up_requests=burst,
        rss_kib_start=samples[0][1], rss_kib_before=rss_before, rss_kib_after=rss_after,
        rss_growth_kib=rss_after - rss_before, rss_kib_max=max(s[1] for s in samples),
        threads_before=first[0][2], threads_after=last[-1][2], fds_before=first[0][3], fds_after=last[-1][3],
        rss_kib_series=[s[1] for s in samples[:: max(1, len(samples) // 10)]],
        achieved_rate_per_s=round(summary["sent"] / SECONDS, 1), **summary,
    )
    assert still == [worker], f"the worker was replaced during the soak: {worker} -> {still}"
    assert summary["failed"] == 0, summary
    assert summary["sent"] >= 0.8 * RATE * SECONDS, summary
    assert rss_after - rss_before <= RSS_SLACK_KIB, f"worker RSS grew {rss_before} -> {rss_after} KiB"
    assert last[-1][3] <= first[0][3] + 5, "file descriptors leak"
    assert last[-1][2] <= max(first[0][2], 8 + 4), "threads leak"
