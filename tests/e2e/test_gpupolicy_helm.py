"""The chart's GPUPolicy with the real Helm 4 on the bed: a fresh ``helm install`` and a ``helm upgrade`` from
a release of the chart before the CRD (828c426) both install the CRD and apply GPUPolicy/default from
values.policy (the ConfigMap carries the same policy); later upgrades patch the object in place (same uid: no
window without it); a field kubectl changed that Helm also sets makes the next upgrade fail with a conflict
naming it; ``helm uninstall`` leaves the CRD and the object. charts/gpu-webhook/README.md says why this design.

No webhook server runs here: the releases' webhooks leave their own namespace alone and nothing else is
created while they exist; each release is uninstalled, and the CRD deleted, at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.bed import CHART
from tests.e2e.gpupolicy import chart_of
from tests.e2e.test_helm import Helm
from tests.tools import ROOT
from webhook.core import gpupolicy
from webhook.core.policycrd import as_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

OLD_CHART_COMMIT = "828c426"  # the last chart without the CRD
NAMESPACE = "gpu-policy-e2e"
CRD_NAME = f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}"
BASE = ["--set", "image.repository=localhost/gpu-webhook", "--set", "certs.mode=helm"]
POLICY = {"limits": {"perPod": 4}, "checks": {"mixedGpuAndMig": False}, "isolation": {"hideGpus": False},
          "namespaces": {"lab": {"enforcement": "warn", "checks": {"zeroGpuLimit": False}}}}


@pytest.fixture(scope="module")
def helm(cluster, tmp_path_factory) -> Helm:
    return Helm(cluster, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture
def clean(cluster):
    """No CRD before (as on a cluster that never had this chart) and none after."""
    def wipe() -> None:
        if cluster.kubectl("get", "crd", CRD_NAME).returncode == 0:
            cluster.kubectl("delete", gpupolicy.PLURAL, "--all")
            cluster.kubectl("delete", "crd", CRD_NAME, "--timeout=60s", check=True)

    wipe()
    yield cluster
    wipe()


@pytest.fixture(scope="module")
def old_chart(tmp_path_factory) -> Path:
    return chart_of(OLD_CHART_COMMIT, tmp_path_factory.mktemp("old-chart"), ROOT)


def get(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json", check=True).stdout)


def the_policy(cluster, release: str) -> tuple[dict, str, dict]:
    """GPUPolicy/default's spec and uid, and the policy the release's ConfigMap carries."""
    stored = get(cluster, "gpupolicy", gpupolicy.NAME)
    configmap = get(cluster, "configmap", "-n", NAMESPACE, f"{release}-gpu-webhook-policy")
    return stored["spec"], stored["metadata"]["uid"], yaml.safe_load(configmap["data"]["policy.yaml"]) or {}


def policy_values(policy: dict) -> list[str]:
    return ["--set-json", f"policy={json.dumps(policy)}"]


def test_upgrade_from_the_chart_without_a_crd_then_again_then_uninstall(helm, clean, old_chart):
    cluster, release = clean, "gw-crd-up"
    try:
        helm("install", release, str(old_chart), "-n", NAMESPACE, "--create-namespace", *BASE, *policy_values(POLICY))
        assert cluster.kubectl("get", "crd", CRD_NAME).returncode != 0
        helm("upgrade", release, str(CHART), "-n", NAMESPACE, "--reuse-values")
        crd = get(cluster, "crd", CRD_NAME)
        assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
        spec, uid, configmap = the_policy(cluster, release)
        assert configmap == POLICY and spec == as_spec(POLICY)
        assert spec["checks"]["mixedGpuAndMig"] == "off"

        changed = {**POLICY, "limits": {"perPod": 2}}
        helm("upgrade", release, str(CHART), "-n", NAMESPACE, "--reuse-values", *policy_values(changed))
        spec, same_uid, configmap = the_policy(cluster, release)
        assert (spec, same_uid, configmap) == (as_spec(changed), uid, changed)  # patched in place

        # kubectl sets a key Helm does not: kept by the next upgrade
        cluster.kubectl("patch", "gpupolicy", gpupolicy.NAME, "--type=merge", "-p",
                        '{"spec": {"tolerations": true}}', check=True)
        helm("upgrade", release, str(CHART), "-n", NAMESPACE, "--reuse-values")
        assert the_policy(cluster, release)[0] == {**as_spec(changed), "tolerations": True}
        # kubectl changes a key Helm sets: the next upgrade fails, naming the field, and changes nothing
        cluster.kubectl("patch", "gpupolicy", gpupolicy.NAME, "--type=merge", "-p",
                        '{"spec": {"limits": {"perPod": 7}}}', check=True)
        failed = helm("upgrade", release, str(CHART), "-n", NAMESPACE, "--reuse-values", check=False)
        assert failed.returncode != 0 and "conflict" in failed.stderr and ".spec.limits.perPod" in failed.stderr
        assert the_policy(cluster, release)[0]["limits"] == {"perPod": 7}
    finally:
        helm("uninstall", release, "-n", NAMESPACE, check=False)
    assert get(cluster, "crd", CRD_NAME)["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert get(cluster, "gpupolicy", gpupolicy.NAME)["metadata"]["uid"] == uid  # a hook: uninstall leaves it


def test_a_fresh_install_renders_the_policy_from_values(helm, clean):
    cluster, release = clean, "gw-crd-new"
    try:
        helm("install", release, str(CHART), "-n", NAMESPACE, "--create-namespace", *BASE, *policy_values(POLICY))
        spec, uid, configmap = the_policy(cluster, release)
        assert configmap == POLICY and spec == as_spec(POLICY)
        rbac = get(cluster, "clusterrole", f"{release}-gpu-webhook-policy")
        assert {"gpupolicies": ["get", "list", "watch"], "gpupolicies/status": ["update", "patch"],
                "validatingadmissionpolicybindings": ["list"]} == {
            rule["resources"][0]: rule["verbs"] for rule in rbac["rules"]}
        # A rollback runs the chart's post-rollback hooks: the revision's policy is applied to the object again.
        changed = {**POLICY, "limits": {"perPod": 2}}
        helm("upgrade", release, str(CHART), "-n", NAMESPACE, "--reuse-values", *policy_values(changed))
        assert the_policy(cluster, release)[0] == as_spec(changed)
        helm("rollback", release, "1", "-n", NAMESPACE)
        spec, same_uid, configmap = the_policy(cluster, release)
        assert (spec, same_uid, configmap) == (as_spec(POLICY), uid, POLICY)
        # Back to the chart's default, an empty policy: Helm's server-side apply of `spec: {}` drops every field it
        # set, which left spec null (refused: "must be of type object") until the CRD gave spec a default of {}.
        helm("upgrade", release, str(CHART), "-n", NAMESPACE, "--reset-values", *BASE)
        assert the_policy(cluster, release)[:2] == ({}, uid)
        helm("rollback", release, "1", "-n", NAMESPACE)
        assert the_policy(cluster, release)[0] == as_spec(POLICY)
        helm("rollback", release, "4", "-n", NAMESPACE)
        assert the_policy(cluster, release)[:2] == ({}, uid)
    finally:
        helm("uninstall", release, "-n", NAMESPACE, check=False)
