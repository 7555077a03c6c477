"""Do no harm, on the node bed: the chart installed at its defaults, webhook-only and then in hybrid mode, lets the
platform's node agents in with no refusal and no warning, and the DaemonSet controller's pods of them are
admitted: a GPU Operator-shaped set of operands in ``gpu-operator``, the NVIDIA device plugin's static DaemonSets
(in its own namespace and in kube-system) and a calico-node-shaped DaemonSet in ``calico-system``. A tenant's
copy of calico-node is warned about, saying why it is not refused, and a privileged GPU pod is refused. The
manifests are tests/day_one.py's.
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from tests.day_one import TENANT, Case, calico_node, device_plugin, operands, tenants
from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.node import NodeBed, until
from tests.manifests import tls_secret
from webhook.rules.admission import NOT_TENANT
from webhook.serving import certs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

RELEASE, NAMESPACE = "day-one", "gpu-webhook-day-one"
FULLNAME = f"{RELEASE}-gpu-webhook"  # the chart's fullname: the Service the certificate is for
# The node labels the operands' node selectors ask for (GPU Feature Discovery sets them on a GPU node).
NODE_LABELS = ("nvidia.com/gpu.deploy.driver=true", "nvidia.com/mps.capable=true")


def agents() -> list[Case]:
    """The DaemonSets (and the validator's pods) of the platform; the claims need a DRA driver the bed lacks."""
    cases = [*operands(), *device_plugin("nvidia-device-plugin"), *device_plugin("kube-system"), calico_node()]
    return [c for c in cases if c.kind in ("DaemonSet", "Pod", "Deployment")]


def apply(bed: NodeBed, case: Case, dry_run: bool = False) -> tuple[int, str]:
    """(exit code, stderr: a refusal or warnings) of ``kubectl apply``, or of a server-side dry run."""
    done = bed.kubectl("apply", *(["--dry-run=server"] if dry_run else []), "-n", case.namespace, "-f", "-",
                       stdin=json.dumps(case.obj))
    return done.returncode, done.stderr.strip()


def daemon_pods(bed: NodeBed, case: Case) -> list[dict]:
    selector = ",".join(f"{k}={v}" for k, v in case.obj["spec"]["selector"]["matchLabels"].items())
    return bed.kubectl_json("get", "pods", "-n", case.namespace, "-l", selector)["items"]


def failed_creates(bed: NodeBed, namespace: str) -> list[str]:
    events = bed.kubectl_json("get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate")["items"]
    return [e.get("message", "") for e in events]


@pytest.fixture(scope="module")
def release(node_bed: NodeBed, webhook_image: str, tmp_path_factory):
    """The chart at its defaults (the image and a certificate are all it is given), webhook-only."""
    bed = node_bed
    tmp = tmp_path_factory.mktemp("day-one")
    bed.kubectl("create", "namespace", NAMESPACE, check=True)
    bundle = certs.generate(certs.service_names(FULLNAME, NAMESPACE))
    secret = tls_secret(f"{RELEASE}-tls", NAMESPACE, bundle.cert_pem, bundle.key_pem)
    bed.kubectl("create", "-f", "-", stdin=json.dumps(secret), check=True)
    repository, tag = webhook_image.rsplit(":", 1)
    values = {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
              "certs": {"mode": "secret", "secret": {"name": f"{RELEASE}-tls",
                                                     "caBundle": base64.b64encode(bundle.ca_pem).decode()}}}
    (tmp / "values.yaml").write_text(yaml.safe_dump(values))
    node = bed.kubectl_json("get", "nodes")["items"][0]["metadata"]["name"]
    namespaces = sorted({c.namespace for c in agents()} - {"kube-system"} | {TENANT})
    try:
        installed = bed.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values",
                             str(tmp / "values.yaml"), "--wait", "--timeout=180s")
        assert installed.returncode == 0, installed.stderr
        bed.kubectl("label", "node", node, *NODE_LABELS, "--overwrite", check=True)
        bed.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({
            "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
            "handler": "runc"}))
        for namespace in namespaces:
            bed.kubectl("create", "namespace", namespace)
        # The service accounts the agents run as (their charts and manifests ship them).
        for case in agents():
            template = case.obj["spec"].get("template", {}).get("spec", {}) if case.kind != "Pod" else {}
            if template.get("serviceAccountName"):
                bed.kubectl("create", "serviceaccount", template["serviceAccountName"], "-n", case.namespace)
        refused = next(c for c in tenants() if c.name == "tenant/device-hostpath")  # refused in any namespace
        until("the webhook refusing a privileged GPU pod",
              lambda: "denied the request" in apply(bed, refused, dry_run=True)[1] or None, 60, interval=0.5,
              diagnose=lambda: apply(bed, refused, dry_run=True)[1])
        yield bed
    finally:
        for case in agents():
            bed.kubectl("delete", case.kind.lower(), case.obj["metadata"]["name"], "-n", case.namespace,
                        "--ignore-not-found", "--wait=false")
        bed.kubectl("label", "node", node, *(label.split("=")[0] + "-" for label in NODE_LABELS))
        bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=90s")
        forget_policy_crd(bed.kubectl)
        for case in agents():
            template = case.obj["spec"].get("template", {}).get("spec", {}) if case.kind != "Pod" else {}
            if case.namespace == "kube-system" and template.get("serviceAccountName"):
                bed.kubectl("delete", "serviceaccount", template["serviceAccountName"], "-n", "kube-system",
                            "--ignore-not-found")
        for namespace in (*namespaces, NAMESPACE):
            bed.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")
        bed.kubectl("delete", "runtimeclass", "nvidia", "--ignore-not-found")


