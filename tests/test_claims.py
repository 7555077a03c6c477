"""DRA rules, one table per rule: (object, where) in, (path, rule) out."""

from __future__ import annotations

import copy
import functools

import pytest

from tests import manifests
from tests.manifests import container, pod, pytorch_job
from webhook.core.cluster import ClusterState
from webhook.core.policyfile import parse_policy
from webhook.rules.admission import decide
from webhook.rules.mutate import pod_patch

GPU_CLASS = "gpu.example.com"
POLICY = parse_policy(f"""
resources: [nvidia.com/gpu, example.com/gpu]
limits: {{perContainer: 4, perPod: 6}}
cluster: {{enabled: true}}
dra:
  gpuClasses: [{GPU_CLASS}, "mig.*"]
  adminAccessNamespaces: [gpu-admin, "ops-*"]
namespaces:
  team-a: {{dra: {{allowedDeviceClasses: ["gpu.*"]}}}}
""")


def req(name="gpu", cls=GPU_CLASS, **exactly):
    return {"name": name, "exactly": {"deviceClassName": cls, **exactly}}


def first_available(name, *subs):
    return {"name": name, "firstAvailable": [{"name": f"s{i}", **s} for i, s in enumerate(subs)]}


def claim(*requests, name="c", namespace="default"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": {"requests": list(requests)}}}


def template(*requests, name="t", namespace="default"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def device_class(name, extended=None, selector=None, created="2026-01-01T00:00:00Z"):
    spec = {}
    if selector:
        spec["selectors"] = [{"cel": {"expression": selector}}]
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def slice_of(node, driver, count, **attributes):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1},
                     "devices": [{"name": f"d{i}", "attributes": {k: {"string": v} for k, v in attributes.items()}}
                                 for i in range(count)]}}


def node(name, **labels):
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8"}}}


CLUSTER = [
    node("n1"), node("n2"),
    device_class(GPU_CLASS, "example.com/gpu", f"device.driver == '{GPU_CLASS}'"),
    device_class("nic.example.com", selector="device.driver == 'nic.example.com'"),
    slice_of("n1", GPU_CLASS, 4, model="l4"), slice_of("n2", GPU_CLASS, 2, model="h100"),
    template(req(count=2), name="two"), template(req(count=3), name="three"),
    template(req("a", count=1), req("b", count=1), name="pair"),
    template(req("nic", "nic.example.com"), name="nic"),
    claim(req(count=2), name="shared"),
    {**claim(req(), name="generated"), "metadata": {"name": "generated", "namespace": "default",
                                                    "annotations": {"resource.kubernetes.io/pod-claim-name": "x"}}},
]


def view_of(objects=CLUSTER):
    state = ClusterState("accelerator")
    state.load(copy.deepcopy(objects))
    state.known = frozenset(state.indices)
    return state.view()


VIEW = view_of()


# Sorted, and without the rules a namespace sets off, as admission leaves them out.
found = functools.partial(manifests.found, policy=POLICY, view=VIEW, sort=True, drop_off=True)


def claim_pod(*containers, claims=(), name="p", **spec):
    return pod(*containers, name=name, resourceClaims=list(claims), **spec)


def gpus_and_claims(limit, *names):
    c = uses(*names)
    c["resources"]["limits"] = {"example.com/gpu": limit}
    return c


def uses(*names, request=None):
    return container(resources={"claims": [{"name": n, **({"request": request} if request else {})} for n in names]})


E = "spec.devices.requests[0].exactly"
MODEL = "device.attributes['gpu.example.com'].model == '{}'"

