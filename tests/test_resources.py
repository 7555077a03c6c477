"""The vendor resource registry: what each name counts, and the rules on shared and partitioned GPUs."""

from __future__ import annotations

import re

import pytest

from tests.manifests import container, found, pod
from webhook.core import resources
from webhook.core.policy import parse_policy
from webhook.core.resources import Kind
from webhook.rules.admission import decide

DEFAULT = parse_policy("{}")
TRUSTING = parse_policy("isolation: {trusted: {namespaces: [monitoring]}}")
C0 = "spec.containers[0].resources"

KINDS = [
    ("nvidia.com/gpu", Kind.DEVICE),
    ("nvidia.com/gpu.shared", Kind.SHARED),
    ("nvidia.com/mig-1g.5gb", Kind.PARTITION),
    ("nvidia.com/mig-7g.80gb", Kind.PARTITION),
    ("nvidia.com/mig-1g.24gb.me.all", Kind.PARTITION),  # "1g.24gb+me.all": "+" becomes "."
    ("nvidia.com/mig-1g.5gb.shared", Kind.SHARED),  # time-sliced MIG under renameByDefault
    ("management.nvidia.com/gpu", Kind.MONITORING),
    ("amd.com/gpu", Kind.DEVICE),
    ("amd.com/spx_nps1", Kind.PARTITION),
    ("amd.com/cpx_nps4", Kind.PARTITION),
    ("amd.com/dpx_nps2", Kind.PARTITION),
    ("gpu.intel.com/i915", Kind.DEVICE),
    ("gpu.intel.com/xe", Kind.DEVICE),
    ("gpu.intel.com/monitoring", Kind.MONITORING),
    ("gpu.intel.com/i915_monitoring", Kind.MONITORING),
    ("gpu.intel.com/xe_monitoring", Kind.MONITORING),
    ("gpu.intel.com/millicores", Kind.CORES),
    ("gpu.intel.com/memory.max", Kind.MEMORY),
    ("nvidia.com/gpumem", Kind.MEMORY),
    ("nvidia.com/gpumem-percentage", Kind.MEMORY),
    ("nvidia.com/gpucores", Kind.CORES),
    ("nvidia.com/priority", Kind.PRIORITY),
    ("volcano.sh/vgpu-number", Kind.DEVICE),
    ("volcano.sh/vgpu-memory", Kind.MEMORY),
    ("volcano.sh/vgpu-memory-percentage", Kind.MEMORY),
    ("volcano.sh/vgpu-cores", Kind.CORES),
    # Not vendor names this registry knows.
    ("nvidia.com/gpus", None),
    ("nvidia.com/mig-1g", None),
    ("amd.com/cpx_nps3", None),
    ("amd.com/xpx_nps1", None),
    ("gpu.intel.com/i915x", None),
    ("example.com/gpu", None),
    ("NVIDIA.com/gpu", None),
    ("cpu", None),
]


@pytest.mark.parametrize(("name", "kind"), KINDS, ids=[k[0] for k in KINDS])
def test_each_name_has_its_kind(name, kind):
    entry = resources.lookup(name)
    assert (entry.kind if entry else None) is kind


@pytest.mark.parametrize(("name", "kind"), KINDS, ids=[k[0] for k in KINDS])
def test_the_chart_pattern_knows_exactly_the_registered_names(name, kind):
    """The anchored expression the chart's CEL matches with agrees with the registry (RE2 reads it as re does)."""
    assert (re.fullmatch(resources.cel_pattern()[1:-1], name) is not None) is (kind is not None)


def test_every_example_is_its_own_entry():
    for entry in resources.REGISTRY:
        assert resources.lookup(entry.example) is entry, entry.example


def test_only_device_counts_are_gpus_for_the_policy():
    """Under a broad nvidia.com/* pattern HAMi's memory in MiB is still no GPU count."""
    policy = parse_policy('resources: ["nvidia.com/*", "gpu.intel.com/*"]').default
    assert policy.is_gpu("nvidia.com/gpu") and policy.is_gpu("nvidia.com/gpu.shared")
    assert policy.is_gpu("nvidia.com/mig-3g.20gb")
    assert not policy.is_gpu("nvidia.com/gpumem") and not policy.is_gpu("nvidia.com/gpucores")
    assert not policy.is_gpu("gpu.intel.com/monitoring") and not policy.is_gpu("gpu.intel.com/millicores")
    assert policy.is_gpu("nvidia.com/custom-accelerator"), "names no vendor here publishes count when listed"
    assert not DEFAULT.default.is_gpu("nvidia.com/gpu.shared"), "the registry never widens policy.resources"


def test_memory_and_cores_are_not_counted_against_the_caps():
    policy = parse_policy('resources: ["nvidia.com/*"]\nlimits: {perContainer: 2, perPod: 2}')
    hami = pod(container(limits={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 16000, "nvidia.com/gpucores": 50}))
    assert decide(hami, "", "Pod", "default", policy).allowed