def agents_admitted(bed: NodeBed, mode: str) -> None:
    """Every agent applies with no refusal and no warning, and each DaemonSet's pod is created on the node."""
    said = {c.name: apply(bed, c) for c in agents()}
    wrong = {name: answer for name, answer in said.items() if answer != (0, "")}
    assert wrong == {}, f"{mode}: {wrong}"
    daemonsets = [c for c in agents() if c.kind == "DaemonSet"]

    def created() -> bool | None:
        missing = [c.name for c in daemonsets if not daemon_pods(bed, c)]
        return None if missing else True
    until(f"{mode}: a pod of every DaemonSet", created, 120, interval=1,
          diagnose=lambda: str({ns: failed_creates(bed, ns) for ns in {c.namespace for c in daemonsets}}))
    for namespace in {c.namespace for c in daemonsets}:
        assert not [m for m in failed_creates(bed, namespace) if "gpu-webhook" in m or "AdmissionPolicy" in m]


def tenants_agent_warned(bed: NodeBed) -> None:
    """A tenant's copy of calico-node, at the chart's defaults: admitted with a warning that says why it is not
    refused (no tenant namespace is named); a privileged GPU pod is refused wherever it is."""
    agent = tenants()[0]
    code, said = apply(bed, agent, dry_run=True)
    assert code == 0 and "tolerates every taint" in said and NOT_TENANT in said, said
    gpu_pod = next(c for c in tenants() if c.name == "tenant/device-hostpath")
    code, said = apply(bed, gpu_pod, dry_run=True)
    assert code != 0 and "is privileged and holds a GPU" in said, said


def test_webhook_only_admits_the_platforms_agents_and_their_pods(release):
    agents_admitted(release, "webhook-only")
    tenants_agent_warned(release)


def test_hybrid_mode_admits_them_too(release):
    bed = release
    upgraded = bed.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values",
                        "--set", "admissionPolicies.enabled=true", "--wait", "--timeout=240s")
    assert upgraded.returncode == 0, upgraded.stderr
    # Every pod made again under the native policies: the bare pods by apply, the others by the DaemonSet
    # controller (kube-system's are left alone: no engine looks there, and the bed's own pods run there).
    for namespace in {c.namespace for c in agents()} - {"kube-system"}:
        bed.kubectl("delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", "--wait=true",
                    "--timeout=60s")
    agents_admitted(bed, "hybrid")
    tenants_agent_warned(bed)
