"""Audit what already runs: page through the live cluster's pod-bearing objects and decide on each.

The resources come from the apiserver's discovery (aggregated discovery, one request for all groups, with
the per-group documents as a fallback): the built-in kinds ``podspecs`` has a table for, and every custom
resource; a custom resource's objects count when ``podspecs`` finds pod templates in them, the same walk
``/validate`` does. Each list is read in pages (``limit``/``continue``) and every object goes through
``admission.decide``, the function behind ``/validate``, with the cluster checks when the policy turns them
on; what it finds is yielded as :class:`~webhook.audit.reports.Finding` and nothing is kept, so memory is one page.

Read-only: ``Audit`` only lists. :class:`ReportWriter` is the one place that writes, the reports the server's
periodic audit keeps (server-side apply, stale ones deleted).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.audit import reports
from webhook.audit.reports import Finding
from webhook.core.cluster import CLUSTER_KINDS, ClusterState
from webhook.core.clusterview import ClusterView
from webhook.core.podspecs import as_mapping, is_builtin
from webhook.core.policy import PolicySet
from webhook.kube.client import ApiError, Kube
from webhook.rules.admission import decide

PAGE_SIZE = 500  # kubectl's chunk size; Gatekeeper's --audit-chunk-size suggestion too
DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
# Report objects hold findings, never pod templates: listing them would only cost.
SKIPPED_GROUPS = frozenset({"openreports.io", "wgpolicyk8s.io", "reports.kyverno.io"})
_MAX_RESTARTS = 3


class AuditError(Exception):
    """The audit could not finish: the apiserver is away, or a built-in pod kind cannot be listed."""


class Stopped(Exception):
    """The audit was asked to stop between two pages."""


@dataclass(frozen=True)
class Resource:
    """A served resource that can be listed."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def builtin(self) -> bool:
        return is_builtin(self.group, self.kind)

    def path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


def builtin_group(group: str) -> bool:
    """Groups Kubernetes itself serves: the core group, dotless groups (apps, batch, ...) and ``*.k8s.io``.

    A CustomResourceDefinition's group must contain a dot, and ``*.k8s.io`` needs an API review approval.
    """
    return group == "" or "." not in group or group.endswith(".k8s.io")


def discover(kube: Kube) -> list[Resource]:
    """Every listable resource, at its group's preferred version (a resource served only in another version
    at the first version that has it)."""
    found: dict[tuple[str, str], Resource] = {}

    def add(group: str, version: str, entry: Mapping[str, Any]) -> None:
        plural = entry.get("resource") or entry.get("name")
        if not isinstance(plural, str) or "/" in plural or "list" not in (entry.get("verbs") or []):
            return
        kind = entry.get("kind") or as_mapping(entry.get("responseKind")).get("kind")
        namespaced = entry.get("namespaced") if "namespaced" in entry else entry.get("scope") == "Namespaced"
        if isinstance(kind, str) and (group, plural) not in found:
            found[(group, plural)] = Resource(group, version, plural, kind, bool(namespaced))

    for root in ("/api", "/apis"):
        body = kube.get(root, accept=DISCOVERY_V2)
        if body.get("kind") == "APIGroupDiscoveryList":
            for item in body.get("items") or []:
                group = str(as_mapping(item.get("metadata")).get("name") or "")
                for version in item.get("versions") or []:  # in preference order
                    for entry in version.get("resources") or []:
                        add(group, str(version.get("version")), entry)
        elif root == "/api":  # APIVersions: the core group, legacy discovery
            for version in body.get("versions") or []:
                for entry in kube.get(f"/api/{version}").get("resources") or []:
                    add("", version, entry)
        else:  # APIGroupList: one more request per group, its preferred version only
            for item in body.get("groups") or []:
                preferred = as_mapping(item.get("preferredVersion"))
                group_version = preferred.get("groupVersion")
                if isinstance(group_version, str) and "/" in group_version:
                    group, version = group_version.split("/", 1)
                    for entry in kube.get(f"/apis/{group_version}").get("resources") or []:
                        add(group, version, entry)
    return list(found.values())


