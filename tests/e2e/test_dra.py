"""Dynamic Resource Allocation through the real apiserver, scheduler and resourceclaim controller.

The bed: a DeviceClass gpu.example.com with extendedResourceName example.com/gpu, a fake Node that
advertises no GPU in allocatable (and is tainted example.com/gpu:NoSchedule, as GPU pools are), and a
ResourceSlice publishing 4 devices of driver gpu.example.com on it. The webhook runs with cluster checks
on, watching all of it.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.e2e.bed import CUSTOM_RESOURCES, register_webhook, unregister_webhook
from tests.manifests import container, device_class, pod, resource_slice
from tests.server import make_certs, start_webhook

pytestmark = pytest.mark.e2e

GPU = "example.com/gpu"
CLASS = "gpu.example.com"
NODE = "dra-node"
NS, TEAM, ADMINS = "dra", "team-a", "gpu-admin"
OUR_DENIAL = 'admission webhook "validate-dra.gpu-webhook.io" denied the request'

POLICY = f"""\
resources: [nvidia.com/gpu, {GPU}]
accelerator: {{default: example-gpu}}
tolerations: true
cluster: {{enabled: true}}
dra:
  gpuClasses: [{CLASS}]
  adminAccessNamespaces: [{ADMINS}]
namespaces:
  {TEAM}: {{dra: {{allowedDeviceClasses: [{CLASS}]}}}}
