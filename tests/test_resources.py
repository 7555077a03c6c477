"""The vendor resource registry: what each name counts, and the rules on shared and partitioned GPUs."""

from __future__ import annotations

import re

import pytest

from tests.manifests import container, found, pod
from webhook.core import resources
from webhook.core.policyfile import parse_policy
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
    ("volcano.sh/gpu-number", Kind.DEVICE),
    ("volcano.sh/gpu-memory", Kind.MEMORY),
    # The other vendors HAMi and Volcano schedule (docs/rules.md has each name's source).
    ("amd.com/gpumem", Kind.MEMORY),
    ("amd.com/gpucores", Kind.CORES),
    ("iluvatar.ai/BI-V100-vgpu", Kind.DEVICE),
    ("iluvatar.ai/MR-V50-vgpu", Kind.DEVICE),
    ("iluvatar.ai/BI-V150.vMem", Kind.MEMORY),
    ("iluvatar.ai/MR-V100.vCore", Kind.CORES),
    ("iluvatar.ai/vgpu", Kind.DEVICE),
    ("iluvatar.ai/vcuda-memory", Kind.MEMORY),
    ("iluvatar.ai/vcuda-core", Kind.CORES),
    ("metax-tech.com/gpu", Kind.DEVICE),
    ("metax-tech.com/sgpu", Kind.DEVICE),
    ("metax-tech.com/vcore", Kind.CORES),
    ("metax-tech.com/vmemory", Kind.MEMORY),
    ("mthreads.com/vgpu", Kind.DEVICE),
    ("mthreads.com/sgpu-memory", Kind.MEMORY),
    ("mthreads.com/sgpu-core", Kind.CORES),
    ("hygon.com/dcunum", Kind.DEVICE),
    ("hygon.com/dcumem", Kind.MEMORY),
    ("hygon.com/dcucores", Kind.CORES),
    ("cambricon.com/vmlu", Kind.DEVICE),
    ("cambricon.com/mlu.smlu.vmemory", Kind.MEMORY),
    ("cambricon.com/mlu370.smlu.vmemory", Kind.MEMORY),
    ("cambricon.com/mlu370.smlu.vcore", Kind.CORES),
    ("huawei.com/Ascend910", Kind.DEVICE),
    ("huawei.com/Ascend310", Kind.DEVICE),
    ("huawei.com/Ascend310P", Kind.DEVICE),
    ("huawei.com/Ascend910A", Kind.DEVICE),
    ("huawei.com/Ascend910B3", Kind.DEVICE),
    ("huawei.com/Ascend910B4-1", Kind.DEVICE),
    ("huawei.com/Ascend910C", Kind.DEVICE),
    ("huawei.com/Ascend910B4-1-memory", Kind.MEMORY),
    ("huawei.com/Ascend310P-memory", Kind.MEMORY),
    ("huawei.com/Ascend910B3-core", Kind.CORES),
    ("huawei.com/Ascend910-16c", Kind.PARTITION),
    ("huawei.com/Ascend310P-4c.3cpu", Kind.PARTITION),
    ("huawei.com/npu-core", Kind.CORES),
    ("enflame.com/gcu", Kind.DEVICE),
    ("enflame.com/drs-gcu", Kind.CORES),
    ("enflame.com/gcu-memory", Kind.MEMORY),
    ("enflame.com/gcu-core", Kind.CORES),
    ("kunlunxin.com/xpu", Kind.DEVICE),
    ("kunlunxin.com/vxpu", Kind.DEVICE),
    ("kunlunxin.com/vxpu-memory", Kind.MEMORY),
    ("birentech.com/gpu", Kind.DEVICE),
    ("vastaitech.com/va", Kind.DEVICE),
    ("aws.amazon.com/neuron", Kind.DEVICE),
    ("aws.amazon.com/neuroncore", Kind.PARTITION),
    # Not vendor names this registry knows.
    ("iluvatar.ai/BI-V100.vmem", None),  # the plugin's names are case-sensitive
    ("huawei.com/AscendReal", None),  # an annotation of Ascend's device plugin, not a resource
    ("huawei.com/Ascend910-NetworkUnhealthy", None),
    ("hygon.com/dcu-mem", None),
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


# --- the other vendors HAMi and Volcano schedule ----------------------------------------------------------------

