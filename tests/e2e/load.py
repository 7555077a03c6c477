"""A steady stream of GPU pod creations (server-side dry run) against a bed's apiserver, for tests that change
the webhook's Deployment, policy or certificate while admissions go on and count what failed.

Each request is ``POST /api/v1/namespaces/<ns>/pods?dryRun=All`` with a one-GPU pod that names no accelerator,
so the apiserver calls both webhooks (mutate, validate) through their Service and the answer carries the
nodeSelector the policy in force injected. ``pods`` replaces that pod: request ``index`` sends ``pods(index)``,
a (namespace, pod) pair, so a test can mix pods the policy admits and refuses and judge each answer by its index.
Requests leave at a fixed rate from a pacing thread, whatever the answers take; a few sender threads keep one
kept-alive HTTPS connection each.
"""

from __future__ import annotations

import http.client
import json
import queue
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Result:
    index: int
    sent: float  # time.monotonic()
    done: float
    status: int  # 0: no HTTP answer (connection error)
    accelerator: str | None  # the nodeSelector the webhook injected, when admitted
    error: str = ""
    warnings: tuple[str, ...] = ()  # the answer's Warning headers (warn actions of the policy in force)

    @property
    def ok(self) -> bool:
        return self.status == 201


@dataclass
class LoadReport:
    rate: float
    started: float
    stopped: float
    results: list[Result] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.results)

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if not r.ok]

    def between(self, start: float, end: float) -> list[Result]:
        return [r for r in self.results if start <= r.sent <= end]

    def latency_ms(self, quantile: float, results: list[Result] | None = None) -> float:
        """The ``quantile`` of the latencies of ``results`` (default: every request), in ms; 0.0 when none."""
        return quantile_ms(self.results if results is None else results, quantile)

    def summary(self) -> str:
        errors = Counter(f"{r.status} {r.error[:160]}" for r in self.failed)
        return (f"{self.sent} sent in {self.stopped - self.started:.1f}s at {self.rate}/s, {len(self.failed)} failed"
                f"{f' {dict(errors)}' if errors else ''}; latency p50 {self.latency_ms(0.5)} ms, "
                f"p99 {self.latency_ms(0.99)} ms, max {self.latency_ms(1.0)} ms")


def quantile_ms(results: list[Result], quantile: float) -> float:
    """The ``quantile`` (nearest rank below) of the results' latencies, in ms; 0.0 for no results."""
    values = sorted(r.done - r.sent for r in results)
    return round(1000 * values[min(len(values) - 1, int(quantile * len(values)))], 1) if values else 0.0


def gpu_pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "cuda", "image": "gw-e2e.invalid/pause:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


class AdmissionLoad:
    """``with AdmissionLoad(url, token, ca_file) as load: ...``; ``load.report`` after the block."""

    def __init__(self, url: str, token: str, ca_file: Path, namespace: str = "default", rate: float = 15.0,
                 senders: int = 6, timeout: float = 30.0, pods: Callable[[int], tuple[str, dict]] | None = None):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 443
        self.token = token
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.pods = pods or (lambda index: (namespace, gpu_pod(f"load-{index}")))
        self.rate = rate
        self.timeout = timeout
        self.senders = senders
        self.queue: queue.Queue[tuple[int, float] | None] = queue.Queue()
        self.results: list[Result] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.report: LoadReport | None = None
        self.started = 0.0

    # lifecycle
    def __enter__(self) -> AdmissionLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.started = time.monotonic()
        self.threads = [threading.Thread(target=self._send, name=f"load-{i}", daemon=True)
                        for i in range(self.senders)]
        self.threads.append(threading.Thread(target=self._pace, name="load-pace", daemon=True))
        for thread in self.threads:
            thread.start()

    def stop(self) -> LoadReport:
        if self.report is None:
            self.stopping.set()
            stopped = time.monotonic()
            for thread in self.threads:
                thread.join(self.timeout + 5)
            with self.lock:
                results = sorted(self.results, key=lambda r: r.index)
            self.report = LoadReport(self.rate, self.started, stopped, results)
        return self.report

    def count(self) -> int:
        with self.lock:
            return len(self.results)

    def snapshot(self) -> list[Result]:
        with self.lock:
            return list(self.results)

    # threads
    def _pace(self) -> None:
        index = 0
        while not self.stopping.is_set():
            due = self.started + index / self.rate
            delay = due - time.monotonic()
            if delay > 0 and self.stopping.wait(delay):
                break
            self.queue.put((index, time.monotonic()))
            index += 1
        for _ in range(self.senders):
            self.queue.put(None)

    def _send(self) -> None:
        connection: http.client.HTTPSConnection | None = None
        try:
            while (item := self.queue.get()) is not None:
                index, sent = item
                if connection is None:
                    connection = http.client.HTTPSConnection(self.host, self.port, context=self.context,
                                                             timeout=self.timeout)
                namespace, document = self.pods(index)
                body = json.dumps(document).encode()
                try:
                    connection.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All", body=body, headers={
                        "Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                        "Accept": "application/json"})
                    response = connection.getresponse()
                    data = response.read()
                    status = response.status
                    warnings = tuple(response.headers.get_all("Warning") or ())
                except (OSError, http.client.HTTPException) as exc:
                    connection.close()
                    connection = None
                    self._record(Result(index, sent, time.monotonic(), 0, None, f"{type(exc).__name__}: {exc}"))
                    continue
                done = time.monotonic()
                accelerator = error = None
                try:
                    answer = json.loads(data)
                except ValueError:
                    answer = {}
                if status == 201:
                    accelerator = ((answer.get("spec") or {}).get("nodeSelector") or {}).get("accelerator")
                else:
                    error = answer.get("message") or data[:300].decode(errors="replace")
                self._record(Result(index, sent, done, status, accelerator, error or "", warnings))
        finally:
            if connection is not None:
                connection.close()

    def _record(self, result: Result) -> None:
        with self.lock:
            self.results.append(result)