"""

PYTORCH_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"group": "kubeflow.org", "scope": "Namespaced",
             "names": {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object",
                 "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}


def request(name: str = "gpu", device_class_name: str = CLASS, **exactly) -> dict:
    return {"name": name, "exactly": {"deviceClassName": device_class_name, **exactly}}


def claim_template(name: str, *requests: dict, namespace: str = NS) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": list(requests)}}}}


def resource_claim(name: str, *requests: dict, namespace: str = NS) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": {"requests": list(requests)}}}


def claim_pod(name: str, template: str, namespace: str = NS) -> dict:
    obj = pod(container(resources={"claims": [{"name": "gpu"}]}), name=name,
              resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": template}])
    obj["metadata"]["namespace"] = namespace
    return obj


def add_dra_node(cluster, name: str) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "accelerator": "example-gpu", "kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}]}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(node), check=True)
    # No device plugin: nothing GPU-like in allocatable. The devices are in the ResourceSlice.
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake DRA node for the e2e bed",
         "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status),
                    check=True)
    cluster.kubectl("taint", "node", name, "node.kubernetes.io/not-ready-", "--overwrite")


def create(cluster, obj):
    return cluster.kubectl("create", "-f", "-", stdin=json.dumps(obj))


def apply_all(cluster, *objects):
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
                    check=True)


@pytest.fixture(scope="module")
def dra_bed(cluster, tmp_path_factory):
    cluster.ensure_scheduler()
    cluster.start_controller_manager("resourceclaim-controller")
    for namespace in (NS, TEAM, ADMINS):
        cluster.kubectl("create", "namespace", namespace)
    # adminAccess needs this label (the apiserver checks it); a tenant who may edit its namespace sets it itself.
    for namespace in (NS, ADMINS):
        cluster.kubectl("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true", check=True)
    apply_all(cluster, device_class(CLASS, GPU), device_class("nic.example.com"), PYTORCH_CRD)
    add_dra_node(cluster, NODE)
    apply_all(cluster, resource_slice(NODE, CLASS, 4, type="gpu"))
    # Made before the webhook was installed: pods that name it are what the webhook sees later.
    apply_all(cluster, claim_template("six-gpus", request(count=6)))
    cluster.kubectl("wait", "--for=condition=Established", "crd/pytorchjobs.kubeflow.org", "--timeout=60s",
                    check=True)

    tmp = tmp_path_factory.mktemp("dra")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY)
    server = start_webhook(tmp, "--policy", str(policy), "--kubeconfig", str(cluster.kubeconfig),
                           certs=make_certs(tmp / "tls", "127.0.0.1"))
    custom = CUSTOM_RESOURCES + [{"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "resources": ["pytorchjobs"]}]
    # The chart renders its matchConditions from the policy: example.com/gpu must be a GPU name there too.
    try:  # a registration that fails must not leave the server running
        register_webhook(cluster, server, webhook={"customResources": custom}, policy=yaml.safe_load(POLICY))
        yield server
    finally:
        unregister_webhook(cluster)
        server.stop()


def test_a_gpu_served_only_by_dra_is_admitted_and_the_scheduler_binds_it(cluster, dra_bed):
    """Before the cluster view read ResourceSlices this pod was refused: no node has example.com/gpu in
    allocatable ("unadvertised-resource")."""
    wants = pod(container(limits={GPU: 2}), name="extended-2")
    wants["metadata"]["namespace"] = NS
    created = create(cluster, wants)
    assert created.returncode == 0, created.stderr
    print(created.stdout.strip())
    assert node_of_ns(cluster, "extended-2") == NODE
    deadline = time.monotonic() + 30
    while True:
        status = cluster.kubectl("-n", NS, "get", "pod", "extended-2", "-o",
                                 "jsonpath={.status.extendedResourceClaimStatus}").stdout
        if status:
            break
        assert time.monotonic() < deadline, "the scheduler recorded no extended-resource claim"
        time.sleep(0.3)
    print(f"extendedResourceClaimStatus: {status}")
    mapping = json.loads(status)
    assert mapping["resourceClaimName"]
    assert [m["resourceName"] for m in mapping["requestMappings"]] == [GPU]


def node_of_ns(cluster, name: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cluster.kubectl("-n", NS, "get", "pod", name, "-o", "jsonpath={.spec.nodeName}")
        if result.stdout:
            return result.stdout
        time.sleep(0.3)
    events = cluster.kubectl("-n", NS, "get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    raise AssertionError(f"pod {name} was not scheduled within {timeout}s: {events}")


def test_more_devices_than_any_node_has_is_refused_in_the_pod_and_in_the_template(cluster, dra_bed):
    refused = create(cluster, claim_pod("wants-six", "six-gpus"))
    assert refused.returncode != 0
    assert "spec.resourceClaims[0]: 6 devices of class gpu.example.com on one node, but the most any node has is 4" \
        in refused.stderr
    print(refused.stderr.strip())
    again = create(cluster, claim_template("six-again", request(count=6)))
    print(again.stderr.strip())
    assert OUR_DENIAL in again.stderr
    assert "spec.spec.devices.requests[0].exactly.count: 6 devices of class gpu.example.com" in again.stderr


def test_a_template_for_two_is_admitted_and_its_pod_scheduled_with_the_injected_toleration(cluster, dra_bed):
    assert create(cluster, claim_template("two-gpus", request(count=2))).returncode == 0
    created = create(cluster, claim_pod("wants-two", "two-gpus"))
    assert created.returncode == 0, created.stderr
    # Only claims, no extended resource: our mutation added the selector and the GPU taint's toleration,
    # without which the scheduler could not use the tainted node.
    spec = json.loads(cluster.kubectl("-n", NS, "get", "pod", "wants-two", "-o", "jsonpath={.spec}").stdout)
    print("nodeSelector:", json.dumps(spec["nodeSelector"]), "tolerations:", json.dumps(spec["tolerations"]))
    assert spec["nodeSelector"] == {"accelerator": "example-gpu"}
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert node_of_ns(cluster, "wants-two") == NODE
    claim = cluster.kubectl("-n", NS, "get", "pod", "wants-two", "-o",
                            "jsonpath={.status.resourceClaimStatuses[0].resourceClaimName}").stdout
    assert claim.startswith("wants-two-gpu-"), "the resourceclaim controller made the pod's claim"


def test_a_class_outside_the_namespace_list_is_refused_with_its_path(cluster, dra_bed):
    refused = create(cluster, resource_claim("nic", request("nic", "nic.example.com"), namespace=TEAM))
    print(refused.stderr.strip())
    assert OUR_DENIAL in refused.stderr
    assert ('spec.devices.requests[0].exactly.deviceClassName: device class "nic.example.com" is not allowed here '
            "(allowed: gpu.example.com)") in refused.stderr
    assert create(cluster, resource_claim("gpu", request(), namespace=TEAM)).returncode == 0


def test_allocation_mode_all_is_refused(cluster, dra_bed):
    refused = create(cluster, resource_claim("every-gpu", request(allocationMode="All")))
    print(refused.stderr.strip())
    assert OUR_DENIAL in refused.stderr
    assert "spec.devices.requests[0].exactly.allocationMode: allocationMode: All takes every matching device" \
        in refused.stderr


def test_admin_access_only_in_the_namespaces_the_policy_names(cluster, dra_bed):
    """The namespace label alone (which a tenant who may edit its namespace can set) is not enough."""
    refused = create(cluster, resource_claim("monitor", request(allocationMode="ExactCount", adminAccess=True)))
    print(refused.stderr.strip())
    assert OUR_DENIAL in refused.stderr
    assert "spec.devices.requests[0].exactly.adminAccess: adminAccess gives access to devices in use" in refused.stderr
    admitted = create(cluster, resource_claim("monitor", request(adminAccess=True), namespace=ADMINS))
    assert admitted.returncode == 0, admitted.stderr


def test_a_pytorchjob_worker_naming_an_undeclared_claim_is_refused(cluster, dra_bed):
    worker = {"replicas": 2, "template": {"spec": {
        "containers": [container("pytorch", resources={"claims": [{"name": "gpus"}]})],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-gpus"}]}}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train", "namespace": NS},
           "spec": {"pytorchReplicaSpecs": {"Worker": worker}}}
    refused = create(cluster, job)
    assert refused.returncode != 0
    assert ('spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.claims[0].name: claim "gpus" is '
            "not declared in spec.pytorchReplicaSpecs.Worker.template.spec.resourceClaims (declared: gpu)") \
        in refused.stderr
    print(refused.stderr.strip())


def test_a_pod_naming_a_template_that_does_not_exist_is_admitted_with_a_warning(cluster, dra_bed):
    created = create(cluster, claim_pod("wants-missing", "no-such-template"))
    print(created.stderr.strip(), created.stdout.strip())
    assert created.returncode == 0, created.stderr
    assert 'ResourceClaimTemplate "no-such-template" does not exist in namespace "dra"' in created.stderr


def test_a_driver_publishing_more_devices_reaches_decisions_through_the_watch(cluster, dra_bed):
    """The driver grows the node's pool to 8 devices: the template for 6 is admitted once the slice's watch
    event has reached the view (printed: the time it took)."""
    assert create(cluster, claim_template("six-later", request(count=6))).returncode != 0
    apply_all(cluster, resource_slice(NODE, CLASS, 8, type="gpu"))
    changed = time.monotonic()
    while create(cluster, claim_template("six-later", request(count=6))).returncode != 0:
        assert time.monotonic() - changed < 10, "the slice change did not reach the webhook's view within 10 s"
        time.sleep(0.05)
    print(f"ResourceSlice change reached decisions in {time.monotonic() - changed:.2f} s")
    assert dra_bed.metric("gpu_webhook_informer_stale", resource="resourceslices") == 0
    assert dra_bed.metric("gpu_webhook_informer_objects", resource="resourceslices") >= 1
