"""``gpu-webhook check``: the webhook's validation, offline, for manifests in a CI pipeline.

Each object goes through ``admission.decide``, the very function behind ``/validate``,
so a manifest that passes here is admitted by the server with the same policy.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

from webhook.admission import decide
from webhook.isolation import runtime_class_selectors
from webhook.nodes import NodeIndex, NodeSummary
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


def read_nodes(path: str, node_label: str) -> NodeSummary:
    """A node summary from saved Node objects, for the cluster-aware checks offline."""
    index = NodeIndex(node_label)
    index.replace([o for o in read_objects(path) if o.get("kind") == "Node"])
    summary = index.summary()
    assert summary is not None
    return summary


def runtime_classes_of(objects: list[Mapping[str, Any]]) -> dict[str, dict[str, str]] | None:
    """RuntimeClass name -> its scheduling.nodeSelector, from saved RuntimeClass objects
    (``kubectl get nodes,runtimeclasses -o yaml``); None when there are none, so the runtime-class checks
    stay off rather than call every class unknown."""
    return runtime_class_selectors(o for o in objects if o.get("kind") == "RuntimeClass") or None


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
    nodes: NodeSummary | None = None,
    runtime_classes: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[tuple[bool, str]]:
    """(denied?, line) for every violation, in the ``FILE: Kind/name: path: message`` form."""
    for obj in objects:
        kind = str(obj["kind"])
        name, own_namespace = _identity(obj)
        target = own_namespace or namespace
        answer = decide(
            obj, group_of(obj.get("apiVersion")), kind, target, policies, nodes, runtime_classes=runtime_classes
        )
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
    nodes: NodeSummary | None = None,
    runtime_classes: Mapping[str, Mapping[str, str]] | None = None,
) -> int:
    status = EXIT_ADMITTED
    for path in paths:
        source = "<stdin>" if path == "-" else path
        try:
            objects = read_objects(path)
        except UnreadableInput as exc:
            print(f"{source}: {exc}", file=sys.stderr)
            status = EXIT_UNREADABLE
            continue
        for denied, line in check_objects(objects, source, policies, namespace, nodes, runtime_classes):
            print(line, file=out)
            if denied and status == EXIT_ADMITTED:
                status = EXIT_DENIED
    return status
