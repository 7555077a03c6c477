"""Cluster-aware checks against node lists built here, and the view's behaviour as watch events arrive."""

from __future__ import annotations

import pytest

from tests.manifests import container, pod, seed_pod
from webhook.core.cluster import ClusterState
from webhook.core.clusterindex import node_info
from webhook.core.clusterview import summarize
from webhook.core.policyfile import parse_policy
from webhook.rules.admission import decide

GPU = "nvidia.com/gpu"
CLUSTER = parse_policy("cluster: {enabled: true}\naccelerator: {default: nvidia-tesla-p100}")


def node(name, accelerator=None, **allocatable):
    labels = {"kubernetes.io/hostname": name}
    if accelerator:
        labels["accelerator"] = accelerator
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "8", **{k.replace("_", "/"): str(v) for k, v in allocatable.items()}}},
    }


NODES = [
    node("l4-a", "nvidia-l4", **{"nvidia.com_gpu": 4}),
    node("l4-b", "nvidia-l4", **{"nvidia.com_gpu": 4}),
    node("l4-c", "nvidia-l4", **{"nvidia.com_gpu": 2}),
    node("p100", "nvidia-tesla-p100", **{"nvidia.com_gpu": 8}),
    node("cpu"),
]


class NodeIndex:
    """The Node part of a ClusterState, as the tests drive it (the other kinds loaded empty)."""

    def __init__(self, nodes=()):
        self.state = ClusterState("accelerator")
        self.state.load(list(nodes))
        self.state.known = frozenset(self.state.indices)

    def apply(self, event, obj):
        self.state.indices["nodes"].apply(event, obj)

    def summary(self):
        return self.state.view()


def index_of(nodes):
    return NodeIndex(nodes)


def decision(obj, nodes=NODES, policy=CLUSTER):
    return decide(obj, "", "Pod", "default", policy, index_of(nodes).summary())


def selecting(accelerator, gpus=1, resource=GPU):
    return pod(container(limits={resource: gpus}), nodeSelector={"accelerator": accelerator})


def test_an_accelerator_no_node_has_is_refused_with_what_the_cluster_has():
    answer = decision(selecting("nvidia-a100"))
    assert not answer.allowed
    assert answer.message == (
        "1 GPU violation: spec: no node has accelerator=nvidia-a100, so the pod would stay Pending "
        "(values of accelerator on the nodes: 2)"
    )


def test_more_gpus_than_any_matching_node_offers_is_refused():
    answer = decision(selecting("nvidia-l4", gpus=6))
    assert answer.message.endswith(
        "the pod needs 6 nvidia.com/gpu on one node; nodes with accelerator=nvidia-l4: 3, "
        "largest allocatable nvidia.com/gpu: 4"
    )


def test_the_largest_node_of_the_model_is_what_counts():
    assert decision(selecting("nvidia-l4", gpus=4)).allowed
    assert decision(selecting("nvidia-tesla-p100", gpus=8)).allowed


def test_the_default_accelerator_the_mutation_would_inject_is_checked():
    bare = seed_pod()
    del bare["spec"]["nodeSelector"]
    bare["spec"]["containers"][0]["resources"]["limits"][GPU] = 9
    answer = decision(bare)
    assert "nodes with accelerator=nvidia-tesla-p100: 1, largest allocatable nvidia.com/gpu: 8" in answer.message


def test_without_any_accelerator_all_nodes_count():
    policy = parse_policy("cluster: {enabled: true}")
    assert decision(pod(container(limits={GPU: 8})), policy=policy).allowed
    assert (
        "on one node; all nodes, largest allocatable nvidia.com/gpu: 8"
        in decision(pod(container(limits={GPU: 9})), policy=policy).message
    )


def test_a_resource_no_node_advertises_is_refused():
    answer = decision(selecting("nvidia-l4", resource="nvidia.com/mig-1g.5gb"))
    expected = "no node advertises nvidia.com/mig-1g.5gb in allocatable or through a DeviceClass"
    assert expected in answer.message


