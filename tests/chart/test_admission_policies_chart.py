"""admissionPolicies.*: the hook Jobs that apply and delete the native policies, their short-lived RBAC, the
engines chosen from .Capabilities (helm's --kube-version and --api-versions offline), and hybrid mode's
matchConditions, failurePolicy and notes. Rendered with helm template (test_chart's fixtures); the Job's command
itself is tested on the e2e beds (test_native_apply, the version matrix)."""

from __future__ import annotations

from typing import Any

from tests.chart import test_chart
from tests.chart.test_chart import Helm, one, values_args

helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

MAP_API = ("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
MAP_BETA = ("--api-versions", "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy")
ADMISSION_RESOURCES = {"validatingadmissionpolicies", "validatingadmissionpolicybindings",
                       "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"}
# The hooks: the apply and delete Jobs with their accounts and rights, and the apply Job's Role for its probes.
HOOK_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job", "Role", "RoleBinding"}
# The checks the generator leaves to the webhook, all off: PyTorchJobs and RayClusters then need the webhook no more.
CHECKS_OFF = {"checks": {key: "off" for key in ("processCountMismatch", "replicaAcceleratorMismatch")}}
CUSTOM = [{"apiGroups": ["kubeflow.org", "example.com"], "apiVersions": ["*"], "resources": ["pytorchjobs", "widgets"]}]


def enabled(*flags: str, **more: Any) -> list[str]:
    return [*(flags or ("--kube-version", "1.37.0")), *values_args({"admissionPolicies": {"enabled": True}, **more})]


def hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The admission-policies hooks (GPUPolicy/default is a hook too: test_gpupolicy_chart.py)."""
    return [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {}) and d["kind"] != "GPUPolicy"]


def conditions(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    out = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(docs, kind)["webhooks"]:
            out[hook["name"]] = [c["name"] for c in hook.get("matchConditions", [])]
    return out


def test_off_by_default_renders_no_hook_and_no_hybrid_condition(helm: Helm) -> None:
    docs = helm.template(*MAP_API, *values_args({"webhook": {"customResources": CUSTOM}}))
    assert hooks(docs) == []
    assert conditions(docs) == {
        "mutate.gpu-webhook.io": ["gpu-or-hidden-namespace"],
        "validate.gpu-webhook.io": ["gpu-or-isolation"],
        "validate-dra.gpu-webhook.io": ["requests-devices-or-names-extended-resource"],
        "validate-custom.gpu-webhook.io": [],
    }


def test_refused_below_kubernetes_1_30(helm: Helm) -> None:
    error = helm.template_error("--kube-version", "1.29.0", *values_args({"admissionPolicies": {"enabled": True}}))
    assert ">=1.30" in error
    assert len(error.strip().splitlines()) <= 3  # the message, and helm's own hint


# helm's flags -> (the MutatingAdmissionPolicy version in the hook's notes, the mutate webhook's conditions, its
# failurePolicy, whether the claims' webhook is sent nothing)
ENGINES = [
    (("--kube-version", "1.30.0"), None, ["gpu-or-hidden-namespace"], "Fail", False),
    (("--kube-version", "1.34.0"), None, ["gpu-or-hidden-namespace"], "Fail", True),
    (("--kube-version", "1.34.0", *MAP_BETA), "v1beta1",
     ["gpu-or-hidden-namespace", "left-to-mutating-admission-policy"], "Ignore", True),
    (("--kube-version", "1.35.0", *MAP_BETA), "v1beta1",
     ["gpu-or-hidden-namespace", "left-to-mutating-admission-policy"], "Ignore", True),
    (("--kube-version", "1.36.0"), "v1", ["gpu-or-hidden-namespace", "left-to-mutating-admission-policy"], "Ignore",
     True),
    (("--kube-version", "1.37.0", *MAP_API), "v1",
     ["gpu-or-hidden-namespace", "left-to-mutating-admission-policy"], "Ignore", True),
]


def test_the_engines_follow_what_the_cluster_serves(helm: Helm) -> None:
    """ValidatingAdmissionPolicies from 1.30; the mutation native where a MutatingAdmissionPolicy is served (v1
    from 1.36, v1beta1 in 1.34 and 1.35 when the cluster names it), else left to the webhook, which then refuses
    what it cannot mutate while it is down; the claims' rules native from 1.34."""
    for flags, _mutating, mutate, failure, claims in ENGINES:
        docs = helm.template(*enabled(*flags))
        assert {d["kind"] for d in hooks(docs)} == HOOK_KINDS
        found = conditions(docs)
        assert found["mutate.gpu-webhook.io"] == mutate, flags
        assert found["validate.gpu-webhook.io"] == ["gpu-or-isolation", "left-to-the-webhook"], flags
        dra = ["requests-devices-or-names-extended-resource"] + (["left-to-validating-admission-policies"] if claims
                                                                else [])
        assert found["validate-dra.gpu-webhook.io"] == dra, flags
        webhook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
        assert webhook["failurePolicy"] == failure, flags
        validating = one(docs, "ValidatingWebhookConfiguration")["webhooks"]
        assert {h["failurePolicy"] for h in validating} == {"Ignore"}, flags


def test_the_webhook_keeps_what_the_versions_cel_cannot_carry(helm: Helm) -> None:
    """gpu-device-mount normalises paths with the lists library (1.35+): before, pods with host paths or device
    list mounts still go to the webhook."""
    def condition(*flags: str) -> str:
        webhook = one(helm.template(*enabled(*flags)), "ValidatingWebhookConfiguration")["webhooks"][0]
        return next(c["expression"] for c in webhook["matchConditions"] if c["name"] == "left-to-the-webhook")

    old, new = condition("--kube-version", "1.34.0"), condition("--kube-version", "1.35.0")
    assert "has(volume.hostPath)" in old and "nvidia-container-devices" in old
    assert "has(volume.hostPath)" not in new and "resourceClaims" in new
    # The custom kinds the policies know have no such condition (their templates are walked by the policies
    # only): before 1.35 every custom object goes to the webhook, as a PyTorchJob mounting /dev/nvidia0 must.
    def custom(version: str) -> list[str]:
        docs = helm.template(*enabled("--kube-version", version, webhook={"customResources": CUSTOM}))
        return conditions(docs)["validate-custom.gpu-webhook.io"]

    assert "kind-not-native" not in custom("1.34.0")
    assert "kind-not-native" in custom("1.35.0")


def test_hook_jobs_service_accounts_and_rbac(helm: Helm) -> None:
    docs = helm.template(*enabled())
    by_hook: dict[str, list[dict[str, Any]]] = {}
    for doc in hooks(docs):
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        by_hook.setdefault(annotations["helm.sh/hook"], []).append(doc)
    assert set(by_hook) == {"post-install,post-upgrade,post-rollback", "pre-delete"}
    for hook, objects in by_hook.items():
        kinds = {d["kind"]: d for d in objects}
        assert set(kinds) == ({"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"} if hook == "pre-delete"
                              else HOOK_KINDS)
        weight = {d["kind"]: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for d in objects}
        # The account and its rights exist before the Job runs.
        assert max(weight["ServiceAccount"], weight["ClusterRole"], weight["ClusterRoleBinding"]) < weight["Job"]
        job, account = kinds["Job"], kinds["ServiceAccount"]
        pod = job["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account["metadata"]["name"]
        binding = kinds["ClusterRoleBinding"]
        assert binding["roleRef"]["name"] == kinds["ClusterRole"]["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": test_chart.NAMESPACE}]
        rule, *rest = kinds["ClusterRole"]["rules"]
        # the apply Job may also get GPUPolicies: a policy whose paramKind is GPUPolicy needs it
        assert rest == ([] if hook == "pre-delete" else
                        [{"apiGroups": ["gpu-webhook.io"], "resources": ["gpupolicies"], "verbs": ["get"]}])
        assert rule["apiGroups"] == ["admissionregistration.k8s.io"]
        assert set(rule["resources"]) == ADMISSION_RESOURCES
        args = pod["containers"][0]["args"]
        if hook == "pre-delete":
            assert args == ["admission-policies", "--delete"]
            assert set(rule["verbs"]) == {"get", "list", "delete"}
        else:
            assert args == ["admission-policies", "--policy", "/etc/gpu-webhook/policy.yaml", "--apply",
                            "--wait", "120", "--probe-namespace", "default"]
            assert set(rule["verbs"]) == {"get", "list", "create", "patch", "delete"}
            # The enforcement probes: dry-run creates of Pods and ResourceClaims in the probe namespace, nothing more.
            role, role_binding = kinds["Role"], kinds["RoleBinding"]
            assert role["metadata"]["namespace"] == role_binding["metadata"]["namespace"] == "default"
            assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
                                     {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                                      "verbs": ["create"]}]
            assert role_binding["roleRef"]["name"] == role["metadata"]["name"]
            assert role_binding["subjects"] == binding["subjects"]
            assert max(weight["Role"], weight["RoleBinding"]) < weight["Job"]
            mount = pod["containers"][0]["volumeMounts"][0]
            assert mount["mountPath"] == "/etc/gpu-webhook"
            assert pod["volumes"][0]["configMap"]["name"] == f"{test_chart.FULLNAME}-policy"
        assert pod["restartPolicy"] == "Never"


