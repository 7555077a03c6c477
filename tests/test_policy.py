"""The policy file: defaults, overlays, and refusals that name the bad key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from webhook.core.policyfile import PolicyError, build_policy, load_policy, parse_policy
from webhook.core.policyschema import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent


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
        ("checks: {cpuPodOnGPUNodes: warn}",
         "checks: unknown key(s) 'cpuPodOnGPUNodes' (did you mean 'cpuPodOnGpuNodes'?)"),
        ("enforcement: block", "enforcement: block is not a setting (use deny or warn)"),
        ("checks: {mixedGpuAndMig: on}", "checks.mixedGpuAndMig: true is not a setting (use deny, warn or off)"),
        ("cluster: {unknownAccelerator: yes}", "cluster.unknownAccelerator: true is not a setting (use deny, warn"),
        ("limits: {perPod: -1}", "limits.perPod: -1 is less than the minimum of 0"),
        ("limits: {perPod: two}", "limits.perPod: 'two' is not of type 'integer'"),
        ("tolerations: yes please", "tolerations: 'yes please' is not of type 'boolean'"),
        ("namespaces: {a: {enforcement: off}}", "namespaces.a.enforcement: false is not a setting (use deny or warn)"),
        ("namespaces: {a: {accelerator: {nodeLabel: x}}}", "namespaces.a.accelerator: unknown key(s) 'nodeLabel'"),
        ("namespaces: {Research: {}}", "namespaces: 'Research' is not a namespace name"),
        ("namespaces: {~: {}}", "namespaces: '~' is not a namespace name"),
        ("namespaces: {1.5: {}}", "namespaces: '1.5' is not a namespace name"),
        ("namespaces: {a: {}, a: {enforcement: warn}}", "found duplicate key 'a'"),
        ('resources: ["*"]', "resources[0]: '*' matches cpu, ephemeral-storage, hugepages-*, memory, pods, storage"),
        ('resources: [nvidia.com/gpu, "huge*"]', "resources[1]: 'huge*' matches hugepages-*, which are not GPUs"),
        ("resources: [nvidia.com/gpu, gpu]", "resources[1]: 'gpu' has no domain (GPUs are extended resources"),
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


NOT_A_NAME = "is not a namespace name (lowercase letters, digits and '-', at most 63)"

# Each bad policy -> every problem it has, all at once: the schema's and those after it (namespace names, GPU
# resource names, the default accelerator of the policy and of each namespace), each naming its key, in the order
# the reference lists the keys (namespace names and list items in their own order).
ALL_AT_ONCE = [
    ("a bad namespace name and a default outside the allowed list",
     "accelerator: {allowed: [nvidia-l4], default: nvidia-a100}\nnamespaces: {Research: {enforcement: warn}}",
     ["accelerator.default: 'nvidia-a100' is not in the allowed list ['nvidia-l4']",
      f"namespaces: 'Research' {NOT_A_NAME}"]),
    ("schema problems and the checks after the schema together",
     'enforcement: x\nlimits: {perPod: -1}\nfoo: 1\nresources: ["*"]\nnamespaces: {A: {}}\n'
     "accelerator: {allowed: [a], default: b}",
     ["(top level): unknown key(s) 'foo'",
      "resources[0]: '*' matches cpu, ephemeral-storage, hugepages-*, memory, pods, storage, which are not GPUs",
      "accelerator.default: 'b' is not in the allowed list ['a']",
      "limits.perPod: -1 is less than the minimum of 0",
      "enforcement: x is not a setting (use deny or warn)",
      f"namespaces: 'A' {NOT_A_NAME}"]),
    ("the same mistakes written in another order: the same list",
     "namespaces: {A: {}}\naccelerator: {allowed: [a], default: b}\nresources: [\"*\"]\nfoo: 1\n"
     "limits: {perPod: -1}\nenforcement: x",
     ["(top level): unknown key(s) 'foo'",
      "resources[0]: '*' matches cpu, ephemeral-storage, hugepages-*, memory, pods, storage, which are not GPUs",
      "accelerator.default: 'b' is not in the allowed list ['a']",
      "limits.perPod: -1 is less than the minimum of 0",
      "enforcement: x is not a setting (use deny or warn)",
      f"namespaces: 'A' {NOT_A_NAME}"]),
    ("every namespace's overlay is checked, each in name order, its keys in the reference's order",
     "namespaces:\n  team-b: {enforcement: block, accelerator: {allowed: [a], default: b}}\n"
     "  team-a: {limits: {perPod: two}, accelerator: {allowed: [c], default: d}}",
     ["namespaces.team-a.accelerator.default: 'd' is not in the allowed list ['c']",
      "namespaces.team-a.limits.perPod: 'two' is not of type 'integer'",
      "namespaces.team-b.accelerator.default: 'b' is not in the allowed list ['a']",
      "namespaces.team-b.enforcement: block is not a setting (use deny or warn)"]),
    ("the overlay of a namespace key that is no name is checked too",
     "namespaces: {Team_A: {enforcement: block, accelerator: {allowed: [a], default: b}}}",
     [f"namespaces: 'Team_A' {NOT_A_NAME}",
      "namespaces.Team_A.accelerator.default: 'b' is not in the allowed list ['a']",
      "namespaces.Team_A.enforcement: block is not a setting (use deny or warn)"]),
    ("a namespace's default against the policy's allowed list, its allowed list against the policy's default",
     "accelerator: {allowed: [a, b], default: a}\n"
     "namespaces: {x: {accelerator: {default: c}}, y: {accelerator: {allowed: [b]}}, z: {enforcement: warn}}",
     ["namespaces.x.accelerator.default: 'c' is not in the allowed list ['a', 'b'] (accelerator.allowed)",
      "namespaces.y.accelerator.allowed: ['b'] leaves out the default 'a' (accelerator.default)"]),
    ("a default outside the allowed list is named once, not again for each namespace that inherits it",
     "accelerator: {allowed: [a], default: b}\nnamespaces: {x: {enforcement: warn}, y: {}}",
     ["accelerator.default: 'b' is not in the allowed list ['a']"]),
    ("a value the schema refuses is not checked again against the rest",
     "accelerator: {allowed: a, default: b}\nnamespaces: {x: {accelerator: {default: 7}}}",
     ["accelerator.allowed: 'a' is not of type 'array'",
      "namespaces.x.accelerator.default: 7 is not of type 'string'"]),
    ("a bad value and an unknown key in one section",
     "checks: {mixedGpuAndMig: on, cpuPodOnGPUNodes: warn}",
     ["checks: unknown key(s) 'cpuPodOnGPUNodes' (did you mean 'cpuPodOnGpuNodes'?)",
      "checks.mixedGpuAndMig: true is not a setting (use deny, warn or off)"]),
]


@pytest.mark.parametrize(("text", "problems"), [(t, p) for _, t, p in ALL_AT_ONCE], ids=[n for n, _, _ in ALL_AT_ONCE])
def test_every_problem_of_a_policy_is_named_at_once(text, problems):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert caught.value.problems == problems
    # one line that reads back as the list: no problem holds the "; " between them
    assert str(caught.value).split("p.yaml: invalid policy: ")[1].split("; ") == problems


# A key written in the wrong place -> where it lives, from the schema: a rule's setting, a section's key, a
# top-level key, a key only the top level has (not a namespace), or the nearest spelling.
WRONG_PLACE = [
    ("unknownAccelerator: warn",
     "(top level): unknown key(s) 'unknownAccelerator' (a setting of cluster.*: write it as "
     "cluster.unknownAccelerator)"),
    ("perContainer: 2",
     "(top level): unknown key(s) 'perContainer' (a setting of limits.*: write it as limits.perContainer)"),
    ("platformNamespaces: [gpu-operator]",
     "(top level): unknown key(s) 'platformNamespaces' (a setting of isolation.*: write it as "
     "isolation.platformNamespaces)"),
    ("serviceAccounts: [monitoring/dcgm]",
     "(top level): unknown key(s) 'serviceAccounts' (a setting of isolation.trusted.*: write it as "
     "isolation.trusted.serviceAccounts)"),
    ("checks: {unknownAccelerator: warn}",
     "checks: unknown key(s) 'unknownAccelerator' (a setting of cluster.*: write it as cluster.unknownAccelerator)"),
    ("dra: {perPod: 1, allocationModeAll: off, enforcement: warn}",
     "dra: unknown key(s) 'enforcement' (a setting of the top level: write it as enforcement), "
     "'perPod' (a setting of limits.*: write it as limits.perPod)"),
    ("isolation: {namespaces: [gpu-operator]}",
     "isolation: unknown key(s) 'namespaces' (a setting of isolation.trusted.* or the top level: write it as "
     "isolation.trusted.namespaces or namespaces)"),
    ("namespaces: {a: {perPod: 2}}",
     "namespaces.a: unknown key(s) 'perPod' (a setting of namespaces.a.limits.*: write it as "
     "namespaces.a.limits.perPod)"),
    ("namespaces: {a: {checks: {allowedDeviceClasses: [x]}}}",
     "namespaces.a.checks: unknown key(s) 'allowedDeviceClasses' (a setting of namespaces.a.dra.*: write it as "
     "namespaces.a.dra.allowedDeviceClasses)"),
    ("namespaces: {a: {cluster: {enabled: true}}}",
     "namespaces.a.cluster: unknown key(s) 'enabled' (not per namespace: cluster.enabled is set at the top level)"),
    ("namespaces: {a: {gpuClasses: [x], platform: gke}}",
     "namespaces.a: unknown key(s) 'gpuClasses' (not per namespace: dra.gpuClasses is set at the top level), "
     "'platform' (not per namespace: platform is set at the top level)"),
    ("cpuPodOnGPUNodes: warn",
     "(top level): unknown key(s) 'cpuPodOnGPUNodes' (did you mean checks.cpuPodOnGpuNodes?)"),
    ("enforcment: warn", "(top level): unknown key(s) 'enforcment' (did you mean 'enforcement'?)"),
    ("accelerator: {label: x}", "accelerator: unknown key(s) 'label' (did you mean 'nodeLabel'?)"),
    ("accelerator: {vendor: x}", "accelerator: unknown key(s) 'vendor'"),  # nothing close enough to suggest
]


@pytest.mark.parametrize(("text", "problem"), WRONG_PLACE)
def test_a_key_in_the_wrong_place_is_told_where_it_lives(text, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert caught.value.problems == [problem]


# A key that both the top level and a section have (excludeNamespaces: every engine's, and the native policies'
# extra ones) is no mistake at the top.
SECTION_KEYS = [(section, key) for section, value in DEFAULTS.items() if isinstance(value, dict) for key in value
                if key not in DEFAULTS]


@pytest.mark.parametrize(("section", "key"), SECTION_KEYS, ids=[f"{s}.{k}" for s, k in SECTION_KEYS])
def test_every_setting_of_every_section_written_at_the_top_level_is_told_its_section(section, key):
    assert {"checks", "cluster", "dra", "limits", "isolation", "accelerator"} <= {s for s, _ in SECTION_KEYS}
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"{key}: x", "p.yaml")
    assert caught.value.problems == [
        f"(top level): unknown key(s) {key!r} (a setting of {section}.*: write it as {section}.{key})"]


COMMANDS = {
    "check": ["check", "--policy", "p.yaml", "pod.yaml"],
    "serve": ["serve", "--self-signed", "--policy", "p.yaml", "--port", "1"],
    "admission-policies": ["admission-policies", "--policy", "p.yaml"],
}


@pytest.mark.process
@pytest.mark.parametrize("args", list(COMMANDS.values()), ids=list(COMMANDS))
def test_each_command_prints_every_problem_in_one_line_and_exits_2(tmp_path, args):
    name, text, problems = ALL_AT_ONCE[0]
    (tmp_path / "p.yaml").write_text(text + "\nperContainer: 2\n")
    (tmp_path / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n")
    result = subprocess.run([sys.executable, "-m", "webhook", *args], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    hint = "(top level): unknown key(s) 'perContainer' (a setting of limits.*: write it as limits.perContainer)"
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "gpu-webhook: p.yaml: invalid policy: " + "; ".join([hint, *problems]) + "\n"


def test_namespace_keys_are_read_as_written_not_as_yaml_numbers_or_booleans():
    policies = parse_policy("namespaces:\n  2024: {enforcement: warn}\n  on: {enforcement: warn}\n  '7': {}\n"
                            "isolation: {platformNamespaces: []}")
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
    assert "enforcement: maybe is not a setting (use deny or warn)" in result.stderr


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
        ("platform: openshift", "platform: openshift is not a setting (use generic, gke, eks, aks or gpu-operator)"),
        ("isolation: {hideGpus: all}", "isolation.hideGpus: all is not a setting (use void, none or off)"),
        ("isolation: {runtimeClass: NVIDIA}", "isolation.runtimeClass: 'NVIDIA' does not match"),
        ("isolation: {trusted: {serviceAccounts: [dcgm]}}",
         "isolation.trusted.serviceAccounts.0: 'dcgm' does not match"),
        ("isolation: {trusted: {namespaces: [Ops]}}", "isolation.trusted.namespaces.0: 'Ops' does not match"),
        ("isolation: {hideGPUs: void}", "isolation: unknown key(s) 'hideGPUs' (did you mean 'hideGpus'?)"),
        ("namespaces: {a: {isolation: {trusted: {namespaces: [a]}}}}",
         "namespaces.a.isolation: unknown key(s) 'trusted'"),
        ("namespaces: {a: {cluster: {enabled: true}}}", "namespaces.a.cluster: unknown key(s) 'enabled'"),
        ("namespaces: {a: {checks: {privilegedGpu: allow}}}",
         "namespaces.a.checks.privilegedGpu: allow is not a setting (use deny, warn or off)"),
        ("gpuTaints: [{value: gpu}]", "gpuTaints.0: 'key' is a required property"),
        ("gpuTaints: [{key: sku, effect: NoEntry}]", "gpuTaints.0.effect: NoEntry is not a setting"),
    ],
)
def test_a_bad_isolation_policy_is_refused_naming_the_key(text, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_the_native_policies_defaults_are_the_ones_the_generator_reads():
    from webhook.native.generate import live, settings

    assert DEFAULTS["nativePolicies"] == {"customKinds": [], "excludeNamespaces": [], "params": "live"}
    # live by default; inline as the policy says
    assert live(load_policy(None)) and not live(parse_policy("nativePolicies: {params: inline}"))
    assert DEFAULTS["excludeNamespaces"] == ["kube-system", "kube-node-lease"]
    assert settings(load_policy(None))[1] == ["kube-system", "kube-node-lease"]
    assert settings(parse_policy("nativePolicies: {customKinds: []}"))[1] == ["kube-system", "kube-node-lease"]
    # the native policies' own list adds to excludeNamespaces; excludeNamespaces replaces the default
    assert settings(parse_policy("nativePolicies: {excludeNamespaces: [a, kube-system]}"))[1] == [
        "kube-system", "kube-node-lease", "a"]
    assert settings(parse_policy("excludeNamespaces: [b]"))[1] == ["b"]
