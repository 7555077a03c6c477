"""Cross-field checks: well-formed GPU manifests that still waste or strand GPUs. Each has its own setting."""

from __future__ import annotations

import pytest

from tests.manifests import container, found, pod, pytorch_job, ray_cluster, ray_job, ray_service, seed_pod
from webhook.core.policyfile import parse_policy
from webhook.rules.admission import decide

GPU = "nvidia.com/gpu"
DEFAULT = parse_policy("{}")


def with_accelerator(p, value):
    p["spec"]["nodeSelector"] = {"accelerator": value}
    return p


def torch(nproc=None, elastic=None, worker_gpus=4, master=None, worker=None):
    job = pytorch_job(
        master or pod(container("pytorch", limits={GPU: worker_gpus})),
        worker or pod(container("pytorch", limits={GPU: worker_gpus})),
    )
    if nproc is not None:
        job["spec"]["nprocPerNode"] = nproc
    if elastic is not None:
        job["spec"]["elasticPolicy"] = {"nProcPerNode": elastic}
    return job


def ray(num_gpus, limit, head_gpus=None, head_limit=None, build=ray_cluster):
    """A Ray object (``build``: a RayCluster, RayJob or RayService) whose worker group is told ``num-gpus`` and whose
    worker container has ``limit`` GPUs; its head told ``head_gpus`` with ``head_limit`` GPUs."""
    head = pod(container("head", limits={GPU: head_limit} if head_limit is not None else None))
    obj = build(head, [pod(container("worker", limits={GPU: limit}))])
    spec = obj["spec"]
    cluster = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
    cluster["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = num_gpus
    if head_gpus is not None:
        cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] = head_gpus
    return obj


CASES = [
    (
        "a CPU pod tolerating the GPU taint",
        pod(container(), tolerations=[{"key": GPU, "operator": "Exists"}]),
        {("spec.tolerations[0]", "cpu-pod-on-gpu-nodes")},
    ),
    (
        "a CPU pod selecting an accelerator",
        with_accelerator(pod(container()), "nvidia-l4"),
        {("spec.nodeSelector[accelerator]", "cpu-pod-on-gpu-nodes")},
    ),
    (
        "a GPU pod with the same toleration is fine",
        pod(container(limits={GPU: 1}), tolerations=[{"key": GPU, "operator": "Exists"}]),
        set(),
    ),
    (
        "whole GPUs and MIG slices in one container",
        pod(container(limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1})),
        {("spec.containers[0].resources", "mixed-gpu-and-mig")},
    ),
    (
        "whole GPUs and MIG slices in different containers are fine",
        pod(container(limits={GPU: 1}), container("b", limits={"nvidia.com/mig-1g.5gb": 1})),
        set(),
    ),
    (
        "GPUs in a plain init container",
        pod(container(), initContainers=[container("dl", limits={GPU: 1})]),
        {("spec.initContainers[0].resources", "init-container-gpus")},
    ),
    (
        "GPUs in a sidecar init container are fine",
        pod(container(), initContainers=[container("s", limits={GPU: 1}, restartPolicy="Always")]),
        set(),
    ),
    (
        "PyTorchJob nprocPerNode differs from the worker's GPUs",
        torch(nproc="2"),
        {("spec.nprocPerNode", "process-count-mismatch")},
    ),
    (
        "PyTorchJob elasticPolicy.nProcPerNode differs",
        torch(elastic=8),
        {("spec.elasticPolicy.nProcPerNode", "process-count-mismatch")},
    ),
    ("PyTorchJob nprocPerNode equal to the GPUs", torch(nproc="4"), set()),
    ("PyTorchJob nprocPerNode auto is not a number to compare", torch(nproc="auto"), set()),
    ("nor is a superscript two, which str.isdigit() accepts", torch(nproc="²"), set()),
    ("nor are 5000 digits, which int() refuses", torch(nproc="9" * 5000), set()),
    (
        "RayCluster num-gpus differs from the worker's limit",
        ray("2", 1),
        {("spec.workerGroupSpecs[0].rayStartParams[num-gpus]", "process-count-mismatch")},
    ),
    ("RayCluster num-gpus equal to the limit", ray("1", 1), set()),
    (
        "PyTorchJob nprocPerNode differs from the Master's GPUs (torchrun starts as many there)",
        torch(nproc="4", master=pod(container("pytorch", limits={GPU: 2}))),
        {("spec.nprocPerNode", "process-count-mismatch")},
    ),
    (
        "PyTorchJob elasticPolicy.nProcPerNode differs from the Master's GPUs",
        torch(elastic=4, master=pod(container("pytorch", limits={GPU: 8}))),
        {("spec.elasticPolicy.nProcPerNode", "process-count-mismatch")},
    ),
    ("PyTorchJob with a CPU-only Master", torch(nproc="4", master=pod(container("pytorch"))), set()),
    (
        "RayCluster head told num-gpus without a GPU",
        ray("1", 1, head_gpus="2"),
        {("spec.headGroupSpec.rayStartParams[num-gpus]", "process-count-mismatch")},
    ),
    (
        "RayCluster head told num-gpus other than its limit",
        ray("1", 1, head_gpus=1, head_limit=2),
        {("spec.headGroupSpec.rayStartParams[num-gpus]", "process-count-mismatch")},
    ),
    ("RayCluster head told num-gpus=0 without a GPU", ray("1", 1, head_gpus="0"), set()),
    ("RayCluster head told its own limit", ray("1", 1, head_gpus="2", head_limit=2), set()),
    (
        "PyTorchJob replicas on different accelerators",
        torch(
            master=with_accelerator(pod(container("pytorch", limits={GPU: 4})), "nvidia-l4"),
            worker=with_accelerator(pod(container("pytorch", limits={GPU: 4})), "nvidia-a100"),
        ),
        {("spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelector[accelerator]", "replica-accelerator-mismatch")},
    ),
    (
        "RayCluster worker groups on different accelerators",
        ray_cluster(pod(container("head")), [with_accelerator(seed_pod(), "a"), with_accelerator(seed_pod(), "b")]),
        {("spec.workerGroupSpecs[1].template.spec.nodeSelector[accelerator]", "replica-accelerator-mismatch")},
    ),
]


