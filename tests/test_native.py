"""``webhook.native``: which objects a policy becomes, which rules they carry, and the CEL pitfalls measured on
kube-apiserver v1.36 (``docs/native-policies.md``), each read off the generated text. What the apiserver makes
of the text is ``tests/e2e/test_native_policies.py``'s."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from webhook.core import catalog
from webhook.core import resources as registry
from webhook.core.policy import CLUSTER_RULES, PolicyError, parse_policy
from webhook.native import claims, kinds, pods, snippets
from webhook.native.generate import LABELS, RULES_ANNOTATION, generate, to_yaml
from webhook.native.rules import BUILDERS, native_rules
from webhook.rules import isolation

POLICY = """\
accelerator: {allowed: [nvidia-l4, nvidia-a100], default: nvidia-l4}
limits: {perContainer: 4, perPod: 8}
tolerations: true
isolation: {hideGpus: void, runtimeClass: nvidia, trusted: {namespaces: [gpu-operator]}}
dra: {allowedDeviceClasses: [gpu.nvidia.com]}
namespaces:
  lab: {enforcement: warn}
  research: {limits: {perPod: 16}, checks: {privilegedGpu: "off"}}
"""


def objects(text: str = POLICY) -> list[dict]:
    return generate(parse_policy(text)).objects


def by_name(objs: list[dict]) -> dict[str, dict]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objs}


def expressions(obj: dict) -> list[str]:
    spec = obj["spec"]
    out = [v["expression"] for v in spec.get("variables", [])]
    for v in spec.get("validations", []):
        out += [v["expression"], v.get("messageExpression", "")]
    out += [m["jsonPatch"]["expression"] for m in spec.get("mutations", []) if "jsonPatch" in m]
    return out


# --- which rules, where ----------------------------------------------------------------------------------------


def test_there_is_one_cel_builder_per_native_rule_of_the_catalog():
    native = {rule.id for rule in catalog.RULES.values() if rule.engine == "native"}
    assert set(BUILDERS) == native
    assert [r.id for r in native_rules()] == [r.id for r in catalog.RULES.values() if r.engine == "native"]
    for builder in BUILDERS.values():
        assert builder.pods or builder.claims, builder.rule


def test_no_cluster_rule_is_native_and_every_webhook_rule_says_why():
    for rule in catalog.RULES.values():
        if rule.id in CLUSTER_RULES:
            assert rule.engine == "webhook", rule.id
        if rule.engine == "webhook":
            assert rule.why, rule.id


def test_a_policy_becomes_two_validating_policies_a_mutating_one_and_few_bindings():
    names = by_name(objects())
    assert sorted(names) == [
        "MutatingAdmissionPolicy/gpu-webhook", "MutatingAdmissionPolicyBinding/gpu-webhook",
        "ValidatingAdmissionPolicy/gpu-webhook-deny", "ValidatingAdmissionPolicy/gpu-webhook-warn",
        "ValidatingAdmissionPolicyBinding/gpu-webhook-deny", "ValidatingAdmissionPolicyBinding/gpu-webhook-deny-warn",
        "ValidatingAdmissionPolicyBinding/gpu-webhook-warn",
    ]
    for obj in names.values():
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert obj["metadata"]["labels"] == LABELS
        assert obj["metadata"]["annotations"][RULES_ANNOTATION]


def test_each_object_names_the_rules_it_implements_and_every_native_rule_that_is_on_is_somewhere():
    names = by_name(objects())
    deny = names["ValidatingAdmissionPolicy/gpu-webhook-deny"]["metadata"]["annotations"][RULES_ANNOTATION].split(",")
    warn = names["ValidatingAdmissionPolicy/gpu-webhook-warn"]["metadata"]["annotations"][RULES_ANNOTATION].split(",")
    assert {"invalid-quantity", "per-pod-limit", "privileged-gpu", "device-class-not-allowed"} <= set(deny)
    assert {"zero-gpu-limit", "cpu-pod-on-gpu-nodes", "blanket-device-toleration"} <= set(warn)
    assert set(deny) | set(warn) == set(BUILDERS)
    for binding in ("gpu-webhook-deny", "gpu-webhook-deny-warn"):
        assert names[f"ValidatingAdmissionPolicyBinding/{binding}"]["metadata"]["annotations"][RULES_ANNOTATION] == \
            ",".join(deny)
    mutations = names["MutatingAdmissionPolicy/gpu-webhook"]["metadata"]["annotations"][RULES_ANNOTATION]
    assert mutations == "accelerator,tolerations,hideGpus,runtimeClass"


def test_a_rule_off_everywhere_is_not_generated_and_one_off_somewhere_is_gated_by_namespace():
    off = objects("checks: {privilegedGpu: \"off\", zeroGpuLimit: \"off\"}\n")
    annotations = " ".join(o["metadata"]["annotations"][RULES_ANNOTATION] for o in off)
    assert "privileged-gpu" not in annotations and "zero-gpu-limit" not in annotations
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]
    variable = next(v["expression"] for v in deny["spec"]["variables"] if v["name"] == "v_privileged_gpu")
    assert variable.startswith("((request.namespace == 'research' ? false : true) ? ")


def test_enforcement_and_namespace_overrides_are_bindings_with_namespace_selectors():
    names = by_name(objects())
    deny = names["ValidatingAdmissionPolicyBinding/gpu-webhook-deny"]["spec"]
    warned = names["ValidatingAdmissionPolicyBinding/gpu-webhook-deny-warn"]["spec"]
    assert deny["validationActions"] == ["Deny"] and warned["validationActions"] == ["Warn"]
    assert deny["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["lab"]}]
    assert warned["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["lab"]}]
    assert names["ValidatingAdmissionPolicyBinding/gpu-webhook-warn"]["spec"]["validationActions"] == ["Warn"]
    everywhere = by_name(objects("enforcement: warn\n"))
    assert everywhere["ValidatingAdmissionPolicyBinding/gpu-webhook-deny"]["spec"] == {
        "policyName": "gpu-webhook-deny", "validationActions": ["Warn"]}
    assert "ValidatingAdmissionPolicyBinding/gpu-webhook-deny-deny" not in everywhere
    back = by_name(objects("enforcement: warn\nnamespaces: {prod: {enforcement: deny}}\n"))
    assert back["ValidatingAdmissionPolicyBinding/gpu-webhook-deny-deny"]["spec"]["validationActions"] == ["Deny"]


def test_namespaces_are_excluded_by_default_and_as_the_policy_says():
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]["matchConstraints"]
    assert deny["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kube-node-lease"]
    mine = by_name(objects("nativePolicies: {excludeNamespaces: [gpu-operator]}\n"))
    spec = mine["MutatingAdmissionPolicy/gpu-webhook"]["spec"]["matchConstraints"]
    assert spec["namespaceSelector"]["matchExpressions"][0]["values"] == ["gpu-operator"]
    none = by_name(objects("nativePolicies: {excludeNamespaces: []}\n"))
    assert "namespaceSelector" not in none["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]["matchConstraints"]


def test_the_known_custom_kinds_are_matched_and_a_policy_adds_a_kind_by_its_template_paths():
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]
    rules = deny["spec"]["matchConstraints"]["resourceRules"]
    matched = {(r["apiGroups"][0], res) for r in rules for res in r["resources"]}
    for kind in kinds.KNOWN_KINDS:
        assert (kind.group, kind.resource) in matched
    assert {("", "pods"), ("apps", "deployments"), ("batch", "cronjobs"), ("resource.k8s.io", "resourceclaims"),
            ("resource.k8s.io", "resourceclaimtemplates")} <= matched
    policy = ("nativePolicies:\n  customKinds:\n  - {group: example.com, version: v2, resource: trainjobs, "
              "kind: TrainJob, templates: ['spec.roles[*].template', 'spec.launcher']}\n")
    custom = by_name(objects(policy))["ValidatingAdmissionPolicy/gpu-webhook-deny"]
    assert {"apiGroups": ["example.com"], "apiVersions": ["v2"], "operations": ["CREATE", "UPDATE"],
            "resources": ["trainjobs"], "scope": "Namespaced"} in custom["spec"]["matchConstraints"]["resourceRules"]
    tpl = next(v["expression"] for v in custom["spec"]["variables"] if v["name"] == "tpl")
    assert "'resource:example.com/trainjobs': [['spec', 'roles', 'template']]" in tpl
    assert "'resource:example.com/trainjobs': [['spec', 'launcher']]" in tpl


@pytest.mark.parametrize("bad", ["spec..x", "*.template", "spec.a[]", "spec.a b", ""])
def test_a_template_path_that_is_not_one_is_refused_with_the_policy(bad):
    with pytest.raises(PolicyError):
        parse_policy(f"nativePolicies: {{customKinds: [{{group: a.io, resource: xs, templates: ['{bad}']}}]}}\n")
    assert kinds.path_problem(bad) is not None


def test_every_template_path_of_the_known_kinds_is_one():
    for kind in kinds.KNOWN_KINDS:
        for path in kind.templates:
            assert kinds.path_problem(path) is None, path


# --- the pitfalls, on the generated text -------------------------------------------------------------------------


def test_no_param_kind_anywhere_values_are_literals():
    text = to_yaml(objects())
    assert "paramKind" not in text and "paramRef" not in text and "params." not in text


def test_integers_are_never_tested_with_is_integer_and_sign_is_a_function():
    for obj in objects():
        for expression in expressions(obj):
            assert ".isInteger()" not in expression
            assert ".sign()" not in expression
    error = snippets.quantity_error("x")
    assert "sign(q) < 0" in error
    # The value is compared with its rounded self, after it is known to be at most the ceiling.
    assert error.index("isGreaterThan(quantity('1000000'))") < error.index("compareTo(quantity(string(int(")


def test_regular_expressions_are_literals_in_matches_never_variables():
    for obj in objects():
        for expression in expressions(obj):
            for match in re.finditer(r"\.matches\(", expression):
                assert expression[match.end():match.end() + 2] in ("r'", 'r"') or expression[match.end()] == '"', \
                    expression[match.start():match.start() + 60]
        for variable in obj["spec"].get("variables", []):
            assert not re.fullmatch(r"r?['\"].*['\"]", variable["expression"]), variable["name"]


def test_node_selector_and_tolerations_are_changed_by_json_patch_only():
    mutating = by_name(objects())["MutatingAdmissionPolicy/gpu-webhook"]["spec"]
    assert mutating["reinvocationPolicy"] == "Never"
    assert all(m["patchType"] == "JSONPatch" and "applyConfiguration" not in m for m in mutating["mutations"])
    patches = " ".join(m["jsonPatch"]["expression"] for m in mutating["mutations"])
    assert "'/spec/nodeSelector'" in patches and "'/spec/tolerations/-'" in patches
    assert "op: 'replace'" not in patches and "op: 'remove'" not in patches


def test_values_that_may_be_numbers_are_typed_before_string_is_applied():
    error = snippets.quantity_error("x")
    for match in re.finditer(r"string\(x\)", error):
        before = error[:match.start()]
        guard = max(before.rfind("type(x) == int ?"), before.rfind("type(x) == double ?"),
                    before.rfind("type(x) == int || type(x) == uint || type(x) == double ?"))
        assert guard >= 0, error[max(0, match.start() - 80):match.end()]


def test_one_aggregated_one_line_message_of_bounded_size_per_deny_policy():
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]
    [validation] = deny["validations"]
    assert validation["expression"] == "size(variables.found) == 0"
    message = validation["messageExpression"]
    assert "variables.found.map(x, x.m).join('; ')" in message and "' GPU violation'" in message
    assert "size(bytes(s)) <= 5000" in message
    assert validation["reason"] == "Forbidden" and "\n" not in validation["message"]
    assert deny["failurePolicy"] == "Fail"
    warn = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-warn"]["spec"]
    assert warn["failurePolicy"] == "Ignore" and len(warn["validations"]) == len(
        by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-warn"]["metadata"]["annotations"][
            RULES_ANNOTATION].split(","))


def test_messages_are_one_line_and_word_violations_as_the_webhook_does():
    # Newlines in values are escaped before they reach a message (the apiserver drops a message with one).
    assert ".replace('\\n', '\\\\n')" in snippets.quoted("v")
    text = " ".join(e for obj in objects() for e in expressions(obj))
    assert "is over the limit of ' + string(" in text
    assert "' is not a whole number (GPUs cannot be shared)'" in text
    assert "' is requested without a limit, set it in limits (requests default to limits)'" in text


def test_an_update_is_held_only_to_the_violations_the_old_object_did_not_have():
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]
    variables = {v["name"]: v["expression"] for v in deny["variables"]}
    assert variables["roots"] == "request.operation == 'UPDATE' && oldObject != null ? [object, oldObject] : [object]"
    assert variables["found"].endswith(".filter(x, x.o == 0 && !(x.k in variables.old_keys))")
    assert ".filter(x, x.o == 1).map(x, x.k)" in variables["old_keys"]


def test_the_apiserver_already_refuses_the_quantity_rules_on_pods_so_only_custom_resources_get_them():
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]
    variables = {v["name"]: v["expression"] for v in deny["variables"]}
    for rule in ("requests_without_limits", "requests_differ", "structure"):
        assert variables[f"v_{rule}"].startswith("(variables.dra ? [] : (variables.custom ? "), rule


def test_the_runtime_class_is_left_to_the_webhook_when_it_must_read_the_cluster():
    clustered = generate(parse_policy("isolation: {runtimeClass: nvidia}\ncluster: {enabled: true}\n"))
    mutating = by_name(clustered.objects)["MutatingAdmissionPolicy/gpu-webhook"]
    assert "runtimeClass" not in mutating["metadata"]["annotations"][RULES_ANNOTATION]
    assert any(what == "mutation: isolation.runtimeClass" for what, _ in clustered.webhook_only)


def test_stderr_lists_every_webhook_rule_and_why():
    left = dict(generate(parse_policy(POLICY)).webhook_only)
    for rule in catalog.RULES.values():
        if rule.engine == "webhook":
            assert left[rule.id] == rule.why
    assert "pod templates in other kinds" in left and "audit, policy reports, gpu-webhook check" in left


def test_the_generator_and_the_webhook_read_one_definition_of_the_device_names():
    """The isolation rules' device names live in the registry (webhook.core.resources), once for both engines."""
    for name in ("VISIBLE_DEVICES", "DEVICE_VARIABLES", "NO_DEVICES", "DEVICE_DIRECTORIES", "NVIDIA_DEVICE_PREFIX",
                 "DEVICE_LIST_DIRECTORIES", "CDI_PREFIXES", "CDI_KEYS", "NVIDIA_RUNTIME_PREFIX"):
        assert getattr(pods, name) is getattr(isolation, name) is getattr(registry, name), name
    assert set(claims.BUILDERS) <= set(BUILDERS)


