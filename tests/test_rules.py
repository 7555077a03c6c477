"""Validation rules, as a table: a manifest, a policy, and the violations it must produce (path, rule)."""

from __future__ import annotations

import copy

import pytest

from tests.manifests import container, found, pod, pytorch_job, ray_cluster, seed_pod, workload
from webhook.core.podspecs import group_of
from webhook.core.policyfile import parse_policy
from webhook.rules.admission import decide

GPU = "nvidia.com/gpu"
DEFAULT = parse_policy("{}")
CAPPED = parse_policy("limits: {perContainer: 2, perPod: 3}")
ALLOWED = parse_policy("accelerator: {allowed: [nvidia-tesla-p100, nvidia-l4]}")

L0 = f"spec.containers[0].resources.limits[{GPU}]"
R0 = f"spec.containers[0].resources.requests[{GPU}]"


ADMITTED = [
    ("the seed cuda-vector-add pod", seed_pod(), DEFAULT),
    ("the seed pod with an allowed accelerator", seed_pod(), ALLOWED),
    ("limits only", pod(container(limits={GPU: 1})), DEFAULT),
    ("requests equal to limits", pod(container(limits={GPU: 2}, requests={GPU: 2})), DEFAULT),
    ("equal in another notation: 1000m is one", pod(container(limits={GPU: 1}, requests={GPU: "1000m"})), DEFAULT),
    ("a quoted whole number", pod(container(limits={GPU: "4"})), DEFAULT),
    ("zero GPUs are a whole number (the zero-limit warning aside)", pod(container(limits={GPU: 0})),
     parse_policy("checks: {zeroGpuLimit: off}")),
    ("cpu and memory may be fractional", pod(container(limits={"cpu": "500m", "memory": "1.5Gi"})), DEFAULT),
    ("a pod with no resources at all", pod(container()), DEFAULT),
    ("AMD and Intel resources", pod(container(limits={"amd.com/gpu": 1, "gpu.intel.com/i915": 1})), DEFAULT),
    ("a MIG profile", pod(container(limits={"nvidia.com/mig-1g.5gb": 2})), DEFAULT),
    ("at the per-container and per-pod caps", pod(container(limits={GPU: 2}), container("b", limits={GPU: 1})), CAPPED),
    (
        "a plain init container does not add to the pod's count",
        pod(container(limits={GPU: 2}), initContainers=[container("init", limits={GPU: 2})]),
        parse_policy("limits: {perContainer: 2, perPod: 3}\nchecks: {initContainerGpus: off}"),
    ),
    ("a resource the policy does not name is not checked", pod(container(limits={"example.com/foo": "500m"})), DEFAULT),
    (
        "annotation and nodeSelector agree",
        pod(container(limits={GPU: 1}), annotations={"gpu-webhook/accelerator": "nvidia-l4"},
            nodeSelector={"accelerator": "nvidia-l4"}),
        ALLOWED,
    ),
]


@pytest.mark.parametrize(("obj", "policy"), [c[1:] for c in ADMITTED], ids=[c[0] for c in ADMITTED])
def test_admitted(obj, policy):
    assert found(obj, policy) == set()