def pod_bearing(resources: Iterable[Resource], custom: Sequence[str] | None = None) -> list[Resource]:
    """The built-in pod kinds, then the custom resources (``custom``: only those matching ``GROUP/PLURAL``
    patterns). Pods come last: when they are many, the templates that made them are reported first."""
    chosen = []
    for resource in resources:
        if resource.builtin:
            chosen.append(resource)
        elif not builtin_group(resource.group) and resource.group not in SKIPPED_GROUPS:
            name = f"{resource.group}/{resource.plural}"
            if custom is None or any(fnmatch.fnmatchcase(name, pattern) for pattern in custom):
                chosen.append(resource)
    return sorted(chosen, key=lambda r: (not r.builtin, r.kind == "Pod", r.group, r.plural))


def _list_key(obj: Mapping[str, Any]) -> str:
    """An object's place in a list: lists come in etcd key order, ``namespace/name``."""
    metadata = as_mapping(obj.get("metadata"))
    return f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}"


def pages(
    kube: Kube,
    path: str,
    selector: str | None = None,
    field_selector: str | None = None,
    limit: int = PAGE_SIZE,
) -> Iterator[tuple[list[dict[str, Any]], int | None]]:
    """(items, objects remaining after them) for each page of a list; remaining is None when the apiserver does
    not say (it does not count with a label selector), 0 on the last page.

    A continue token can expire (410) when a list takes longer than etcd keeps its snapshot: the apiserver
    may hand a token for an inconsistent continuation, else the list starts over and skips what was seen.
    """
    token: str | None = None
    after: str | None = None  # key of the last object yielded
    restarts = 0
    while True:
        query = {"limit": limit, "labelSelector": selector, "fieldSelector": field_selector, "continue": token}
        try:
            body = kube.get(path, query)
        except ApiError as exc:
            if exc.status != 410 or token is None or restarts >= _MAX_RESTARTS:
                raise
            restarts += 1
            token = as_mapping(exc.body.get("metadata")).get("continue") or None
            continue
        items = body.get("items") or []
        if after is not None:
            items = [item for item in items if _list_key(item) > after]
        metadata = as_mapping(body.get("metadata"))
        token = metadata.get("continue") or None
        remaining = metadata.get("remainingItemCount") if token else 0  # the last page: nothing remains
        yield items, remaining if isinstance(remaining, int) else None
        if items:
            after = _list_key(items[-1])
        if not token:
            return


def cluster_view(kube: Kube, node_label: str, limit: int = PAGE_SIZE) -> ClusterView:
    """The cluster as the cluster checks see it (the server's informers, listed once): Nodes, DRA objects,
    RuntimeClasses, a paged list each, only the summaries kept. A kind the apiserver does not serve (DRA
    before 1.34) or this identity may not list stays unknown, and nothing is judged missing for want of it."""
    state = ClusterState(node_label)
    known = []
    for kind in CLUSTER_KINDS:
        try:
            state.indices[kind.name].replace(obj for items, _ in pages(kube, kind.path, limit=limit) for obj in items)
        except ApiError as exc:
            if kind.name == "nodes" or exc.status not in (403, 404):
                raise
            state.indices[kind.name].replace([])
            continue
        known.append(kind.name)
    state.known = frozenset(known)
    view = state.view()
    assert view is not None
    return view


@dataclass
class Progress:
    """What the audit has done so far; ``on_page`` is called after every page (a progress bar, a stop check)."""

    resources: int = 0
    resource: str = ""
    resource_done: int = 0
    resource_total: int | None = None
    objects: int = 0
    findings: int = 0
    denied_objects: int = 0
    skipped: list[str] = field(default_factory=list)