# --- the command ----------------------------------------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "admission-policies", *args], capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.process
def test_the_command_writes_the_objects_on_stdout_and_the_webhook_rules_on_stderr(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    done = run("--policy", str(policy))
    assert done.returncode == 0, done.stderr
    documents = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert [f"{d['kind']}/{d['metadata']['name']}" for d in documents] == [
        f"{d['kind']}/{d['metadata']['name']}" for d in objects()]
    assert "left to the webhook: exceeds-node-capacity: " in done.stderr
    assert "left to the webhook: process-count-mismatch: " in done.stderr


@pytest.mark.process
def test_a_bad_policy_is_one_line_and_exit_2(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("nativePolicies: {customKinds: [{group: a.io, templates: [spec.x]}]}\n")
    done = run("--policy", str(policy))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "resource" in done.stderr


def test_each_policy_asks_first_whether_a_pod_holds_anything_its_rules_read():
    names = by_name(objects())
    deny = names["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]["matchConditions"][0]["expression"]
    warn = names["ValidatingAdmissionPolicy/gpu-webhook-warn"]["spec"]["matchConditions"][0]["expression"]
    # Custom kinds and claims always go on; Pods and built-in templates only when something matters.
    assert deny.startswith("!((request.kind.group == '' && request.kind.kind in ['Pod', 'PodTemplate', ")
    for read in ("k.contains('/')", "c.securityContext.privileged", "v.hostPath", "'cdi.k8s.io/'",
                 "'NVIDIA_VISIBLE_DEVICES'", "'nvidia-container-devices'"):
        assert read in deny, read
    # The warn policy's rules read other things: an envFrom, a zero count, a node name, GPU tolerations.
    assert "c.envFrom" in warn and "t.spec.nodeName" in warn and "t.spec.tolerations" in warn
    assert "c.securityContext.privileged" not in warn
    mutating = names["MutatingAdmissionPolicy/gpu-webhook"]["spec"]["matchConditions"][0]["expression"]
    # hideGpus applies everywhere in POLICY: every pod goes to the mutation.
    assert mutating.startswith("true || ")
    gpu_only = by_name(objects("accelerator: {default: nvidia-l4}\n"))["MutatingAdmissionPolicy/gpu-webhook"]
    assert gpu_only["spec"]["matchConditions"][0]["expression"].startswith("['containers', 'initContainers']")
