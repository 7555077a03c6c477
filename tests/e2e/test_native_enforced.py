"""``admission-policies --apply`` returns only once the apiserver enforces what it applied (the bed's v1.37.2).

The apiserver stores a policy at once and enforces it a moment later (each is compiled on its own). ``--apply``
now waits (``--wait``, 60 s) until each generated policy acts on its dry-run probe (``webhook.native.probes``):

- live mode with the GPUPolicy CRD and GPUPolicy/default in place, the PyTorchJob CRD served: exit 0, and right
  after it returns every probe is acted on at once, the MutatingAdmissionPolicy's too (no window);
- ``--wait`` too short for the apiserver (fresh objects, 10 ms): exit 2 and one line naming the policies that had not
  taken effect;
- GPUPolicy/default missing: the policies that read it are named as not probed (they act once it exists), the
  seed's are waited for.

Everything created here is deleted at the end (the bed is shared by the session)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from webhook.cli.policies import _live_policy, discover, resolver
from webhook.core import gpupolicy, policycrd
from webhook.core.policyfile import parse_policy
from webhook.kube.client import Kube
from webhook.native.generate import generate
from webhook.native.probes import outcome, probes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PYTORCHJOB_CRD = Path(__file__).resolve().parent / "pytorchjob-crd.yaml"
POLICY = """\
accelerator: {allowed: [nvidia-tesla-p100, nvidia-tesla-k80, nvidia-l4], default: nvidia-tesla-k80}
limits: {perContainer: 4, perPod: 8}
"""
CRD = policycrd.crd()["metadata"]["name"]


def cli(policy_file: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webhook", "admission-policies", "--policy", str(policy_file),
                           "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=240, check=False)


def delete_all(cluster) -> None:
    done = subprocess.run([sys.executable, "-m", "webhook", "admission-policies", "--delete",
                           "--kubeconfig", str(cluster.kubeconfig)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def bed(cluster, tmp_path_factory):
    created = []
    crds = ((CRD, json.dumps(policycrd.crd())), ("pytorchjobs.kubeflow.org", PYTORCHJOB_CRD.read_text()))
    for name, document in crds:
        if cluster.kubectl("get", "crd", name).returncode != 0:
            cluster.kubectl("apply", "--server-side", "-f", "-", stdin=document, check=True)
            created.append(name)
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s", check=True)
    policy_file = tmp_path_factory.mktemp("enforced") / "policy.yaml"
    policy_file.write_text(POLICY)
    had_object = cluster.kubectl("get", f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}/{gpupolicy.NAME}").returncode == 0
    delete_all(cluster)
    try:
        yield cluster, policy_file
    finally:
        delete_all(cluster)
        if not had_object:
            cluster.kubectl("delete", f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}/{gpupolicy.NAME}", "--wait=false")
        for name in created:
            cluster.kubectl("delete", "crd", name, "--timeout=60s")  # not left terminating for the next module


def put_policy_object(cluster) -> None:
    obj = generate(parse_policy(POLICY)).policy_object
    assert obj is not None
    obj["spec"] = policycrd.as_spec(obj["spec"])
    deadline = time.monotonic() + 30
    while (done := cluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(obj))).returncode:
        assert time.monotonic() < deadline, done.stderr  # served a moment after Established
        time.sleep(0.5)


def test_too_short_a_wait_exits_2_naming_the_policies(bed):
    cluster, policy_file = bed
    put_policy_object(cluster)
    delete_all(cluster)  # fresh objects: each compiled on its own after it is stored
    done = cli(policy_file, cluster.kubeconfig, "--apply", "--wait", "0.01")
    assert done.returncode == 2, done.stdout + done.stderr
    failed = [line for line in done.stderr.splitlines() if line.startswith("gpu-webhook: admission-policies:")]
    assert len(failed) == 1, done.stderr
    assert "stored but not enforced after 0.01 s: " in failed[0] and "gpu-webhook-" in failed[0], failed
    print(failed[0])


def test_apply_returns_once_every_policy_is_enforced(bed):
    cluster, policy_file = bed
    put_policy_object(cluster)
    delete_all(cluster)
    start = time.monotonic()
    done = cli(policy_file, cluster.kubeconfig, "--apply")
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout + done.stderr
    assert "enforced: " in done.stdout, done.stdout
    # Right after it returned: every probe acted on at once, the mutation included.
    kube = Kube.connect(str(cluster.kubeconfig), timeout=30.0)
    try:
        policies = parse_policy(POLICY)
        generated = generate(policies, discover(kube))
        probed_by, without = _live_policy(kube, generated, policies)
        assert not without
        found, missing = probes(generated, probed_by, "default", resolver(kube))
        seen = {}
        for probe in found:
            while True:
                status, answer, warnings = kube.dry_run(probe.path, probe.obj)
                seen[probe.policy] = outcome(probe, status, answer, warnings)
                if not seen[probe.policy].startswith("inconclusive") or not probe.give_up(seen[probe.policy]):
                    break
    finally:
        kube.close()
    acted = {name for name, what in seen.items() if what == "enforced"}
    assert not {name: what for name, what in seen.items() if what == "waiting"}, seen
    assert {"gpu-webhook-live", "gpu-webhook-live-deny", "gpu-webhook-custom-live-deny"} <= acted, (
        json.dumps(seen, indent=1), missing, done.stdout[-2000:], done.stderr[-3000:])
    not_probed = [line for line in done.stderr.splitlines() if line.startswith("not probed: ")]
    print(f"--apply took {took:.1f} s; {done.stdout.splitlines()[-1]}; {len(acted)} acted on right after; "
          f"not probed: {len(not_probed)}")
    for line in not_probed:
        print(" ", line[:200])
    # The seed's Pod rules are caught by the apiserver's own validation first on CREATE: not probed, never waited on.
    assert len(not_probed) + len(acted) == len(found) + len(missing), (not_probed, seen)


def test_without_the_policy_object_apply_creates_it_and_waits_for_the_live_policies(bed):
    """--apply creates GPUPolicy/default from --policy when it is missing (never changing one that exists), so the
    policies that read it are probed like the others."""
    cluster, policy_file = bed
    cluster.kubectl("delete", f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}/{gpupolicy.NAME}", "--ignore-not-found",
                    check=True)
    done = cli(policy_file, cluster.kubeconfig, "--apply")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"created {gpupolicy.KIND}/{gpupolicy.NAME}" in done.stdout, done.stdout
    assert "not probed: gpu-webhook-live-deny:" not in done.stderr, done.stderr
    assert "enforced: " in done.stdout
