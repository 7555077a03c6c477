"""The server's periodic audit (``serve --audit``), in a process of its own.

The gunicorn master starts ``python -m webhook.audit.loop SETTINGS`` beside its workers and restarts it when
it exits (``server.AuditProcess``). A process, not a thread in a worker: parsing a 500-object page and
deciding on each object holds the GIL for tens of milliseconds at a time, which a worker's event loop and
handler threads would wait for; in its own process the audit costs the admission path no GIL, its memory is
its own (and measured), and a crash in it takes no worker with it.

Across replicas a Lease (``webhook.kube.lease``) lets one run at a time and records when the last run finished:
a run is due ``interval`` after that, plus a random jitter of up to a tenth of the interval (at most a
minute) so replicas do not wake together. Each run reloads the policy file, audits the whole cluster (minus
the excluded namespaces), writes the reports (``scan.ReportWriter``) and sets the audit metrics.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from webhook.audit import reports
from webhook.audit.scan import PAGE_SIZE, Audit, AuditError, Progress, ReportsUnavailable, ReportWriter, Stopped
from webhook.core import gpupolicy
from webhook.core.policy import PolicySet
from webhook.core.policyfile import PolicyError, build_policy, load_policy
from webhook.kube.client import ApiError, ConfigError, Kube
from webhook.kube.lease import Lease
from webhook.telemetry import logs, metrics

MAX_JITTER = 60.0
NICENESS = 10


@dataclass(frozen=True)
class LoopSettings:
    interval: float = 3600.0
    report_kind: str = "openreports"
    lease_namespace: str = "default"
    lease_name: str = "gpu-webhook-audit"
    exclude_namespaces: tuple[str, ...] = ()
    custom: tuple[str, ...] | None = None  # GROUP/PLURAL patterns of the custom resources audited; None: all
    kubeconfig: str | None = None
    policy_file: str | None = None
    # serve --policy-object: each run audits against that GPUPolicy, the file (or the defaults) when it is missing
    policy_object: str | None = None
    lease_seconds: int = 60
    page_size: int = PAGE_SIZE

    def command(self) -> list[str]:
        return [sys.executable, "-m", "webhook.audit.loop", json.dumps(asdict(self))]

    @classmethod
    def from_json(cls, text: str) -> LoopSettings:
        values: dict[str, Any] = json.loads(text)
        values["exclude_namespaces"] = tuple(values.get("exclude_namespaces") or ())
        if values.get("custom") is not None:
            values["custom"] = tuple(values["custom"])
        return cls(**values)


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``1h``, ``30m``, ``1h30m``, ``90s``, ``500ms``) or a plain number."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    text = text.strip()
    if not text:
        raise ValueError("an empty duration")
    try:
        return float(text)
    except ValueError:
        pass
    total, number, i = 0.0, "", 0
    while i < len(text):
        if text[i].isdigit() or text[i] == ".":
            number += text[i]
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else text[i]
        if unit not in units or not number:
            raise ValueError(f"{text!r} is not a duration (like 1h, 30m, 90s)")
        total += float(number) * units[unit]
        number, i = "", i + len(unit)
    if number:
        raise ValueError(f"{text!r} has a number without a unit (h, m, s, ms)")
    return total


@dataclass
class _Published:
    series: set[tuple[str, str, str]] = field(default_factory=set)


class AuditLoop:
    def __init__(self, settings: LoopSettings, kube: Kube, identity: str | None = None):
        self.settings = settings
        self.kube = kube
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.lease = Lease(kube, settings.lease_namespace, settings.lease_name, self.identity, settings.lease_seconds)
        self.stop = threading.Event()
        self.lost = threading.Event()
        self.policies: PolicySet | None = None
        self.published = _Published()
        self.jitter = min(settings.interval / 10, MAX_JITTER)
        self.parent = os.getppid()

    # -- scheduling -----------------------------------------------------------------------------------

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True when asked to stop (also when the server that started us is gone)."""
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            if os.getppid() != self.parent:
                self.stop.set()
                break
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.stop.wait(min(left, 2.0))
        return True

    def due_in(self, now: float) -> float:
        """Seconds until the next run is due, by the Lease; 0 when it is due now."""
        state = self.lease.read()
        if state is None:
            return 0.0
        if state.finished_by and state.finished_by != self.identity and self.published.series:
            self.unpublish()  # another replica ran since: what this one published is stale
        if state.held_by_another(self.identity, now):
            assert state.renewed is not None
            return max(1.0, min(state.renewed + state.duration - now, float(self.settings.lease_seconds)))
        if state.finished is None:
            return 0.0
        return max(0.0, state.finished + self.settings.interval - now)

    def run_forever(self) -> None:
        backoff = 5.0
        logs.event("audit_loop_started", identity=self.identity, interval=self.settings.interval,
                   lease=f"{self.settings.lease_namespace}/{self.settings.lease_name}")
        while not self.stop.is_set():
            try:
                wait = self.due_in(time.time())
                if wait > 0:
                    if self.wait(wait + random.uniform(0, self.jitter)):
                        break
                    continue
                if not self.lease.acquire(time.time()):
                    if self.wait(1.0 + random.uniform(0, self.jitter)):
                        break
                    continue
                finished = False
                try:
                    finished = self.run_held()
                finally:
                    self.lease.release(time.time(), finished=finished)
                backoff = 5.0
                if not finished and self.wait(backoff):
                    break
            except (ApiError, AuditError) as exc:
                metrics.AUDIT_RUNS.labels(result="failure").inc()
                logs.event("audit_failed", logging.WARNING, error=str(exc)[:500], retry_in=backoff)
                if self.wait(backoff):
                    break
                backoff = min(backoff * 2, max(60.0, self.settings.interval / 4))
        try:
            self.lease.release(time.time(), finished=False)
        except ApiError:
            pass
        logs.event("audit_loop_stopped", identity=self.identity)

    def run_held(self) -> bool:
        """One run while holding the Lease, renewed in the background; False when it did not finish."""
        self.lost.clear()
        done = threading.Event()

        def renew() -> None:
            while not done.wait(self.settings.lease_seconds / 3):
                try:
                    if not self.lease.renew(time.time()):
                        self.lost.set()
                        return
                except ApiError as exc:
                    logs.event("audit_lease_renew_failed", logging.WARNING, error=str(exc)[:300])

        renewer = threading.Thread(target=renew, name="audit-lease", daemon=True)
        renewer.start()
        try:
            return self.run_once()
        except Stopped:
            logs.event("audit_interrupted", reason="lease lost" if self.lost.is_set() else "stopping")
            return False
        finally:
            done.set()
            renewer.join(5)

    # -- one run --------------------------------------------------------------------------------------

    def load_policy(self) -> PolicySet | None:
        """The policy the webhook enforces: GPUPolicy ``policy_object`` when set and present, else the file; an
        invalid one leaves the last good policy."""
        try:
            spec = self._policy_spec()
            if spec is not None:
                self.policies = build_policy(spec, f"{gpupolicy.KIND}/{self.settings.policy_object}", within="spec")
            else:
                self.policies = load_policy(self.settings.policy_file)
        except PolicyError as exc:
            logs.event("audit_policy_invalid", logging.ERROR, error=str(exc)[:500],
                       using="the last good policy" if self.policies else "none: the run is skipped")
        return self.policies

    def _policy_spec(self) -> Any:
        if not self.settings.policy_object:
            return None
        try:
            obj = self.kube.get(f"{gpupolicy.PATH}/{self.settings.policy_object}")
        except ApiError as exc:
            if exc.status == 404:  # no such object (or kind): the file
                return None
            raise PolicyError(f"{gpupolicy.KIND}/{self.settings.policy_object}", [f"cannot read: {exc}"]) from None
        return obj.get("spec") or {}

    def check(self, progress: Progress) -> None:
        if self.stop.is_set() or self.lost.is_set():
            raise Stopped()

    def run_once(self) -> bool:
        policies = self.load_policy()
        if policies is None:
            return False
        started, before = time.monotonic(), self.kube.requests
        audit = Audit(self.kube, policies, exclude_namespaces=self.settings.exclude_namespaces,
                      custom=self.settings.custom, page_size=self.settings.page_size, on_page=self.check)
        collected = reports.Collected()
        collected.extend(audit.findings())
        self.check(audit.progress)
        written = deleted = 0
        try:
            result = ReportWriter(self.kube, self.settings.report_kind).sync(collected, int(time.time()))
            written, deleted = result.written, result.deleted
        except ReportsUnavailable as exc:
            logs.event("audit_reports_unavailable", logging.WARNING, error=str(exc)[:500],
                       hint="install the report CRD and grant the chart's audit RBAC")
        seconds = time.monotonic() - started
        self.publish(collected, audit.progress, seconds, self.kube.requests - before)
        progress = audit.progress
        logs.event(
            "audit_finished", objects=progress.objects, resources=progress.resources, violations=progress.findings,
            denied_objects=progress.denied_objects, skipped=progress.skipped, reports_written=written,
            reports_deleted=deleted, api_requests=self.kube.requests - before, seconds=round(seconds, 3),
        )
        return True

    def publish(self, collected: reports.Collected, progress: Progress, seconds: float, requests: int) -> None:
        current = set(collected.counts)
        for series in self.published.series - current:
            metrics.AUDIT_VIOLATIONS.labels(*series).set(0)  # fixed since: 0, not gone (multiprocess files)
        for series, count in collected.counts.items():
            metrics.AUDIT_VIOLATIONS.labels(*series).set(count)
        self.published.series = current
        metrics.AUDIT_LAST_RUN.set(time.time())
        metrics.AUDIT_DURATION.set(seconds)
        metrics.AUDIT_OBJECTS.set(progress.objects)
        metrics.AUDIT_REQUESTS.set(requests)
        metrics.AUDIT_RUNS.labels(result="success").inc()

    def unpublish(self) -> None:
        for series in self.published.series:
            metrics.AUDIT_VIOLATIONS.labels(*series).set(0)
        self.published.series = set()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logs.configure()
    settings = LoopSettings.from_json(argv[0])
    try:
        # Below the workers: on a busy node the admission path gets the CPU first.
        os.nice(NICENESS)
    except OSError:
        pass
    try:
        kube = Kube.connect(settings.kubeconfig)
    except ConfigError as exc:
        logs.event("audit_unavailable", logging.ERROR, error=str(exc))
        return 2
    loop = AuditLoop(settings, kube)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: loop.stop.set())
    try:
        loop.run_forever()
    except Exception:
        logs.event("audit_loop_crashed", logging.ERROR, exc_info=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
