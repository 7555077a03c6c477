"""An in-memory stand-in for ``webhook.kube.client.Kube``: lists served in pages, objects written by path.

Just enough of the apiserver for the audit's unit tests: aggregated discovery, ``limit``/``continue`` pages
(a continue token is the offset), label selectors of the ``key=value`` form, 403 for resources marked
forbidden, and reports and Leases kept by path with a resourceVersion.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from webhook.kube.client import ApiError

BUILTIN = [
    # (group, version, plural, kind, namespaced)
    ("", "v1", "pods", "Pod", True),
    ("", "v1", "podtemplates", "PodTemplate", True),
    ("", "v1", "replicationcontrollers", "ReplicationController", True),
    ("", "v1", "nodes", "Node", False),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("apps", "v1", "replicasets", "ReplicaSet", True),
    ("apps", "v1", "statefulsets", "StatefulSet", True),
    ("apps", "v1", "daemonsets", "DaemonSet", True),
    ("batch", "v1", "jobs", "Job", True),
    ("batch", "v1", "cronjobs", "CronJob", True),
    ("coordination.k8s.io", "v1", "leases", "Lease", True),
]


def _base(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


class FakeKube:
    def __init__(self, extra: list[tuple[str, str, str, str, bool]] = (), legacy_discovery: bool = False):
        self.resources = list(BUILTIN) + list(extra)
        self.objects: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (group, plural) -> objects
        self.stored: dict[str, dict[str, Any]] = {}  # path -> object written by apply/create/replace
        self.forbidden: set[str] = set()  # plurals that answer 403
        self.expire_after: dict[str, int] = {}  # plural -> pages served before a continue token expires
        self.legacy_discovery = legacy_discovery
        self.requests = 0
        self.calls: list[tuple[str, str]] = []
        self._version = 0

    # -- test setup -----------------------------------------------------------------------------------

    def add(self, group: str, plural: str, *objects: Mapping[str, Any]) -> None:
        bucket = self.objects.setdefault((group, plural), [])
        for obj in objects:
            item = copy.deepcopy(dict(obj))
            metadata = item.setdefault("metadata", {})
            metadata.setdefault("uid", f"uid-{metadata.get('namespace', '')}-{metadata['name']}")
            bucket.append(item)
        bucket.sort(key=lambda o: f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}")

    # -- the Kube interface ---------------------------------------------------------------------------

    def get(self, path: str, query: Mapping[str, Any] | None = None, accept: str = "") -> dict[str, Any]:
        self.requests += 1
        self.calls.append(("GET", path))
        if path in ("/api", "/apis"):
            return self._legacy_root(path) if self.legacy_discovery else self._discovery(path)
        if self.legacy_discovery:
            served = {_base(g, v): (g, v) for g, v, _, _, _ in self.resources}
            if path in served:
                return self._resource_list(*served[path])
        if path in self.stored:
            return copy.deepcopy(self.stored[path])
        listed = self._list(path, dict(query or {}))
        if listed is None:
            raise ApiError(404, "NotFound", f"{path} not found")
        return listed

    def _discovery(self, path: str) -> dict[str, Any]:
        core = path == "/api"
        groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for group, version, plural, kind, namespaced in self.resources:
            if (group == "") != core:
                continue
            groups.setdefault(group, {}).setdefault(version, []).append({
                "resource": plural, "responseKind": {"group": group, "version": version, "kind": kind},
                "scope": "Namespaced" if namespaced else "Cluster", "verbs": ["get", "list", "watch"],
            })
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "items": [
                {"metadata": {"name": group},
                 "versions": [{"version": v, "resources": r} for v, r in versions.items()]}
                for group, versions in groups.items()
            ],
        }

    def _legacy_root(self, path: str) -> dict[str, Any]:
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        groups = {g: v for g, v, _, _, _ in self.resources if g}
        return {"kind": "APIGroupList", "groups": [
            {"name": g, "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups.items()
        ]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        resources = []
        for g, v, plural, kind, namespaced in self.resources:
            if (g, v) == (group, version):
                resources.append({"name": plural, "kind": kind, "namespaced": namespaced,
                                  "verbs": ["get", "list", "watch"]})
                resources.append({"name": f"{plural}/status", "kind": kind, "namespaced": namespaced,
                                  "verbs": ["get", "patch"]})
        return {"kind": "APIResourceList", "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    def _list(self, path: str, query: dict[str, Any]) -> dict[str, Any] | None:
        parts = path.strip("/").split("/")
        if parts[0] == "api":
            group, rest = "", parts[2:]
        else:
            group, rest = parts[1], parts[3:]
        namespace = None
        if len(rest) == 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if len(rest) != 1:
            return None
        plural = rest[0]
        if not any(g == group and p == plural for g, _, p, _, _ in self.resources):
            return None
        if plural in self.forbidden:
            raise ApiError(403, "Forbidden", f'{plural} is forbidden: User "reader" cannot list resource "{plural}"')
        items = [
            o for o in self.objects.get((group, plural), []) + self._stored_items(group, plural)
            if (namespace is None or o["metadata"].get("namespace") == namespace)
            and _selected(o, query.get("labelSelector"), query.get("fieldSelector"))
        ]
        start = int(query.get("continue") or 0)
        served = start // max(1, int(query.get("limit") or len(items) or 1))
        if query.get("continue") and plural in self.expire_after and served >= self.expire_after[plural]:
            del self.expire_after[plural]
            raise ApiError(410, "Expired", "The provided continue parameter is too old", {"metadata": {}})
        limit = int(query.get("limit") or len(items) or 1)
        page = items[start:start + limit]
        metadata: dict[str, Any] = {"resourceVersion": "1"}
        if start + limit < len(items):
            metadata["continue"] = str(start + limit)
            metadata["remainingItemCount"] = len(items) - start - limit
        return {"kind": "List", "metadata": metadata, "items": copy.deepcopy(page)}

    def _stored_items(self, group: str, plural: str) -> list[dict[str, Any]]:
        prefix = _base(group, "")
        return [o for p, o in self.stored.items() if p.startswith(prefix) and f"/{plural}/" in p]

    def _write(self, method: str, path: str, body: Mapping[str, Any], expect_version: bool) -> dict[str, Any]:
        self.requests += 1
        self.calls.append((method, path))
        current = self.stored.get(path)
        if expect_version:
            if current is None:
                raise ApiError(404, "NotFound", path)
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
        self._version += 1
        stored = copy.deepcopy(dict(body))
        stored.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        self.stored[path] = stored
        return copy.deepcopy(stored)

    def apply(self, path: str, body: Mapping[str, Any], field_manager: str) -> dict[str, Any]:
        return self._write("PATCH", path, body, False)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        target = f"{path}/{body['metadata']['name']}"
        if target in self.stored:
            self.requests += 1
            raise ApiError(409, "AlreadyExists", target)
        return self._write("POST", target, body, False)

    def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self._write("PUT", path, body, True)

    def delete(self, path: str) -> dict[str, Any]:
        self.requests += 1
        self.calls.append(("DELETE", path))
        if self.stored.pop(path, None) is None:
            raise ApiError(404, "NotFound", path)
        return {}


def _selected(obj: Mapping[str, Any], labels: str | None, fields: str | None) -> bool:
    metadata = obj.get("metadata") or {}
    for term in filter(None, (labels or "").split(",")):
        key, _, value = term.partition("=")
        if (metadata.get("labels") or {}).get(key) != value:
            return False
    for term in filter(None, (fields or "").split(",")):
        key, _, value = term.partition("!=")
        if key == "metadata.namespace" and metadata.get("namespace") == value:
            return False
    return True
