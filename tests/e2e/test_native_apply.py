"""``gpu-webhook admission-policies --apply`` and ``--delete`` against the bed's real apiserver: the generated
objects land, a changed policy reaches them (and the apiserver enforces the change), an object no longer
generated is pruned, ``--delete`` removes them all; a bad policy or an unreachable cluster is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]  # --apply waits for enforcement (up to 120 s)

KINDS = "validatingadmissionpolicies,validatingadmissionpolicybindings,mutatingadmissionpolicies," \
        "mutatingadmissionpolicybindings"
SELECTOR = "app.kubernetes.io/name=gpu-webhook,app.kubernetes.io/component=admission-policies"
# Policy A: up to 4 GPUs per container, and namespace "lab" only warned (a second deny binding for it).
# With the values written into the CEL (params: inline), as clusters hit by the apiserver's param bugs keep them.
POLICY_A = """\
limits: {perContainer: 4}
namespaces:
  lab: {enforcement: warn}
nativePolicies: {params: inline}
"""
# Policy B: up to 2, no namespace overlay (the "lab" binding is no longer generated).
POLICY_B = "limits: {perContainer: 2}\nnativePolicies: {params: inline}\n"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "admission-policies", *args], capture_output=True,
                          text=True, timeout=200, check=False)


def labelled(cluster) -> dict[str, dict]:
    done = cluster.kubectl("get", KINDS, "-l", SELECTOR, "-o", "json", "--show-managed-fields", check=True)
    return {f"{item['kind']}/{item['metadata']['name']}": item for item in json.loads(done.stdout)["items"]}


def pod(gpus: int) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"gpus-{gpus}", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/cuda",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
    })


def refused(cluster, gpus: int) -> bool:
    done = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=pod(gpus))
    return (done.returncode != 0 and "ValidatingAdmissionPolicy 'gpu-webhook-" in done.stderr
            and f"{gpus} nvidia.com/gpu is over the limit" in done.stderr)


def eventually(test, timeout: float = 20.0) -> bool:
    """The apiserver's policy informers pick changes up within a second or two."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if test():
            return True
        time.sleep(0.5)
    return False


def test_apply_change_prune_delete(cluster, tmp_path: Path) -> None:
    kubeconfig = str(cluster.kubeconfig)
    policy = tmp_path / "policy.yaml"

    policy.write_text(POLICY_A)
    done = cli("--policy", str(policy), "--apply", "--kubeconfig", kubeconfig)
    assert done.returncode == 0, done.stderr
    first = labelled(cluster)
    applied = {line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("applied ")}
    assert applied == set(first)
    assert "ValidatingAdmissionPolicyBinding/gpu-webhook-deny-warn" in first  # the "lab" binding
    assert "MutatingAdmissionPolicy/gpu-webhook" in first
    for item in first.values():
        managers = {m["manager"] for m in item["metadata"]["managedFields"]}
        assert managers == {"gpu-webhook"}, item["metadata"]["name"]
    assert "left to the webhook:" in done.stderr
    assert eventually(lambda: refused(cluster, 5)), "a 5-GPU container is refused under a 4 limit"
    assert not refused(cluster, 3)

    # Applying the same policy again changes nothing and prunes nothing.
    again = cli("--policy", str(policy), "--apply", "--kubeconfig", kubeconfig)
    assert again.returncode == 0 and "pruned" not in again.stdout
    assert {k: v["metadata"]["generation"] for k, v in labelled(cluster).items()} == \
        {k: v["metadata"]["generation"] for k, v in first.items()}

    policy.write_text(POLICY_B)
    done = cli("--policy", str(policy), "--apply", "--kubeconfig", kubeconfig)
    assert done.returncode == 0, done.stderr
    # Each family's "lab" binding is no longer generated: pruned, and nothing else.
    lab = {f"ValidatingAdmissionPolicyBinding/gpu-webhook-{family}deny-warn" for family in ("", "custom-", "claims-")}
    assert {line for line in done.stdout.splitlines() if line.startswith("pruned ")} == {f"pruned {b}" for b in lab}
    second = labelled(cluster)
    assert set(second) == set(first) - lab
    deny = "ValidatingAdmissionPolicy/gpu-webhook-deny"
    assert second[deny]["metadata"]["generation"] > first[deny]["metadata"]["generation"]
    assert eventually(lambda: refused(cluster, 3)), "the new limit of 2 reaches the apiserver"

    # Something else's object with another label is never pruned.
    cluster.kubectl("create", "-f", "-", check=True, stdin=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "someone-else", "labels": {"app.kubernetes.io/name": "other"}},
        "spec": {"policyName": "gpu-webhook-deny", "validationActions": ["Audit"]},
    }))
    done = cli("--delete", "--kubeconfig", kubeconfig)
    assert done.returncode == 0, done.stderr
    assert labelled(cluster) == {}
    assert {line.split(" ", 1)[1] for line in done.stdout.splitlines()} == set(second)
    assert cluster.kubectl("get", "validatingadmissionpolicybinding", "someone-else").returncode == 0
    cluster.kubectl("delete", "validatingadmissionpolicybinding", "someone-else", check=True)
    assert eventually(lambda: not refused(cluster, 5))


