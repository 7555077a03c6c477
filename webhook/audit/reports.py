"""Policy reports from audit findings: openreports.io Report/ClusterReport or wgpolicyk8s.io PolicyReport.

Pure: findings in, report objects (plain dicts) out; the audit runner writes them. One namespaced report per
namespace with violations, named ``gpu-webhook-audit``, and one cluster report of the same name for
cluster-scoped objects, if any. Each violation is one result: ``policy: gpu-webhook``, ``rule`` the rule id,
``result`` ``fail`` (the webhook would deny) or ``warn``, the object in ``resources``, the field path in the
message and in ``properties.path``. A result keeps the time it was first found across runs, so a run that
finds nothing new writes the same report again.

Both APIs share the result schema (openreports.io/v1alpha1 in openreports/reports-api; wgpolicyk8s.io/v1alpha2
in kubernetes-sigs/wg-policy-prototypes); openreports adds a top-level ``source`` and ``configuration``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SOURCE = "gpu-webhook"
POLICY = "gpu-webhook"
CATEGORY = "GPU"
REPORT_NAME = "gpu-webhook-audit"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-webhook"}
LABEL_SELECTOR = "app.kubernetes.io/managed-by=gpu-webhook"
# One report stays far below etcd's 1.5 MiB object limit: a result is about 600 bytes. Findings past this
# are counted in the summary and the annotation below, not listed (Gatekeeper's violations limit does the same).
MAX_RESULTS = 1000
TRUNCATED_ANNOTATION = "gpu-webhook.io/results-not-listed"

RESULT_OF_ACTION = {"deny": "fail", "warn": "warn"}
SEVERITY_OF_ACTION = {"deny": "high", "warn": "medium"}


@dataclass(frozen=True)
class Kinds:
    """Where one report API lives: its group/version, kinds and resource names."""

    api_version: str
    namespaced: str
    cluster: str
    namespaced_plural: str
    cluster_plural: str

    def path(self, namespace: str | None, name: str | None = None) -> str:
        """The REST path of the namespaced (``namespace`` given) or cluster report collection, or of one report."""
        base = f"/apis/{self.api_version}"
        if namespace:
            path = f"{base}/namespaces/{namespace}/{self.namespaced_plural}"
        else:
            path = f"{base}/{self.cluster_plural}"
        return f"{path}/{name}" if name else path

    def all_namespaces_path(self) -> str:
        return f"/apis/{self.api_version}/{self.namespaced_plural}"


KINDS = {
    "openreports": Kinds("openreports.io/v1alpha1", "Report", "ClusterReport", "reports", "clusterreports"),
    "wgpolicyk8s": Kinds(
        "wgpolicyk8s.io/v1alpha2", "PolicyReport", "ClusterPolicyReport", "policyreports", "clusterpolicyreports"
    ),
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One violation of one live object, with the action the webhook would take on it (deny or warn)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    path: str
    rule: str
    action: str
    message: str

    def record(self) -> dict[str, str]:
        """The ``-o json`` record."""
        return {
            "kind": self.kind,
            "apiVersion": self.api_version,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "path": self.path,
            "rule": self.rule,
            "action": self.action,
            "message": self.message,
        }

    @property
    def key(self) -> tuple[str, str, str]:
        """The same finding in two runs: same object (by uid), rule and path."""
        return (self.uid, self.rule, self.path)


@dataclass
class Collected:
    """Findings kept per namespace ("" for cluster-scoped objects), at most ``max_results`` each, and counted.

    Memory is bounded by namespaces x ``max_results``, whatever the number of objects audited.
    """

    max_results: int = MAX_RESULTS
    listed: dict[str, list[Finding]] = field(default_factory=dict)
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (namespace, rule, action) -> n

    def add(self, finding: Finding) -> None:
        self.counts[(finding.namespace, finding.rule, finding.action)] += 1
        kept = self.listed.setdefault(finding.namespace, [])
        if len(kept) < self.max_results:
            kept.append(finding)

    def extend(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            self.add(finding)

    def namespaces(self) -> list[str]:
        return sorted({ns for ns, _, _ in self.counts})

    def total(self, namespace: str, action: str) -> int:
        return sum(n for (ns, _, a), n in self.counts.items() if ns == namespace and a == action)


def _timestamp(seconds: int) -> dict[str, int]:
    return {"seconds": seconds, "nanos": 0}


def _result(finding: Finding, seconds: int) -> dict[str, Any]:
    result: dict[str, Any] = {
        "source": SOURCE,
        "policy": POLICY,
        "rule": finding.rule,
        "category": CATEGORY,
        "severity": SEVERITY_OF_ACTION.get(finding.action, "medium"),
        "timestamp": _timestamp(seconds),
        "result": RESULT_OF_ACTION.get(finding.action, "warn"),
        "resources": [_reference(finding)],
        "message": f"{finding.path}: {finding.message}" if finding.path else finding.message,
        "properties": {"path": finding.path, "action": finding.action},
    }
    if result["result"] == "fail":
        result["scored"] = True  # warn results are "not scored" by the API's definition
    return result


def _reference(finding: Finding) -> dict[str, str]:
    reference = {"apiVersion": finding.api_version, "kind": finding.kind, "name": finding.name}
    if finding.namespace:
        reference["namespace"] = finding.namespace
    if finding.uid:
        reference["uid"] = finding.uid
    return reference


def first_seen(report: Mapping[str, Any]) -> dict[tuple[str, str, str], int]:
    """``Finding.key`` -> timestamp seconds of every result in a report this module built."""
    seen: dict[tuple[str, str, str], int] = {}
    for result in report.get("results") or []:
        if not isinstance(result, Mapping):
            continue
        resources = result.get("resources") or [{}]
        uid = resources[0].get("uid", "") if isinstance(resources[0], Mapping) else ""
        path = (result.get("properties") or {}).get("path", "")
        seconds = (result.get("timestamp") or {}).get("seconds")
        if isinstance(seconds, int):
            seen[(str(uid), str(result.get("rule", "")), str(path))] = seconds
    return seen


def build(
    kinds: Kinds,
    namespace: str,
    findings: Iterable[Finding],
    fail: int,
    warn: int,
    now: int,
    seen: Mapping[tuple[str, str, str], int] | None = None,
    max_results: int = MAX_RESULTS,
) -> dict[str, Any]:
    """The report of one namespace ("" for the cluster report). ``fail``/``warn`` count every finding, listed
    or not; ``seen`` gives the first-found time of findings an earlier report had."""
    seen = seen or {}
    ordered = sorted(findings, key=lambda f: (f.kind, f.name, f.path, f.rule, f.uid))
    results = [_result(f, seen.get(f.key, now)) for f in ordered[:max_results]]
    metadata: dict[str, Any] = {"name": REPORT_NAME}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(MANAGED_BY)
    unlisted = fail + warn - len(results)
    if unlisted > 0:
        metadata["annotations"] = {TRUNCATED_ANNOTATION: str(unlisted)}
    report: dict[str, Any] = {
        "apiVersion": kinds.api_version,
        "kind": kinds.namespaced if namespace else kinds.cluster,
        "metadata": metadata,
    }
    if kinds.api_version.startswith("openreports.io/"):
        report["source"] = SOURCE
        report["configuration"] = {"limits": {"maxResults": max_results, "statusFilter": ["fail", "warn"]}}
    report["summary"] = {"pass": 0, "fail": fail, "warn": warn, "error": 0, "skip": 0}
    report["results"] = results
    return report


def build_all(
    kinds: Kinds,
    collected: Collected,
    now: int,
    seen: Mapping[str, Mapping[tuple[str, str, str], int]] | None = None,
) -> list[dict[str, Any]]:
    """Every report for what an audit collected: one per namespace with findings (cluster report for "")."""
    seen = seen or {}
    return [
        build(
            kinds,
            namespace,
            collected.listed.get(namespace, []),
            collected.total(namespace, "deny"),
            collected.total(namespace, "warn"),
            now,
            seen.get(namespace),
            collected.max_results,
        )
        for namespace in collected.namespaces()
    ]