def test_the_seed_pod_fits():
    assert decision(seed_pod()).allowed


@pytest.mark.parametrize("rule", ["unknownAccelerator", "exceedsNodeCapacity", "unadvertisedResource"])
def test_each_cluster_rule_has_its_own_setting(rule):
    policy = parse_policy(f"cluster: {{enabled: true, {rule}: warn}}")
    obj = {
        "unknownAccelerator": selecting("nvidia-a100"),
        "exceedsNodeCapacity": selecting("nvidia-l4", 6),
        "unadvertisedResource": selecting("nvidia-l4", resource="amd.com/gpu"),
    }[rule]
    answer = decision(obj, policy=policy)
    assert answer.allowed and len(answer.warnings) == 1


def test_cluster_rules_are_off_unless_enabled():
    assert decision(selecting("nvidia-a100"), policy=parse_policy("{}")).allowed


def test_a_watch_event_changes_the_decision():
    index = index_of(NODES)
    before = index.summary()
    index.apply("ADDED", node("a100", "nvidia-a100", **{"nvidia.com_gpu": 8}))
    assert decide(selecting("nvidia-a100"), "", "Pod", "default", CLUSTER, before).allowed is False
    assert decide(selecting("nvidia-a100"), "", "Pod", "default", CLUSTER, index.summary()).allowed
    index.apply("DELETED", node("a100"))
    assert not decide(selecting("nvidia-a100"), "", "Pod", "default", CLUSTER, index.summary()).allowed


def test_a_heartbeat_that_changes_nothing_keeps_the_cached_summary():
    index = index_of(NODES)
    summary = index.summary()
    index.apply("MODIFIED", NODES[0])
    assert index.summary() is summary


def test_a_stale_index_keeps_deciding_from_the_last_nodes():
    index = index_of(NODES)  # no informer touches it: the view stays what it was
    assert decide(selecting("nvidia-l4", 4), "", "Pod", "default", CLUSTER, index.summary()).allowed
    assert not decide(selecting("nvidia-a100"), "", "Pod", "default", CLUSTER, index.summary()).allowed


def test_before_the_first_list_there_is_no_view():
    state = ClusterState("accelerator")
    assert state.view() is None
    for kind in ("nodes", "resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"):
        state.indices[kind].replace([])
    assert state.view() is None and state.waiting_for() == ["runtimeclasses"]
    state.indices["runtimeclasses"].replace([])
    assert state.view() is not None


def test_odd_allocatable_values_are_ignored():
    info = node_info(
        {"metadata": {"labels": {"accelerator": "x"}}, "status": {"allocatable": {GPU: "lots", "amd.com/gpu": "2"}}},
        "accelerator",
    )
    assert info.extended == (("amd.com/gpu", 2),)
    assert summarize([info], "accelerator").by_accelerator["x"].largest == {"amd.com/gpu": 2}


# --- DRA capacity: ResourceSlices and DeviceClasses ------------------------------------------------