# Every RayCluster rule reads the RayCluster a RayJob or a RayService embeds too, at its path there.
RAY_KINDS = [(ray_cluster, "spec"), (ray_job, "spec.rayClusterSpec"), (ray_service, "spec.rayClusterConfig")]
RAY_CASES = [
    (
        "num-gpus differs from the worker's limit",
        lambda build: ray("2", 1, build=build),
        {("workerGroupSpecs[0].rayStartParams[num-gpus]", "process-count-mismatch")},
    ),
    ("num-gpus equal to the worker's limit", lambda build: ray("1", 1, build=build), set()),
    (
        "the head told num-gpus other than its limit",
        lambda build: ray("1", 1, head_gpus="1", head_limit=2, build=build),
        {("headGroupSpec.rayStartParams[num-gpus]", "process-count-mismatch")},
    ),
    (
        "the head and a worker group both told wrong",
        lambda build: ray("4", 2, head_gpus="1", build=build),
        {
            ("headGroupSpec.rayStartParams[num-gpus]", "process-count-mismatch"),
            ("workerGroupSpecs[0].rayStartParams[num-gpus]", "process-count-mismatch"),
        },
    ),
    ("the head told its own limit", lambda build: ray("1", 1, head_gpus="2", head_limit=2, build=build), set()),
    (
        "worker groups on different accelerators",
        lambda build: build(pod(container("head")), [with_accelerator(seed_pod(), "a"),
                                                     with_accelerator(seed_pod(), "b")]),
        {("workerGroupSpecs[1].template.spec.nodeSelector[accelerator]", "replica-accelerator-mismatch")},
    ),
    (
        "worker groups on one accelerator",
        lambda build: build(pod(container("head")), [with_accelerator(seed_pod(), "a"),
                                                     with_accelerator(seed_pod(), "a")]),
        set(),
    ),
]


@pytest.mark.parametrize(("build", "at"), RAY_KINDS, ids=[at for _, at in RAY_KINDS])
@pytest.mark.parametrize(("make", "expected"), [c[1:] for c in RAY_CASES], ids=[c[0] for c in RAY_CASES])
def test_the_ray_checks_read_the_raycluster_of_a_rayjob_and_a_rayservice(build, at, make, expected):
    assert found(make(build)) == {(f"{at}.{path}", rule) for path, rule in expected}


