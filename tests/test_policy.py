"""The policy file: defaults, overlays, and refusals that name the bad key."""

import subprocess
import sys

import pytest

from webhook.core.policy import PolicyError, build_policy, load_policy, parse_policy


def test_no_file_means_the_documented_defaults():
    p = load_policy(None).for_namespace("anything")
    assert p.resources == ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/*", "nvidia.com/mig-*")
    assert (p.node_label, p.annotation, p.allowed, p.default) == ("accelerator", "gpu-webhook/accelerator", (), "")
    assert (p.per_container, p.per_pod, p.tolerations, p.enforcement) == (0, 0, False, "deny")


def test_the_example_from_the_reference_loads():
    policies = parse_policy(
        """
resources: [nvidia.com/gpu, amd.com/gpu, "gpu.intel.com/*", "nvidia.com/mig-*"]
accelerator:
  nodeLabel: accelerator
  annotation: gpu-webhook/accelerator
  allowed: []
  default: ""
limits: {perContainer: 0, perPod: 0}
tolerations: false
enforcement: deny
namespaces:
  research: {accelerator: {default: nvidia-l4}, enforcement: warn}
"""
    )
    research = policies.for_namespace("research")
    assert (research.default, research.enforcement, research.node_label) == ("nvidia-l4", "warn", "accelerator")
    assert policies.for_namespace("prod").enforcement == "deny"


def test_glob_patterns_name_gpu_resources():
    p = parse_policy("{}").for_namespace("")
    assert p.is_gpu("gpu.intel.com/i915") and p.is_gpu("nvidia.com/mig-3g.20gb")
    assert not p.is_gpu("nvidia.com/gpu-memory") and not p.is_gpu("cpu")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("enforcment: warn", "(top level): unknown key(s) 'enforcment' (did you mean 'enforcement'?)"),
        ("checks: {cpuPodOnGPUNodes: warn}",
         "checks: unknown key(s) 'cpuPodOnGPUNodes' (did you mean 'cpuPodOnGpuNodes'?)"),
        ("accelerator: {label: x}", "accelerator: unknown key(s) 'label'"),  # nothing close enough to suggest
        ("enforcement: block", "enforcement: block is not a setting; use deny or warn"),
        ("checks: {mixedGpuAndMig: on}", "checks.mixedGpuAndMig: true is not a setting; use deny, warn or off"),
        ("cluster: {unknownAccelerator: yes}", "cluster.unknownAccelerator: true is not a setting; use deny, warn"),
        ("limits: {perPod: -1}", "limits.perPod: -1 is less than the minimum of 0"),
        ("limits: {perPod: two}", "limits.perPod: 'two' is not of type 'integer'"),
        ("tolerations: yes please", "tolerations: 'yes please' is not of type 'boolean'"),
        ("namespaces: {a: {enforcement: off}}", "namespaces.a.enforcement: false is not a setting; use deny or warn"),
        ("namespaces: {a: {accelerator: {nodeLabel: x}}}", "namespaces.a.accelerator: unknown key(s) 'nodeLabel'"),
        ("namespaces: {Research: {}}", "namespaces: 'Research' is not a namespace name"),
        ("namespaces: {~: {}}", "namespaces: '~' is not a namespace name"),
        ("namespaces: {1.5: {}}", "namespaces: '1.5' is not a namespace name"),
        ("namespaces: {a: {}, a: {enforcement: warn}}", "found duplicate key 'a'"),
        ('resources: ["*"]', "resources[0]: '*' matches cpu, ephemeral-storage, hugepages-*, memory, pods, storage"),
        ('resources: [nvidia.com/gpu, "huge*"]', "resources[1]: 'huge*' matches hugepages-*, which are not GPUs"),
        ("resources: [nvidia.com/gpu, gpu]", "resources[1]: 'gpu' has no domain; GPUs are extended resources"),
        ('resources: ["*gpu*"]', "resources[0]: '*gpu*' has no domain"),
        ("accelerator: {allowed: [a], default: b}", "accelerator.default: 'b' is not in the allowed list ['a']"),
        ("- a list", "(top level): ['a list'] is not of type 'object'"),
        ("a: [unclosed", "not valid YAML"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(text, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_every_problem_is_reported_at_once():
    with pytest.raises(PolicyError) as caught:
        parse_policy('enforcement: x\nlimits: {perPod: -1}\nfoo: 1\nresources: ["*"]\nnamespaces: {A: {}}')
    assert len(caught.value.problems) == 5


def test_namespace_keys_are_read_as_written_not_as_yaml_numbers_or_booleans():
    policies = parse_policy("namespaces:\n  2024: {enforcement: warn}\n  on: {enforcement: warn}\n  '7': {}")
    assert sorted(policies.by_namespace) == ["2024", "7", "on"]
    assert policies.for_namespace("2024").enforcement == "warn"
    assert policies.for_namespace("on").enforcement == "warn"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        (True, "namespaces: key True (YAML read 'on'/'yes'/'true' as a boolean): quote it"),
        (False, "namespaces: key False (YAML read 'off'/'no'/'false' as a boolean): quote it"),
        (2024, "namespaces: key 2024 is a number, not a name: quote it"),
    ],
)
def test_a_decoded_policy_with_a_namespace_key_that_is_no_string_is_refused(key, problem):
    """Documents decoded elsewhere (not by parse_policy's loader) may still carry YAML 1.1's numbers and booleans."""
    with pytest.raises(PolicyError) as caught:
        build_policy({"namespaces": {key: {"enforcement": "warn"}}})
    assert caught.value.problems == [problem]


def test_merged_keys_may_be_overridden_but_not_written_twice():
    policies = parse_policy("namespaces: {<<: {research: {enforcement: warn}}, research: {}}")
    assert policies.for_namespace("research").enforcement == "deny"


def test_an_unreadable_file_is_a_policy_error(tmp_path):
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")


@pytest.mark.process
def test_serve_refuses_an_invalid_policy_with_exit_code_2(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("enforcement: maybe\n")
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--self-signed", "--policy", str(bad), "--port", "1"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "enforcement: maybe is not a setting; use deny or warn" in result.stderr


@pytest.mark.parametrize(
    ("platform", "label", "taints"),
    [
        ("generic", "accelerator", []),
        ("gke", "cloud.google.com/gke-accelerator", [("nvidia.com/gpu", None, "NoSchedule")]),
        ("eks", "karpenter.k8s.aws/instance-gpu-name", [("nvidia.com/gpu", None, "NoSchedule")]),
        ("aks", "kubernetes.azure.com/accelerator", [("sku", "gpu", "NoSchedule")]),
        ("gpu-operator", "nvidia.com/gpu.product", []),
    ],
)
def test_a_platform_names_its_node_label_and_taints(platform, label, taints):
    p = parse_policy(f"platform: {platform}").default
    assert (p.platform, p.node_label) == (platform, label)
    assert [(t.key, t.value, t.effect) for t in p.gpu_taints] == taints


def test_policy_keys_override_the_platform():
    p = parse_policy("platform: gke\naccelerator: {nodeLabel: pool-gpu}\ngpuTaints: []").default
    assert (p.node_label, p.gpu_taints, p.annotation) == ("pool-gpu", (), "gpu-webhook/accelerator")
    p = parse_policy("platform: aks\ngpuTaints: [{key: gpu, effect: NoExecute}]").default
    assert p.node_label == "kubernetes.azure.com/accelerator"
    assert [(t.key, t.value, t.effect) for t in p.gpu_taints] == [("gpu", None, "NoExecute")]


def test_isolation_settings_and_checks_apply_per_namespace():
    policies = parse_policy(
        "isolation: {runtimeClass: nvidia}\n"
        "checks: {zeroGpuLimit: deny}\n"
        "namespaces:\n"
        "  shared: {isolation: {hideGpus: void}, checks: {privilegedGpu: warn}, cluster: {unknownRuntimeClass: off}}\n"
        "  cdi: {isolation: {runtimeClass: ''}}\n"
    )
    shared, cdi, other = (policies.for_namespace(n) for n in ("shared", "cdi", "other"))
    assert (shared.hide_gpus, shared.runtime_class) == ("void", "nvidia")
    assert (other.hide_gpus, other.runtime_class, cdi.runtime_class) == ("off", "nvidia", "")
    assert shared.settings["privileged-gpu"] == "warn" and other.settings["privileged-gpu"] == "deny"
    assert shared.settings["unknown-runtime-class"] == "off"
    assert shared.settings["zero-gpu-limit"] == other.settings["zero-gpu-limit"] == "deny"


def test_a_bare_off_hides_nothing():
    assert parse_policy("isolation: {hideGpus: off}").default.hide_gpus == "off"
    assert parse_policy("namespaces: {a: {isolation: {hideGpus: none}}}").for_namespace("a").hide_gpus == "none"


def test_trusted_namespaces_and_service_accounts_are_resolved_per_namespace():
    policies = parse_policy(
        "isolation: {trusted: {namespaces: [gpu-operator], serviceAccounts: [monitoring/dcgm, monitoring/gfd]}}\n"
        "namespaces: {gpu-operator: {enforcement: warn}}"
    )
    operator, monitoring, tenant = (policies.for_namespace(n) for n in ("gpu-operator", "monitoring", "team-a"))
    assert operator.trusted and operator.enforcement == "warn" and operator.trusts({})
    assert not monitoring.trusted and monitoring.trusted_accounts == {"dcgm", "gfd"}
    assert monitoring.trusts({"serviceAccountName": "dcgm"}) and not monitoring.trusts({})
    assert not tenant.trusts({"serviceAccountName": "dcgm"})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("platform: openshift", "platform: openshift is not a setting; use generic, gke, eks, aks or gpu-operator"),
        ("isolation: {hideGpus: all}", "isolation.hideGpus: all is not a setting; use void, none or off"),
        ("isolation: {runtimeClass: NVIDIA}", "isolation.runtimeClass: 'NVIDIA' does not match"),
        ("isolation: {trusted: {serviceAccounts: [dcgm]}}",
         "isolation.trusted.serviceAccounts.0: 'dcgm' does not match"),
        ("isolation: {trusted: {namespaces: [Ops]}}", "isolation.trusted.namespaces.0: 'Ops' does not match"),
        ("isolation: {hideGPUs: void}", "isolation: unknown key(s) 'hideGPUs' (did you mean 'hideGpus'?)"),
        ("namespaces: {a: {isolation: {trusted: {namespaces: [a]}}}}",
         "namespaces.a.isolation: unknown key(s) 'trusted'"),
        ("namespaces: {a: {cluster: {enabled: true}}}", "namespaces.a.cluster: unknown key(s) 'enabled'"),
        ("namespaces: {a: {checks: {privilegedGpu: allow}}}",
         "namespaces.a.checks.privilegedGpu: allow is not a setting; use deny, warn or off"),
        ("gpuTaints: [{value: gpu}]", "gpuTaints.0: 'key' is a required property"),
        ("gpuTaints: [{key: sku, effect: NoEntry}]", "gpuTaints.0.effect: NoEntry is not a setting"),
    ],
)
def test_a_bad_isolation_policy_is_refused_naming_the_key(text, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert any(problem in p for p in caught.value.problems), caught.value.problems