# (glob over the vendor's domain, device counts, names that are no count (memory, cores, slice sizes), percentages)
VENDORS = [
    ("iluvatar.ai/*", ["iluvatar.ai/BI-V100-vgpu", "iluvatar.ai/MR-V100-vgpu", "iluvatar.ai/vgpu"],
     ["iluvatar.ai/BI-V100.vMem", "iluvatar.ai/BI-V100.vCore", "iluvatar.ai/vcuda-memory", "iluvatar.ai/vcuda-core"],
     ["iluvatar.ai/BI-V100.vCore", "iluvatar.ai/vcuda-core"]),
    ("metax-tech.com/*", ["metax-tech.com/gpu", "metax-tech.com/sgpu"],
     ["metax-tech.com/vcore", "metax-tech.com/vmemory"], ["metax-tech.com/vcore"]),
    ("mthreads.com/*", ["mthreads.com/vgpu"], ["mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"], []),
    ("birentech.com/*", ["birentech.com/gpu"], [], []),
    ("hygon.com/*", ["hygon.com/dcunum"], ["hygon.com/dcumem", "hygon.com/dcucores"], ["hygon.com/dcucores"]),
    ("cambricon.com/*", ["cambricon.com/vmlu"],
     ["cambricon.com/mlu.smlu.vmemory", "cambricon.com/mlu370.smlu.vcore"], ["cambricon.com/mlu370.smlu.vcore"]),
    ("huawei.com/*", ["huawei.com/Ascend910", "huawei.com/Ascend910B4-1", "huawei.com/Ascend310P-2c.1cpu"],
     ["huawei.com/Ascend910B4-1-memory", "huawei.com/Ascend910C-core", "huawei.com/npu-core"],
     ["huawei.com/Ascend910C-core"]),
    ("enflame.com/*", ["enflame.com/gcu"], ["enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core"],
     ["enflame.com/gcu-core"]),
    ("kunlunxin.com/*", ["kunlunxin.com/xpu", "kunlunxin.com/vxpu"], ["kunlunxin.com/vxpu-memory"], []),
    ("vastaitech.com/*", ["vastaitech.com/va"], [], []),
    ("amd.com/*", ["amd.com/gpu", "amd.com/cpx_nps4"], ["amd.com/gpumem", "amd.com/gpucores"], ["amd.com/gpucores"]),
    ("volcano.sh/*", ["volcano.sh/vgpu-number", "volcano.sh/gpu-number"], ["volcano.sh/gpu-memory"], []),
]


@pytest.mark.parametrize(("glob", "counts", "others", "percent"), VENDORS, ids=[v[0] for v in VENDORS])
def test_under_a_vendor_glob_only_device_counts_are_gpus(glob, counts, others, percent):
    policy = parse_policy(f'resources: ["{glob}"]').default
    for name in counts:
        assert policy.is_gpu(name) and resources.counts_gpus(name), name
    for name in others:
        assert not policy.is_gpu(name) and not resources.counts_gpus(name), name
        assert resources.known(name), name


def test_the_default_resources_list_no_new_vendor():
    """The default ``resources`` stay the NVIDIA, AMD and Intel device plugins' names (docs/rules.md says why):
    the other vendors' names are GPUs when a policy lists them."""
    for glob, counts, _, _ in VENDORS:
        if glob not in ("amd.com/*", "volcano.sh/*"):
            assert not any(DEFAULT.default.is_gpu(name) for name in counts), glob


@pytest.mark.parametrize(("glob", "counts", "others", "percent"), VENDORS, ids=[v[0] for v in VENDORS])
def test_vendor_percentages_over_100_are_refused(glob, counts, others, percent):
    for name in percent:
        assert resources.lookup(name).percent and resources.lookup(name).scheduler, name
        assert found(pod(container(limits={counts[0]: 1, name: 101}))) == {
            (f"{C0}.limits[{name}]", "fractional-gpu-request")}, name
        assert found(pod(container(limits={counts[0]: 1, name: 100}))) == set(), name
    for name in set(others) - set(percent):
        assert not resources.lookup(name).percent, name
        assert found(pod(container(limits={counts[0]: 1, name: 200}))) == set(), f"{name} is no percentage"


