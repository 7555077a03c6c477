"""Day one through the generated admission policies on a real kube-apiserver (v1.37.2, no webhook registered):
the default policy's objects, generated for what the apiserver serves, admit the platform's node agents (the GPU
Operator's operands, the device plugin's DaemonSets, calico-node) with no warning, admit the other node agents
(Falco, Sysdig, Dynatrace, node-exporter, Datadog, OpenEBS, Portworx, the Network Operator, Istio and Linkerd CNI)
with the warnings the webhook gives, warn about the tenants' exploit shapes saying why they are not refused, and
refuse them once GPUPolicy/default names the tenants' namespaces; wherever the kind is native. The corpus is
tests/day_one.py; the webhook and ``check`` are held to it in the unit tier (tests/test_day_one.py), the webhook
through the chart's rendered configurations in tests/e2e/test_agents_admission.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.day_one import AGENT_NAMESPACES, PLATFORM_NAMESPACES, STRICT, TENANT, Case, corpus
from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import MATRIX_BEDS
from tests.test_day_one import native_expected
from webhook.cli.policies import discover
from webhook.core import policycrd
from webhook.core.policyfile import load_policy
from webhook.kube.client import Kube
from webhook.native.generate import generate, to_yaml
from webhook.rules.admission import NOT_TENANT

BEDS = [bed for bed in MATRIX_BEDS if bed.id == "1.37"]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.parametrize("matrix_cluster", BEDS, ids=[b.id for b in BEDS], indirect=True)]

CRDS = Path(__file__).resolve().parent / "native-crds.yaml"
NATIVE_KINDS = ("Pod", "DaemonSet", "Deployment", "LeaderWorkerSet", "ResourceClaim", "ResourceClaimTemplate")


def dry_run(cluster: ControlPlane, case: Case) -> tuple[bool, str]:
    """(admitted, what the apiserver said: its refusal, or its warnings) for a server-side dry-run create."""
    done = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-n", case.namespace or "default", "-f", "-",
                           stdin=json.dumps(case.obj))
    return done.returncode == 0, done.stderr.strip()


@pytest.fixture(scope="module")
def native(matrix_cluster: ControlPlane):
    cluster = matrix_cluster
    cluster.kubectl("apply", "-f", str(CRDS), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS), check=True)
    for namespace in (*PLATFORM_NAMESPACES, *AGENT_NAMESPACES, TENANT):
        cluster.kubectl("create", "namespace", namespace)
    # The GPU Operator creates the nvidia RuntimeClass its operands and validator pods run with.
    cluster.kubectl("apply", "-f", "-", check=True, stdin=json.dumps({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
    # The DCGM exporter's admin-access claim needs the namespace label the apiserver checks (DRAAdminAccess).
    cluster.kubectl("label", "namespace", "gpu-operator", "resource.kubernetes.io/admin-access=true", check=True)
    target = discover(Kube.connect(str(cluster.kubeconfig)))
    generated = generate(load_policy(None), target)
    # The live policies read GPUPolicy/default (the chart installs its CRD and the object); without them they are
    # skipped (parameterNotFoundAction Allow) and only the seed policies act.
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=to_yaml([policycrd.crd()]), check=True)
    crd = policycrd.crd()["metadata"]["name"]
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}", check=True)
    objects = [*generated.objects, *([generated.policy_object] if generated.policy_object else [])]
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=to_yaml(objects), check=True)
    probe = next(c for c in corpus() if c.name == "tenant/device-hostpath")  # refused in every namespace
    deadline = time.monotonic() + 240  # met at once on an idle bed; a loaded one compiles for longer
    while dry_run(cluster, probe)[0]:
        assert time.monotonic() < deadline, "the generated policies never took effect"
        time.sleep(0.5)
    return cluster, generated


def name_tenants(cluster: ControlPlane, generated) -> None:
    """The documented setting, as a platform applies it: GPUPolicy/default edited live (isolation.tenantNamespaces
    is read through params), then waited for until a tenant's CPU pod naming every GPU is refused."""
    spec = {**generated.policy_object["spec"], **yaml.safe_load(STRICT)}
    edited = {**generated.policy_object, "spec": spec}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=to_yaml([edited]), check=True)
    probe = next(c for c in corpus() if c.name == "tenant/visible-devices-all")
    deadline = time.monotonic() + 120
    while dry_run(cluster, probe)[0]:
        assert time.monotonic() < deadline, "the edit never took effect"
        time.sleep(0.2)


@pytest.mark.parametrize("named", [False, True], ids=["defaults", "tenants-named"])
def test_the_apiserver_admits_the_platform_and_refuses_the_tenants_as_the_webhook_does(native, named):
    """No agent refused, in either mode; the tenants' exploit shapes warned (saying why) by default and refused once
    the tenants' namespaces are named. The parameters run in order: the second edits GPUPolicy/default."""
    cluster, generated = native
    if named:
        name_tenants(cluster, generated)
    cases = [c for c in corpus() if c.kind in NATIVE_KINDS]
    assert len(cases) >= 30
    carried = set(generated.native)
    wrong = []
    for case in cases:
        admitted, said = dry_run(cluster, case)
        refused_by_us = "ValidatingAdmissionPolicy" in said
        expected = case.expects(named)
        warned = [rule for rule, action in expected.items() if action == "warn" and rule in carried]
        if admitted == native_expected(case, carried, named):
            wrong.append(f"{case.name}: admitted={admitted}: {said[:300]}")
        elif not expected and said:
            wrong.append(f"{case.name}: admitted with words: {said[:300]}")
        elif admitted and warned and said.count("Warning:") != len(warned):
            wrong.append(f"{case.name}: {len(warned)} warnings expected: {said[:300]}")
        elif not admitted and not refused_by_us and case.namespace != TENANT:
            wrong.append(f"{case.name}: refused by the apiserver itself: {said[:300]}")
    softened = [c for c in cases if c.namespace == TENANT and NOT_TENANT in dry_run(cluster, c)[1]]
    print(f"{len(cases)} objects through {target_of(generated)}: {len(wrong)} differ, {len(softened)} softened")
    assert wrong == []
    assert bool(softened) is not named


def target_of(generated) -> str:
    return generated.target.describe()
