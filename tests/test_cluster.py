"""Cluster-aware checks against node lists built here, and the view's behaviour as watch events arrive."""

from __future__ import annotations

import pytest

from tests.manifests import container, pod, seed_pod
from webhook.admission import decide
from webhook.cluster import ClusterState, node_info, summarize
from webhook.policy import parse_policy

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
        "(nodes by accelerator: nvidia-l4: 3, nvidia-tesla-p100: 1)"
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
    expected = "no node advertises nvidia.com/mig-1g.5gb in allocatable or through a DeviceClass (nodes: 5)"
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
