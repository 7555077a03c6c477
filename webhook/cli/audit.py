"""``gpu-webhook audit``: the audit of a live cluster as a command, printed as a table, one JSON document, JSON
lines or reports.

Exit codes as ``check``: 0 when nothing would be denied, 1 when something would (or, with ``--fail-on
warning``, is warned about), 2 when the audit could not run (no cluster, no permission to list a built-in pod
kind, a bad policy). A progress line is drawn on stderr only when stderr is a terminal; the summary line is
always written there.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

import orjson
import yaml

from webhook.audit import reports
from webhook.audit.scan import Audit, AuditError, Progress
from webhook.core.policy import PolicySet
from webhook.kube.client import ConfigError, Kube

EXIT_ADMITTED, EXIT_DENIED, EXIT_FAILED = 0, 1, 2
OUTPUTS = ("table", "json", "jsonl", "report")


class ProgressLine:
    """One self-rewriting stderr line, at most ten times a second; nothing unless ``stream`` is a terminal."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.enabled = stream.isatty()
        self._last = 0.0
        self._width = 0

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.1:
            return
        self._last = now
        total = f"/{progress.resource_total:,}" if progress.resource_total is not None else ""
        text = (f"audit: {progress.resource} {progress.resource_done:,}{total} | "
                f"{progress.objects:,} objects, {progress.findings:,} violations")
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def table(findings: list[reports.Finding]) -> list[str]:
    """Rows grouped by namespace and rule: each group's name is written on its first row only."""
    header = ("NAMESPACE", "RULE", "ACTION", "OBJECT", "PATH", "MESSAGE")
    ordered = sorted(findings, key=lambda f: (f.namespace, f.rule, f.kind, f.name, f.path))
    rows = []
    previous: tuple[str, str] | None = None
    for f in ordered:
        group = (f.namespace, f.rule)
        namespace = f.namespace or "(cluster)"
        namespace_cell = namespace if previous is None or previous[0] != f.namespace else ""
        rule_cell = f.rule if group != previous else ""
        rows.append((namespace_cell, rule_cell, f.action, f"{f.kind}/{f.name}", f.path, f.message))
        previous = group
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
            for row in [header, *rows]]


def report_list(collected: reports.Collected, kind: str, now: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": reports.build_all(reports.KINDS[kind], collected, now)}


def run(
    policies: PolicySet,
    kubeconfig: str | None = None,
    namespace: str | None = None,
    selector: str | None = None,
    output: str = "table",
    report_kind: str = "openreports",
    out: TextIO | None = None,
    err: TextIO | None = None,
    fail_on: str = "deny",
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    started = time.monotonic()
    bar = ProgressLine(err)
    try:
        kube = Kube.connect(kubeconfig)
    except ConfigError as exc:
        print(f"gpu-webhook: audit: {exc}", file=err)
        return EXIT_FAILED
    audit = Audit(kube, policies, namespace=namespace, selector=selector, on_page=bar)
    kept: list[reports.Finding] = []
    collected = reports.Collected()
    denied = warned = False
    records: list[dict[str, Any]] = []
    try:
        for finding in audit.findings():
            denied = denied or finding.action == "deny"
            warned = warned or finding.action == "warn"
            if output == "jsonl":
                out.write(orjson.dumps(finding.record()).decode() + "\n")
            elif output == "json":
                records.append(finding.record())
            elif output == "table":
                kept.append(finding)
            else:
                collected.add(finding)
    except AuditError as exc:
        bar.clear()
        print(f"gpu-webhook: audit: {exc}", file=err)
        return EXIT_FAILED
    except KeyboardInterrupt:
        bar.clear()
        print("gpu-webhook: audit: interrupted", file=err)
        return 130
    bar.clear()
    progress = audit.progress
    status = EXIT_DENIED if denied or (fail_on == "warning" and warned) else EXIT_ADMITTED
    if output == "table" and kept:
        print("\n".join(table(kept)), file=out)
    elif output == "report":
        document = report_list(collected, report_kind, int(time.time()))
        out.write(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
    elif output == "json":
        summary = {"objects": progress.objects, "resources": progress.resources, "violations": progress.findings,
                   "deniedObjects": progress.denied_objects, "skipped": list(progress.skipped),
                   "apiRequests": kube.requests, "failOn": fail_on, "exitCode": status}
        out.write(json.dumps({"findings": records, "summary": summary}, indent=2) + "\n")
    for skipped in progress.skipped:
        print(f"gpu-webhook: audit: not audited: {skipped}", file=err)
    print(
        f"audit: {progress.objects:,} objects in {progress.resources} resources, {progress.findings:,} violations "
        f"({progress.denied_objects:,} objects would be denied), {kube.requests} API requests, "
        f"{time.monotonic() - started:.1f} s",
        file=err,
    )
    return status
