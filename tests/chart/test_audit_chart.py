"""The chart's audit values: the periodic audit's arguments, token and RBAC (only when audit.enabled), and the
read-only ClusterRole for running ``gpu-webhook audit`` by hand. Uses test_chart's helm fixtures."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.chart import test_chart
from tests.chart.test_chart import CUSTOM_RESOURCES, FULLNAME, KUBE_MINOR, NAMESPACE, Helm, container, one, values_args
from webhook.cli import main as cli

# test_chart's session fixtures, found here by name.
helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

AUDIT = values_args({"audit": {"enabled": True}})
AUDIT_CUSTOM = values_args(
    {"audit": {"enabled": True, "interval": "30m", "reportKind": "wgpolicyk8s"},
     "webhook": {"customResources": CUSTOM_RESOURCES, "excludeNamespaces": ["batch-system"]}}
)
READER = values_args({"audit": {"readerClusterRole": {"enabled": True}}})
POD_KINDS = [
    {"apiGroups": [""], "resources": ["pods", "podtemplates", "replicationcontrollers"], "verbs": ["list"]},
    {"apiGroups": ["apps"], "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"],
     "verbs": ["list"]},
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ["list"]},
]


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def test_audit_is_off_by_default_and_adds_nothing(helm: Helm) -> None:
    docs = helm.template()
    rbac = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    # the GPUPolicy's (test_gpupolicy_chart.py) only
    assert {name for kind, name in kinds(docs) if kind in rbac} <= {f"{FULLNAME}-policy", f"{FULLNAME}-policy-status"}
    assert not [a for a in container(docs)["args"] if a.startswith("--audit")]
    # the policy object's watch has a token; without it, nothing calls the API
    assert "kube-api-access" in {v["name"] for v in pod_spec(docs)["volumes"]}
    alone = helm.template("--set", "policyObject.enabled=false")
    assert "kube-api-access" not in {v["name"] for v in pod_spec(alone)["volumes"]}


@pytest.mark.parametrize("args", [AUDIT, AUDIT_CUSTOM, READER], ids=["audit", "audit-custom", "reader"])
def test_audit_renders_are_valid_kubernetes(helm: Helm, args: list[str]) -> None:
    for doc in helm.template(*args):
        if doc["kind"] in ("Issuer", "Certificate", "ServiceMonitor", "GPUPolicy"):
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_MINOR, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_audit_enabled_gets_list_on_pod_kinds_reports_and_its_lease_only(helm: Helm) -> None:
    docs = helm.template(*AUDIT)
    role = one(docs, "ClusterRole", f"{FULLNAME}-audit")
    assert role["rules"] == [
        *POD_KINDS,
        {"apiGroups": ["openreports.io"], "resources": ["reports", "clusterreports"],
         "verbs": ["get", "list", "create", "patch", "delete"]},
    ]
    lease_role = one(docs, "Role", f"{FULLNAME}-audit")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [f"{FULLNAME}-audit"],
         "verbs": ["get", "update"]},
    ]
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(docs, kind, f"{FULLNAME}-audit")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                      "name": f"{FULLNAME}-audit"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_audit_arguments_follow_the_values_and_parse(helm: Helm) -> None:
    docs = helm.template(*AUDIT_CUSTOM)
    args = container(docs)["args"]
    audit_args = [a for a in args if a.startswith("--audit")]
    assert audit_args == [
        "--audit",
        "--audit-interval=30m",
        "--audit-report-kind=wgpolicyk8s",
        f"--audit-lease={NAMESPACE}/{FULLNAME}-audit",
        "--audit-exclude-namespace=kube-system",
        "--audit-exclude-namespace=kube-node-lease",
        f"--audit-exclude-namespace={NAMESPACE}",
        "--audit-exclude-namespace=batch-system",
        "--audit-resource=kubeflow.org/pytorchjobs",
        "--audit-resource=ray.io/rayclusters",
        "--audit-resource=ray.io/rayjobs",
    ]
    role = one(docs, "ClusterRole", f"{FULLNAME}-audit")
    assert {"apiGroups": ["ray.io"], "resources": ["rayclusters", "rayjobs"], "verbs": ["list"]} in role["rules"]
    assert role["rules"][-1]["apiGroups"] == ["wgpolicyk8s.io"]
    # The server's own parser takes them and makes the settings the audit process runs with.
    parsed = cli._parser().parse_args(args[:1] + ["--self-signed"] + args[1:])
    settings = cli._audit_settings(parsed, cli._parser())
    assert settings.interval == 1800 and settings.report_kind == "wgpolicyk8s"
    assert (settings.lease_namespace, settings.lease_name) == (NAMESPACE, f"{FULLNAME}-audit")
    assert settings.custom == ("kubeflow.org/pytorchjobs", "ray.io/rayclusters", "ray.io/rayjobs")
    assert "batch-system" in settings.exclude_namespaces


def test_without_custom_resources_the_audit_lists_none(helm: Helm) -> None:
    args = [a for a in container(helm.template(*AUDIT))["args"] if a.startswith("--audit-resource")]
    assert args == ["--audit-resource="]  # a pattern no GROUP/PLURAL matches: the RBAC lists no custom kind


def test_audit_mounts_a_token_for_the_container(helm: Helm) -> None:
    docs = helm.template(*AUDIT)
    spec = pod_spec(docs)
    assert spec["automountServiceAccountToken"] is False
    volume = next(v for v in spec["volumes"] if v["name"] == "kube-api-access")
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "kube-api-access")
    assert mount == {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                     "readOnly": True}


def test_reader_cluster_role_is_read_only_and_bound_to_nobody(helm: Helm) -> None:
    docs = helm.template(*READER, *values_args({"webhook": {"customResources": CUSTOM_RESOURCES}}))
    role = one(docs, "ClusterRole", f"{FULLNAME}-audit-reader")
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} == {"list"}
    assert role["rules"][:3] == POD_KINDS
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]} in role["rules"]
    assert not [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
                and not d["metadata"]["name"].startswith(f"{FULLNAME}-policy")]  # the GPUPolicy's
    assert not [a for a in container(docs)["args"] if a.startswith("--audit")]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"audit": {"reportKind": "policyreport"}}, "/audit/reportKind"),
        ({"audit": {"interval": "1d"}}, "/audit/interval"),
        ({"audit": {"enable": True}}, "enable"),
    ],
)
def test_schema_refuses_bad_audit_values(helm: Helm, values: dict[str, Any], message: str) -> None:
    assert message in helm.template_error(*values_args(values))