def test_a_rayjobs_submitter_is_no_replica_of_its_cluster():
    """The submitter pod runs ``ray job submit``; it is no Ray node, whatever accelerator it asks for."""
    job = ray_job(pod(container("head")), [with_accelerator(seed_pod(), "a")],
                  submitter=with_accelerator(seed_pod(), "b"))
    assert found(job) == set()
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"].append(
        {"groupName": "other", "rayStartParams": {}, "template": {"spec": with_accelerator(seed_pod(), "b")["spec"]}})
    assert found(job) == {("spec.rayClusterSpec.workerGroupSpecs[1].template.spec.nodeSelector[accelerator]",
                           "replica-accelerator-mismatch")}


@pytest.mark.parametrize(("obj", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cross_field_checks(obj, expected):
    assert found(obj) == expected


def test_the_process_count_messages_name_the_replica():
    master = torch(nproc="4", master=pod(container("pytorch", limits={GPU: 2})))
    assert decide(master, "kubeflow.org", "PyTorchJob", "default", DEFAULT).warnings == (
        "spec.nprocPerNode: 4 processes per node but the Master container has 2 GPUs",)
    head = ray("1", 1, head_gpus=1, head_limit=2)
    assert decide(head, "ray.io", "RayCluster", "default", DEFAULT).warnings == (
        "spec.headGroupSpec.rayStartParams[num-gpus]: the Ray head is told num-gpus=1 but its container's GPU limit "
        "is 2",)
    service = ray("2", 1, build=ray_service)
    assert decide(service, "ray.io", "RayService", "default", DEFAULT).warnings == (
        "spec.rayClusterConfig.workerGroupSpecs[0].rayStartParams[num-gpus]: Ray is told num-gpus=2 but the "
        "container's GPU limit is 1",)


def test_defaults_warn_on_mixing_and_the_rest():
    """GPU plus MIG in one container is a device-plugin strategy choice, not a Kubernetes rule: warned about."""
    mixed = pod(
        container(limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1}), initContainers=[container("i", limits={GPU: 1})]
    )
    answer = decide(mixed, "", "Pod", "default", DEFAULT)
    assert answer.allowed
    assert answer.warnings == (
        "spec.containers[0].resources: container \"main\" mixes nvidia.com/gpu with MIG slices (nvidia.com/mig-1g.5gb)",
        "spec.initContainers[0].resources: an init container asks for GPUs "
        "(1 nvidia.com/gpu); they stay reserved for the pod's lifetime",
    )
    denying = decide(mixed, "", "Pod", "default", parse_policy("checks: {mixedGpuAndMig: deny}"))
    assert not denying.allowed and "mixes nvidia.com/gpu with MIG slices (nvidia.com/mig-1g.5gb)" in denying.message


@pytest.mark.parametrize("setting", ["off", "'off'", "false"])
def test_each_check_can_be_switched_off(setting):
    policy = parse_policy(f"checks: {{mixedGpuAndMig: {setting}, initContainerGpus: {setting}}}")
    mixed = pod(
        container(limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1}), initContainers=[container("i", limits={GPU: 1})]
    )
    assert found(mixed, policy) == set()
    assert decide(mixed, "", "Pod", "default", policy).allowed


def test_a_warn_check_can_be_made_to_deny():
    policy = parse_policy("checks: {cpuPodOnGpuNodes: deny}")
    answer = decide(with_accelerator(pod(container()), "nvidia-l4"), "", "Pod", "default", policy)
    assert not answer.allowed and "uses no GPU but selects accelerator=nvidia-l4" in answer.message


def test_warn_enforcement_softens_deny_checks_too():
    policy = parse_policy("enforcement: warn\nchecks: {mixedGpuAndMig: deny}")
    answer = decide(pod(container(limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1})), "", "Pod", "default", policy)
    assert answer.allowed and answer.warnings


def test_the_response_carries_each_violations_action():
    mixed = pod(
        container(limits={GPU: 1, "nvidia.com/mig-1g.5gb": 1}), initContainers=[container("i", limits={GPU: 1})]
    )
    answer = decide(mixed, "", "Pod", "default", parse_policy("checks: {mixedGpuAndMig: deny}"))
    assert {(v.rule, action) for v, action in answer.judged()} == {
        ("mixed-gpu-and-mig", "deny"), ("init-container-gpus", "warn")
    }