def test_nothing_that_stays_may_write_admission_policies(helm: Helm) -> None:
    """Every non-hook ClusterRole or Role, with every optional feature on, is free of admissionregistration."""
    docs = helm.template(*enabled(audit={"enabled": True, "readerClusterRole": {"enabled": True}},
                                  policy={"cluster": {"enabled": True}}))
    staying = [d for d in docs if d["kind"] in ("ClusterRole", "Role") and d not in hooks(docs)]
    assert staying  # the cluster reader, the audit's roles
    for role in staying:
        for rule in role.get("rules", []):
            touches = {"admissionregistration.k8s.io", "*"} & set(rule.get("apiGroups", []))
            # Reading the bindings (the policy status says which generation they enforce) writes nothing.
            assert not touches or set(rule["verbs"]) <= {"get", "list", "watch"}, \
                f"{role['kind']} {role['metadata']['name']} has {rule}"
    assert {d["kind"] for d in hooks(docs)} == HOOK_KINDS


def test_hybrid_mode_narrows_every_webhook(helm: Helm) -> None:
    # With the policy written into the CEL (inline), routing follows the values; read live, an edit of GPUPolicy may
    # turn the replica checks on, so their kinds keep going to the webhook.
    live = helm.template(*enabled(policy=CHECKS_OFF, webhook={"customResources": CUSTOM}))
    custom = one(live, "ValidatingWebhookConfiguration")["webhooks"][-1]["matchConditions"][0]["expression"]
    assert custom.endswith(" in ['kubeflow.org/pytorchjobs', 'ray.io/rayclusters', 'ray.io/rayjobs', "
                           "'ray.io/rayservices']")
    inline = {**CHECKS_OFF, "nativePolicies": {"params": "inline"}}
    docs = helm.template(*enabled(policy=inline, webhook={"customResources": CUSTOM}))
    assert conditions(docs) == {
        "mutate.gpu-webhook.io": ["gpu-or-hidden-namespace", "left-to-mutating-admission-policy"],
        "validate.gpu-webhook.io": ["gpu-or-isolation", "left-to-the-webhook"],
        "validate-dra.gpu-webhook.io": ["requests-devices-or-names-extended-resource",
                                        "left-to-validating-admission-policies"],
        "validate-custom.gpu-webhook.io": ["kind-not-native"],
    }
    custom = one(docs, "ValidatingWebhookConfiguration")["webhooks"][-1]["matchConditions"][0]["expression"]
    assert "'kubeflow.org/pytorchjobs'" in custom and "example.com/widgets" not in custom
    assert " || " not in custom  # the replica checks are off: no kind goes to the webhook for them


