"""Registering the webhook in the bed with the Helm chart's own configurations, and reading what users see."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path

import yaml

from tests.e2e.cluster import NO_PROXY_ENV, ControlPlane
from tests.server import WebhookProcess

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-webhook"
RELEASE, NAMESPACE = "gpu-webhook", "gpu-system"
CUSTOM_RESOURCES = [{"apiGroups": ["example.com"], "apiVersions": ["v1"], "resources": ["trainingjobs"]}]


def render_webhook_configurations(cluster: ControlPlane, url: str, ca_file: Path, **values) -> list[dict]:
    """``helm template`` of the chart's webhook configurations, pointed at ``url`` (one source with the chart)."""
    settings = {
        "webhook": {"url": url, "customResources": CUSTOM_RESOURCES, **values.pop("webhook", {})},
        "certs": {"mode": "secret", "secret": {"name": "unused-in-url-mode",
                                               "caBundle": base64.b64encode(ca_file.read_bytes()).decode()}},
        **values,
    }
    values_file = ca_file.parent / "e2e-values.yaml"
    values_file.write_text(yaml.safe_dump(settings))
    result = subprocess.run(
        [cluster.binary("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--values", str(values_file), "--show-only", "templates/webhooks.yaml",
         "--set", "image.repository=localhost/gpu-webhook"],  # no pod runs: any image will do
        capture_output=True, text=True, timeout=120, env=NO_PROXY_ENV, check=False,
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def apply(cluster: ControlPlane, documents: list[dict]) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
                    check=True)


def register_webhook(cluster: ControlPlane, server: WebhookProcess, probe: dict | None = None, **values) -> list[dict]:
    """The chart's webhook configurations for ``values``, applied, once the webhook refuses ``probe`` (by default a
    pod of 5 GPUs, which a policy with a cap or the cluster checks refuses)."""
    documents = render_webhook_configurations(cluster, server.address, server.ca, **values)
    apply(cluster, documents)
    wait_until_called(cluster, probe=probe)
    return documents


def unregister_webhook(cluster: ControlPlane) -> None:
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        cluster.kubectl("delete", kind, "-l", f"app.kubernetes.io/instance={RELEASE}", "--ignore-not-found")


def wait_until_called(cluster: ControlPlane, timeout: float = 30, probe: dict | None = None) -> None:
    """The apiserver picks configurations up asynchronously; wait until a bad GPU pod is refused by us."""
    probe = probe or {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                      "spec": {"containers": [{"name": "c", "image": "busybox",
                                               "resources": {"limits": {"nvidia.com/gpu": 5}}}]}}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe))
        if "gpu-webhook.io" in result.stderr:
            return
        time.sleep(0.2)
    raise AssertionError(f"the webhook was never called: {result.stdout} {result.stderr}")


def forget_policy_crd(kubectl) -> None:
    """After ``helm uninstall`` on a test bed: delete the GPUPolicy CRD the chart keeps (helm.sh/resource-policy
    keep) and, with it, GPUPolicy/default. Kept, it carries the uninstalled release's ownership, and Helm refuses
    to install the chart again under another release name. ``kubectl``: a bed's kubectl (ControlPlane or NodeBed)."""
    kubectl("delete", "crd", "gpupolicies.gpu-webhook.io", "--ignore-not-found")
