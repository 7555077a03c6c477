"""The commands of docs/day-one.md and the tests that run them.

The page's ``sh`` blocks are read section by section. ``RUN_BY`` names, for every command of the page, the test that
runs it as written (from the repository's root, with the bed's kubeconfig and the page's release ``gpu-webhook`` in
``gpu-system``): tests/test_day_one_page.py holds the page to this table, so a command added to the page without a
test that runs it, or a test left running a command the page no longer shows, fails there; the e2e walkthrough
(tests/e2e/test_node_day_one_page.py) asserts at its end that it ran every command of the table.

Manifests the page's commands are run on: a node-exporter-shaped DaemonSet in ``monitoring`` (privileged, the host's
root mounted, every taint tolerated: what the isolation rules look at) and a tenant's Deployment in ``team-a`` whose
accelerator annotation and nodeSelector disagree (refused by every engine, in every namespace a tenant works in).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "day-one.md"
RELEASE, NAMESPACE = "gpu-webhook", "gpu-system"
AGENTS, TENANT = "monitoring", "team-a"

E2E = "tests/e2e/test_node_day_one_page.py"
UNIT = "tests/test_day_one_page.py"
POLICIES = ("validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingadmissionpolicies,"
            "mutatingadmissionpolicybindings")
GENERATED = "app.kubernetes.io/name=gpu-webhook,app.kubernetes.io/component=admission-policies"
PATCH = "kubectl patch gpupolicy default --type merge -p "
UPGRADE = "helm upgrade gpu-webhook charts/gpu-webhook -n gpu-system --reuse-values "

RUN_BY: dict[str, str] = {
    "gpu-webhook audit": f"{E2E}::test_1_audit_before_install",
    "gpu-webhook audit --policy policy.yaml": f"{E2E}::test_1_audit_before_install",
    "gpu-webhook check -R manifests/": f"{UNIT}::test_check_on_manifests_reports_the_agent_and_refuses_the_tenant",
    "kubectl get daemonsets -A -o json | gpu-webhook check -": f"{E2E}::test_1_audit_before_install",
    PATCH + """'{"spec":{"isolation":{"trusted":{"namespaces":["monitoring"]}}}}'""":
        f"{E2E}::test_2_exempt_a_namespace_in_webhook_mode",
    PATCH + """'{"spec":{"namespaces":{"team-a":{"enforcement":"warn"}}}}'""":
        f"{E2E}::test_2_exempt_a_namespace_in_webhook_mode",
    UPGRADE + """--set-json 'policy.excludeNamespaces=["kube-system","kube-node-lease","team-a"]'""":
        f"{E2E}::test_2_exempt_a_namespace_in_webhook_mode",
    UPGRADE + """--set-json 'webhook.excludeNamespaces=["team-a"]'""":
        f"{E2E}::test_2_exempt_a_namespace_in_webhook_mode",
    UPGRADE + "--set admissionPolicies.enabled=true --wait": f"{E2E}::test_3_turn_on_hybrid_mode",
    "kubectl get gpupolicy default": f"{E2E}::test_3_turn_on_hybrid_mode",
    f"kubectl get validatingadmissionpolicies -l {GENERATED}": f"{E2E}::test_3_turn_on_hybrid_mode",
    UPGRADE + "--set admissionPolicies.enabled=true --set policy.nativePolicies.params=inline --wait":
        f"{E2E}::test_3_turn_on_hybrid_mode",
    "helm history gpu-webhook -n gpu-system": f"{E2E}::test_4_roll_back",
    "helm rollback gpu-webhook 1 -n gpu-system --wait": f"{E2E}::test_4_roll_back",
    f"kubectl delete {POLICIES} -l {GENERATED}": f"{E2E}::test_4_roll_back",
    "helm uninstall gpu-webhook -n gpu-system --wait": f"{E2E}::test_5_uninstall",
    "kubectl delete gpupolicy default": f"{E2E}::test_5_uninstall",
    "kubectl delete crd gpupolicies.gpu-webhook.io": f"{E2E}::test_5_uninstall",
    "kubectl -n gpu-system describe job gpu-webhook-policies-delete": f"{E2E}::test_6_uninstall_when_the_job_fails",
    "kubectl -n gpu-system logs job/gpu-webhook-policies-delete": f"{E2E}::test_6_uninstall_when_the_job_fails",
    "helm uninstall gpu-webhook -n gpu-system --no-hooks": f"{E2E}::test_6_uninstall_when_the_job_fails",
    "kubectl delete clusterroles,clusterrolebindings -l "
    "app.kubernetes.io/name=gpu-webhook,app.kubernetes.io/component=admission-policies-job":
        f"{E2E}::test_6_uninstall_when_the_job_fails",
}


def sections(text: str | None = None) -> dict[str, list[str]]:
    """``## title`` -> the command lines of the ``sh`` blocks under it (its ``###`` subsections included), in order."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    out: dict[str, list[str]] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = [line.strip() for block in re.findall(r"```sh\n(.*?)```", body, flags=re.S)
                              for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    return out


def commands(text: str | None = None) -> list[str]:
    return [command for found in sections(text).values() for command in found]


def command(section: str, starts: str, nth: int = 0) -> str:
    """The ``nth`` command of ``## section`` that starts with ``starts``, exactly as the page writes it."""
    found = [c for c in sections()[section] if c.startswith(starts)]
    assert len(found) > nth, f"docs/day-one.md, {section!r}: no command {nth + 1} starting {starts!r}: {found}"
    return found[nth]


def node_exporter() -> dict[str, Any]:
    """A node exporter as its chart renders it, in its own namespace: privileged, ``/`` mounted, every taint."""
    labels = {"app": "node-exporter"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "node-exporter", "namespace": AGENTS},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
                "hostPID": True, "hostNetwork": True,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "node-exporter", "image": "registry.invalid/node-exporter:v1",
                                "securityContext": {"privileged": True},
                                "volumeMounts": [{"name": "root", "mountPath": "/host", "readOnly": True}]}],
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}}}


def tenant_deployment(name: str = "trainer") -> dict[str, Any]:
    """A tenant's GPU Deployment whose accelerator annotation contradicts its nodeSelector: refused everywhere."""
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": TENANT},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels, "annotations": {"gpu-webhook/accelerator": "model-a"}},
                "spec": {"nodeSelector": {"accelerator": "model-b"},
                         "containers": [{"name": name, "image": "registry.invalid/trainer:v1",
                                         "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
