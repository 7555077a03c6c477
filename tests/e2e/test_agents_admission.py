"""Do no harm, through the webhook on a real kube-apiserver (v1.37.2): the chart's webhook configurations rendered at
its defaults, the webhook serving the built-in default policy. The node agents of tests/day_one.py (Falco, Sysdig,
Dynatrace, node-exporter, Datadog with GPU monitoring, OpenEBS, Portworx, the Network Operator, Istio CNI, Linkerd
CNI), each in the namespace its project documents and again in ``observability``, are admitted; a tenant's exploit
shapes in ``team-a`` are admitted with a warning that says why they are not refused. With the one documented setting
(``isolation.tenantNamespaces``) the same shapes are refused and every agent is still admitted.

The generated admission policies alone are held to the same on the same apiserver version in
tests/e2e/test_day_one_native.py.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.day_one import STRICT, TENANT, Case, agents, agents_elsewhere, tenants
from tests.e2e.bed import register_webhook, unregister_webhook
from tests.server import make_certs, start_webhook
from webhook.rules.admission import NOT_TENANT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# A tenant's exploit shapes, and the agents looked at (kube-system is left alone by every engine).
SHAPES = ("tenant/privileged-daemonset-tolerating-every-taint", "tenant/privileged-pod-tolerating-every-taint",
          "tenant/visible-devices-all-under-nvidia-runtime", "tenant/visible-devices-all", "tenant/cdi-annotation")


def looked_at() -> list[Case]:
    return [c for c in (*agents(), *agents_elsewhere()) if c.namespace != "kube-system"]


def shapes() -> list[Case]:
    by_name = {c.name: c for c in tenants()}
    return [by_name[name] for name in SHAPES]


def dry_run(cluster, case: Case) -> tuple[bool, str]:
    """(admitted, what the apiserver said: its refusal, or its warnings) for a server-side dry-run create."""
    done = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-n", case.namespace, "-f", "-",
                           stdin=json.dumps(case.obj))
    return done.returncode == 0, done.stderr.strip()


@pytest.fixture(scope="module")
def namespaces(cluster):
    for namespace in sorted({c.namespace for c in (*looked_at(), *shapes())}):
        cluster.kubectl("create", "namespace", namespace)  # some may exist already: the bed is shared
    cluster.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
    return cluster


def serving(cluster, tmp, policy: dict | None):
    """The webhook with ``policy`` (the built-in default when None), registered as the chart renders it."""
    args = []
    if policy is not None:
        (tmp / "policy.yaml").write_text(yaml.safe_dump(policy))
        args = ["--policy", str(tmp / "policy.yaml")]
    server = start_webhook(tmp, *args, certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:
        # a privileged GPU pod: refused by every policy here, in every namespace
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": {"containers": [
            {"name": "c", "image": "busybox", "securityContext": {"privileged": True},
             "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
        register_webhook(cluster, server, probe=probe, **({"policy": policy} if policy is not None else {}))
    except BaseException:
        server.stop()
        raise
    return server


@pytest.mark.parametrize("named", [False, True], ids=["chart-defaults", "tenants-named"])
def test_no_agent_is_refused_and_the_tenants_shapes_are_warned_or_refused(namespaces, tmp_path, named):
    cluster = namespaces
    server = serving(cluster, tmp_path, yaml.safe_load(STRICT) if named else None)
    try:
        wrong = []
        for case in looked_at():
            admitted, said = dry_run(cluster, case)
            if not admitted:
                wrong.append(f"{case.name}: refused: {said[:300]}")
            elif any(a == "warn" for a in case.expects(named).values()) and "Warning:" not in said:
                wrong.append(f"{case.name}: no warning")
        for case in shapes():
            admitted, said = dry_run(cluster, case)
            refused_by_us = not admitted and 'admission webhook "validate.gpu-webhook.io" denied' in said
            if named and not refused_by_us:
                wrong.append(f"{case.name}: not refused by the webhook: {said[:300]}")
            if not named and not (admitted and NOT_TENANT in said):
                wrong.append(f"{case.name}: admitted={admitted}, not warned as softened: {said[:300]}")
        assert len(looked_at()) == 25 and len(shapes()) == 5
        assert wrong == [], "\n".join(wrong)
        assert all(c.namespace == TENANT for c in shapes())
    finally:
        unregister_webhook(cluster)
        server.stop()
