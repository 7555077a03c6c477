"""The default policy's generated objects (live mode: the seed, deny, deny-2, warn ... policies, their bindings, the
MutatingAdmissionPolicy, GPUPolicy/default) on the bed's real apiserver (v1.37.2): each is at most
``generate.MAX_BYTES`` (128,000) bytes as compact JSON, and a client-side ``kubectl apply`` of each, which stores
the whole object in the ``kubectl.kubernetes.io/last-applied-configuration`` annotation (at most 256 KiB of
annotations per object), succeeds. tests/test_native_size.py holds the bound for every target version offline.

Every object applied here is deleted at the end (the bed is shared by the session)."""

from __future__ import annotations

import json

import pytest

from webhook.cli.policies import discover
from webhook.core import policycrd
from webhook.core.policyfile import load_policy
from webhook.kube.client import Kube
from webhook.native.generate import MAX_BYTES, generate, size

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ANNOTATIONS_LIMIT = 256 * 1024  # the apiserver's bound on an object's annotations (total)


def _resource(obj: dict) -> str:
    kind = obj["kind"]
    group = obj["apiVersion"].rpartition("/")[0]
    plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
              "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
              "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
              "GPUPolicy": "gpupolicies"}[kind]
    return f"{plural}.{group}/{obj['metadata']['name']}"


def test_every_default_object_fits_and_applies_client_side(cluster):
    kube = Kube.connect(str(cluster.kubeconfig), timeout=30.0)
    try:
        target = discover(kube)
    finally:
        kube.close()
    assert target.minor == 37 and target.mutating == "v1", target.describe()
    out = generate(load_policy(None), target)
    assert out.policy_object is not None
    objects = [*out.objects, out.policy_object]
    sizes = {_resource(o): size(o) for o in objects}
    assert max(sizes.values()) > MAX_BYTES // 2, sizes  # the bound is what is tested: the large ones are near it
    assert all(s <= MAX_BYTES for s in sizes.values()), {k: s for k, s in sizes.items() if s > MAX_BYTES}

    created_crd = cluster.kubectl("get", "crd", policycrd.crd()["metadata"]["name"]).returncode != 0
    applied: list[str] = []
    try:
        if created_crd:
            cluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(policycrd.crd()), check=True)
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                            f"crd/{policycrd.crd()['metadata']['name']}", check=True)
        failed = {}
        for obj in sorted(objects, key=lambda o: o["kind"].endswith("Binding")):  # a binding names its policy
            name = _resource(obj)
            if obj["kind"] == "GPUPolicy" and cluster.kubectl("get", name).returncode == 0:
                continue  # another test's object: left alone
            for _ in range(20):  # the GPUPolicy resource is served a moment after the CRD is Established
                done = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
                if done.returncode == 0 or obj["kind"] != "GPUPolicy" or "the server" not in done.stderr:
                    break
                cluster.kubectl("wait", "--for=condition=Established", "--timeout=5s",
                                f"crd/{policycrd.crd()['metadata']['name']}")
            if done.returncode:
                failed[name] = done.stderr.strip()[:300]
                continue
            applied.append(name)
            stored = json.loads(cluster.kubectl("get", name, "-o", "json", check=True).stdout)
            annotations = stored["metadata"].get("annotations") or {}
            assert LAST_APPLIED in annotations, name
            assert len(json.dumps(annotations).encode()) < ANNOTATIONS_LIMIT, name
        assert not failed, failed
        print(f"{len(applied)} objects applied client-side on {target.describe()}; largest "
              f"{max(sizes, key=lambda k: sizes[k])} {max(sizes.values())} bytes")
    finally:
        for name in reversed(applied):
            cluster.kubectl("delete", name, "--wait=false")
        if created_crd:
            # waited for: the next module must not find it still terminating (it would not create its own)
            cluster.kubectl("delete", "crd", policycrd.crd()["metadata"]["name"], "--timeout=60s")
