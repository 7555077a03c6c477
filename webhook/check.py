"""``gpu-webhook check``: the webhook's validation, offline, for manifests in a CI pipeline.

Each object goes through ``admission.decide``, the very function behind ``/validate``,
so a manifest that passes here is admitted by the server with the same policy.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from webhook.admission import decide
from webhook.cluster import KIND_OF, ClusterState, ClusterView
from webhook.podspecs import as_mapping, group_of
from webhook.policy import PolicySet

EXIT_ADMITTED, EXIT_DENIED, EXIT_UNREADABLE = 0, 1, 2


class UnreadableInput(ValueError):
    pass


def read_objects(path: str) -> list[Mapping[str, Any]]:
    """Every object in a multi-document YAML or JSON file (``-`` is stdin); ``List`` kinds expand."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableInput(f"cannot read: {exc}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise UnreadableInput(f"not valid YAML or JSON: {exc}".replace("\n", " ")) from None
    objects: list[Mapping[str, Any]] = []
    for number, document in enumerate(documents, 1):
        if not isinstance(document, Mapping) or not isinstance(document.get("kind"), str):
            raise UnreadableInput(f"document {number} is not a Kubernetes object (no kind)")
        if document["kind"].endswith("List") and isinstance(document.get("items"), list):
            objects.extend(i for i in document["items"] if isinstance(i, Mapping))
        else:
            objects.append(document)
    return objects


def read_cluster_state(paths: list[str]) -> list[Mapping[str, Any]]:
    """Saved objects (``kubectl get nodes,resourceslices,deviceclasses -o yaml``) for the cluster view."""
    objects: list[Mapping[str, Any]] = []
    for path in paths:
        objects.extend(read_objects(path))
    return objects


def cluster_view(
    state: Sequence[Mapping[str, Any]], node_label: str, manifests: Sequence[Mapping[str, Any]] = ()
) -> ClusterView:
    """A cluster view from saved objects, for the cluster-aware checks offline. ResourceClaims and
    ResourceClaimTemplates among the manifests being checked join it, so pods are judged with the claims
    they come with."""
    objects = list(state)
    # The state files say which kinds are complete; claims beside the pods only help resolve them.
    known = {KIND_OF[str(o.get("kind"))] for o in objects if o.get("kind") in KIND_OF}
    objects.extend(o for o in manifests if o.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"))
    cluster = ClusterState(node_label)
    cluster.load(objects, known)
    view = cluster.view()
    assert view is not None
    return view


def manifest_view(objects: list[Mapping[str, Any]], namespace: str, node_label: str) -> ClusterView | None:
    """Without --cluster-state: the claims and templates in the checked files, so a pod and the template it
    names, checked together, are judged together. None when the files hold none."""
    found = [o for o in objects if o.get("kind") in ("ResourceClaim", "ResourceClaimTemplate")]
    if not found:
        return None
    return cluster_view([], node_label, [_with_namespace(o, namespace) for o in found])


def _with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    metadata = as_mapping(obj.get("metadata"))
    if metadata.get("namespace"):
        return obj
    return {**obj, "metadata": {**metadata, "namespace": namespace}}


def _identity(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = as_mapping(obj.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    namespace = metadata.get("namespace")
    return str(name), namespace if isinstance(namespace, str) else ""


def check_objects(
    objects: list[Mapping[str, Any]],
    source: str,
    policies: PolicySet,
    namespace: str,
    view: ClusterView | None = None,
) -> Iterator[tuple[bool, str]]:
    """(denied?, line) for every violation, in the ``FILE: Kind/name: path: message`` form."""
    for obj in objects:
        kind = str(obj["kind"])
        name, own_namespace = _identity(obj)
        target = own_namespace or namespace
        answer = decide(obj, group_of(obj.get("apiVersion")), kind, target, policies, view)
        policy = policies.for_namespace(target)
        for violation in answer.violations:
            denied = policy.action(violation.rule) == "deny"
            note = "" if denied else "warning: "
            yield (denied, f"{source}: {kind}/{name}: {violation.path}: {note}{violation.message}")


def run(
    paths: list[str],
    policies: PolicySet,
    namespace: str = "default",
    out: TextIO = sys.stdout,
    cluster_state: list[Mapping[str, Any]] | None = None,
) -> int:
    """Check every file; ``cluster_state`` holds Nodes, ResourceSlices, DeviceClasses, ... (from
    :func:`read_cluster_state`) for the cluster-aware checks."""
    node_label = policies.default.node_label
    status = EXIT_ADMITTED
    for path in paths:
        source = "<stdin>" if path == "-" else path
        try:
            objects = read_objects(path)
        except UnreadableInput as exc:
            print(f"{source}: {exc}", file=sys.stderr)
            status = EXIT_UNREADABLE
            continue
        view: ClusterView | None
        if cluster_state is not None:
            view = cluster_view(cluster_state, node_label, [_with_namespace(o, namespace) for o in objects])
        else:
            view = manifest_view(objects, namespace, node_label)
        for denied, line in check_objects(objects, source, policies, namespace, view):
            print(line, file=out)
            if denied and status == EXIT_ADMITTED:
                status = EXIT_DENIED
    return status