def test_the_replica_checks_pull_only_the_kinds_they_read(helm: Helm) -> None:
    """On by default (warn), and on in a single namespace: PyTorchJobs and the Ray kinds (RayClusters, RayJobs and
    RayServices, which embed one) still go to the webhook, and nothing else does for them."""
    for policy in ({}, {**CHECKS_OFF, "namespaces": {"team": {"checks": {"processCountMismatch": "deny"}}}}):
        docs = helm.template(*enabled(policy=policy, webhook={"customResources": CUSTOM}))
        found = conditions(docs)
        assert found["validate.gpu-webhook.io"] == ["gpu-or-isolation", "left-to-the-webhook"], policy
        custom = one(docs, "ValidatingWebhookConfiguration")["webhooks"][-1]["matchConditions"][0]["expression"]
        assert custom.endswith(" in ['kubeflow.org/pytorchjobs', 'ray.io/rayclusters', 'ray.io/rayjobs', "
                               "'ray.io/rayservices']"), policy


def test_a_bare_off_in_a_values_file_is_off(helm: Helm, tmp_path) -> None:
    """YAML reads `off` as false: the chart takes it as the policy does."""
    values = tmp_path / "values.yaml"
    values.write_text("admissionPolicies: {enabled: true}\nwebhook:\n  customResources:\n"
                      "  - {apiGroups: [kubeflow.org], apiVersions: ['*'], resources: [pytorchjobs]}\n"
                      "policy:\n  checks: {processCountMismatch: off, replicaAcceleratorMismatch: off}\n"
                      "  nativePolicies: {params: inline}\n")
    docs = helm.template("--kube-version", "1.37.0", "-f", str(values))
    custom = one(docs, "ValidatingWebhookConfiguration")["webhooks"][-1]["matchConditions"][0]["expression"]
    assert " || " not in custom


def test_the_cluster_checks_keep_the_dra_objects_custom_kinds_and_pods_the_policies_cannot_judge(helm: Helm) -> None:
    found = conditions(helm.template(*enabled(policy={"cluster": {"enabled": True}},
                                              webhook={"customResources": CUSTOM})))
    assert found["validate.gpu-webhook.io"] == ["gpu-or-isolation", "left-to-the-webhook"]
    assert found["validate-custom.gpu-webhook.io"] == []
    assert found["validate-dra.gpu-webhook.io"] == ["requests-devices-or-names-extended-resource"]