# HAMi's examples (examples/<vendor>/ at v2.10.0; Iluvatar's earlier names from v2.7.0), each container's limits,
# and the one device count in it.
HAMI_EXAMPLES = [
    ("iluvatar.ai/*", {"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vCore": 50, "iluvatar.ai/BI-V100.vMem": 64},
     "iluvatar.ai/BI-V100-vgpu"),
    ("iluvatar.ai/*", {"iluvatar.ai/vgpu": 1, "iluvatar.ai/vcuda-core": 50, "iluvatar.ai/vcuda-memory": 64},
     "iluvatar.ai/vgpu"),
    ("metax-tech.com/*", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 60, "metax-tech.com/vmemory": 4},
     "metax-tech.com/sgpu"),
    ("metax-tech.com/*", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 60, "metax-tech.com/vmemory": "2048Mi"},
     "metax-tech.com/sgpu"),
    ("mthreads.com/*", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32, "mthreads.com/sgpu-core": 8},
     "mthreads.com/vgpu"),
    ("birentech.com/*", {"birentech.com/gpu": 1}, "birentech.com/gpu"),
    ("hygon.com/*", {"hygon.com/dcunum": 1, "hygon.com/dcucores": 60, "hygon.com/dcumem": 2000}, "hygon.com/dcunum"),
    ("cambricon.com/*", {"cambricon.com/vmlu": "1", "cambricon.com/mlu370.smlu.vmemory": "20",
                         "cambricon.com/mlu370.smlu.vcore": "10"}, "cambricon.com/vmlu"),
    ("huawei.com/*", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 2000}, "huawei.com/Ascend910B3"),
    ("huawei.com/*", {"huawei.com/Ascend310P": "1", "huawei.com/Ascend310P-memory": "4096",
                      "huawei.com/Ascend310P-core": "90"}, "huawei.com/Ascend310P"),
    ("enflame.com/*", {"enflame.com/gcu": 1}, "enflame.com/gcu"),
    ("kunlunxin.com/*", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576}, "kunlunxin.com/vxpu"),
    ("vastaitech.com/*", {"vastaitech.com/va": "1"}, "vastaitech.com/va"),
]


@pytest.mark.parametrize(("glob", "limits", "count"), HAMI_EXAMPLES, ids=[next(iter(e[1])) for e in HAMI_EXAMPLES])
def test_hami_examples_hold_one_gpu_under_a_cap_of_one(glob, limits, count):
    """Under ``resources: [<vendor>/*]`` and a cap of one GPU a container, HAMi's own examples are admitted:
    Iluvatar's vgpu 1, vCore 50 and vMem 64 hold one GPU, not 115; two of the device count are over the cap."""
    policy = parse_policy(f'resources: ["{glob}"]\nlimits: {{perContainer: 1}}')
    for policies in (DEFAULT, policy):
        answer = decide(pod(container(limits=dict(limits))), "", "Pod", "default", policies)
        assert answer.allowed and not answer.violations, answer.message
    answer = decide(pod(container(limits={**limits, count: 2})), "", "Pod", "default", policy)
    assert not answer.allowed
    assert {(str(v.path), v.rule) for v in answer.violations} == {
        (f"{C0}.limits[{count}]", "per-container-limit")}


def test_an_enflame_slice_size_is_no_count_of_gcus():
    """enflame.com/drs-gcu: 3 asks for one 3g DRS slice of a GCU, not three GCUs."""
    policy = parse_policy('resources: ["enflame.com/*"]\nlimits: {perContainer: 1}')
    for limits in ({"enflame.com/drs-gcu": 3}, {"enflame.com/gcu-memory": 20480, "enflame.com/gcu-core": 40}):
        answer = decide(pod(container(limits=limits)), "", "Pod", "default", policy)
        assert answer.allowed and not answer.violations, limits


def test_hami_example_percentage_over_100_is_refused():
    limits = {"iluvatar.ai/BI-V100-vgpu": 1, "iluvatar.ai/BI-V100.vCore": 150, "iluvatar.ai/BI-V100.vMem": 64}
    answer = decide(pod(container(limits=limits)), "", "Pod", "default", DEFAULT)
    assert not answer.allowed
    assert {(str(v.path), v.rule) for v in answer.violations} == {
        (f"{C0}.limits[iluvatar.ai/BI-V100.vCore]", "fractional-gpu-request")}


def test_a_vendor_gpu_container_holds_a_gpu_for_isolation():
    """The registry's names are GPUs to the isolation rules whatever ``resources`` lists: a privileged
    container with a MetaX sGPU is a privileged GPU container."""
    limits = {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 60, "metax-tech.com/vmemory": 4}
    shape = pod(container(limits=limits, securityContext={"privileged": True}))
    assert ("spec.containers[0].securityContext.privileged", "privileged-gpu") in found(shape)
