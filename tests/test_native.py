"""``webhook.native``: which objects a policy becomes for a target, which rules they carry, and the CEL pitfalls
measured on real apiservers (``docs/native-policies.md``), each read off the generated text. What the apiserver's
CEL makes of the text is ``tests/test_native_eval.py``'s (in seconds) and ``tests/e2e/test_native_policies.py``'s
(on real apiservers of each version)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from webhook.core import catalog
from webhook.core import resources as registry
from webhook.core.kinds import RAY_CLUSTER_SPECS
from webhook.core.policy import CLUSTER_RULES
from webhook.core.policyfile import PolicyError, parse_policy
from webhook.native import cluster as native_cluster
from webhook.native import hybrid, kinds, pods, snippets
from webhook.native import isolation as native_isolation
from webhook.native.celtext import one_line
from webhook.native.generate import (
    CEL_FIELDS,
    LABELS,
    RULES_ANNOTATION,
    TARGET_ANNOTATION,
    generate,
    left_to_webhook,
    to_yaml,
)
from webhook.native.reads import Reads, template_facts
from webhook.native.registry import NEVER, native
from webhook.native.rules import BUILDERS, matters, native_rules
from webhook.native.target import for_version
from webhook.rules import isolation
from webhook.rules.crossfield import REPLICA_KINDS

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


def inline(text: str) -> str:
    """``text`` with ``nativePolicies.params: inline``: the tests here read the policy's values written into the CEL;
    the policies that read them live are ``tests/test_native_params.py``'s."""
    document = yaml.safe_load(text) or {}
    document.setdefault("nativePolicies", {}).setdefault("params", "inline")
    return yaml.safe_dump(document)


def objects(text: str = POLICY, version: str = "1.37", *api_versions: str) -> list[dict]:
    """The generated objects, each expression on one line as the builders wrote it (``celtext.one_line``): the tests
    here read what the CEL says; how it is laid out is ``tests/test_native_layout.py``'s."""
    return one_lined(generate(parse_policy(inline(text)), for_version(version, api_versions)).objects)


def one_lined(value):  # type: ignore[no-untyped-def]
    if isinstance(value, list):
        return [one_lined(v) for v in value]
    if isinstance(value, dict):
        return {k: one_line(v) if k in CEL_FIELDS and isinstance(v, str) else one_lined(v) for k, v in value.items()}
    return value


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


def test_a_native_cluster_rule_reads_the_facts_and_every_webhook_rule_says_why():
    for rule in catalog.RULES.values():
        if rule.id in CLUSTER_RULES and rule.engine == "native":
            assert BUILDERS[rule.id].reads_facts, rule.id  # so that inline policies leave it to the webhook
        if rule.engine == "webhook":
            assert rule.why, rule.id
    inline = parse_policy("cluster: {enabled: true}\nnativePolicies: {params: inline}\n")
    left = dict(left_to_webhook(inline, for_version("1.37")))
    assert {"unknown-accelerator", "unknown-runtime-class"} <= set(left)
    assert "unknown-accelerator" not in dict(left_to_webhook(parse_policy("cluster: {enabled: true}\n"),
                                                             for_version("1.37")))


FAMILIES = ("gpu-webhook", "gpu-webhook-custom", "gpu-webhook-claims")


