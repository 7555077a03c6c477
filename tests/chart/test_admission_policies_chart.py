"""admissionPolicies.*: the hook Jobs that apply and delete the native policies, their short-lived RBAC, the gate
on the MutatingAdmissionPolicy API, and hybrid mode's matchConditions and failurePolicy. Rendered with helm
template (test_chart's fixtures); the Job's command itself is tested on the e2e bed (test_native_apply)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.chart import test_chart
from tests.chart.test_chart import Helm, one, values_args

helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

MAP_API = ("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
HELPERS = Path(__file__).resolve().parents[2] / "charts" / "gpu-webhook" / "templates" / "_helpers.tpl"
ADMISSION_RESOURCES = {"validatingadmissionpolicies", "validatingadmissionpolicybindings",
                       "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"}
# The checks the generator leaves to the webhook, all off: hybrid mode can then narrow what the webhook sees.
CHECKS_OFF = {"checks": {key: "off" for key in ("processCountMismatch", "replicaAcceleratorMismatch")}}
CUSTOM = [{"apiGroups": ["kubeflow.org", "example.com"], "apiVersions": ["*"], "resources": ["pytorchjobs", "widgets"]}]


def enabled(**more: Any) -> list[str]:
    return [*MAP_API, *values_args({"admissionPolicies": {"enabled": True}, **more})]


def hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


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


def test_refused_on_a_cluster_without_mutating_admission_policies(helm: Helm) -> None:
    error = helm.template_error(*values_args({"admissionPolicies": {"enabled": True}}))
    assert "admissionPolicies.enabled needs admissionregistration.k8s.io/v1 MutatingAdmissionPolicy" in error
    assert len(error.strip().splitlines()) <= 3  # the message, and helm's own hint


def test_hook_jobs_service_accounts_and_rbac(helm: Helm) -> None:
    docs = helm.template(*enabled())
    by_hook: dict[str, list[dict[str, Any]]] = {}
    for doc in hooks(docs):
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        by_hook.setdefault(annotations["helm.sh/hook"], []).append(doc)
    assert set(by_hook) == {"post-install,post-upgrade", "pre-delete"}
    for hook, objects in by_hook.items():
        kinds = {d["kind"]: d for d in objects}
        assert set(kinds) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}
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
        (rule,) = kinds["ClusterRole"]["rules"]
        assert rule["apiGroups"] == ["admissionregistration.k8s.io"]
        assert set(rule["resources"]) == ADMISSION_RESOURCES
        args = pod["containers"][0]["args"]
        if hook == "pre-delete":
            assert args == ["admission-policies", "--delete"]
            assert set(rule["verbs"]) == {"get", "list", "delete"}
        else:
            assert args == ["admission-policies", "--policy", "/etc/gpu-webhook/policy.yaml", "--apply"]
            assert set(rule["verbs"]) == {"get", "list", "create", "patch", "delete"}
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
            assert not touches, f"{role['kind']} {role['metadata']['name']} has {rule}"
    assert {d["kind"] for d in hooks(docs)} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}


def test_hybrid_mode_narrows_every_webhook(helm: Helm) -> None:
    docs = helm.template(*enabled(policy=CHECKS_OFF, webhook={"customResources": CUSTOM}))
    assert conditions(docs) == {
        "mutate.gpu-webhook.io": ["gpu-or-hidden-namespace", "left-to-mutating-admission-policy"],
        "validate.gpu-webhook.io": ["gpu-or-isolation", "follows-claims"],
        "validate-dra.gpu-webhook.io": ["requests-devices-or-names-extended-resource",
                                        "left-to-validating-admission-policies"],
        "validate-custom.gpu-webhook.io": ["kind-not-native"],
    }
    custom = one(docs, "ValidatingWebhookConfiguration")["webhooks"][-1]["matchConditions"][0]["expression"]
    assert "'kubeflow.org/pytorchjobs'" in custom and "example.com/widgets" not in custom


def test_hybrid_mode_keeps_everything_where_the_webhook_alone_checks(helm: Helm) -> None:
    """Default checks (warn/deny) the generator leaves to the webhook, or cluster checks: every GPU object still
    goes to /validate; a check turned on in one namespace is enough."""
    for policy in ({}, {"cluster": {"enabled": True}, **CHECKS_OFF},
                   {**CHECKS_OFF, "namespaces": {"team": {"checks": {"processCountMismatch": "deny"}}}}):
        found = conditions(helm.template(*enabled(policy=policy, webhook={"customResources": CUSTOM})))
        assert found["validate.gpu-webhook.io"] == ["gpu-or-isolation"], policy
        assert found["validate-custom.gpu-webhook.io"] == [], policy


def test_mutate_stays_for_cluster_checked_runtime_class(helm: Helm) -> None:
    policy = {"cluster": {"enabled": True}, "isolation": {"runtimeClass": "nvidia"}}
    assert conditions(helm.template(*enabled(policy=policy)))["mutate.gpu-webhook.io"] == ["gpu-or-hidden-namespace"]


def test_failure_policy_in_hybrid_mode(helm: Helm) -> None:
    def policies(*args: str) -> set[str]:
        docs = helm.template(*args)
        return {h["failurePolicy"] for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
                for h in one(docs, kind)["webhooks"]}

    assert policies(*enabled()) == {"Fail"}
    assert policies(*enabled(admissionPolicies={"enabled": True, "webhookFailurePolicy": "Ignore"})) == {"Ignore"}
    # Outside hybrid mode the hybrid value changes nothing.
    assert policies(*values_args({"admissionPolicies": {"webhookFailurePolicy": "Ignore"}})) == {"Fail"}


def test_schema_refuses_bad_values(helm: Helm) -> None:
    for bad in ({"enabled": "yes"}, {"webhookFailurePolicy": "Maybe"}, {"job": {"backoffLimit": -1}},
                {"job": {"activeDeadlineSeconds": 1}}, {"jobs": {}}):
        error = helm.template_error(*MAP_API, *values_args({"admissionPolicies": bad}))
        assert "admissionPolicies" in error, (bad, error)


def test_chart_lists_agree_with_the_generator_and_the_rule_table() -> None:
    from webhook.core.catalog import RULES
    from webhook.native.kinds import KNOWN_KINDS

    text = HELPERS.read_text()
    kinds = re.search(r'define "gpu-webhook.nativeCustomKinds".*?\$kinds := list (.*?) }}', text, re.S)
    assert kinds is not None
    assert set(re.findall(r'"([^"]+)"', kinds.group(1))) == {f"{k.group}/{k.resource}" for k in KNOWN_KINDS}
    checks = re.search(r'define "gpu-webhook.webhookChecks" -}}\n(.*?)\n', text)
    assert checks is not None
    assert set(checks.group(1).split(",")) == {r.key for r in RULES.values()
                                              if r.engine == "webhook" and r.section == "checks"}