def test_bad_policy_and_unreachable_cluster_are_one_line(cluster, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perContainer: many}\n")
    done = cli("--policy", str(policy), "--apply", "--kubeconfig", str(cluster.kubeconfig))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert labelled(cluster) == {}

    # A kubeconfig whose server is a closed loopback port.
    text = cluster.kubeconfig.read_text()
    server = next(line.split("server:", 1)[1].strip() for line in text.splitlines() if "server:" in line)
    unreachable = tmp_path / "kubeconfig"
    unreachable.write_text(text.replace(server, "https://127.0.0.1:1"))
    policy.write_text(POLICY_B)
    done = cli("--policy", str(policy), "--apply", "--kubeconfig", str(unreachable))
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("gpu-webhook: admission-policies: ") and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_live_apply_needs_the_crd_creates_the_policy_object_once_and_an_edit_needs_no_apply(cluster,
                                                                                          tmp_path: Path) -> None:
    kubeconfig = str(cluster.kubeconfig)
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perContainer: 4}\n")
    # Without GPUPolicy's CRD the live policies would read nothing: one line, exit 2, nothing applied.
    done = cli("--policy", str(policy), "--apply", "--kubeconfig", kubeconfig)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "admission-policies --crd | kubectl apply -f -" in done.stderr and labelled(cluster) == {}
    crd = cli("--crd")
    assert crd.returncode == 0, crd.stderr
    cluster.kubectl("apply", "-f", "-", stdin=crd.stdout, check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/gpupolicies.gpu-webhook.io",
                    check=True)
    try:
        done = cli("--policy", str(policy), "--apply", "--kubeconfig", kubeconfig)
        assert done.returncode == 0, done.stderr
        assert "created GPUPolicy/default" in done.stdout and "read live from GPUPolicy/default" in done.stderr
        # A CRD the apiserver has just established takes its policy machinery a while to resolve (measured here:
        # 10-15 s); --apply does not wait for that.
        assert eventually(lambda: refused(cluster, 5), timeout=60) and not refused(cluster, 3)
        # An edit of the object is enforced without generating anything again.
        cluster.kubectl("patch", "gpupolicy", "default", "--type", "merge", "-p",
                        '{"spec": {"limits": {"perContainer": 2}}}', check=True)
        assert eventually(lambda: refused(cluster, 3)), "the edited limit of 2 reaches the apiserver"
        # A second --apply leaves the edited object alone.
        again = cli("--policy", str(policy), "--apply", "--kubeconfig", kubeconfig)
        assert again.returncode == 0 and "GPUPolicy/default exists" in again.stdout, again.stdout
        spec = json.loads(cluster.kubectl("get", "gpupolicy", "default", "-o", "json", check=True).stdout)["spec"]
        assert spec["limits"] == {"perContainer": 2}
    finally:
        cli("--delete", "--kubeconfig", kubeconfig)
        cluster.kubectl("delete", "crd", "gpupolicies.gpu-webhook.io", "--wait=true")