def test_a_policy_becomes_a_deny_and_a_warn_policy_per_kind_family_a_mutating_one_and_few_bindings():
    names = by_name(objects())
    validating = [f"ValidatingAdmissionPolicy/{family}-{action}" for family in FAMILIES for action in ("deny", "warn")]
    assert sorted(names) == sorted([
        "MutatingAdmissionPolicy/gpu-webhook", "MutatingAdmissionPolicyBinding/gpu-webhook", *validating,
        *[n.replace("Policy/", "PolicyBinding/") for n in validating],
        *[f"ValidatingAdmissionPolicyBinding/{family}-deny-warn" for family in FAMILIES],
    ])
    for obj in names.values():
        assert obj["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert obj["metadata"]["labels"] == LABELS
        assert obj["metadata"]["annotations"][RULES_ANNOTATION]
        assert obj["metadata"]["annotations"][TARGET_ANNOTATION] == "1.37"


@pytest.mark.parametrize("version, api_versions, mutating, claims", [
    ("1.30", (), None, False),
    ("1.33", (), None, False),
    ("1.34", (), None, True),
    ("1.34", ("admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy",), "v1beta1", True),
    ("1.35", ("admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy",), "v1beta1", True),
    ("1.36", (), "v1", True),
    ("1.37", (), "v1", True),
])
def test_what_a_target_serves_decides_what_is_generated(version, api_versions, mutating, claims):
    names = by_name(objects(POLICY, version, *api_versions))
    mutation = [o for n, o in names.items() if n.startswith("Mutating")]
    assert [o["apiVersion"] for o in mutation] == ([f"admissionregistration.k8s.io/{mutating}"] * 2 if mutating else [])
    assert ("ValidatingAdmissionPolicy/gpu-webhook-claims-deny" in names) is claims
    # Validation is native on every version from 1.30: Pods and built-in workloads, and the custom kinds.
    assert {"ValidatingAdmissionPolicy/gpu-webhook-deny", "ValidatingAdmissionPolicy/gpu-webhook-custom-deny"} <= set(
        names)
    left = dict(generate(parse_policy(POLICY), for_version(version, api_versions)).webhook_only)
    assert ("mutation (accelerator, tolerations, hideGpus, runtimeClass)" in left) is (mutating is None)


def test_a_rule_whose_cel_needs_a_newer_library_stays_with_the_webhook_and_says_why():
    old = generate(parse_policy(POLICY), for_version("1.34"))
    annotations = " ".join(o["metadata"]["annotations"][RULES_ANNOTATION] for o in old.objects)
    assert "gpu-device-mount" not in annotations
    assert "lists (flatten, slice" in dict(old.webhook_only)["gpu-device-mount"]
    new = generate(parse_policy(POLICY), for_version("1.35"))
    assert "gpu-device-mount" in " ".join(o["metadata"]["annotations"][RULES_ANNOTATION] for o in new.objects)
    assert "gpu-device-mount" not in dict(new.webhook_only)


def test_each_object_names_the_rules_it_implements_and_every_native_rule_that_is_on_is_somewhere():
    names = by_name(objects())

    def rules(name: str) -> list[str]:
        return names[name]["metadata"]["annotations"][RULES_ANNOTATION].split(",")

    deny = rules("ValidatingAdmissionPolicy/gpu-webhook-deny")
    warn = rules("ValidatingAdmissionPolicy/gpu-webhook-warn")
    assert {"invalid-quantity", "per-pod-limit", "privileged-gpu"} <= set(deny)
    assert {"zero-gpu-limit", "cpu-pod-on-gpu-nodes"} <= set(warn)
    # The apiserver refuses the quantity rules on Pods itself: only custom kinds get them from us.
    assert not {"requests-without-limits", "requests-differ", "structure"} & set(deny + warn)
    custom = rules("ValidatingAdmissionPolicy/gpu-webhook-custom-deny")
    assert {"requests-without-limits", "requests-differ", "structure"} <= set(custom)
    claims_ = rules("ValidatingAdmissionPolicy/gpu-webhook-claims-deny") + rules(
        "ValidatingAdmissionPolicy/gpu-webhook-claims-warn")
    assert {"device-class-not-allowed", "blanket-device-toleration"} <= set(claims_)
    every = {r for o in names.values() if o["kind"] == "ValidatingAdmissionPolicy"
             for r in o["metadata"]["annotations"][RULES_ANNOTATION].split(",")}
    assert every == {rule for rule, entry in BUILDERS.items() if not entry.reads_facts}  # inline: they read no facts
    live_cluster = generate(parse_policy("cluster: {enabled: true}\n"), for_version("1.37")).objects
    live_deny = {r for o in live_cluster if o["kind"] == "ValidatingAdmissionPolicy"
                 and o["metadata"]["name"].startswith("gpu-webhook-live-deny")
                 for r in o["metadata"]["annotations"][RULES_ANNOTATION].split(",")}
    assert {"unknown-accelerator", "unknown-runtime-class", "exceeds-node-capacity",
            "unadvertised-resource"} <= live_deny
    for binding in ("gpu-webhook-deny", "gpu-webhook-deny-warn"):
        assert rules(f"ValidatingAdmissionPolicyBinding/{binding}") == deny
    assert rules("MutatingAdmissionPolicy/gpu-webhook") == ["accelerator", "tolerations", "hideGpus", "runtimeClass"]


def test_a_rule_off_everywhere_is_not_generated_and_one_off_somewhere_is_gated_by_namespace():
    off = objects("checks: {privilegedGpu: \"off\", zeroGpuLimit: \"off\"}\n")
    annotations = " ".join(o["metadata"]["annotations"][RULES_ANNOTATION] for o in off)
    assert "privileged-gpu" not in annotations and "zero-gpu-limit" not in annotations
    deny = by_name(objects())["ValidatingAdmissionPolicy/gpu-webhook-deny"]
    variable = next(v["expression"] for v in deny["spec"]["variables"] if v["name"] == "privileged_gpu")
    assert variable == "(request.namespace == 'research' ? false : true) && variables.privileged_gpu_hits[0] != ''"


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
    assert spec["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kube-node-lease",
                                                                          "gpu-operator"]
    own = by_name(objects("excludeNamespaces: [gpu-operator]\n"))
    spec = own["MutatingAdmissionPolicy/gpu-webhook"]["spec"]["matchConstraints"]
    assert spec["namespaceSelector"]["matchExpressions"][0]["values"] == ["gpu-operator"]
    none = by_name(objects("excludeNamespaces: []\n"))
    assert "namespaceSelector" not in none["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]["matchConstraints"]


def test_each_family_matches_its_kinds_and_a_policy_adds_a_kind_by_its_template_paths():
    names = by_name(objects())

    def matched(name: str) -> set[tuple[str, str]]:
        rules = names[name]["spec"]["matchConstraints"]["resourceRules"]
        return {(r["apiGroups"][0], res) for r in rules for res in r["resources"]}

    assert {("", "pods"), ("apps", "deployments"), ("batch", "cronjobs")} <= matched(
        "ValidatingAdmissionPolicy/gpu-webhook-deny")
    known = {(k.group, k.resource) for k in kinds.KNOWN_KINDS}
    assert known == matched("ValidatingAdmissionPolicy/gpu-webhook-custom-deny")
    assert matched("ValidatingAdmissionPolicy/gpu-webhook-claims-deny") == {
        ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "resourceclaimtemplates")}
    policy = ("nativePolicies:\n  customKinds:\n  - {group: example.com, version: v2, resource: trainjobs, "
              "kind: TrainJob, templates: ['spec.roles[*].template', 'spec.launcher']}\n")
    custom = by_name(objects(policy))["ValidatingAdmissionPolicy/gpu-webhook-custom-deny"]
    assert {"apiGroups": ["example.com"], "apiVersions": ["v2"], "operations": ["CREATE", "UPDATE"],
            "resources": ["trainjobs"], "scope": "Namespaced"} in custom["spec"]["matchConstraints"]["resourceRules"]
    nodes = next(v["expression"] for v in custom["spec"]["variables"] if v["name"] == "candidate_nodes")
    assert "variables.group_resource == 'example.com/trainjobs' ? " in nodes and "'roles' in obj.spec" in nodes


def test_a_kind_whose_templates_need_flatten_stays_with_the_webhook_before_1_35():
    policy = ("nativePolicies:\n  customKinds:\n  - {group: example.com, resource: grids, "
              "templates: ['spec.rows[*].cells[*].template']}\n")
    old = generate(parse_policy(policy), for_version("1.34"))
    nodes = next(v["expression"] for o in old.objects if o["metadata"]["name"] == "gpu-webhook-custom-live-deny"
                 and o["kind"] == "ValidatingAdmissionPolicy" for v in o["spec"]["variables"]
                 if v["name"] == "candidate_nodes")
    assert "example.com/grids" not in nodes
    assert any(what == "pod templates of grids.example.com" for what, _ in old.webhook_only)
    new = generate(parse_policy(policy), for_version("1.35"))
    assert not any(what == "pod templates of grids.example.com" for what, _ in new.webhook_only)


@pytest.mark.parametrize("bad", ["spec..x", "*.template", "spec.a[]", "spec.a b", ""])
def test_a_template_path_that_is_not_one_is_refused_with_the_policy(bad):
    with pytest.raises(PolicyError):
        parse_policy(f"nativePolicies: {{customKinds: [{{group: a.io, resource: xs, templates: ['{bad}']}}]}}\n")
    assert kinds.path_problem(bad) is not None


def test_every_template_path_of_the_known_kinds_is_one():
    for kind in kinds.KNOWN_KINDS:
        for path in kind.templates:
            assert kinds.path_problem(path) is None, path


def test_hybrid_mode_sends_the_webhook_every_kind_the_replica_checks_read():
    """The replica checks read PyTorchJobs and the RayCluster of every Ray kind (a RayJob's, a RayService's): each is
    a known kind, so hybrid mode's custom condition lets it through, and the Ray kinds' template paths are in the
    RayCluster spec where the checks read it (one table, podspecs.RAY_CLUSTER_SPECS)."""
    known = {(k.group, k.kind): k for k in kinds.KNOWN_KINDS}
    assert set(REPLICA_KINDS) <= set(known)
    assert hybrid.replica_kinds() == [
        "kubeflow.org/pytorchjobs", "ray.io/rayclusters", "ray.io/rayjobs", "ray.io/rayservices"]
    assert hybrid.custom_condition([], replicas=True).endswith(
        " in ['kubeflow.org/pytorchjobs', 'ray.io/rayclusters', 'ray.io/rayjobs', 'ray.io/rayservices']")
    for key, fields in RAY_CLUSTER_SPECS.items():
        cluster = ".".join(fields)
        assert {f"{cluster}.headGroupSpec.template", f"{cluster}.workerGroupSpecs[*].template"} <= set(
            known[key].templates), key


# --- the pitfalls, on the generated text -------------------------------------------------------------------------


def test_no_param_kind_anywhere_values_are_literals():
    text = to_yaml(objects())
    assert "paramKind" not in text and "paramRef" not in text and "params." not in text


def test_integers_are_never_tested_with_is_integer_and_sign_is_a_function():
    for obj in objects():
        for expression in expressions(obj):
            assert ".isInteger()" not in expression
            assert ".sign()" not in expression
    reason = snippets.quantity_reason("x")
    assert "sign(amount) < 0" in reason
    # The value is compared with its rounded self, after it is known to be at most the ceiling.
    assert reason.index("isGreaterThan(quantity('1000000'))") < reason.index("compareTo(quantity(string(int(")


def test_no_expression_uses_what_its_target_lacks():
    """Before Kubernetes 1.33 no two-variable comprehension, before 1.35 no flatten, slice, distinct or sort (the
    CEL of new expressions is their minor's minus one): measured as refusals at apply on v1.30.14 and v1.34.4."""
    later = {"1.30": ("transformList", "transformMap", ".flatten()", ".slice(", ".distinct()", ".sort", ".sortBy("),
             "1.34": (".flatten()", ".slice(", ".distinct()", ".sort", ".sortBy(")}
    for version, missing in later.items():
        for obj in objects(POLICY, version, "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"):
            for expression in expressions(obj):
                for name in missing:
                    assert name not in expression, (version, obj["metadata"]["name"], name)


def test_regular_expressions_are_literals_in_matches_never_variables():
    for obj in objects():
        for expression in expressions(obj):
            for match in re.finditer(r"\.matches\(", expression):
                assert expression[match.end():match.end() + 2] in ("r'", 'r"') or expression[match.end()] == '"', \
                    expression[match.start():match.start() + 60]
        for variable in obj["spec"].get("variables", []):
            # A variable holding a pattern would be compiled again on every call.
            assert not re.fullmatch(r"r?'[^']*'|r?\"[^\"]*\"", variable["expression"]), variable["name"]


def test_node_selector_and_tolerations_are_changed_by_json_patch_only():
    mutating = by_name(objects())["MutatingAdmissionPolicy/gpu-webhook"]["spec"]
    assert mutating["reinvocationPolicy"] == "Never"
    assert all(m["patchType"] == "JSONPatch" and "applyConfiguration" not in m for m in mutating["mutations"])
    patches = " ".join(m["jsonPatch"]["expression"] for m in mutating["mutations"])
    assert "'/spec/nodeSelector'" in patches and "'/spec/tolerations/-'" in patches
    assert "op: 'replace'" not in patches and "op: 'remove'" not in patches


def test_values_that_may_be_numbers_are_typed_before_string_is_applied():
    reason = snippets.quantity_reason("x")
    for match in re.finditer(r"string\(x\)", reason + snippets.plain("x")):
        text = reason + snippets.plain("x")
        before = text[:match.start()]
        guard = max(before.rfind("type(x) == int ?"), before.rfind("type(x) == double ?"),
                    before.rfind("type(x) == int || type(x) == uint || type(x) == double ?"))
        assert guard >= 0, text[max(0, match.start() - 80):match.end()]


def test_one_aggregated_one_line_message_of_bounded_size_per_deny_policy_and_nothing_costly_on_a_pass():
    names = by_name(objects())
    deny = names["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]
    [validation] = deny["validations"]
    assert validation["expression"] == "!variables.violated"
    message = validation["messageExpression"]
    # The apiserver evaluates every messageExpression, passed or not: this one starts with the cheap test.
    assert message.startswith("variables.violated ? ") and message.endswith(" : ''")
    assert "' GPU violation'" in message and "size(bytes(message)) <= 5000" in message
    assert ".split(\"\\u001f\")" in message and "hits.join('; ')" in message
    assert validation["reason"] == "Forbidden" and "\n" not in validation["message"]
    assert deny["failurePolicy"] == "Fail"
    warn = names["ValidatingAdmissionPolicy/gpu-webhook-warn"]
    assert warn["spec"]["failurePolicy"] == "Ignore"
    assert len(warn["spec"]["validations"]) == len(warn["metadata"]["annotations"][RULES_ANNOTATION].split(","))
    for v in warn["spec"]["validations"]:
        assert v["messageExpression"].startswith("variables.")


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
    assert variables["update"] == "request.operation == 'UPDATE'"
    assert variables["candidate_nodes"].startswith("(variables.update ? [object, oldObject] : [object]).map(obj, ")
    assert variables["old_templates"] == "variables.update ? variables.all_templates[1] : []"
    # Each rule's hits are read from the templates and the old templates, and only the message's words of that
    # rule compare them: whether the object violates the rule does not read the old object.
    assert variables["invalid_quantity_hits"].startswith("[variables.templates, variables.old_templates].map(pods, ")
    assert "variables.invalid_quantity_hits[1]" in variables["invalid_quantity_found"]
    assert variables["invalid_quantity"] == "variables.invalid_quantity_hits[0] != ''"


def test_with_the_cluster_checks_inline_policies_leave_the_runtime_class_to_the_webhook_and_live_ones_read_facts():
    text = "isolation: {runtimeClass: nvidia}\ncluster: {enabled: true}\n"
    inline = generate(parse_policy(text + "nativePolicies: {params: inline}\n"))
    mutating = by_name(inline.objects)["MutatingAdmissionPolicy/gpu-webhook"]
    assert "runtimeClass" not in mutating["metadata"]["annotations"][RULES_ANNOTATION]
    assert any(what == "mutation: isolation.runtimeClass" for what, _ in inline.webhook_only)
    clustered = generate(parse_policy(text))
    mutating = by_name(clustered.objects)["MutatingAdmissionPolicy/gpu-webhook-live"]
    assert "runtimeClass" in mutating["metadata"]["annotations"][RULES_ANNOTATION]
    assert "variables.cluster_facts.runtimeClasses" in mutating["spec"]["mutations"][0]["jsonPatch"]["expression"]
    assert not any(what == "mutation: isolation.runtimeClass" for what, _ in clustered.webhook_only)


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
        assert getattr(native_isolation, name) is getattr(isolation, name) is getattr(registry, name), name
    # One record per rule: the per-pod cap's findings in pod templates and in claims.
    assert BUILDERS["per-pod-limit"].pods and BUILDERS["per-pod-limit"].claims


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
    live = generate(parse_policy(POLICY), for_version("1.37"))
    assert live.policy_object is not None
    assert [f"{d['kind']}/{d['metadata']['name']}" for d in documents] == [
        f"{d['kind']}/{d['metadata']['name']}" for d in [*live.objects, live.policy_object]]
    assert "left to the webhook: missing-claim-source: " in done.stderr
    assert "left to the webhook: process-count-mismatch: " in done.stderr


@pytest.mark.process
def test_a_bad_policy_is_one_line_and_exit_2(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("nativePolicies: {customKinds: [{group: a.io, templates: [spec.x]}]}\n")
    done = run("--policy", str(policy))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "resource" in done.stderr


def test_each_policy_asks_first_whether_anything_in_a_pod_can_make_its_rules_fire():
    names = by_name(objects())
    deny = names["ValidatingAdmissionPolicy/gpu-webhook-deny"]["spec"]["matchConditions"][0]["expression"]
    warn = names["ValidatingAdmissionPolicy/gpu-webhook-warn"]["spec"]["matchConditions"][0]["expression"]
    assert deny.startswith("(request.kind.kind == 'Pod' ? [object] : ")
    # A count that is no plain count, a name that is no plain GPU name, the isolation fields.
    for read in ("!value.matches(r'^[0-9]{1,6}$')", "!(name in ['amd.com/gpu', 'nvidia.com/gpu'])",
                 "container.securityContext.privileged", "volume.hostPath", "'cdi.k8s.io/'", "'NVIDIA_VISIBLE_DEVICES'",
                 "'nvidia-container-devices'"):
        assert read in deny, read
    # The warn policy's rules read other things: an envFrom, a zero count, a node name, GPU tolerations.
    assert "container.envFrom" in warn and "pod.spec.nodeName" in warn and "pod.spec.tolerations" in warn
    # and the tenant rules' softened denials: a privileged pod that asks for no GPU, outside a tenant's namespace
    assert "container.securityContext.privileged" in warn
    # Custom kinds and claims have no matchConditions: CEL cannot tell without reading their templates.
    assert "matchConditions" not in names["ValidatingAdmissionPolicy/gpu-webhook-custom-deny"]["spec"]
    mutating = names["MutatingAdmissionPolicy/gpu-webhook"]["spec"]["matchConditions"][0]["expression"]
    # hideGpus applies everywhere in POLICY: every pod goes to the mutation.
    assert mutating.startswith("true || ")


def test_every_pod_rule_says_what_can_make_it_fire():
    """A builder declares its rule with what can make it fire: none, or a second builder, is refused at import."""
    with pytest.raises(ValueError, match="say what can make it fire"):
        native("new-rule", fires=())
    with pytest.raises(ValueError, match="two builders"):
        native("privileged-gpu", fires=(NEVER,))(BUILDERS["privileged-gpu"].pods)
    with pytest.raises(ValueError, match="two builders"):
        native("admin-access", claims=True)(BUILDERS["admin-access"].claims)
    assert all(entry.fires for entry in BUILDERS.values() if entry.pods)
    assert not any(entry.fires for entry in BUILDERS.values() if not entry.pods)
    with pytest.raises(KeyError):
        matters(snippets.Ctx(parse_policy(POLICY)), ["no-such-rule"])


def test_a_rules_own_trigger_joins_the_policys_match_conditions():
    """host-pid-gpu declares its trigger inline: a GPU pod with hostPID reaches the warn policy, one without skips
    it (the GPU pod's plain count triggers nothing else there)."""
    ctx = snippets.Ctx(parse_policy("{}"))
    assert "pod.spec.hostPID" in matters(ctx, ["host-pid-gpu"])
    assert "pod.spec.hostPID" not in matters(ctx, ["privileged-gpu"])


def test_a_templates_gpu_counts_are_read_once_per_name_where_the_apiserver_does_not_type_them():
    """Untyped (custom kinds, 1.30's CEL), whether a container asks for a GPU, or for a fractional scheduler, tests
    each name's value once, bound: the guarded read of the section is written once per section and use, not once
    per type the value may have (it was, 11 % of the generated 1.30 policies)."""
    ctx = snippets.Ctx(parse_policy("{}"))
    reads = Reads(ctx)
    facts = template_facts(ctx, "pod.spec", "pod.metadata")
    for fact in ("counted", "fractional"):
        for section in ("limits", "requests"):
            read = reads.section(section)
            assert facts[fact].count(read) == 2, (fact, section)  # the loop over its names, the value of one
            assert f"[{read}[name]].exists(value, " in facts[fact], (fact, section)


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
def test_the_accelerator_a_template_asks_for_reads_each_map_once(typed):
    """The annotation, the nodeSelector's label, and where runtime-class-conflict places the pod: each map is read
    once and bound, not once per test of the value (untyped, the guarded read is some 100 characters)."""
    ctx = snippets.Ctx(parse_policy("cluster: {enabled: true}\n"), shape=snippets.Shape(typed=typed))
    reads = Reads(ctx)
    annotations, selector = reads.get("pod.meta", "annotations", "map", "{}"), reads.get(
        "pod.spec", "nodeSelector", "map", "{}")
    assert pods.annotated(reads).count(annotations) == (2 if typed else 1)  # typed: the ?-read, then the value
    assert pods.selected(reads).count(selector) == 1
    assert native_cluster._placed(ctx, reads).count(pods.selected(reads)) == 1


def test_the_cluster_facts_are_read_only_while_fresh_against_the_requests_own_time():
    """The two variables every policy that reads the cluster's facts starts from, as a cluster admin reviews them:
    the request's time as the apiserver wrote it, and the summary while it is within FRESH_FOR of that time."""
    generated = generate(parse_policy("cluster: {enabled: true}\n"), for_version("1.37"))
    deny = next(o for o in generated.objects if o["metadata"]["name"].startswith("gpu-webhook-live-deny")
                and "unknown-accelerator" in o["metadata"]["annotations"][RULES_ANNOTATION])
    variables = {v["name"]: v["expression"] for v in deny["spec"]["variables"]}
    assert variables["request_times"] == (
        "request.operation == 'CREATE'\n"
        "? [timestamp(object.metadata.creationTimestamp)]\n"
        ": (has(object.metadata.managedFields)\n"
        "   ? object.metadata.managedFields.filter(entry, has(entry.time)).map(entry, timestamp(entry.time))\n"
        "   : [])")
    assert variables["cluster_facts"] == (
        "[params.?status.?cluster.orValue({})].map(facts,\n"
        "  has(facts.writtenAt)\n"
        "  && variables.request_times.all(moment, moment - timestamp(facts.writtenAt) <= duration('300s'))\n"
        "  && variables.request_times.exists(moment, timestamp(facts.writtenAt) - moment <= duration('300s'))\n"
        "  ? facts\n"
        "  : {})[0]")
    inline = generate(parse_policy("cluster: {enabled: true}\nnativePolicies: {params: inline}\n"), for_version("1.37"))
    assert "cluster_facts" not in to_yaml(inline.objects)
