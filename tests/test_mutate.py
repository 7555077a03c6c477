"""Mutation: requests defaulted from limits, the accelerator nodeSelector injected, tolerations added;
applying the patch twice changes nothing."""

from __future__ import annotations

import base64
import json

import jsonpatch
import pytest

from tests.manifests import admission_request, container, pod, runtime_class_view, seed_pod, workload
from webhook.core.policyfile import parse_policy
from webhook.rules import admission
from webhook.rules.mutate import mutated_pod, pod_patch

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
    from webhook.core import review

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


# --- isolation: hideGpus and runtimeClass ---------------------------------------------------------

NVD = "NVIDIA_VISIBLE_DEVICES"
HIDING = parse_policy("namespaces: {shared: {isolation: {hideGpus: void}}, notebooks: {isolation: {hideGpus: none}}}")
VOID = {"name": NVD, "value": "void"}


def env_of(result, list_name="containers", i=0):
    return result["spec"][list_name][i].get("env")


def test_hide_gpus_sets_void_on_a_cpu_pod_in_a_named_namespace_only():
    assert env_of(mutated(pod(container()), HIDING, "shared")) == [VOID]
    assert env_of(mutated(pod(container()), HIDING, "notebooks")) == [{"name": NVD, "value": "none"}]
    assert pod_patch(pod(container()), HIDING.for_namespace("default")) == []