DENIED = [  # violations found; decide() turns each into a denial or a warning by its setting
    (
        "a CPU pod selecting an accelerator: not the allowed-list rule, but a wasted GPU node",
        pod(container(), nodeSelector={"accelerator": "nvidia-a100"}),
        ALLOWED,
        {("spec.nodeSelector[accelerator]", "cpu-pod-on-gpu-nodes")},
    ),
    (
        "requests without limits",
        pod(container(requests={GPU: 1})),
        DEFAULT,
        {(R0, "requests-without-limits")},
    ),
    ("a fraction in milli notation: 500m", pod(container(limits={GPU: "500m"})), DEFAULT, {(L0, "invalid-quantity")}),
    ("a decimal fraction: 1.5", pod(container(limits={GPU: "1.5"})), DEFAULT, {(L0, "invalid-quantity")}),
    ("half a GPU as a JSON number", pod(container(limits={GPU: 0.5})), DEFAULT, {(L0, "invalid-quantity")}),
    ("a negative count", pod(container(limits={GPU: -1})), DEFAULT, {(L0, "invalid-quantity")}),
    ("a word", pod(container(limits={GPU: "two"})), DEFAULT, {(L0, "invalid-quantity")}),
    ("NaN, which Python's Decimal would accept", pod(container(limits={GPU: "NaN"})), DEFAULT,
     {(L0, "invalid-quantity")}),
    ("a boolean", pod(container(limits={GPU: True})), DEFAULT, {(L0, "invalid-quantity")}),
    ("an absurd count: 1Ei", pod(container(limits={GPU: "1Ei"})), DEFAULT, {(L0, "invalid-quantity")}),
    ("an absurd exponent under a cap is a violation, not an internal error",
     pod(container(limits={GPU: "1e5000"})), CAPPED, {(L0, "invalid-quantity")}),
    ("requests differ from limits", pod(container(limits={GPU: 2}, requests={GPU: 1})), DEFAULT,
     {(R0, "requests-differ")}),
    (
        "a fractional request without limits: both problems at once",
        pod(container(requests={GPU: "500m"})),
        DEFAULT,
        {(R0, "invalid-quantity"), (R0, "requests-without-limits")},
    ),
    ("over the per-container cap", pod(container(limits={GPU: 3})), CAPPED,
     {(L0, "per-container-limit")}),
    (
        "over the per-pod cap across containers",
        pod(container(limits={GPU: 2}), container("b", limits={GPU: 2})),
        CAPPED,
        {("spec", "per-pod-limit")},
    ),
    (
        "a sidecar init container runs beside the app containers and counts",
        pod(container(limits={GPU: 2}),
            initContainers=[container("side", limits={GPU: 2}, restartPolicy="Always")]),
        CAPPED,
        {("spec", "per-pod-limit")},
    ),
    (
        "a plain init container after a sidecar counts with the sidecar",
        pod(container(limits={GPU: 1}),
            initContainers=[container("side", limits={GPU: 1}, restartPolicy="Always"),
                            container("init", limits={GPU: 2})]),
        parse_policy("limits: {perPod: 2}"),
        {("spec", "per-pod-limit"), ("spec.initContainers[1].resources", "init-container-gpus")},  # 2 + 1 = 3
    ),
    (
        "an accelerator not in the allowed list, by nodeSelector",
        pod(container(limits={GPU: 1}), nodeSelector={"accelerator": "nvidia-a100"}),
        ALLOWED,
        {("spec.nodeSelector[accelerator]", "accelerator-not-allowed")},
    ),
    (
        "an accelerator not in the allowed list, by annotation",
        pod(container(limits={GPU: 1}), annotations={"gpu-webhook/accelerator": "nvidia-a100"}),
        ALLOWED,
        {("metadata.annotations[gpu-webhook/accelerator]", "accelerator-not-allowed")},
    ),
    (
        "annotation conflicts with nodeSelector",
        pod(container(limits={GPU: 1}), annotations={"gpu-webhook/accelerator": "nvidia-l4"},
            nodeSelector={"accelerator": "nvidia-tesla-p100"}),
        ALLOWED,
        {("metadata.annotations[gpu-webhook/accelerator]", "accelerator-conflict")},
    ),
    (
        "ephemeral containers may not hold GPUs",
        pod(container(), ephemeralContainers=[container("debug", limits={GPU: 1})]),
        DEFAULT,
        {("spec.ephemeralContainers[0].resources", "ephemeral-gpu")},
    ),
    (
        "GPUs in pod-level resources",
        pod(container(), resources={"limits": {GPU: 1}}),
        DEFAULT,
        {(f"spec.resources.limits[{GPU}]", "pod-level-gpu")},
    ),
    (
        "init containers are checked like app containers",
        pod(container(), initContainers=[container("init", requests={GPU: 1})]),
        DEFAULT,
        {(f"spec.initContainers[0].resources.requests[{GPU}]", "requests-without-limits"),
         ("spec.initContainers[0].resources", "init-container-gpus")},
    ),
    (
        "every violation in every container is reported at once",
        pod(container(limits={GPU: "500m"}), container("b", requests={"amd.com/gpu": 1}),
            container("c", limits={"nvidia.com/mig-1g.5gb": 1}, requests={"nvidia.com/mig-1g.5gb": 2})),
        DEFAULT,
        {
            (L0, "invalid-quantity"),
            ("spec.containers[1].resources.requests[amd.com/gpu]", "requests-without-limits"),
            ("spec.containers[2].resources.requests[nvidia.com/mig-1g.5gb]", "requests-differ"),
        },
    ),
    ("containers not a list", {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": "x"}},
     DEFAULT, {("spec.containers", "structure")}),
    ("a container that is not a mapping", {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{}, 3]}},
     DEFAULT, {("spec.containers[1]", "structure")}),
    ("limits not a mapping", pod(container(resources={"limits": [1]})), DEFAULT,
     {("spec.containers[0].resources.limits", "structure")}),
]