CASES = [
    # (id, limits of one container, policy, namespace, expected)
    ("two time-sliced replicas", {"nvidia.com/gpu.shared": 2}, DEFAULT, "default",
     {(f"{C0}.limits[nvidia.com/gpu.shared]", "shared-gpu-over-one")}),
    ("one replica", {"nvidia.com/gpu.shared": 1}, DEFAULT, "default", set()),
    ("two replicas of a shared MIG slice", {"nvidia.com/mig-1g.5gb.shared": "2"}, DEFAULT, "default",
     {(f"{C0}.limits[nvidia.com/mig-1g.5gb.shared]", "shared-gpu-over-one")}),
    ("two whole MIG slices are fine", {"nvidia.com/mig-1g.5gb": 2}, DEFAULT, "default", set()),
    ("shared over one, the rule off", {"nvidia.com/gpu.shared": 2}, parse_policy("checks: {sharedGpuOverOne: off}"),
     "default", set()),
    ("HAMi memory as a percentage over 100", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150}, DEFAULT,
     "default", {(f"{C0}.limits[nvidia.com/gpumem-percentage]", "fractional-gpu-request")}),
    ("HAMi cores over 100", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 101}, DEFAULT, "default",
     {(f"{C0}.limits[nvidia.com/gpucores]", "fractional-gpu-request")}),
    ("HAMi cores at 100", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}, DEFAULT, "default", set()),
    ("a percentage written as 50%", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": "50%"}, DEFAULT, "default",
     {(f"{C0}.limits[nvidia.com/gpucores]", "fractional-gpu-request")}),
    ("HAMi memory both in MiB and as a percentage",
     {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpumem-percentage": 50}, DEFAULT, "default",
     {(C0, "fractional-gpu-request")}),
    ("Volcano memory without a vGPU count", {"volcano.sh/vgpu-memory": 2048}, DEFAULT, "default",
     {(C0, "fractional-gpu-request")}),
    ("Volcano cores as a percentage over 100", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 200},
     DEFAULT, "default", {(f"{C0}.limits[volcano.sh/vgpu-cores]", "fractional-gpu-request")}),
    ("a well-formed Volcano vGPU", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory-percentage": 25}, DEFAULT,
     "default", set()),
    ("Intel's monitoring resource", {"gpu.intel.com/monitoring": 1}, DEFAULT, "default",
     {(f"{C0}.limits[gpu.intel.com/monitoring]", "gpu-monitoring-resource")}),
    ("Intel's deprecated xe_monitoring", {"gpu.intel.com/xe_monitoring": 1}, DEFAULT, "default",
     {(f"{C0}.limits[gpu.intel.com/xe_monitoring]", "gpu-monitoring-resource")}),
    ("NVIDIA's management devices", {"management.nvidia.com/gpu": 1}, DEFAULT, "default",
     {(f"{C0}.limits[management.nvidia.com/gpu]", "gpu-monitoring-resource")}),
    ("monitoring in a trusted namespace", {"gpu.intel.com/monitoring": 1}, TRUSTING, "monitoring", set()),
]


@pytest.mark.parametrize(("limits", "policy", "namespace", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_shared_and_fractional_requests(limits, policy, namespace, expected):
    assert found(pod(container(limits=limits)), policy, namespace) == expected


def test_requests_copied_from_limits_are_not_told_twice():
    """The apiserver stores requests equal to limits for extended resources: one problem, one violation."""
    values = {"nvidia.com/gpu.shared": 2, "nvidia.com/gpucores": 120, "gpu.intel.com/monitoring": 1}
    stored = pod(container(limits=values, requests=dict(values)))
    assert found(stored) == {
        (f"{C0}.limits[nvidia.com/gpu.shared]", "shared-gpu-over-one"),
        (f"{C0}.limits[nvidia.com/gpucores]", "fractional-gpu-request"),
        (f"{C0}.limits[gpu.intel.com/monitoring]", "gpu-monitoring-resource"),
    }
    assert found(pod(container(requests={"nvidia.com/gpu.shared": 3}))) == {
        (f"{C0}.requests[nvidia.com/gpu.shared]", "shared-gpu-over-one")}


def test_shared_over_one_is_refused_with_a_reason():
    answer = decide(pod(container("train", limits={"nvidia.com/gpu.shared": 2})), "", "Pod", "default", DEFAULT)
    assert not answer.allowed
    assert answer.message == (
        "1 GPU violation: spec.containers[0].resources.limits[nvidia.com/gpu.shared]: container \"train\": 2 "
        "nvidia.com/gpu.shared asks for several replicas of a shared GPU, which give no more compute than one "
        "(the kubelet refuses it with failRequestsGreaterThanOne); ask for 1"
    )


def test_hostile_names_are_looked_up_in_bounded_time_and_memory():
    for i in range(5000):
        resources.lookup(f"nvidia.com/mig-{'1' * 200}g.{i}gb" + ".x" * 50)
    assert resources.lookup.cache_info().currsize <= 4096
