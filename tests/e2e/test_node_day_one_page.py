"""docs/day-one.md, walked through on the node bed: every cluster command of the page, as the page writes it (release
``gpu-webhook`` in ``gpu-system``, run by bash from a folder where ``charts/`` is the repository's), in the page's
order, with what the page says about it checked after each.

1. Before the install: ``gpu-webhook audit`` finds a tenant's Deployment the default policy refuses and a node
   agent's DaemonSet the isolation rules look at; with the agent's namespace trusted, the agent is not listed;
   ``kubectl get daemonsets -A -o json | gpu-webhook check -`` reports the agent.
2. Webhook mode (the chart at its defaults, the image and a certificate given): trusting the agent's namespace and
   a namespace at ``enforcement: warn`` take effect live through GPUPolicy/default; ``policy.excludeNamespaces`` and
   ``webhook.excludeNamespaces`` through ``helm upgrade``.
3. Hybrid mode: the upgrade returns with the native policies enforced and ``NATIVE-POLICIES Live``; there
   ``webhook.excludeNamespaces`` reaches only the webhook (a ValidatingAdmissionPolicy still refuses the tenant),
   ``policy.excludeNamespaces`` every engine; the inline upgrade writes the inline policies.
4. ``helm rollback`` to the install's revision leaves the generated policies in place; the page's delete removes them.
5. ``helm uninstall`` in hybrid mode: the pre-delete Job deletes the policies; the CRD and GPUPolicy/default stay,
   and the page's two deletes remove them.
6. The pre-delete Job failing (a ResourceQuota of no pods in the release's namespace, a 120 s deadline): ``helm
   uninstall`` fails, and the page's recovery (``describe``, ``logs``, ``--no-hooks``, the deletes by label) leaves
   no release, no generated policy and no hook ClusterRole behind.

The manifests and the table of which test runs which command are tests/day_one_page.py's; the unit tier holds the
page to that table (tests/test_day_one_page.py). The tests share the release and run in file order.

"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.day_one_page import (
    AGENTS,
    GENERATED,
    NAMESPACE,
    RELEASE,
    RUN_BY,
    TENANT,
    command,
    node_exporter,
    tenant_deployment,
)
from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.cluster import NO_PROXY_ENV
from tests.e2e.node import NodeBed, until
from tests.manifests import tls_secret
from webhook.serving import certs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

FULLNAME = RELEASE  # the chart's fullname when the release is named after the chart
HOOK_ROLES = "app.kubernetes.io/name=gpu-webhook,app.kubernetes.io/component=admission-policies-job"
BEFORE = "Before you install: what would be refused"
EXEMPT = "Exempt a namespace"
HYBRID = "Turn on hybrid mode"
ROLLBACK = "Roll back"
UNINSTALL = "Uninstall"
RAN: set[str] = set()


@dataclass
class Walk:
    bed: NodeBed
    cwd: Path
    env: dict[str, str]
    values: Path
    log: list[str] = field(default_factory=list)

    def sh(self, line: str, ok: bool = True, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        """A command of the page, run as written; ``ok``: it must succeed."""
        assert line in RUN_BY, f"not a command of docs/day-one.md: {line}"
        RAN.add(line)
        done = subprocess.run(["bash", "-c", line], cwd=self.cwd, env=self.env, text=True, capture_output=True,
                              timeout=timeout)
        self.log.append(f"$ {line}\n{done.stdout}{done.stderr}(exit {done.returncode})")
        if ok:
            assert done.returncode == 0, self.log[-1]
        return done

    def helm(self, *args: str) -> None:
        """A step of the walk that is not a command of the page (setting up, or undoing one to test the next)."""
        done = self.bed.helm(*args, "--namespace", NAMESPACE, timeout=420)
        assert done.returncode == 0, done.stderr

    def dry_run(self, obj: dict) -> tuple[int, str]:
        """``kubectl create --dry-run=server`` of a copy named ``<name>-probe``: (exit code, stderr: a refusal or
        warnings). Always a create: an apply of an object that exists unchanged sends nothing (kubectl says
        "unchanged"), and an update is held only to the violations its old object did not have."""
        probe = copy.deepcopy(obj)
        probe["metadata"]["name"] += "-probe"
        done = self.bed.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(probe))
        return done.returncode, done.stderr.strip()

    def seen(self, obj: dict) -> str:
        """For a failure's message: the dry run's answer, the GPUPolicy's spec and the webhook's last log lines."""
        spec = self.bed.kubectl("get", "gpupolicy", "default", "-o", "jsonpath={.spec}").stdout
        logs = self.bed.kubectl("logs", "-n", NAMESPACE, f"deployment/{FULLNAME}", "--tail=30").stdout
        return f"{self.dry_run(obj)[1]}\nGPUPolicy/default spec: {spec}\nwebhook log:\n{logs}"

    def generated(self) -> list[str]:
        return self.bed.kubectl("get", "validatingadmissionpolicies,mutatingadmissionpolicies", "-l", GENERATED,
                                "-o", "name", check=True).stdout.split()


def tenant(name: str = "trainer-2") -> dict:
    return tenant_deployment(name)


def refused(walk: Walk, obj: dict, by: str = "") -> bool | None:
    code, said = walk.dry_run(obj)
    return True if code != 0 and by in said else None


def admitted_quietly(walk: Walk, obj: dict) -> bool | None:
    return True if walk.dry_run(obj) == (0, "") else None


def install(walk: Walk, *more: str) -> None:
    walk.helm("install", RELEASE, str(CHART), "--values", str(walk.values), *more, "--wait", "--timeout=240s")
    until("the webhook refusing the tenant's Deployment", lambda: refused(walk, tenant()), 90, interval=0.5,
          diagnose=lambda: walk.dry_run(tenant())[1])


@pytest.fixture(scope="module")
def walk(node_bed: NodeBed, webhook_image: str, tmp_path_factory) -> Iterator[Walk]:
    bed = node_bed
    cwd = tmp_path_factory.mktemp("day-one-page")
    (cwd / "charts").symlink_to(CHART.parent)  # the page's charts/gpu-webhook, from its own folder
    tools = cwd / ".bin"
    tools.mkdir()
    for name in ("kubectl", "helm"):
        (tools / name).symlink_to(bed.binary(name) if name == "kubectl" else bed.cp_bin / "helm")
    env = {**NO_PROXY_ENV, "KUBECONFIG": str(bed.kubeconfig),
           "PATH": os.pathsep.join([str(tools), str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    bundle = certs.generate(certs.service_names(FULLNAME, NAMESPACE))
    repository, tag = webhook_image.rsplit(":", 1)
    values = cwd / "values.yaml"
    values.write_text(yaml.safe_dump({
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "certs": {"mode": "secret", "secret": {"name": f"{FULLNAME}-tls",
                                               "caBundle": base64.b64encode(bundle.ca_pem).decode()}}}))
    walking = Walk(bed, cwd, env, values)
    try:
        for namespace in (NAMESPACE, AGENTS, TENANT):
            # another module of the bed may have left the namespace being deleted (team-a is common): wait it out
            bed.kubectl("wait", "--for=delete", f"namespace/{namespace}", "--timeout=180s")
            bed.kubectl("create", "namespace", namespace, check=True)
        bed.kubectl("create", "-f", "-", check=True, stdin=json.dumps(
            tls_secret(f"{FULLNAME}-tls", NAMESPACE, bundle.cert_pem, bundle.key_pem)))
        for obj in (node_exporter(), tenant_deployment()):
            bed.kubectl("apply", "-f", "-", stdin=json.dumps(obj), check=True)
        yield walking
    finally:
        print("\n" + "\n".join(walking.log))
        bed.kubectl("delete", "resourcequota", "no-pods", "-n", NAMESPACE, "--ignore-not-found")
        bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--no-hooks")
        bed.kubectl("delete", "validatingadmissionpolicies,validatingadmissionpolicybindings,"
                    "mutatingadmissionpolicies,mutatingadmissionpolicybindings", "-l", GENERATED,
                    "--ignore-not-found")
        bed.kubectl("delete", "clusterroles,clusterrolebindings", "-l", HOOK_ROLES, "--ignore-not-found")
        forget_policy_crd(bed.kubectl)
        # Gone before the bed's next module, which may create the same namespace (the chart's gpu-system).
        bed.kubectl("delete", "namespace", AGENTS, TENANT, NAMESPACE, "--ignore-not-found", "--wait=true",
                    "--timeout=180s", timeout=200)


def test_1_audit_before_install(walk):
    everything = walk.sh(command(BEFORE, "gpu-webhook audit"), ok=False)
    assert everything.returncode == 1, walk.log[-1]  # something would be denied: the tenant's Deployment
    assert "Deployment/trainer" in everything.stdout and "accelerator-conflict" in everything.stdout, walk.log[-1]
    assert "DaemonSet/node-exporter" in everything.stdout, walk.log[-1]
    (walk.cwd / "policy.yaml").write_text(yaml.safe_dump({"isolation": {"trusted": {"namespaces": [AGENTS]}}}))
    trusted = walk.sh(command(BEFORE, "gpu-webhook audit --policy"), ok=False)
    assert trusted.returncode == 1 and "node-exporter" not in trusted.stdout, walk.log[-1]
    assert "Deployment/trainer" in trusted.stdout, walk.log[-1]
    daemonsets = walk.sh(command(BEFORE, "kubectl get daemonsets"), ok=False)
    assert daemonsets.returncode in (0, 1) and "DaemonSet monitoring/node-exporter" in daemonsets.stdout, walk.log[-1]
    install(walk)


def test_2_exempt_a_namespace_in_webhook_mode(walk):
    agent = node_exporter()
    code, said = walk.dry_run(agent)
    # What the page says of a node agent outside the tenants' namespaces: admitted, warned, saying why.
    assert code == 0 and "is privileged" in said and "warn: not a tenant namespace" in said, (code, said)
    walk.sh(command(EXEMPT, "kubectl patch gpupolicy default", 0))
    until("the agent's namespace trusted, live", lambda: admitted_quietly(walk, agent), 30, interval=0.5,
          diagnose=lambda: walk.seen(agent))

    walk.sh(command(EXEMPT, "kubectl patch gpupolicy default", 1))
    until("team-a warned instead of refused, live",
          lambda: True if walk.dry_run(tenant())[0] == 0 and "conflicts with nodeSelector" in walk.dry_run(
              tenant())[1] else None, 30, interval=0.5, diagnose=lambda: walk.dry_run(tenant())[1])
    walk.bed.kubectl("patch", "gpupolicy", "default", "--type", "json", "-p",
                     '[{"op": "remove", "path": "/spec/namespaces/team-a"}]', check=True)
    until("team-a refused again", lambda: refused(walk, tenant()), 30, interval=0.5)

    walk.sh(command(EXEMPT, "helm upgrade gpu-webhook charts/gpu-webhook -n gpu-system --reuse-values --set-json "
                            "'policy.excludeNamespaces"))
    until("team-a excluded from every engine", lambda: admitted_quietly(walk, tenant()), 60, interval=0.5,
          diagnose=lambda: walk.dry_run(tenant())[1])
    walk.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set-json",
              'policy.excludeNamespaces=["kube-system","kube-node-lease"]', "--wait")
    until("team-a judged again", lambda: refused(walk, tenant()), 60, interval=0.5)

    walk.sh(command(EXEMPT, "helm upgrade gpu-webhook charts/gpu-webhook -n gpu-system --reuse-values --set-json "
                            "'webhook.excludeNamespaces"))
    until("team-a not sent to the webhook", lambda: admitted_quietly(walk, tenant()), 60, interval=0.5,
          diagnose=lambda: walk.dry_run(tenant())[1])


def test_3_turn_on_hybrid_mode(walk):
    walk.sh(command(HYBRID, "helm upgrade gpu-webhook charts/gpu-webhook -n gpu-system --reuse-values --set "
                            "admissionPolicies.enabled=true --wait"))
    status = command(HYBRID, "kubectl get gpupolicy default")
    until("NATIVE-POLICIES Live", lambda: True if "Live" in walk.sh(status).stdout else None, 60, interval=1,
          diagnose=lambda: walk.log[-1])
    listed = walk.sh(command(HYBRID, "kubectl get validatingadmissionpolicies"))
    assert "gpu-webhook-live-deny" in listed.stdout and "gpu-webhook-seed-deny" in listed.stdout, walk.log[-1]
    # webhook.excludeNamespaces (still team-a) reaches only the webhook: the native policies judge team-a, at once.
    code, said = walk.dry_run(tenant())
    assert code != 0 and "ValidatingAdmissionPolicy" in said and "conflicts with nodeSelector" in said, said
    # The agent's namespace, trusted live in the GPUPolicy, is trusted by the native policies too.
    assert walk.dry_run(node_exporter()) == (0, "")
    # policy.excludeNamespaces reaches every engine (the hook Job compiles it into the policies).
    walk.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set-json",
              'policy.excludeNamespaces=["kube-system","kube-node-lease","team-a"]', "--wait")
    until("team-a excluded from the native policies too", lambda: admitted_quietly(walk, tenant()), 60, interval=0.5,
          diagnose=lambda: walk.dry_run(tenant())[1])
    walk.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set-json",
              'policy.excludeNamespaces=["kube-system","kube-node-lease"]', "--wait")

    walk.sh(command(HYBRID, "helm upgrade gpu-webhook charts/gpu-webhook -n gpu-system --reuse-values --set "
                            "admissionPolicies.enabled=true --set policy.nativePolicies.params=inline"))
    until("the inline policies in place of the live ones", lambda: True if (
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-webhook-deny" in (names := walk.generated())
        and not [n for n in names if "-live-" in n or "-seed-" in n]) else None, 60, interval=1,
        diagnose=lambda: str(walk.generated()))
    until("the inline deny policy refusing the tenant",
          lambda: refused(walk, tenant(), "ValidatingAdmissionPolicy 'gpu-webhook-deny'"), 60, interval=0.5,
          diagnose=lambda: walk.dry_run(tenant())[1])


def test_4_roll_back(walk):
    history = walk.sh(command(ROLLBACK, "helm history"))
    assert "Install complete" in history.stdout, walk.log[-1]
    walk.sh(command(ROLLBACK, "helm rollback"))
    webhooks = walk.bed.kubectl_json("get", "validatingwebhookconfiguration", FULLNAME)["webhooks"]
    assert {hook["failurePolicy"] for hook in webhooks} == {"Fail"}, webhooks  # webhook mode again
    left = walk.generated()
    assert left, "the page says a rollback to a revision without hybrid mode leaves the generated policies"
    walk.sh(command(ROLLBACK, "kubectl delete validatingadmissionpolicies"))
    assert walk.generated() == []


def test_5_uninstall(walk):
    walk.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "admissionPolicies.enabled=true", "--wait",
              "--timeout=300s")
    assert walk.generated()
    walk.sh(command(UNINSTALL, "helm uninstall gpu-webhook -n gpu-system --wait"))
    assert walk.generated() == [], "the pre-delete Job deletes the generated policies"
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        assert FULLNAME not in walk.bed.kubectl("get", kind, "-o", "name", check=True).stdout
    assert walk.bed.kubectl("get", "crd", "gpupolicies.gpu-webhook.io").returncode == 0, "the CRD is kept"
    assert walk.bed.kubectl("get", "gpupolicy", "default").returncode == 0, "GPUPolicy/default is kept"
    walk.sh(command(UNINSTALL, "kubectl delete gpupolicy default"))
    walk.sh(command(UNINSTALL, "kubectl delete crd"))
    assert walk.bed.kubectl("get", "crd", "gpupolicies.gpu-webhook.io").returncode != 0


def test_6_uninstall_when_the_job_fails(walk):
    # The deadline holds the install's apply Job too, which waits until the apiserver enforces the new policies:
    # 120 s leaves it room on a busy machine, and makes the pre-delete Job fail in 2 minutes rather than helm's 5.
    install(walk, "--set", "admissionPolicies.enabled=true", "--set", "admissionPolicies.job.backoffLimit=0",
            "--set", "admissionPolicies.job.activeDeadlineSeconds=120")
    assert walk.generated()
    walk.bed.kubectl("create", "quota", "no-pods", "--hard=pods=0", "-n", NAMESPACE, check=True)
    started = time.monotonic()
    failed = walk.sh(command(UNINSTALL, "helm uninstall gpu-webhook -n gpu-system --wait"), ok=False)
    assert failed.returncode != 0, walk.log[-1]
    assert time.monotonic() - started < 300
    described = walk.sh(command(UNINSTALL, "kubectl -n gpu-system describe job"))
    assert "DeadlineExceeded" in described.stdout or "exceeded quota" in described.stdout, walk.log[-1]
    logs = walk.sh(command(UNINSTALL, "kubectl -n gpu-system logs job/"), ok=False)
    assert logs.returncode == 0 or logs.stderr.strip(), walk.log[-1]  # no pod of it ran: kubectl says so
    assert walk.generated(), "the failed Job deleted nothing"
    walk.sh(command(UNINSTALL, "helm uninstall gpu-webhook -n gpu-system --no-hooks"))
    walk.sh(command(UNINSTALL, "kubectl delete validatingadmissionpolicies"))
    walk.sh(command(UNINSTALL, "kubectl delete clusterroles,clusterrolebindings"))
    assert walk.generated() == []
    assert walk.bed.kubectl("get", "clusterroles", "-l", HOOK_ROLES, "-o", "name", check=True).stdout == ""
    assert walk.bed.helm("status", RELEASE, "--namespace", NAMESPACE).returncode != 0
    walk.bed.kubectl("delete", "quota", "no-pods", "-n", NAMESPACE, check=True)


def test_7_every_command_of_the_page_ran_on_the_bed_or_in_the_unit_tier(walk):
    offline = {line for line, test in RUN_BY.items() if not test.startswith("tests/e2e/")}
    assert set(RUN_BY) - offline - RAN == set()