@pytest.mark.parametrize(("obj", "policy", "expected"), [c[1:] for c in DENIED], ids=[c[0] for c in DENIED])
def test_denied(obj, policy, expected):
    assert found(obj, policy) == expected


BAD_POD = pod(container(requests={GPU: 1}))
BAD = f"requests[{GPU}]"


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        (workload("Deployment", BAD_POD), "spec.template.spec.containers[0].resources." + BAD),
        (workload("ReplicaSet", BAD_POD), "spec.template.spec.containers[0].resources." + BAD),
        (workload("StatefulSet", BAD_POD), "spec.template.spec.containers[0].resources." + BAD),
        (workload("DaemonSet", BAD_POD), "spec.template.spec.containers[0].resources." + BAD),
        (workload("Job", BAD_POD), "spec.template.spec.containers[0].resources." + BAD),
        (workload("ReplicationController", BAD_POD), "spec.template.spec.containers[0].resources." + BAD),
        (workload("PodTemplate", BAD_POD), "template.spec.containers[0].resources." + BAD),
        (workload("CronJob", BAD_POD), "spec.jobTemplate.spec.template.spec.containers[0].resources." + BAD),
        (pytorch_job(seed_pod(), BAD_POD),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources." + BAD),
        (ray_cluster(seed_pod(), [seed_pod(), BAD_POD]),
         "spec.workerGroupSpecs[1].template.spec.containers[0].resources." + BAD),
    ],
    ids=lambda v: v["kind"] if isinstance(v, dict) else "",
)
def test_pod_templates_are_found_in_every_kind_with_their_real_path(obj, path):
    assert found(obj) == {(path, "requests-without-limits")}


def test_a_template_annotation_is_read_from_the_template_metadata():
    obj = workload("Deployment", pod(container(limits={GPU: 1}), annotations={"gpu-webhook/accelerator": "x"}))
    assert found(obj, ALLOWED) == {("spec.template.metadata.annotations[gpu-webhook/accelerator]",
                                    "accelerator-not-allowed")}


def test_a_bare_pod_spec_in_a_custom_resource_is_found():
    obj = {"apiVersion": "example.com/v1", "kind": "Runner", "metadata": {"name": "r"},
           "spec": {"podSpec": {"containers": [container(limits={GPU: "1.5"})]}}}
    assert found(obj) == {(f"spec.podSpec.containers[0].resources.limits[{GPU}]", "invalid-quantity")}


def test_a_custom_resource_without_pod_specs_has_nothing_to_check():
    obj = {"apiVersion": "example.com/v1", "kind": "Thing", "spec": {"containers": "not a pod", "x": [1, {"y": 2}]}}
    assert found(obj) == set()


def test_hostile_nesting_is_bounded():
    deep: dict = {}
    node = deep
    for _ in range(10_000):
        node["a"] = {}
        node = node["a"]
    assert found({"apiVersion": "example.com/v1", "kind": "Deep", "spec": deep}) == set()