def test_hide_gpus_appends_to_env_and_never_overrides():
    result = mutated(pod(container(env=[{"name": "A", "value": "1"}])), HIDING, "shared")
    assert env_of(result) == [{"name": "A", "value": "1"}, VOID]
    for value in ("all", "0", "none"):
        obj = pod(container(env=[{"name": NVD, "value": value}]))
        assert pod_patch(obj, HIDING.for_namespace("shared")) == [], value
    from_secret = pod(container(env=[{"name": NVD, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]))
    assert pod_patch(from_secret, HIDING.for_namespace("shared")) == []


def test_hide_gpus_leaves_gpu_containers_and_covers_their_cpu_sidecars_and_init_containers():
    obj = pod(container("gpu", limits={GPU: 1}), container("side"), initContainers=[container("init")])
    result = mutated(obj, HIDING, "shared")
    assert env_of(result, i=0) is None
    assert env_of(result, i=1) == [VOID]
    assert env_of(result, "initContainers") == [VOID]
    assert result["spec"]["containers"][0]["resources"]["requests"] == {GPU: 1}


@pytest.mark.parametrize(
    "obj",
    [
        pod(container("gpu", limits={"nvidia.com/gpumem": 4000}), container("side")),  # HAMi
        pod(container("gpu", limits={"volcano.sh/vgpu-number": 1}), container("side")),  # Volcano
        pod(container(), container("side"), annotations={"gpu-fraction": "0.5"}),  # KAI / Run:ai
    ],
    ids=["hami", "volcano", "kai-fraction"],
)
def test_hide_gpus_never_touches_a_fractional_schedulers_pod(obj):
    assert pod_patch(obj, HIDING.for_namespace("shared")) == []


def test_hide_gpus_skips_trusted_pods_and_dra_containers():
    trusting = parse_policy("isolation: {hideGpus: void, trusted: {serviceAccounts: [shared/dcgm]}}")
    assert pod_patch(pod(container(), serviceAccountName="dcgm"), trusting.for_namespace("shared")) == []
    claimed = pod(container(resources={"claims": [{"name": "gpu"}]}), resourceClaims=[{"name": "gpu"}])
    assert pod_patch(claimed, HIDING.for_namespace("shared")) == []


def test_a_container_with_a_gpu_limit_of_zero_is_hidden():
    result = mutated(pod(container(limits={GPU: 0})), HIDING, "shared")
    assert env_of(result) == [VOID]


RUNTIME = parse_policy("isolation: {runtimeClass: nvidia}\ncluster: {enabled: true}")
CLASSES = runtime_class_view({"nvidia": {}, "nvidia-h100": {"accelerator": "nvidia-h100"}})


def test_the_runtime_class_goes_to_gpu_pods_that_name_none():
    assert mutated(pod(container(limits={GPU: 1})), RUNTIME)["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in mutated(pod(container()), RUNTIME)["spec"]
    assert "runtimeClassName" not in mutated(pod(container(limits={GPU: 0})), RUNTIME)["spec"]
    hami = pod(container(limits={GPU: 1, "nvidia.com/gpumem": 4000}))
    assert "runtimeClassName" not in mutated(hami, RUNTIME)["spec"], "HAMi sets its own"
    assert mutated(pod(container(limits={GPU: 1}), runtimeClassName="kata"), RUNTIME)["spec"]["runtimeClassName"] == \
        "kata"


def test_the_runtime_class_is_injected_only_if_it_exists_and_agrees_with_the_selector():
    gpu_pod = pod(container(limits={GPU: 1}))
    policy = RUNTIME.for_namespace("default")
    assert mutated_pod(gpu_pod, policy, CLASSES)["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in mutated_pod(gpu_pod, policy, runtime_class_view({"kata": {}}))["spec"]
    h100 = parse_policy(
        "isolation: {runtimeClass: nvidia-h100}\naccelerator: {default: nvidia-l4}\ncluster: {enabled: true}"
    ).default
    assert "runtimeClassName" not in mutated_pod(gpu_pod, h100, CLASSES)["spec"], "it contradicts the default"
    agreeing = pod(container(limits={GPU: 1}), annotations={"gpu-webhook/accelerator": "nvidia-h100"})
    result = mutated_pod(agreeing, h100, CLASSES)["spec"]
    assert (result["runtimeClassName"], result["nodeSelector"]) == ("nvidia-h100", {"accelerator": "nvidia-h100"})


@pytest.mark.parametrize(
    ("policy", "namespace"),
    [(HIDING, "shared"), (RUNTIME, "default"), (parse_policy("platform: aks\ntolerations: true"), "default")],
    ids=["hideGpus", "runtimeClass", "platform tolerations"],
)
def test_isolation_mutation_is_idempotent(policy, namespace):
    obj = pod(container(limits={GPU: 1}), container("side", env=[{"name": "A", "value": "1"}]),
              initContainers=[container("init")])
    ops = pod_patch(obj, policy.for_namespace(namespace), CLASSES)
    assert ops
    once = jsonpatch.apply_patch(obj, ops)
    assert pod_patch(once, policy.for_namespace(namespace), CLASSES) == []


@pytest.mark.parametrize(
    ("platform", "toleration"),
    [
        ("gke", {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        ("aks", {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
    ],
)
def test_tolerations_follow_the_platforms_taints(platform, toleration):
    policy = parse_policy(f"platform: {platform}\ntolerations: true")
    result = mutated(pod(container(limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1})), policy)
    assert result["spec"]["tolerations"] == [toleration]
    already = pod(container(limits={GPU: 1}), tolerations=[{"key": toleration["key"], "operator": "Exists"}])
    assert mutated(already, policy)["spec"]["tolerations"] == already["spec"]["tolerations"]


def test_a_gpu_count_of_zero_gets_no_selector_and_no_toleration():
    """The zero-limit trick lands a pod on GPU nodes; the webhook does not help it (found by the property that
    mutation never makes a pod worse: a privileged container with nvidia.com/gpu: 0 became a privileged pod on
    GPU nodes)."""
    policy = parse_policy("platform: aks\ntolerations: true\naccelerator: {default: nvidia-l4}")
    result = mutated(pod(container(limits={GPU: 0}, securityContext={"privileged": True})), policy)
    assert "nodeSelector" not in result["spec"] and "tolerations" not in result["spec"]
    assert result["spec"]["containers"][0]["resources"]["requests"] == {GPU: 0}
