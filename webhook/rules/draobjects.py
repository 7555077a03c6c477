"""DRA objects themselves: the device requests of ResourceClaims and ResourceClaimTemplates, and DeviceClasses.

Every rule has the shape ``check_x(thing, path, policy[, view]) -> list[Violation]`` and its own
``deny|warn|off`` setting (``dra.*`` for what the object alone shows, ``cluster.*`` for what needs
the cluster view). Paths are the ones users write: ``spec.devices.requests[0].exactly.count`` in a
claim, ``spec.spec.devices…`` in a template. The claims a pod spec references are ``webhook.rules.claims``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.clusterindex import cel_expressions, device_count
from webhook.core.clusterview import ClusterView
from webhook.core.field import ROOT, FieldPath, Violation
from webhook.core.podspecs import as_list, as_mapping
from webhook.core.policy import Policy
from webhook.core.quantity import quoted

GROUP = "resource.k8s.io"
# kind -> keys from the object to its ResourceClaimSpec
CLAIM_SPECS: dict[str, tuple[str, ...]] = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}


def is_dra_object(group: str, kind: str) -> bool:
    return group == GROUP and (kind in CLAIM_SPECS or kind == "DeviceClass")


# --- Device requests (claims and templates) -------------------------------------------------------


def check_device_class_allowed(request: Mapping[str, Any], path: FieldPath, policy: Policy) -> list[Violation]:
    """D7: a device class outside the namespace's ``dra.allowedDeviceClasses``."""
    name = request.get("deviceClassName")
    if not isinstance(name, str) or not policy.checks("device-class-not-allowed"):
        return []
    if policy.device_class_allowed(name):
        return []
    return [Violation(
        path.child("deviceClassName"), "device-class-not-allowed",
        f"device class {quoted(name)} is not allowed here (allowed: {', '.join(policy.allowed_device_classes)})",
        name,
    )]


def check_device_class_exists(
    request: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None
) -> list[Violation]:
    """D8: a class the cluster does not have; the scheduler would say so only when the pod is pending."""
    name = request.get("deviceClassName")
    if view is None or "deviceclasses" not in view.known or not isinstance(name, str) or not name:
        return []
    if name in view.classes or not policy.checks("unknown-device-class"):
        return []
    return [Violation(
        path.child("deviceClassName"), "unknown-device-class",
        f"device class {quoted(name)} does not exist, so the claim can never be allocated "
        f"(DeviceClasses in the cluster: {len(view.classes)})",
        name,
    )]


def check_allocation_mode(request: Mapping[str, Any], path: FieldPath, policy: Policy) -> list[Violation]:
    """D10: allocationMode All takes every matching device of a node, and fails if any is in use.

    Not with ``adminAccess: true`` (a monitoring claim, such as DCGM exporter's): an admin-access allocation
    ignores the ordinary claims on its devices and holds none of them (the API: "Allocation will fail if some
    devices are already allocated, unless adminAccess is requested"), so it takes nothing from anyone and does not
    fail while they are in use; who may ask for admin access is ``admin-access``'s to say."""
    if request.get("allocationMode") != "All" or request.get("adminAccess") is True:
        return []
    if not policy.checks("allocation-mode-all") or policy.trusted:
        return []
    return [Violation(
        path.child("allocationMode"), "allocation-mode-all",
        "allocationMode: All takes every matching device on the node (and fails while any is in use); "
        "ask for a count instead",
        "All",
    )]


def check_admin_access(request: Mapping[str, Any], path: FieldPath, policy: Policy, namespace: str) -> list[Violation]:
    """D11: adminAccess outside the namespaces the policy names; the namespace label can be self-granted."""
    if request.get("adminAccess") is not True or not policy.checks("admin-access"):
        return []
    if policy.trusted or policy.admin_access_allowed(namespace):
        return []
    allowed = ", ".join(policy.admin_access_namespaces) or "none"
    return [Violation(
        path.child("adminAccess"), "admin-access",
        f"adminAccess gives access to devices in use by other pods; it is allowed only in the namespaces "
        f"the webhook policy names (dra.adminAccessNamespaces: {allowed}), not in {quoted(namespace)}",
        "true",
    )]


def check_device_tolerations(request: Mapping[str, Any], path: FieldPath, policy: Policy) -> list[Violation]:
    """D12: tolerating every device taint, or NoExecute ones (devices being drained or unhealthy)."""
    if not policy.checks("blanket-device-toleration") or policy.trusted:
        return []
    out = []
    for i, toleration in enumerate(as_list(request.get("tolerations"))):
        if not isinstance(toleration, Mapping):
            continue
        where = path.child("tolerations").item(i, "key", toleration.get("key"))
        blanket = not toleration.get("key") and toleration.get("operator") == "Exists"
        if blanket and toleration.get("effect") in (None, ""):
            out.append(Violation(where, "blanket-device-toleration",
                                 "tolerates every device taint, unhealthy and draining devices included", "*"))
        elif toleration.get("effect") == "NoExecute":
            key = str(toleration.get("key") or "*")
            out.append(Violation(where, "blanket-device-toleration",
                                 f"tolerates the NoExecute device taint {key}: the pod keeps devices taken out "
                                 "of service", key))
        elif blanket:
            out.append(Violation(where, "blanket-device-toleration",
                                 f"tolerates every {toleration.get('effect')} device taint", "*"))
    return out