def test_the_message_names_the_path_the_container_and_the_value():
    answer = decide(pod(container("cuda", limits={GPU: "500m"})), "", "Pod", "default", DEFAULT)
    assert not answer.allowed and answer.code == 403
    assert answer.message == (
        f'1 GPU violation: {L0}: container "cuda": "500m" is not a whole number (GPUs cannot be shared)'
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [("${GPUS}", '"${GPUS}" is a placeholder that was never substituted; render the manifest first'),
     ("$GPUS", '"$GPUS" is a placeholder that was never substituted; render the manifest first'),
     ("{{ .Values.gpus }}", '"{{ .Values.gpus }}" is a placeholder that was never substituted; render the manifest '
                            'first'),
     ("${GPUS}x", '"${GPUS}x" is not a quantity')],
    ids=["envsubst", "envsubst-bare", "helm", "not-only-a-placeholder"],
)
def test_a_placeholder_left_in_the_manifest_is_named_as_one(value, said):
    """A manifest applied before envsubst or helm rendered it: the count is a placeholder, not a bad number."""
    job = pytorch_job(pod(container()), pod(container("cuda", limits={GPU: value})))
    answer = decide(job, "kubeflow.org", "PyTorchJob", "default", DEFAULT)
    path = f"spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits[{GPU}]"
    assert not answer.allowed
    assert answer.message == f'1 GPU violation: {path}: container "cuda": {said}'
    assert [v.rule for v in answer.violations] == ["invalid-quantity"]


def test_warn_enforcement_admits_and_returns_every_violation_as_a_warning():
    policy = parse_policy("enforcement: warn")
    answer = decide(pod(container(requests={GPU: 1}), container("b", limits={GPU: "x"})), "", "Pod", "ns", policy)
    assert answer.allowed
    assert [w.split(":")[0] for w in answer.warnings] == [R0, f"spec.containers[1].resources.limits[{GPU}]"]


def test_namespace_overrides_apply_only_in_their_namespace():
    policy = parse_policy("limits: {perContainer: 4}\nnamespaces: {small: {limits: {perContainer: 1}}}")
    two = pod(container(limits={GPU: 2}))
    assert found(two, policy, "default") == set()
    assert found(two, policy, "small") == {(L0, "per-container-limit")}


def test_a_namespace_may_relax_enforcement_to_warn():
    policy = parse_policy("namespaces: {research: {enforcement: warn}}")
    bad = pod(container(requests={GPU: 1}))
    assert not decide(bad, "", "Pod", "prod", policy).allowed
    assert decide(bad, "", "Pod", "research", policy).allowed


def test_an_update_is_judged_on_what_it_changes():
    from tests.manifests import admission_request
    from webhook.rules.admission import validate

    capped = parse_policy("limits: {perContainer: 1}")
    old = pod(container(limits={GPU: 2}))  # admitted before the cap existed
    relabelled = pod(container(limits={GPU: 2}))
    relabelled["metadata"]["labels"] = {"team": "a"}
    request = admission_request(relabelled, operation="UPDATE")
    request["oldObject"] = old
    assert validate(request, capped).allowed
    grown = pod(container(limits={GPU: 2}), container("b", limits={GPU: 3}))
    request = admission_request(grown, operation="UPDATE")
    request["oldObject"] = old
    answer = validate(request, capped)
    assert not answer.allowed
    assert [str(v.path) for v in answer.violations] == [f"spec.containers[1].resources.limits[{GPU}]"]


def labelled(obj):
    obj = copy.deepcopy(obj)
    obj["metadata"]["labels"] = {"team": "a"}
    obj["metadata"]["finalizers"] = ["example.com/cleanup"]
    return obj


def deployment(*containers, **spec):
    return workload("Deployment", pod(*containers, **spec))


def ray_groups(*groups):
    """A RayCluster whose worker groups are (groupName, container) pairs, in order."""
    cluster = ray_cluster(pod(container("head")), [pod(c) for _, c in groups])
    for spec, (name, _) in zip(cluster["spec"]["workerGroupSpecs"], groups, strict=True):
        spec["groupName"] = name
    return cluster


CAP1 = parse_policy("limits: {perContainer: 1}")
POD_CAP2 = parse_policy("limits: {perPod: 2}")
T = "spec.template.spec"
TL0 = f"{T}.containers[0].resources.limits[{GPU}]"
A100 = {"accelerator": "nvidia-a100"}
H100 = {"accelerator": "nvidia-h100"}
TOLERATE_GPU = {"key": GPU, "operator": "Exists"}

