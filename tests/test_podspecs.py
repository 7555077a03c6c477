"""Pod-spec shapes every rule reads: how a container is named in messages, the containers read once, the keys
a required node affinity names."""

from __future__ import annotations

import pytest

from tests.manifests import container, pod
from webhook.core.cluster import ClusterState
from webhook.core.field import ROOT
from webhook.core.podspecs import affinity_keys, container_label, read_containers
from webhook.core.policyfile import parse_policy
from webhook.rules.pods import violations

C0 = ROOT.child("spec").child("containers").index(0)

LABELS = [
    ("named", {"name": "main"}, 'container "main"'),
    ("unnamed: by its path, never None", {}, "container spec.containers[0]"),
    ("empty name", {"name": ""}, "container spec.containers[0]"),
    ("a name that is no string", {"name": 7}, "container spec.containers[0]"),
    ("quotes escaped", {"name": 'a"b'}, 'container "a\\"b"'),
    ("a long name cut short", {"name": "x" * 100}, 'container "xxxxxxxxxxxxxxxx…" (100 characters)'),
]


@pytest.mark.parametrize(("fields", "expected"), [case[1:] for case in LABELS], ids=[case[0] for case in LABELS])
def test_container_label(fields, expected):
    assert container_label(fields, C0) == expected


def template_view():
    """A view holding one ResourceClaimTemplate ``two`` asking for 2 devices of class gpu.example.com."""
    state = ClusterState("accelerator")
    state.load([
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.example.com"},
         "spec": {"extendedResourceName": "example.com/gpu"}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "two", "namespace": "default"},
         "spec": {"spec": {"devices": {"requests": [
             {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "count": 2}}]}}}},
    ])
    return state.view()


def messages(obj, policy="{}", view=None):
    return {v.rule: v.message for v in violations(obj, "", "Pod", parse_policy(policy).default, view, "default")}


def test_every_family_names_an_unnamed_container_by_its_path():
    unnamed = {"image": "cuda"}
    mixed = pod({**unnamed, "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.5gb": 1}}})
    assert messages(mixed)["mixed-gpu-and-mig"].startswith("container spec.containers[0] mixes")
    shared = pod({**unnamed, "resources": {"limits": {"nvidia.com/gpu.shared": 2}}})
    assert messages(shared)["shared-gpu-over-one"].startswith("container spec.containers[0]: 2 ")
    visible = pod({**unnamed, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]})
    assert messages(visible)["visible-devices-without-gpu"].startswith("container spec.containers[0] uses no GPU")
    over = pod({**unnamed, "resources": {"limits": {"nvidia.com/gpu": 5}}})
    assert messages(over, "limits: {perContainer: 4}")["per-container-limit"].startswith(
        "container spec.containers[0]: 5 nvidia.com/gpu")
    both = pod({**unnamed, "resources": {"limits": {"example.com/gpu": 1}, "claims": [{"name": "gpu"}]}},
               resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "two"}])
    found = messages(both, "resources: [example.com/gpu]\ndra: {gpuClasses: [gpu.example.com]}\n"
                           "cluster: {enabled: true}", template_view())
    assert found["gpu-limit-and-claim"].startswith("container spec.containers[0] asks for 1 example.com/gpu")


def test_containers_are_read_once_in_order_with_odd_shapes_told():
    spec = {"containers": [container("a"), "oops", container("b", limits={"nvidia.com/gpu": 1})],
            "initContainers": {"not": "a list"},
            "ephemeralContainers": [container("debug")]}
    problems = []
    found = read_containers(spec, ROOT.child("spec"), problems)
    assert [(c.list_name, c.position, str(c.path), c.path.stable) for c in found] == [
        ("containers", 0, "spec.containers[0]", "spec.containers[name=a]"),
        ("containers", 2, "spec.containers[2]", "spec.containers[name=b]"),
        ("ephemeralContainers", 0, "spec.ephemeralContainers[0]", "spec.ephemeralContainers[name=debug]"),
    ]
    assert found[1].limits == {"nvidia.com/gpu": 1} and found[0].limits == {} and found[0].requests == {}
    assert [(str(v.path), v.message) for v in problems] == [
        ("spec.containers[1]", "must be a container mapping"),
        ("spec.initContainers", "must be a list of containers"),
    ]
    assert read_containers({}, ROOT, problems := []) == () and [str(v.path) for v in problems] == ["containers"]


def test_affinity_keys_reads_every_term_and_skips_odd_ones():
    terms = [{"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["l4"]}]},
             "oops", {"matchExpressions": "oops"}, {"matchExpressions": [{"key": "zone"}, {"key": 3}]}]
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}}
    assert affinity_keys(spec) == {"accelerator", "zone"}
    assert affinity_keys({"affinity": {"nodeAffinity": []}}) == set()