# --- claims and templates: one row per rule --------------------------------------------------------
CLAIM_CASES = [
    ("fine", claim(req(count=2)), "default", []),
    ("class-not-allowed", claim(req(cls="nic.example.com")), "team-a",
     [(f"{E}.deviceClassName", "device-class-not-allowed"), (f"{E}.count", "exceeds-device-capacity")]),
    ("class-allowed-by-glob", claim(req(cls=GPU_CLASS)), "team-a", []),
    ("unknown-class", claim(req(cls="gpu.nowhere.com")), "default", [(f"{E}.deviceClassName", "unknown-device-class")]),
    ("allocation-mode-all", claim(req(allocationMode="All")), "default",
     [(f"{E}.allocationMode", "allocation-mode-all")]),
    ("admin-access-tenant", claim(req(adminAccess=True)), "default", [(f"{E}.adminAccess", "admin-access")]),
    ("admin-access-named-namespace", claim(req(adminAccess=True)), "gpu-admin", []),
    ("admin-access-glob-namespace", claim(req(adminAccess=True)), "ops-monitoring", []),
    # DCGM exporter's monitoring claim: admin access holds no device, so All takes nothing and fails on nothing.
    ("all-devices-with-admin-access", claim(req(allocationMode="All", adminAccess=True)), "gpu-admin", []),
    ("all-devices-with-admin-access-tenant", claim(req(allocationMode="All", adminAccess=True)), "default",
     [(f"{E}.adminAccess", "admin-access")]),
    ("all-devices-admin-access-false", claim(req(allocationMode="All", adminAccess=False)), "gpu-admin",
     [(f"{E}.allocationMode", "allocation-mode-all")]),
    ("blanket-toleration", claim(req(tolerations=[{"operator": "Exists"}])), "default",
     [(f"{E}.tolerations[0]", "blanket-device-toleration")]),
    ("no-execute-toleration", claim(req(tolerations=[{"key": "health", "operator": "Exists", "effect": "NoExecute"}])),
     "default", [(f"{E}.tolerations[0]", "blanket-device-toleration")]),
    ("keyed-noschedule-toleration",
     claim(req(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}])),
     "default", []),
    ("over-container-cap", claim(req(count=5)), "default",
     [(f"{E}.count", "exceeds-device-capacity"), (f"{E}.count", "per-container-limit")]),
    ("over-largest-node", claim(req(cls="nic.example.com", count=1)), "default",
     [(f"{E}.count", "exceeds-device-capacity")]),
    ("at-largest-node", claim(req(count=4)), "default", []),
    ("first-available-each-alternative", claim(first_available("gpu", {"deviceClassName": GPU_CLASS, "count": 8},
                                                                {"deviceClassName": "gone.example.com"})),
     "default", [("spec.devices.requests[0].firstAvailable[0].count", "exceeds-device-capacity"),
                 ("spec.devices.requests[0].firstAvailable[0].count", "per-container-limit"),
                 ("spec.devices.requests[0].firstAvailable[1].deviceClassName", "unknown-device-class")]),
    ("selector-matches-no-device", claim(req(selectors=[{"cel": {"expression": MODEL.format("b200")}}])), "default",
     [(f"{E}.selectors", "selector-matches-no-device"), (f"{E}.count", "exceeds-device-capacity")]),
    ("selector-narrows-capacity", claim(req(count=3, selectors=[{"cel": {"expression": MODEL.format("h100")}}])),
     "default", [(f"{E}.count", "exceeds-device-capacity")]),
    ("selector-fits", claim(req(count=2, selectors=[{"cel": {"expression": MODEL.format("h100")}}])), "default", []),
    ("selector-cel-python-cannot-evaluate", claim(req(count=4, selectors=[{"cel": {"expression":
                                                   "device.attributes['gpu.example.com'].model.isGreaterThan(1)"}}])),
     "default", []),
    ("template-paths", template(req(allocationMode="All")), "default",
     [("spec.spec.devices.requests[0].exactly.allocationMode", "allocation-mode-all")]),
    ("v1beta1-shape", {**claim(), "spec": {"devices": {"requests": [{"name": "g", "deviceClassName": GPU_CLASS,
                                                                     "allocationMode": "All"}]}}},
     "default", [("spec.devices.requests[0].allocationMode", "allocation-mode-all")]),
    ("odd-shapes-are-ignored", {**claim(), "spec": {"devices": {"requests": ["x", {"name": "y", "exactly": "z"}]}}},
     "default", []),
]


@pytest.mark.parametrize(
    ("obj", "namespace", "expected"), [c[1:] for c in CLAIM_CASES], ids=[c[0] for c in CLAIM_CASES]
)
def test_claim_rules(obj, namespace, expected):
    assert found(obj, namespace=namespace) == sorted(expected)


def test_cluster_rules_need_the_view_and_cluster_enabled():
    off = parse_policy("dra: {gpuClasses: [gpu.example.com]}")
    assert found(claim(req(cls="gpu.nowhere.com", count=9)), policy=off) == []
    assert found(claim(req(cls="gpu.nowhere.com", count=9)), view=None) == []


