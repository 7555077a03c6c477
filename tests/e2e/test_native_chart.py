"""The chart in hybrid mode (``admissionPolicies.enabled=true``) on every bed of the version matrix: ``helm install``
renders for what the apiserver serves, ``gpu-webhook admission-policies --apply`` (what the chart's hook Job runs;
the bed has no node to run the Job, so the test runs the command) applies the engines that version allows, and:

- the NOTES and the command's stderr name the same engines: validation native everywhere, mutation native where
  MutatingAdmissionPolicy is served (v1, or v1beta1 when turned on), else the webhook;
- the NOTES' one-liner is refused by the ValidatingAdmissionPolicy with the very line the NOTES promise, and the
  webhook's /validate never sees it;
- a GPU pod gets its accelerator selector from the engine the NOTES name: /mutate is called only where the
  webhook carries mutation;
- the webhooks' failurePolicy is the one chosen for hybrid mode: Ignore for validation (the policies refuse),
  Fail for a mutating webhook that still mutates.

The webhook runs as a process of this machine, reached through ``webhook.url`` (certs.mode=secret), as in
tests/e2e/test_helm.py.
"""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
import time

import pytest
import yaml

from tests.e2e.bed import CHART
from tests.e2e.cluster import ControlPlane
from tests.e2e.test_helm import NAMESPACE, Helm, dry_run_until, remove_release
from tests.manifests import container, pod
from tests.server import make_certs, start_webhook
from webhook.cli.policies import discover
from webhook.kube.client import Kube

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

RELEASE = "gw-hybrid"
# The chart's default policy plus a default accelerator: something for the mutation to add.
POLICY = "accelerator: {default: nvidia-l4}\n"
GPU_POD = pod(container(limits={"nvidia.com/gpu": 1}), name="hybrid-gpu")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "admission-policies", *args], capture_output=True,
                          text=True, timeout=400, check=False)  # --apply waits for enforcement


def configurations(cluster: ControlPlane) -> dict[str, list[dict]]:
    found = {}
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        done = cluster.kubectl("get", kind, f"{RELEASE}-gpu-webhook", "-o", "json", check=True)
        found[kind] = json.loads(done.stdout)["webhooks"]
    return found


def test_the_chart_installs_in_hybrid_mode_with_the_engines_the_version_allows(matrix_cluster, tmp_path):
    cluster = matrix_cluster
    assert cluster.bed is not None
    target = discover(Kube.connect(str(cluster.kubeconfig)))
    helm = Helm(cluster, tmp_path / "helm-home")
    tls = make_certs(tmp_path / "tls", "127.0.0.1")
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("-n", NAMESPACE, "create", "secret", "tls", f"{RELEASE}-tls", f"--cert={tls['cert']}",
                    f"--key={tls['key']}", check=True)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps({"policy": yaml.safe_load(POLICY)}))
    server = start_webhook(tmp_path, "--policy", str(policy), certs=tls)  # the policy the chart's values hold
    try:
        installed = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--no-hooks", "-f", str(values),
                         "--set", "admissionPolicies.enabled=true", "--set", "certs.mode=secret",
                         "--set", "image.repository=localhost/gpu-webhook",
                         "--set", f"certs.secret.name={RELEASE}-tls",
                         "--set", f"certs.secret.caBundle={base64.b64encode(tls['ca'].read_bytes()).decode()}",
                         "--set", f"webhook.url={server.address}")
        # The chart's Job waits 120 s by default; a bed on a loaded 2-core machine may take longer (1.30 most).
        applied = cli("--policy", str(policy), "--apply", "--wait", "300", "--kubeconfig", str(cluster.kubeconfig))
        assert applied.returncode == 0, applied.stderr
        notes = installed.stdout
        mutation = "native" if target.mutating else "webhook"
        assert f"generated for Kubernetes {target.version} " in applied.stderr
        assert f"validation native, mutation {mutation}" in applied.stderr
        assert f"Hybrid mode on Kubernetes {cluster.bed.version}:" in notes
        if target.mutating:
            assert f"Mutation: MutatingAdmissionPolicy gpu-webhook-live ({target.mutating})" in notes
        else:
            assert "Mutation: the webhook (failurePolicy Fail): this cluster serves no MutatingAdmissionPolicy" in notes

        # Before 1.35 the CEL cannot carry gpu-device-mount: every custom kind goes to the webhook too.
        sent = ("every custom kind and the pods\n  of the rules this version's CEL cannot carry" if target.minor < 35
                else "custom kinds they do not know")
        assert f"The webhook sees only what they leave: pods with DRA claims, {sent}" in notes, notes

        webhooks = configurations(cluster)
        assert {w["failurePolicy"] for w in webhooks["validatingwebhookconfiguration"]} == {"Ignore"}
        mutating = {w["failurePolicy"] for w in webhooks["mutatingwebhookconfiguration"]}
        assert mutating == {"Ignore" if target.mutating else "Fail"}, mutating

        # The NOTES' one-liner: refused by the ValidatingAdmissionPolicy, in the words the NOTES promise.
        lines = [line.strip() for line in notes.splitlines()]
        [command] = [line for line in lines if line.startswith("kubectl ") and " run gpu-test " in line]
        [promised] = [line for line in lines if line.startswith("Error from server (Forbidden): ")]
        validated = server.metric("gpu_webhook_requests_total", endpoint="validate")
        deadline = time.monotonic() + 180  # a wait, met at once on an idle bed; 1.30 under a full run is slow
        while (result := cluster.kubectl(*shlex.split(command)[1:])).stderr.strip() != promised:
            assert time.monotonic() < deadline, f"never refused as the NOTES say:\n{result.stderr}\n{promised}"
            time.sleep(0.3)
        assert "ValidatingAdmissionPolicy 'gpu-webhook-live-deny'" in promised
        assert server.metric("gpu_webhook_requests_total", endpoint="validate") == validated

        # A GPU pod gets the accelerator selector from the engine the NOTES name.
        mutated = server.metric("gpu_webhook_requests_total", endpoint="mutate")
        done = dry_run_until(cluster, GPU_POD, lambda r: r.returncode == 0 and "accelerator" in r.stdout,
                            timeout=180)
        assert json.loads(done.stdout)["spec"]["nodeSelector"]["accelerator"] == "nvidia-l4"
        called = server.metric("gpu_webhook_requests_total", endpoint="mutate") - mutated
        assert (called == 0) == bool(target.mutating), called
        print(f"{cluster.bed.id}: {target.describe()}; NOTES and stderr agree; /mutate called {called:.0f} times")
    finally:
        server.stop()
        # --no-hooks: the pre-delete hook Job would wait for a node this bed does not have.
        helm("uninstall", RELEASE, "-n", NAMESPACE, "--no-hooks", "--ignore-not-found", check=False)
        remove_release(helm, cluster, RELEASE)
        cli("--delete", "--kubeconfig", str(cluster.kubeconfig))