class Audit:
    """The audit of one cluster with one policy; iterate :meth:`findings` once."""

    def __init__(
        self,
        kube: Kube,
        policies: PolicySet,
        namespace: str | None = None,
        selector: str | None = None,
        exclude_namespaces: Sequence[str] = (),
        custom: Sequence[str] | None = None,
        page_size: int = PAGE_SIZE,
        on_page: Callable[[Progress], None] | None = None,
    ):
        self.kube = kube
        self.policies = policies
        self.namespace = namespace
        self.selector = selector
        self.exclude_namespaces = tuple(exclude_namespaces)
        self.custom = custom
        self.page_size = page_size
        self.on_page = on_page or (lambda progress: None)
        self.progress = Progress()

    def _field_selector(self) -> str | None:
        if self.namespace or not self.exclude_namespaces:
            return None
        return ",".join(f"metadata.namespace!={ns}" for ns in self.exclude_namespaces)

    def findings(self) -> Iterator[Finding]:
        try:
            resources = pod_bearing(discover(self.kube), self.custom)
            view = None
            if self.policies.default.cluster_enabled:
                view = cluster_view(self.kube, self.policies.default.node_label, self.page_size)
        except ApiError as exc:
            raise AuditError(f"cannot discover the cluster's resources: {exc}") from None
        for resource in resources:
            if self.namespace and not resource.namespaced:
                continue
            self.progress.resources += 1
            self.progress.resource, self.progress.resource_done, self.progress.resource_total = str(resource), 0, None
            try:
                yield from self._resource(resource, view)
            except ApiError as exc:
                if exc.status == 404 or (exc.status == 403 and not resource.builtin):
                    # Gone since discovery, or a custom resource this identity may not list: say so, go on.
                    self.progress.skipped.append(f"{resource} ({exc.reason or exc.status})")
                    continue
                raise AuditError(f"cannot list {resource}: {exc}") from None

    def _resource(self, resource: Resource, view: ClusterView | None) -> Iterator[Finding]:
        path = resource.path(self.namespace)
        field_selector = self._field_selector() if resource.namespaced else None
        for items, remaining in pages(self.kube, path, self.selector, field_selector, self.page_size):
            for obj in items:
                found = self.decide(resource, obj, view)
                self.progress.objects += 1
                self.progress.findings += len(found)
                self.progress.denied_objects += any(f.action == "deny" for f in found)
                yield from found
            self.progress.resource_done += len(items)
            if remaining is not None:
                self.progress.resource_total = self.progress.resource_done + remaining
            self.on_page(self.progress)

    def decide(self, resource: Resource, obj: Mapping[str, Any], view: ClusterView | None) -> list[Finding]:
        """What ``/validate`` would say about ``obj`` if it were created now, as findings."""
        metadata = as_mapping(obj.get("metadata"))
        namespace = str(metadata.get("namespace") or "")
        answer = decide(obj, resource.group, resource.kind, namespace, self.policies, view)
        if not answer.violations:
            return []
        name, uid = str(metadata.get("name") or ""), str(metadata.get("uid") or "")
        # each violation's action as decide judged it (a tenant rule's denial may be softened there)
        return [
            Finding(resource.api_version, resource.kind, namespace, name, uid, str(v.path), v.rule, action, v.message)
            for v, action in zip(answer.violations, answer.actions, strict=True)
        ]


class ReportsUnavailable(Exception):
    """The report API (its CRD) is not installed, or we may not write it."""


@dataclass
class WriteResult:
    written: int = 0
    deleted: int = 0


class ReportWriter:
    """Keeps the cluster's gpu-webhook reports equal to the last audit: applies one per namespace with
    findings (server-side apply, field manager ``gpu-webhook``) and deletes those of namespaces now clean."""

    FIELD_MANAGER = "gpu-webhook"

    def __init__(self, kube: Kube, kind: str = "openreports"):
        self.kube = kube
        self.kinds = reports.KINDS[kind]

    def existing(self) -> dict[str, dict[tuple[str, str, str], int]]:
        """Namespace ("" for the cluster report) -> first-found times of the reports we wrote before."""
        seen: dict[str, dict[tuple[str, str, str], int]] = {}
        for path in (self.kinds.all_namespaces_path(), self.kinds.path(None)):
            try:
                for items, _ in pages(self.kube, path, reports.LABEL_SELECTOR):
                    for report in items:
                        metadata = as_mapping(report.get("metadata"))
                        if metadata.get("name") == reports.REPORT_NAME:
                            seen[str(metadata.get("namespace") or "")] = reports.first_seen(report)
            except ApiError as exc:
                if exc.status in (403, 404):
                    raise ReportsUnavailable(f"cannot list {path}: {exc}") from None
                raise
        return seen

    def sync(self, collected: reports.Collected, now: int) -> WriteResult:
        before = self.existing()
        result = WriteResult()
        for report in reports.build_all(self.kinds, collected, now, before):
            namespace = report["metadata"].get("namespace")
            try:
                self.kube.apply(self.kinds.path(namespace, reports.REPORT_NAME), report, self.FIELD_MANAGER)
            except ApiError as exc:
                if exc.status in (403, 404):
                    raise ReportsUnavailable(f"cannot write {self.kinds.path(namespace)}: {exc}") from None
                raise
            result.written += 1
        for namespace in sorted(set(before) - set(collected.namespaces())):
            try:
                self.kube.delete(self.kinds.path(namespace or None, reports.REPORT_NAME))
            except ApiError as exc:
                if exc.status != 404:
                    raise
            result.deleted += 1
        return result