def test_inline_policies_with_the_cluster_checks_keep_everything_with_the_webhook(helm: Helm) -> None:
    policy = {"cluster": {"enabled": True}, "nativePolicies": {"params": "inline"}}
    found = conditions(helm.template(*enabled(policy=policy, webhook={"customResources": CUSTOM})))
    assert found["validate.gpu-webhook.io"] == ["gpu-or-isolation"]
    assert found["validate-custom.gpu-webhook.io"] == []
    assert found["validate-dra.gpu-webhook.io"] == ["requests-devices-or-names-extended-resource"]


def test_mutate_stays_for_a_runtime_class_inline_policies_cannot_check_against_the_cluster(helm: Helm) -> None:
    policy = {"cluster": {"enabled": True}, "isolation": {"runtimeClass": "nvidia"}}
    inline = {**policy, "nativePolicies": {"params": "inline"}}
    assert conditions(helm.template(*enabled(policy=inline)))["mutate.gpu-webhook.io"] == ["gpu-or-hidden-namespace"]
    # Read live, the MutatingAdmissionPolicy checks it against the facts; the webhook keeps the pods with claims.
    assert conditions(helm.template(*enabled(policy=policy)))["mutate.gpu-webhook.io"] == [
        "gpu-or-hidden-namespace", "pod-with-claims"]


def test_failure_policy_in_hybrid_mode(helm: Helm) -> None:
    def policies(*args: str) -> dict[str, set[str]]:
        docs = helm.template(*args)
        return {kind: {h["failurePolicy"] for h in one(docs, kind)["webhooks"]}
                for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")}

    assert policies(*enabled()) == {"MutatingWebhookConfiguration": {"Ignore"},
                                    "ValidatingWebhookConfiguration": {"Ignore"}}
    assert policies(*enabled("--kube-version", "1.33.0")) == {"MutatingWebhookConfiguration": {"Fail"},
                                                              "ValidatingWebhookConfiguration": {"Ignore"}}
    chosen = {"enabled": True, "webhookFailurePolicy": "Fail", "mutatingWebhookFailurePolicy": "Ignore"}
    assert policies(*enabled("--kube-version", "1.33.0", admissionPolicies=chosen)) == {
        "MutatingWebhookConfiguration": {"Ignore"}, "ValidatingWebhookConfiguration": {"Fail"}}
    # Outside hybrid mode the hybrid values change nothing.
    assert policies(*values_args({"admissionPolicies": {"webhookFailurePolicy": "Ignore"}})) == {
        "MutatingWebhookConfiguration": {"Fail"}, "ValidatingWebhookConfiguration": {"Fail"}}


def test_schema_refuses_bad_values(helm: Helm) -> None:
    for bad in ({"enabled": "yes"}, {"webhookFailurePolicy": "Maybe"}, {"mutatingWebhookFailurePolicy": "Never"},
                {"job": {"backoffLimit": -1}}, {"job": {"activeDeadlineSeconds": 1}}, {"jobs": {}}):
        error = helm.template_error(*MAP_API, *values_args({"admissionPolicies": bad}))
        assert "admissionPolicies" in error, (bad, error)


def test_the_notes_say_which_engine_carries_what_and_show_the_policys_denial(helm: Helm) -> None:
    from tests.chart.test_chart import notes
    from webhook.core.policyfile import parse_policy
    from webhook.native.generate import generate
    from webhook.native.target import for_version

    text = notes(helm, *values_args({"admissionPolicies": {"enabled": True}}))
    assert ("Validation: ValidatingAdmissionPolicies gpu-webhook-seed-deny, gpu-webhook-live-deny and "
            "gpu-webhook-live-warn") in text
    assert "Mutation: MutatingAdmissionPolicy gpu-webhook-live (v1)" in text
    denial = next(ln.strip() for ln in text.splitlines() if "denied request" in ln)
    assert denial.startswith('Error from server (Forbidden): pods "gpu-test" is forbidden: ValidatingAdmissionPolicy '
                             "'gpu-webhook-live-deny' with binding 'gpu-webhook-live-deny' denied request: "
                             "1 GPU violation: ")
    # The policies the hook Job applies are named as the notes name them.
    names = {o["metadata"]["name"] for o in generate(parse_policy("{}"), for_version("1.37")).objects}
    assert {"gpu-webhook-seed-deny", "gpu-webhook-live-deny", "gpu-webhook-live-warn", "gpu-webhook-live"} <= names
    # (helm install --dry-run=client takes no --kube-version: the branch for a cluster without a
    # MutatingAdmissionPolicy is read on the version matrix's installs, tests/e2e/test_native_chart.py.)
