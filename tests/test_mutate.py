"""Mutation: requests defaulted from limits, the accelerator nodeSelector injected, tolerations added;
applying the patch twice changes nothing."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from tests.manifests import admission_request, container, pod, seed_pod, workload
from webhook import admission
from webhook.mutate import mutated_pod, pod_patch
from webhook.policy import parse_policy

GPU = "nvidia.com/gpu"
DEFAULT = parse_policy("{}")
WITH_DEFAULT = parse_policy(
    "accelerator: {default: nvidia-tesla-t4}\n"
    "namespaces: {research: {accelerator: {default: nvidia-l4}}}"
)
TOLERATE = parse_policy("tolerations: true")


def mutated(obj, policy=DEFAULT, namespace="default"):
    return mutated_pod(obj, policy.for_namespace(namespace))


def test_the_seed_pod_gets_requests_equal_to_limits_and_keeps_its_node_selector():
    result = mutated(seed_pod(), WITH_DEFAULT)
    assert result["spec"]["containers"][0]["resources"] == {"limits": {GPU: 1}, "requests": {GPU: 1}}
    assert result["spec"]["nodeSelector"] == {"accelerator": "nvidia-tesla-p100"}


def test_requests_are_defaulted_beside_other_requests():
    result = mutated(pod(container(limits={GPU: 2, "cpu": "1"}, requests={"cpu": "500m"})))
    assert result["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "500m", GPU: 2}


def test_init_containers_are_defaulted_too():
    result = mutated(pod(container(), initContainers=[container("init", limits={GPU: 1})]))
    assert result["spec"]["initContainers"][0]["resources"]["requests"] == {GPU: 1}


@pytest.mark.parametrize(
    ("annotations", "namespace", "expected"),
    [
        ({"gpu-webhook/accelerator": "nvidia-a100"}, "research", "nvidia-a100"),  # annotation wins
        (None, "research", "nvidia-l4"),  # then the namespace default
        (None, "default", "nvidia-tesla-t4"),  # then the global default
    ],
    ids=["annotation", "namespace default", "global default"],
)
def test_accelerator_comes_from_annotation_then_namespace_then_global_default(annotations, namespace, expected):
    result = mutated(pod(container(limits={GPU: 1}), annotations=annotations), WITH_DEFAULT, namespace)
    assert result["spec"]["nodeSelector"] == {"accelerator": expected}


def test_no_accelerator_is_injected_without_annotation_or_default():
    assert "nodeSelector" not in mutated(pod(container(limits={GPU: 1})))["spec"]


def test_an_existing_node_selector_value_is_never_overridden_and_other_keys_stay():
    obj = pod(container(limits={GPU: 1}), nodeSelector={"accelerator": "mine", "zone": "a"})
    assert mutated(obj, WITH_DEFAULT)["spec"]["nodeSelector"] == {"accelerator": "mine", "zone": "a"}


def test_other_node_selector_keys_are_kept_when_the_accelerator_is_added():
    obj = pod(container(limits={GPU: 1}), nodeSelector={"zone": "a"})
    assert mutated(obj, WITH_DEFAULT)["spec"]["nodeSelector"] == {"zone": "a", "accelerator": "nvidia-tesla-t4"}


def test_a_required_node_affinity_on_the_label_is_respected():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["a", "b"]}]}]}}}
    assert "nodeSelector" not in mutated(pod(container(limits={GPU: 1}), affinity=affinity), WITH_DEFAULT)["spec"]


def test_a_cpu_pod_is_left_alone():
    obj = pod(container(limits={"cpu": "1"}))
    assert pod_patch(obj, WITH_DEFAULT.for_namespace("default")) == []


def test_an_accelerator_outside_the_allowed_list_is_not_injected():
    policy = parse_policy("accelerator: {allowed: [nvidia-l4]}")
    obj = pod(container(limits={GPU: 1}), annotations={"gpu-webhook/accelerator": "nvidia-a100"})
    assert "nodeSelector" not in mutated(obj, policy)["spec"]


def test_tolerations_are_added_once_per_gpu_resource():
    obj = pod(container(limits={GPU: 1}), container("b", limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1}))
    assert mutated(obj, TOLERATE)["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/mig-1g.5gb", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_an_existing_toleration_that_covers_the_resource_is_not_duplicated():
    existing = [{"key": GPU, "operator": "Exists"}]
    obj = pod(container(limits={GPU: 1}), tolerations=existing)
    assert mutated(obj, TOLERATE)["spec"]["tolerations"] == existing


def test_tolerations_are_not_added_unless_the_policy_says_so():
    assert "tolerations" not in mutated(pod(container(limits={GPU: 1})))["spec"]


def test_the_input_is_not_modified():
    obj = pod(container(limits={GPU: 1}))
    before = json.dumps(obj, sort_keys=True)
    mutated(obj, WITH_DEFAULT)
    assert json.dumps(obj, sort_keys=True) == before


@pytest.mark.parametrize("policy", [DEFAULT, WITH_DEFAULT, TOLERATE], ids=["defaults", "accelerator", "tolerations"])
def test_mutation_is_idempotent(policy):
    obj = pod(container(limits={GPU: 1}), initContainers=[container("i", limits={"amd.com/gpu": 1})])
    ops = pod_patch(obj, policy.for_namespace("default"))
    assert ops
    once = jsonpatch.apply_patch(obj, ops)
    assert pod_patch(once, policy.for_namespace("default")) == []


def test_odd_shapes_are_left_for_validate():
    obj = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": "x", "nodeSelector": [1]}}
    assert pod_patch(obj, WITH_DEFAULT.for_namespace("default")) == []


def test_the_mutate_handler_returns_a_base64_json_patch_only_for_new_pods():
    from webhook import review

    request = admission_request(pod(container(limits={GPU: 1})))
    answer = admission.mutate(request, WITH_DEFAULT)
    body = review.encode(review.Review("admission.k8s.io/v1", request), answer)["response"]
    assert body["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(body["patch"]))
    assert {"op": "add", "path": "/spec/nodeSelector", "value": {"accelerator": "nvidia-tesla-t4"}} in ops

    for other in (admission_request(pod(container(limits={GPU: 1})), operation="UPDATE"),
                  admission_request(workload("Deployment", pod(container(limits={GPU: 1})))),
                  admission_request(None, operation="DELETE")):
        answer = admission.mutate(other, WITH_DEFAULT)
        assert answer.allowed and not answer.patch


@pytest.mark.parametrize("value", ["500m", "1Ei", "8Ei", "1e400", "1e600000"])
def test_a_limit_that_is_no_sensible_count_is_not_copied_into_requests(value):
    assert pod_patch(pod(container(limits={GPU: value})), DEFAULT.for_namespace("default")) == []


def test_mutate_never_denies_an_invalid_pod():
    answer = admission.mutate(admission_request(pod(container(limits={GPU: "two"}))), DEFAULT)
    assert answer.allowed


def test_the_patch_adds_only_what_is_absent_with_escaped_paths():
    obj = pod(container(limits={GPU: 2, "cpu": "1"}, requests={"cpu": "500m"}), nodeSelector={"zone": "a"},
              tolerations=[{"key": "x", "operator": "Exists"}])
    ops = pod_patch(obj, parse_policy("accelerator: {default: nvidia-l4}\ntolerations: true").for_namespace(""))
    assert ops == [
        {"op": "add", "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu", "value": 2},
        {"op": "add", "path": "/spec/nodeSelector/accelerator", "value": "nvidia-l4"},
        {"op": "add", "path": "/spec/tolerations/1",
         "value": {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}},
    ]