# --- pod specs: one row per rule -------------------------------------------------------------------
C = "spec.containers[0]"
TWO = {"name": "gpu", "resourceClaimTemplateName": "two"}
POD_CASES = [
    ("fine", claim_pod(uses("gpu"), claims=[TWO]), []),
    ("undeclared-claim", claim_pod(uses("gpus"), claims=[TWO]),
     [(f"{C}.resources.claims[0].name", "undeclared-claim"), ("spec.resourceClaims[0]", "unused-claim")]),
    ("neither-source", claim_pod(uses("gpu"), claims=[{"name": "gpu"}]), [("spec.resourceClaims[0]", "claim-source")]),
    ("both-sources", claim_pod(uses("gpu"), claims=[{**TWO, "resourceClaimName": "shared"}]),
     [("spec.resourceClaims[0]", "claim-source")]),
    ("pre-1.31-source",
     claim_pod(uses("gpu"), claims=[{"name": "gpu", "source": {"resourceClaimTemplateName": "two"}}]),
     [("spec.resourceClaims[0]", "claim-source")]),
    ("unused-claim", claim_pod(container(), claims=[TWO]), [("spec.resourceClaims[0]", "unused-claim")]),
    ("missing-template", claim_pod(uses("gpu"), claims=[{"name": "gpu", "resourceClaimTemplateName": "nope"}]),
     [("spec.resourceClaims[0].resourceClaimTemplateName", "missing-claim-source")]),
    ("missing-claim", claim_pod(uses("gpu"), claims=[{"name": "gpu", "resourceClaimName": "nope"}]),
     [("spec.resourceClaims[0].resourceClaimName", "missing-claim-source")]),
    ("generated-claim", claim_pod(uses("gpu"), claims=[{"name": "gpu", "resourceClaimName": "generated"}]),
     [("spec.resourceClaims[0].resourceClaimName", "generated-claim-reference")]),
    ("unknown-request", claim_pod(uses("gpu", request="b"), claims=[TWO]),
     [(f"{C}.resources.claims[0].request", "unknown-claim-request")]),
    ("known-request",
     claim_pod(uses("gpu", request="a"), claims=[{"name": "gpu", "resourceClaimTemplateName": "pair"}]),
     []),
    ("limits-and-gpu-claim", claim_pod(gpus_and_claims(1, "gpu"), claims=[TWO]),
     [(f"{C}.resources.claims[0]", "gpu-limit-and-claim")]),
    ("limits-and-claims-add-up", claim_pod(gpus_and_claims(3, "gpu"), claims=[TWO]),
     [(f"{C}.resources.claims", "per-container-limit"), (f"{C}.resources.claims[0]", "gpu-limit-and-claim")]),
    ("limits-and-other-claim",
     claim_pod(gpus_and_claims(1, "n"), claims=[{"name": "n", "resourceClaimTemplateName": "nic"}]),
     [("spec.resourceClaims[0]", "exceeds-device-capacity")]),
    ("over-container-cap-together",
     claim_pod(uses("a", "b"), claims=[{"name": "a", "resourceClaimTemplateName": "two"},
                                       {"name": "b", "resourceClaimTemplateName": "three"}]),
     [(f"{C}.resources.claims", "per-container-limit"), ("spec.resourceClaims[0]", "exceeds-device-capacity")]),
    ("shared-claim-counts-once-for-the-pod",
     claim_pod(uses("s"), {**uses("s"), "name": "b"}, {**uses("s"), "name": "c"}, {**uses("s"), "name": "d"},
               claims=[{"name": "s", "resourceClaimName": "shared"}]), []),
    ("over-pod-cap-with-limits",
     claim_pod(uses("a"), container("b", limits={"example.com/gpu": 4}),
               claims=[{"name": "a", "resourceClaimTemplateName": "three"}]),
     [("spec", "per-pod-limit")]),
    ("node-name-with-claims", claim_pod(uses("gpu"), claims=[TWO], nodeName="n1"),
     [("spec.nodeName", "node-name-with-gpus")]),
    ("node-name-with-gpu-limits", pod(container(limits={"example.com/gpu": 1}), nodeName="n1"),
     [("spec.nodeName", "node-name-with-gpus")]),
    ("node-name-cpu-pod", pod(container(), nodeName="n1"), []),
    ("init-container-claims-count", claim_pod(container(), claims=[TWO], initContainers=[uses("gpu")]), []),
]


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in POD_CASES], ids=[c[0] for c in POD_CASES])
def test_pod_claim_rules(obj, expected):
    assert found(obj) == sorted(expected)


SOURCE_MOVED = "uses source:, the pre-1.31 form Kubernetes removed; move the name up into the entry:"
NAMES_NEITHER = "names neither of resourceClaimName and resourceClaimTemplateName; exactly one is required"
# What claim-source says of each spec.resourceClaims[] entry (no view: the pod's own fields only).
CLAIM_SOURCE_MESSAGES = [
    ("template-under-source", {"name": "gpu", "source": {"resourceClaimTemplateName": "two"}},
     f'claim "gpu" {SOURCE_MOVED} resourceClaimTemplateName: two'),
    ("claim-under-source", {"name": "gpu", "source": {"resourceClaimName": "shared"}},
     f'claim "gpu" {SOURCE_MOVED} resourceClaimName: shared'),
    ("neither", {"name": "gpu"}, f'claim "gpu" {NAMES_NEITHER}'),
    ("empty-source", {"name": "gpu", "source": {}}, f'claim "gpu" {NAMES_NEITHER}'),
    ("both-under-source", {"name": "gpu", "source": {"resourceClaimName": "a", "resourceClaimTemplateName": "b"}},
     f'claim "gpu" {NAMES_NEITHER}'),
    ("source-not-a-string", {"name": "gpu", "source": {"resourceClaimName": 7}}, f'claim "gpu" {NAMES_NEITHER}'),
    ("moved-up-already", {"name": "gpu", "resourceClaimName": "shared", "source": {"resourceClaimName": "shared"}},
     None),
]


