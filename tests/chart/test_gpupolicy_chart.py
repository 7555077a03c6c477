"""The chart's GPUPolicy: the CRD (templates/crd.yaml, generated from webhook.core.policycrd.crd()), and
GPUPolicy/default whose spec is the policy the ConfigMap carries (a bare off written "off"); the RBAC of the
webhook and of the policies Job. Uses test_chart's helm fixtures."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.chart import test_chart
from tests.chart.test_chart import CUSTOM_POLICY, FULLNAME, NAMESPACE, Helm, one, values_args
from webhook.core import gpupolicy
from webhook.core.policycrd import as_spec, crd
from webhook.core.policyfile import parse_policy

# test_chart's session fixtures, found here by name.
helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

OFF = {"checks": {"mixedGpuAndMig": False}, "isolation": {"hideGpus": False, "runtimeClass": "nvidia"},
       "cluster": {"enabled": False, "unknownAccelerator": False},
       "namespaces": {"lab": {"checks": {"zeroGpuLimit": False}, "isolation": {"hideGpus": False},
                              "tolerations": False}, "open": {}}}


@pytest.mark.parametrize("policy", [None, {}, {"limits": {"perPod": 4}}, CUSTOM_POLICY, OFF],
                         ids=["chart-default", "empty", "one-key", "custom", "bare-off"])
def test_the_gpupolicy_spec_is_the_policy_of_the_configmap(helm: Helm, policy: dict[str, Any] | None) -> None:
    docs = helm.template(*([] if policy is None else values_args({"policy": policy})))
    configmap = yaml.safe_load(one(docs, "ConfigMap", f"{FULLNAME}-policy")["data"]["policy.yaml"]) or {}
    resource = one(docs, gpupolicy.KIND, gpupolicy.NAME)
    assert resource["apiVersion"] == gpupolicy.API_VERSION
    spec = resource["spec"] or {}
    assert spec == as_spec(configmap) == as_spec(policy or {})
    # the same rules for the webhook, read from either
    assert parse_policy(yaml.safe_dump(spec)).default == parse_policy(yaml.safe_dump(configmap)).default
    annotations = resource["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade,post-rollback"
    assert annotations["helm.sh/hook-delete-policy"] == "hook-failed"  # never before-hook-creation: no window


def test_the_crd_is_the_generated_one_and_kept(helm: Helm) -> None:
    rendered = one(helm.template(), "CustomResourceDefinition")
    wanted = crd(annotations={"helm.sh/resource-policy": "keep"})
    labels = rendered["metadata"].pop("labels")
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert rendered == wanted


def test_crd_install_false_renders_neither_the_crd_nor_the_policy(helm: Helm) -> None:
    kinds = {d["kind"] for d in helm.template("--set", "crd.install=false")}
    assert not kinds & {"CustomResourceDefinition", gpupolicy.KIND}
    assert "ConfigMap" in kinds


def test_the_webhook_may_read_gpupolicies_write_their_status_and_hold_its_lease(helm: Helm) -> None:
    docs = helm.template()
    role = one(docs, "ClusterRole", f"{FULLNAME}-policy")
    assert role["rules"] == [
        {"apiGroups": ["gpu-webhook.io"], "resources": ["gpupolicies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["gpu-webhook.io"], "resources": ["gpupolicies/status"], "verbs": ["update", "patch"]},
        # the status says which generation the generated policies' bindings enforce: read, never written
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingadmissionpolicybindings"],
         "verbs": ["list"]},
    ]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--policy-object=default" in args and f"--status-lease={NAMESPACE}/{FULLNAME}-status" in args
    lease = one(docs, "Role", f"{FULLNAME}-policy-status")
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": [f"{FULLNAME}-status"], "verbs": ["get", "update"]} in lease["rules"]
    for binding in (one(docs, "ClusterRoleBinding", f"{FULLNAME}-policy"),
                    one(docs, "RoleBinding", f"{FULLNAME}-policy-status")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_the_policies_job_may_get_gpupolicies(helm: Helm) -> None:
    docs = helm.template("--set", "admissionPolicies.enabled=true")
    role = one(docs, "ClusterRole", f"{FULLNAME}-policies-apply")
    assert {"apiGroups": ["gpu-webhook.io"], "resources": ["gpupolicies"], "verbs": ["get"]} in role["rules"]


def test_values_of_an_older_chart_without_policy_object_still_read_the_object(helm: Helm, tmp_path) -> None:
    """helm upgrade --reuse-values keeps the previous chart's values, which have no policyObject: the webhook must
    still read GPUPolicy/default (the native policies do), or the two engines would read different policies."""
    values = tmp_path / "old.yaml"
    values.write_text("policyObject: null\n")
    docs = helm.template("-f", str(values))
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--policy-object=default" in args
    assert one(docs, "ClusterRole", f"{FULLNAME}-policy")
