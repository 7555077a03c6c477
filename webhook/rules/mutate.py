"""Mutation: the Pod a GPU workload should have been, as a JSONPatch.

Each step emits ``add`` operations for what is absent and nothing else, so "nothing to change"
is an empty patch and a second pass is a no-op (the apiserver may reinvoke us). Operations
are built from the object as read, not by diffing a mutated deep copy: ``jsonpatch.make_patch``
over a whole pod cost 0.5 ms for one container and 11 ms for fifty, most of ``/mutate``'s time.
Odd shapes are left untouched for ``/validate`` to report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonpointer import JsonPointer

from webhook.core import quantity
from webhook.core.clusterview import ClusterView
from webhook.core.podspecs import CONTAINER_LISTS, affinity_keys, as_mapping
from webhook.core.policy import Policy, Taint, gpu_entries
from webhook.rules.claims import claim_gpu_resources
from webhook.rules.context import GpuUse, gpu_use
from webhook.rules.isolation import (
    VISIBLE_DEVICES,
    RuntimeClasses,
    effective_node_selector,
    runtime_class_conflicts,
    runtime_class_of,
    runtime_classes,
)

Operation = dict[str, Any]


def _add(value: Any, *tokens: str | int) -> Operation:
    # jsonpointer escapes the tokens (``nvidia.com/gpu`` -> ``nvidia.com~1gpu``), as RFC 6901 says.
    return {"op": "add", "path": JsonPointer.from_parts(tokens).path, "value": value}


def _whole(value: object) -> bool:
    try:
        quantity.gpu_count(value)
    except quantity.QuantityError:
        return False
    return True


def _zero(value: object) -> bool:
    try:
        return quantity.gpu_count(value) == 0
    except quantity.QuantityError:
        return False


def default_requests(spec: Mapping[str, Any], policy: Policy) -> tuple[list[Operation], set[str]]:
    """Operations copying GPU limits into absent requests, and every GPU resource the pod asks for (not 0)."""
    ops: list[Operation] = []
    used: set[str] = set()
    for list_name in CONTAINER_LISTS[:2]:  # ephemeral containers may not hold GPUs at all
        items = spec.get(list_name)
        if not isinstance(items, list):
            continue
        for i, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            if not isinstance(resources, dict):
                continue
            limits, requests = resources.get("limits"), resources.get("requests")
            limits = gpu_entries(limits, policy) if isinstance(limits, Mapping) else {}
            if requests is not None and not isinstance(requests, dict):
                continue
            # A count of 0 holds no GPU: it gets no accelerator selector and no toleration from us (that is
            # the trick zero-gpu-limit warns about), so the zero check is /validate's alone.
            used.update(name for name, value in limits.items() if not _zero(value))
            used.update(name for name, value in gpu_entries(requests or {}, policy).items() if not _zero(value))
            # Only whole counts are copied: an invalid limit is /validate's to report, once.
            missing = {name: value for name, value in limits.items() if name not in (requests or {}) and _whole(value)}
            if not missing:
                continue
            where = ("spec", list_name, i, "resources", "requests")
            if requests is None:
                ops.append(_add(missing, *where))
            else:
                ops.extend(_add(value, *where, name) for name, value in missing.items())
    return ops, used


def inject_accelerator(pod: Mapping[str, Any], spec: Mapping[str, Any], policy: Policy) -> list[Operation]:
    """nodeSelector[label] from the annotation, else the namespace/global default; never overriding."""
    annotations = as_mapping(as_mapping(pod.get("metadata")).get("annotations"))
    value = policy.injected_accelerator(annotations.get(policy.annotation))
    if value is None:
        return []
    selector = spec.get("nodeSelector")
    if selector is not None and (not isinstance(selector, dict) or policy.node_label in selector):
        return []
    if policy.node_label in affinity_keys(spec):
        return []
    if selector is None:
        return [_add({policy.node_label: value}, "spec", "nodeSelector")]
    return [_add(value, "spec", "nodeSelector", policy.node_label)]


def add_tolerations(spec: Mapping[str, Any], resources: set[str], policy: Policy) -> list[Operation]:
    """A toleration for each of the platform's GPU taints (gpuTaints), else one per GPU resource used."""
    tolerations = spec.get("tolerations")
    if tolerations is not None and not isinstance(tolerations, list):
        return []
    taints = policy.gpu_taints or tuple(Taint(name, None, "NoSchedule") for name in sorted(resources))
    present = [t for t in tolerations or [] if isinstance(t, Mapping)]
    added = [taint.toleration() for taint in taints if not any(taint.tolerated_by(t) for t in present)]
    if not added:
        return []
    if tolerations is None:
        return [_add(added, "spec", "tolerations")]
    return [_add(t, "spec", "tolerations", len(tolerations) + k) for k, t in enumerate(added)]