@pytest.mark.parametrize(("entry", "said"), [c[1:] for c in CLAIM_SOURCE_MESSAGES],
                         ids=[c[0] for c in CLAIM_SOURCE_MESSAGES])
def test_claim_source_says_what_to_write(entry, said):
    answer = decide(claim_pod(uses("gpu"), claims=[entry]), "", "Pod", "default", POLICY)
    said_of = [str(v) for v in answer.violations if v.rule == "claim-source"]
    assert said_of == ([f"spec.resourceClaims[0]: {said}"] if said else [])


def test_all_devices_keeps_its_message_without_admin_access():
    answer = decide(claim(req(allocationMode="All", adminAccess=False)), "resource.k8s.io", "ResourceClaim",
                    "gpu-admin", POLICY)
    assert [str(v) for v in answer.violations] == [
        f"{E}.allocationMode: allocationMode: All takes every matching device on the node (and fails while any is in "
        "use); ask for a count instead"]


def test_in_a_custom_resource_template_the_claim_rules_apply_at_the_real_path():
    worker = claim_pod(uses("gpus"), claims=[TWO])
    job = pytorch_job(pod(container()), worker)
    paths = found(job, group="kubeflow.org", kind="PyTorchJob")
    assert ("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.claims[0].name",
            "undeclared-claim") in paths


def test_without_the_view_only_the_pods_own_fields_are_judged():
    assert found(claim_pod(uses("gpus"), claims=[{"name": "gpu"}]), view=None) == [
        ("spec.containers[0].resources.claims[0].name", "undeclared-claim"),
        ("spec.resourceClaims[0]", "claim-source"),
        ("spec.resourceClaims[0]", "unused-claim"),
    ]


def test_duplicate_extended_resource_name_on_a_device_class():
    other = device_class("gpu2.example.com", "example.com/gpu")
    assert found(other, group="resource.k8s.io") == [("spec.extendedResourceName", "duplicate-extended-resource-name")]
    assert found(device_class(GPU_CLASS, "example.com/gpu"), group="resource.k8s.io") == []


def test_each_dra_rule_has_its_own_setting():
    policy = parse_policy("dra: {gpuClasses: [gpu.example.com], allocationModeAll: warn}")
    answer = decide(claim(req(allocationMode="All")), "resource.k8s.io", "ResourceClaim", "default", policy)
    assert answer.allowed and answer.warnings == (
        "spec.devices.requests[0].exactly.allocationMode: allocationMode: All takes every matching device on the "
        "node (and fails while any is in use); ask for a count instead",)
    off = parse_policy("dra: {adminAccess: 'off'}")
    assert decide(claim(req(adminAccess=True)), "resource.k8s.io", "ResourceClaim", "default", off).allowed


def test_a_claims_only_gpu_pod_is_no_cpu_pod_on_gpu_nodes():
    tolerating = claim_pod(uses("gpu"), claims=[TWO], nodeSelector={"accelerator": "x"},
                           tolerations=[{"key": "example.com/gpu", "operator": "Exists"}])
    assert not any(rule == "cpu-pod-on-gpu-nodes" for _, rule in found(tolerating))
    unresolved = claim_pod(uses("gpu"), claims=[TWO], nodeSelector={"accelerator": "x"})
    assert not any(rule == "cpu-pod-on-gpu-nodes" for _, rule in found(unresolved, view=None))


# --- mutation ----------------------------------------------------------------------------------------


def test_a_claims_only_gpu_pod_gets_the_selector_and_the_toleration():
    policy = parse_policy("accelerator: {default: l4}\ntolerations: true\ndra: {gpuClasses: [gpu.example.com]}")
    ops = pod_patch(claim_pod(uses("gpu"), claims=[TWO]), policy.default, VIEW, "default")
    assert ops == [
        {"op": "add", "path": "/spec/nodeSelector", "value": {"accelerator": "l4"}},
        {"op": "add", "path": "/spec/tolerations",
         "value": [{"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    ]
    assert pod_patch(claim_pod(uses("n"), claims=[{"name": "n", "resourceClaimTemplateName": "nic"}]),
                     policy.default, VIEW, "default") == []
    assert pod_patch(claim_pod(uses("gpu"), claims=[TWO]), policy.default, None, "default") == []
    assert pod_patch(claim_pod(uses("gpu"), claims=[TWO]), parse_policy("{}").default, VIEW, "default") == []