UPDATES = [  # (old object, new object, policy, violations held against the UPDATE)
    # An object admitted under an older policy still takes new labels and finalizers.
    ("metadata on a pod over a newer cap", pod(container(limits={GPU: 2})), labelled(pod(container(limits={GPU: 2}))),
     CAP1, set()),
    ("metadata on a Deployment over the per-pod cap", deployment(container(limits={GPU: 3})),
     labelled(deployment(container(limits={GPU: 3}))), POD_CAP2, set()),
    ("metadata on a Deployment with a disallowed accelerator",
     deployment(container(limits={GPU: 1}), nodeSelector=A100),
     labelled(deployment(container(limits={GPU: 1}), nodeSelector=A100)), ALLOWED, set()),
    ("metadata on a Deployment requesting without limits", deployment(container(requests={GPU: 1})),
     labelled(deployment(container(requests={GPU: 1}))), DEFAULT, set()),
    # Containers are matched by name: problems that only moved are the same problems.
    ("a CPU container inserted before an old problem", deployment(container("gpu", limits={GPU: 2})),
     deployment(container("cpu"), container("gpu", limits={GPU: 2})), CAP1, set()),
    ("containers reordered", deployment(container("a", limits={GPU: 2}), container("b", requests={GPU: 1})),
     deployment(container("b", requests={GPU: 1}), container("a", limits={GPU: 2})), CAP1, set()),
    ("a toleration inserted before an old one", pod(container(), tolerations=[TOLERATE_GPU]),
     pod(container(), tolerations=[{"key": "other", "operator": "Exists"}, TOLERATE_GPU]), DEFAULT, set()),
    ("a RayCluster worker group inserted before an old problem", ray_groups(("big", container(limits={GPU: 2}))),
     ray_groups(("cpu", container()), ("big", container(limits={GPU: 2}))), CAP1, set()),
    # A problem made different is held to the policy in force, whether it grew or shrank.
    ("a Deployment over a per-pod cap of 2 grown from 3 to 64 GPUs", deployment(container(limits={GPU: 3})),
     deployment(container(limits={GPU: 64})), POD_CAP2, {(T, "per-pod-limit")}),
    ("shrunk from 64 to 3, still over the cap", deployment(container(limits={GPU: 64})),
     deployment(container(limits={GPU: 3})), POD_CAP2, {(T, "per-pod-limit")}),
    ("over the per-container cap, from 2 to 3", deployment(container(limits={GPU: 2})),
     deployment(container(limits={GPU: 3})), CAP1, {(TL0, "per-container-limit")}),
    ("a disallowed accelerator swapped for another", deployment(container(limits={GPU: 1}), nodeSelector=A100),
     deployment(container(limits={GPU: 1}), nodeSelector=H100), ALLOWED,
     {(f"{T}.nodeSelector[accelerator]", "accelerator-not-allowed")}),
    ("requests without limits, from 1 to 2", deployment(container(requests={GPU: 1})),
     deployment(container(requests={GPU: 2})), DEFAULT,
     {(f"{T}.containers[0].resources.requests[{GPU}]", "requests-without-limits")}),
    ("one invalid quantity for another", deployment(container(limits={GPU: "500m"})),
     deployment(container(limits={GPU: "1.5"})), DEFAULT, {(TL0, "invalid-quantity")}),
    ("a renamed container is a new container", deployment(container("a", limits={GPU: 2})),
     deployment(container("b", limits={GPU: 2})), CAP1, {(TL0, "per-container-limit")}),
    ("a CPU container inserted and the GPU container grown", deployment(container("gpu", limits={GPU: 2})),
     deployment(container("cpu"), container("gpu", limits={GPU: 3})), CAP1,
     {(f"{T}.containers[1].resources.limits[{GPU}]", "per-container-limit")}),
    ("a new problem beside an old one", deployment(container("a", limits={GPU: 2})),
     deployment(container("a", limits={GPU: 2}), container("b", limits={GPU: 3})), CAP1,
     {(f"{T}.containers[1].resources.limits[{GPU}]", "per-container-limit")}),
]


@pytest.mark.parametrize(("old", "new", "policy", "expected"), [c[1:] for c in UPDATES], ids=[c[0] for c in UPDATES])
def test_an_update_is_held_to_the_violations_it_introduces_or_changes(old, new, policy, expected):
    answer = decide(new, group_of(new["apiVersion"]), new["kind"], "default", policy, old=old)
    assert {(str(v.path), v.rule) for v in answer.violations} == expected
    assert answer.allowed is not expected