NV_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def device_class(name, extended=None, *selectors, created="2026-01-01T00:00:00Z"):
    spec = {"selectors": [{"cel": {"expression": s}} for s in selectors]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"kind": "DeviceClass", "metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def gpu_slice(where, count, driver="gpu.nvidia.com", kind="gpu", generation=1, pool=None, taint=None, **extra):
    devices = []
    for i in range(count):
        device = {"name": f"gpu-{i}", "attributes": {"type": {"string": kind}, "uuid": {"string": f"GPU-{i}"}}}
        if taint and i == 0:
            device["taints"] = [{"key": "health", "effect": taint}]
        devices.append(device)
    spec = {"driver": driver, "pool": {"name": pool or str(where), "generation": generation}, "devices": devices,
            **extra}
    if not {"allNodes", "nodeSelector"} & set(extra):
        spec["nodeName"] = where
    return {"kind": "ResourceSlice", "metadata": {"name": f"{where}-{driver}-{pool}-{generation}"}, "spec": spec}


def view_of(*objects):
    state = ClusterState("accelerator")
    state.load(list(objects))
    state.known = frozenset(state.indices)
    return state.view()


DRA_NODE = node("dra-a", "nvidia-l4")  # no nvidia.com/gpu in allocatable: the driver publishes the GPUs


def test_a_gpu_published_only_in_a_resource_slice_is_not_taken_for_missing():
    """The false denial of issue 14: with only allocatable read, this pod was 'unadvertised-resource'."""
    wants = selecting("nvidia-l4", gpus=4)
    assert not decide(wants, "", "Pod", "default", CLUSTER, view_of(DRA_NODE)).allowed
    view = view_of(DRA_NODE, device_class("gpu.nvidia.com", GPU, NV_SELECTOR), gpu_slice("dra-a", 4))
    assert decide(wants, "", "Pod", "default", CLUSTER, view).allowed
    assert view.class_devices["gpu.nvidia.com"].counted_by == "its selectors (cel-python)"
    too_many = decide(selecting("nvidia-l4", gpus=5), "", "Pod", "default", CLUSTER, view)
    assert "largest allocatable nvidia.com/gpu: 4" in too_many.message


CAPACITY_CASES = [
    # (case, objects besides the nodes and the class, most nvidia.com/gpu on one node)
    ("selector matches gpus, not mig slices", [gpu_slice("dra-a", 4), gpu_slice("dra-b", 3, kind="mig")], 8),
    ("device plugin and DRA add up on one node", [gpu_slice("l4-a", 5)], 9),
    ("older pool generations are ignored", [gpu_slice("dra-a", 12, generation=1), gpu_slice("dra-a", 9, generation=2)],
     9),
    ("NoSchedule/NoExecute tainted devices are not offered", [gpu_slice("dra-a", 10, taint="NoExecute")], 9),
    ("a None taint still offers the device", [gpu_slice("dra-a", 10, taint="None")], 10),
    ("allNodes slices reach every node", [gpu_slice("net", 1, allNodes=True, pool="net")], 9),
    ("node selector slices reach matching nodes",
     [gpu_slice("sel", 3, pool="sel", nodeSelector={"nodeSelectorTerms": [
         {"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["nvidia-tesla-p100"]}]}]})], 11),
    ("another driver's devices do not count", [gpu_slice("dra-a", 10, driver="gpu.other.com")], 8),
]


@pytest.mark.parametrize(("objects", "largest"), [c[1:] for c in CAPACITY_CASES], ids=[c[0] for c in CAPACITY_CASES])
def test_dra_capacity(objects, largest):
    view = view_of(*NODES, DRA_NODE, node("dra-b"), device_class("gpu.nvidia.com", GPU, NV_SELECTOR), *objects)
    assert view.nodes.total.largest[GPU] == largest


def test_tainted_device_count():
    view = view_of(DRA_NODE, device_class("gpu.nvidia.com", GPU, NV_SELECTOR),
                   gpu_slice("dra-a", 4, taint="NoSchedule"))
    assert view.nodes.total.largest[GPU] == 3
    assert view.class_devices["gpu.nvidia.com"].largest == 3


def test_every_class_is_also_its_implicit_extended_resource():
    view = view_of(DRA_NODE, device_class("gpu.nvidia.com", None, NV_SELECTOR), gpu_slice("dra-a", 2))
    assert view.nodes.total.largest == {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 2}
    assert view.resource_of_class("gpu.nvidia.com") == "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def test_a_selector_cel_python_cannot_evaluate_counts_the_drivers_devices_and_says_so():
    semver = "device.attributes['gpu.nvidia.com'].uuid.isGreaterThan(semver('1.0.0'))"
    view = view_of(DRA_NODE, device_class("gpu.nvidia.com", GPU, "device.driver == 'gpu.nvidia.com'", semver),
                   gpu_slice("dra-a", 3), gpu_slice("dra-a", 5, driver="gpu.other.com"))
    devices = view.class_devices["gpu.nvidia.com"]
    assert devices.largest == 3
    assert devices.counted_by.startswith("every device of driver gpu.nvidia.com (selectors not evaluated: ")
    assert "isGreaterThan" in devices.counted_by
    assert view.notes == (f"DeviceClass gpu.nvidia.com: counted {devices.counted_by}",)


def test_a_missing_attribute_does_not_match_as_in_the_scheduler():
    view = view_of(DRA_NODE, device_class("c", None, "device.attributes['gpu.nvidia.com'].nope == 'x'"),
                   gpu_slice("dra-a", 3))
    assert view.class_devices["c"].largest == 0
    assert view.class_devices["c"].counted_by == "its selectors (cel-python)"


def test_the_class_created_last_serves_an_extended_resource_name():
    old = device_class("gpu.nvidia.com", GPU, NV_SELECTOR, created="2026-01-01T00:00:00Z")
    new = device_class("gpu.other.com", GPU, "device.driver == 'gpu.other.com'", created="2026-02-01T00:00:00Z")
    view = view_of(DRA_NODE, old, new, gpu_slice("dra-a", 2), gpu_slice("dra-a", 6, driver="gpu.other.com"))
    assert view.extended_classes == {GPU: "gpu.other.com"}
    assert view.nodes.total.largest[GPU] == 6
    assert view.resource_of_class("gpu.nvidia.com") == "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def test_runtime_classes_are_read_as_name_to_node_selector():
    view = view_of({"kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia",
                    "scheduling": {"nodeSelector": {"nvidia.com/gpu.present": "true"}}},
                   {"kind": "RuntimeClass", "metadata": {"name": "runc"}, "handler": "runc"})
    assert view.runtime_class_node_selectors == {"nvidia": {"nvidia.com/gpu.present": "true"}, "runc": {}}
    assert view.runtime_classes["nvidia"].handler == "nvidia"


def test_a_claim_change_does_not_recount_devices():
    state = ClusterState("accelerator")
    state.load([DRA_NODE, device_class("gpu.nvidia.com", GPU, NV_SELECTOR), gpu_slice("dra-a", 2)])
    first = state.view()
    state.indices["resourceclaimtemplates"].apply("ADDED", {"metadata": {"name": "t", "namespace": "n"},
                                                            "spec": {"spec": {}}})
    second = state.view()
    assert second is not first and second.nodes is first.nodes and ("n", "t") in second.templates
    state.indices["resourceslices"].apply("ADDED", gpu_slice("dra-a", 3, pool="two"))
    assert state.view().nodes.total.largest[GPU] == 5


def test_a_claim_status_update_changes_nothing_indexed():
    state = ClusterState("accelerator")
    claim = {"kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "n"},
             "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "x"}}]}}}
    state.load([claim])
    view = state.view()
    state.indices["resourceclaims"].apply("MODIFIED", {**claim, "status": {"reservedFor": [{"name": "p"}]}})
    assert state.view() is view


def test_with_a_refresher_a_change_reaches_the_view_without_a_rebuild_on_the_request_path():
    import threading
    import time

    state = ClusterState("accelerator")
    state.load([node("a", "nvidia-l4", **{"nvidia.com_gpu": 4})])
    stop = threading.Event()
    state.start_refresher(stop)
    try:
        first = state.view()
        state.indices["nodes"].apply("ADDED", node("b", "nvidia-a100", **{"nvidia.com_gpu": 8}))
        deadline = time.monotonic() + 5
        while "nvidia-a100" not in state.view().nodes.by_accelerator:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert "nvidia-a100" not in first.nodes.by_accelerator, "a view, once handed out, never changes"
    finally:
        stop.set()