def hide_gpus(spec: Mapping[str, Any], policy: Policy, use: GpuUse) -> list[Operation]:
    """isolation.hideGpus: NVIDIA_VISIBLE_DEVICES=void (or none) for every container that holds no GPU, so
    an image's ``NVIDIA_VISIBLE_DEVICES=all`` shows it nothing. Never a container that sets the variable
    itself (env), never a GPU container, never a fractional scheduler's pod (its binder sets the variable),
    never a trusted pod (monitoring agents see every GPU by design). An env entry wins over envFrom."""
    if policy.hide_gpus not in ("void", "none") or use.fractional or policy.trusts(spec):
        return []
    ops: list[Operation] = []
    variable = {"name": VISIBLE_DEVICES, "value": policy.hide_gpus}
    for list_name in CONTAINER_LISTS[:2]:  # ephemeral containers come later, through their own subresource
        items = spec.get(list_name)
        for i, container in enumerate(items if isinstance(items, list) else []):
            if not isinstance(container, dict) or use.holds(list_name, i):
                continue
            env = container.get("env")
            if env is None:
                ops.append(_add([variable], "spec", list_name, i, "env"))
            elif isinstance(env, list) and not any(as_mapping(e).get("name") == VISIBLE_DEVICES for e in env):
                ops.append(_add(variable, "spec", list_name, i, "env", len(env)))
    return ops


def inject_runtime_class(
    spec: Mapping[str, Any],
    policy: Policy,
    use: GpuUse,
    selector: Mapping[str, str],
    runtime_classes: RuntimeClasses | None,
) -> list[Operation]:
    """isolation.runtimeClass on GPU pods that name none. Knowing the cluster's RuntimeClasses, never one that
    does not exist or whose scheduling.nodeSelector contradicts ``selector`` (the pod's, with what this patch
    adds): the apiserver would reject the pod, and /validate says why instead."""
    name, injected = runtime_class_of(spec, policy, use)
    if name is None or not injected:
        return []
    if runtime_classes is not None:
        if name not in runtime_classes or runtime_class_conflicts(runtime_classes[name], selector):
            return []
    return [_add(name, "spec", "runtimeClassName")]


def pod_patch(
    pod: Mapping[str, Any], policy: Policy, view: ClusterView | None = None, namespace: str = ""
) -> list[Operation]:
    """RFC 6902 operations that give ``pod`` its GPU defaults; empty when nothing changes.

    A pod that gets GPUs only through claims gets the same selector and tolerations: the built-in
    ExtendedResourceToleration plugin looks only at extended-resource names. Its claims are read from
    the cluster view, so without one such a pod is left alone."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return []
    metadata = as_mapping(pod.get("metadata"))
    use = gpu_use(spec, metadata, policy)
    ops, used = default_requests(spec, policy)
    used |= claim_gpu_resources(spec, namespace, policy, view)
    if used:
        ops += inject_accelerator(pod, spec, policy)
        if policy.tolerations:
            ops += add_tolerations(spec, used, policy)
    ops += hide_gpus(spec, policy, use)
    selector = effective_node_selector(spec, metadata, policy)
    ops += inject_runtime_class(spec, policy, use, selector, runtime_classes(view, policy))
    return ops


def mutated_pod(
    pod: Mapping[str, Any], policy: Policy, view: ClusterView | None = None, namespace: str = ""
) -> dict[str, Any]:
    """The pod with GPU defaults applied (a copy; ``pod`` is not touched). For tests and tools: jsonpatch (and
    difflib with it) stays out of the serving processes."""
    import jsonpatch

    return jsonpatch.apply_patch(dict(pod), pod_patch(pod, policy, view, namespace))