def check_request_count(
    request: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None
) -> list[Violation]:
    """D9: a count over the per-container or per-pod cap (GPU classes), or above the most devices of its
    class on any node (cluster view)."""
    name = request.get("deviceClassName")
    if not isinstance(name, str) or request.get("allocationMode") == "All":
        return []
    count = device_count(request.get("count"))
    where = path.child("count")
    out = []
    if policy.is_gpu_class(name):
        cap = min((c for c in (policy.per_container, policy.per_pod) if c), default=0)
        if cap and count > cap:
            scope = "per container" if cap == policy.per_container else "per pod"
            out.append(Violation(where, "per-container-limit" if scope == "per container" else "per-pod-limit",
                                 f"{count} devices of class {name} are over the limit of {cap} {scope}", str(count)))
    out.extend(exceeds_devices(name, count, where, policy, view, cel_expressions(request)))
    return out


def exceeds_devices(
    device_class: str, count: int, where: FieldPath, policy: Policy, view: ClusterView | None,
    selectors: tuple[str, ...] = (),
) -> list[Violation]:
    """D9 capacity: ``count`` devices of a class on one node, against the most any node has of them (of those the
    request's own selectors match, when it has any)."""
    if view is None or not {"resourceslices", "deviceclasses"} <= view.known:
        return []
    devices = view.class_devices.get(device_class)
    if devices is None or not policy.checks("exceeds-device-capacity"):
        return []
    largest, nodes = devices.largest, devices.nodes
    # How they were counted, where it is not the class's own selectors (what the native policies read from the
    # facts, which say the same).
    how = "" if devices.evaluated else f"; counted {devices.counted_by}"
    narrowed = view.devices_matching(device_class, selectors) if selectors else None
    if narrowed is not None:
        largest, nodes = narrowed
        how = f"; counted {devices.counted_by} and the request's selectors"
    if count <= largest:
        return []
    return [Violation(
        where, "exceeds-device-capacity",
        f"{count} device{'s' if count != 1 else ''} of class {device_class} on one node, but the most any node has "
        f"is {largest} ({nodes} node{'s' if nodes != 1 else ''} with such devices{how})",
        f"{count} {device_class}",
    )]


def check_request_selectors(
    request: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None
) -> list[Violation]:
    """D14: a request whose selectors match none of its class's published devices (a typo in an attribute
    name or domain, a product no node has): the claim would never be allocated."""
    selectors = cel_expressions(request)
    name = request.get("deviceClassName")
    if not selectors or view is None or not isinstance(name, str):
        return []
    if not {"resourceslices", "deviceclasses"} <= view.known:
        return []
    devices = view.class_devices.get(name)
    if devices is None or not devices.devices or not policy.checks("selector-matches-no-device"):
        return []
    narrowed = view.devices_matching(name, selectors)
    if narrowed is None or narrowed[0] > 0:
        return []
    total = len(devices.devices)
    return [Violation(
        path.child("selectors"), "selector-matches-no-device",
        f"the selectors match none of the {total} published device{'s' if total != 1 else ''} of class {name} "
        "(a misspelt attribute or domain does not match either)",
        name,
    )]


def check_device_request(
    request: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None, namespace: str
) -> list[Violation]:
    return [
        *check_device_class_allowed(request, path, policy),
        *check_device_class_exists(request, path, policy, view),
        *check_allocation_mode(request, path, policy),
        *check_admin_access(request, path, policy, namespace),
        *check_device_tolerations(request, path, policy),
        *check_request_count(request, path, policy, view),
        *check_request_selectors(request, path, policy, view),
    ]


def check_claim_spec(
    spec: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None, namespace: str
) -> list[Violation]:
    """Every device request of a ResourceClaimSpec, ``exactly`` and each ``firstAvailable`` alternative."""
    out: list[Violation] = []
    requests_path = path.child("devices").child("requests")
    for i, raw in enumerate(as_list(as_mapping(spec.get("devices")).get("requests"))):
        if not isinstance(raw, Mapping):
            continue
        where = requests_path.item(i, "name", raw.get("name"))
        if isinstance(raw.get("exactly"), Mapping):
            out.extend(check_device_request(raw["exactly"], where.child("exactly"), policy, view, namespace))
        elif isinstance(raw.get("deviceClassName"), str):  # the v1beta1 shape, in files checked offline
            out.extend(check_device_request(raw, where, policy, view, namespace))
        for j, sub in enumerate(as_list(raw.get("firstAvailable"))):
            if isinstance(sub, Mapping):
                sub_path = where.child("firstAvailable").item(j, "name", sub.get("name"))
                out.extend(check_device_request(sub, sub_path, policy, view, namespace))
    return out


def check_device_class(
    obj: Mapping[str, Any], path: FieldPath, policy: Policy, view: ClusterView | None
) -> list[Violation]:
    """D17: an extendedResourceName another DeviceClass already declares (the newer class silently wins)."""
    spec = as_mapping(obj.get("spec"))
    name = as_mapping(obj.get("metadata")).get("name")
    extended = spec.get("extendedResourceName")
    if view is None or "deviceclasses" not in view.known or not isinstance(extended, str):
        return []
    if not policy.checks("duplicate-extended-resource-name"):
        return []
    others = sorted(c.name for c in view.classes.values() if c.extended_resource_name == extended and c.name != name)
    if not others:
        return []
    return [Violation(
        path.child("spec").child("extendedResourceName"), "duplicate-extended-resource-name",
        f"{extended} is already served by device class {', '.join(others)}; the class created last takes it over "
        "for every pod that asks for it",
        extended,
    )]


def object_violations(
    obj: Mapping[str, Any], kind: str, policy: Policy, view: ClusterView | None, namespace: str
) -> list[Violation]:
    """Violations of a ResourceClaim, ResourceClaimTemplate or DeviceClass."""
    if kind == "DeviceClass":
        return check_device_class(obj, ROOT, policy, view)
    spec: object = obj
    path = ROOT
    for key in CLAIM_SPECS[kind]:
        spec = as_mapping(spec).get(key)
        path = path.child(key)
    return check_claim_spec(as_mapping(spec), path, policy, view, namespace)
