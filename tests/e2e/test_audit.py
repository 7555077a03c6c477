"""The audit through a real kube-apiserver: what already runs, found with exact paths, and kept in reports.

Objects are made two ways the webhook never refuses: before it is registered (namespace audit-old) and
through it in warn mode (audit-warn, where kubectl prints the warnings). ``gpu-webhook audit`` then finds
them; a stricter policy file shows what it would deny, run as a service account bound to the chart's
read-only ClusterRole, with nothing changed; ``-o report`` is accepted by the apiserver in both report
APIs (tests/e2e/report-crds.yaml); and ``serve --audit`` writes a Report that follows a fix.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.bed import CHART, CUSTOM_RESOURCES, NAMESPACE, RELEASE, register_webhook, unregister_webhook
from tests.e2e.cluster import NO_PROXY_ENV, ControlPlane
from tests.manifests import admission_review, container, pod, workload
from tests.server import GPU_WEBHOOK, make_certs, start_webhook

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
REPORT_CRDS = Path(__file__).with_name("report-crds.yaml")
POLICY = """\
accelerator: {allowed: [nvidia-l4, nvidia-tesla-t4]}
limits: {perPod: 4}
namespaces:
  audit-warn: {enforcement: warn}
"""
STRICTER = """\
accelerator: {allowed: [nvidia-l4]}
limits: {perPod: 1}
"""
GPUJOBS = {"apiGroups": ["audit.example.org"], "apiVersions": ["v1"], "resources": ["gpujobs"]}
GPUJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "gpujobs.audit.example.org"},
    "spec": {
        "group": "audit.example.org",
        "names": {"kind": "GpuJob", "plural": "gpujobs", "singular": "gpujob"},
        "scope": "Namespaced",
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        }}}],
    },
}


def placed(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["namespace"] = namespace
    return obj


def gpujob(name: str, namespace: str, worker_gpus: int) -> dict[str, Any]:
    def role(role_name: str, gpus: int) -> dict[str, Any]:
        return {"name": role_name, "replicas": 1,
                "template": {"spec": {"containers": [container("c", limits={GPU: gpus})]}}}

    return {"apiVersion": "audit.example.org/v1", "kind": "GpuJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"roles": [role("head", 1), role("worker", worker_gpus)]}}


def deployment(name: str, namespace: str, accelerator: str) -> dict[str, Any]:
    obj = workload("Deployment", pod(container(limits={GPU: 1}), name="x", nodeSelector={"accelerator": accelerator}),
                   name=name)
    obj["spec"]["selector"] = {"matchLabels": {"app": name}}
    obj["spec"]["template"]["metadata"]["labels"] = {"app": name}
    return placed(obj, namespace)


def over_cap(name: str, namespace: str) -> dict[str, Any]:
    return placed(pod(container("a", limits={GPU: 3}), container("b", limits={GPU: 2}), name=name), namespace)


def create(cluster: ControlPlane, *objects: dict[str, Any]) -> subprocess.CompletedProcess:
    return cluster.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                   "items": list(objects)}), check=True)


def audit(cluster: ControlPlane, policy: Path, *args: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
    result = subprocess.run(
        [*GPU_WEBHOOK, "audit", "--kubeconfig", str(kubeconfig or cluster.kubeconfig), "--policy", str(policy), *args],
        capture_output=True, text=True, timeout=120, env=NO_PROXY_ENV, check=False,
    )
    return result.returncode, result.stdout, result.stderr


def found(stdout: str, *namespaces: str) -> set[tuple[str, str, str, str, str, str]]:
    records = [json.loads(line) for line in stdout.splitlines()]
    return {(r["kind"], r["namespace"], r["name"], r["path"], r["rule"], r["action"])
            for r in records if r["namespace"] in namespaces}


DEPLOYED_FINDINGS = {
    ("Pod", "audit-old", "over-cap", "spec", "per-pod-limit", "deny"),
    ("Deployment", "audit-old", "wrong-acc", "spec.template.spec.nodeSelector[accelerator]",
     "accelerator-not-allowed", "deny"),
    ("GpuJob", "audit-old", "big-worker", "spec.roles[1].template.spec", "per-pod-limit", "deny"),
    ("Pod", "audit-warn", "over-cap-warned", "spec", "per-pod-limit", "warn"),
    ("CronJob", "audit-warn", "h100-nightly", "spec.jobTemplate.spec.template.spec.nodeSelector[accelerator]",
     "accelerator-not-allowed", "warn"),
}


@pytest.fixture(scope="module")
def bed(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory):
    """Objects the webhook never refused: made before it was registered, and through it in warn mode."""
    tmp = tmp_path_factory.mktemp("audit")
    policy, stricter = tmp / "policy.yaml", tmp / "stricter.yaml"
    policy.write_text(POLICY)
    stricter.write_text(STRICTER)
    cluster.kubectl("apply", "-f", str(REPORT_CRDS), check=True)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(GPUJOB_CRD), check=True)
    cluster.kubectl("wait", "--for", "condition=established", "--timeout=60s", "crd/gpujobs.audit.example.org",
                    "crd/reports.openreports.io", "crd/policyreports.wgpolicyk8s.io", check=True)
    for namespace in ("audit-old", "audit-warn", "audit-fix"):
        cluster.kubectl("create", "namespace", namespace)
    # Before the webhook is registered: nothing checks them.
    t4 = placed(pod(container(limits={GPU: 1}), name="t4", nodeSelector={"accelerator": "nvidia-tesla-t4"}),
                "audit-old")
    create(cluster, over_cap("over-cap", "audit-old"), deployment("wrong-acc", "audit-old", "nvidia-a100"),
           gpujob("big-worker", "audit-old", 6), t4,
           placed(pod(container(limits={GPU: 1}), name="fine"), "audit-old"),
           deployment("wrong-acc", "audit-fix", "nvidia-a100"), gpujob("big-worker", "audit-fix", 6),
           over_cap("over-cap", "audit-fix"))
    server = start_webhook(tmp, "--policy", str(policy), certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:  # a failure before the yield must not leave the server running
        register_webhook(cluster, server, webhook={"customResources": [*CUSTOM_RESOURCES, GPUJOBS]})
        # Through the webhook, in warn mode: admitted, and kubectl says why.
        cron = placed(workload("CronJob", pod(container(limits={GPU: 1}), name="x", restartPolicy="OnFailure",
                                              nodeSelector={"accelerator": "nvidia-h100"}), name="h100-nightly"),
                      "audit-warn")
        warned = create(cluster, over_cap("over-cap-warned", "audit-warn"), cron)
        assert "Warning: spec: pod asks for 5 nvidia.com/gpu, over the limit of 4 per pod" in warned.stderr
        assert 'accelerator "nvidia-h100" is not allowed here' in warned.stderr
        yield {"policy": policy, "stricter": stricter, "tmp": tmp, "server": server}
    finally:
        unregister_webhook(cluster)
        server.stop()
    # No namespace controller runs here: deleting a namespace would leave its pods, and the scheduler other
    # modules start would place them. Unbound pods go at once.
    for namespace in ("audit-old", "audit-warn", "audit-fix"):
        cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false")


def test_what_was_never_refused_is_found_with_exact_paths(cluster, bed) -> None:
    status, stdout, stderr = audit(cluster, bed["policy"], "-o", "jsonl")
    assert status == 1, stderr  # something in audit-old would be denied now
    assert found(stdout, "audit-old", "audit-warn") == DEPLOYED_FINDINGS
    assert stderr.splitlines()[-1].startswith("audit: ")

    # The table, one namespace: grouped by rule, the namespace written once.
    status, stdout, _ = audit(cluster, bed["policy"], "--namespace", "audit-old")
    rows = [line.split() for line in stdout.splitlines()]
    assert status == 1
    assert rows[0] == ["NAMESPACE", "RULE", "ACTION", "OBJECT", "PATH", "MESSAGE"]
    assert rows[1][:5] == ["audit-old", "accelerator-not-allowed", "deny", "Deployment/wrong-acc",
                           "spec.template.spec.nodeSelector[accelerator]"]
    assert rows[2][:4] == ["per-pod-limit", "deny", "GpuJob/big-worker", "spec.roles[1].template.spec"]
    assert rows[3][:3] == ["deny", "Pod/over-cap", "spec"]
    assert len(rows) == 4

    # Only warnings in audit-warn: exit 0.
    assert audit(cluster, bed["policy"], "--namespace", "audit-warn", "-o", "jsonl")[0] == 0
    # A label selector narrows every list.
    cluster.kubectl("label", "-n", "audit-old", "pod/over-cap", "team=vision", check=True)
    status, stdout, _ = audit(cluster, bed["policy"], "-l", "team=vision", "-o", "jsonl")
    assert found(stdout, "audit-old", "audit-warn") == {
        ("Pod", "audit-old", "over-cap", "spec", "per-pod-limit", "deny")}


def reader_kubeconfig(cluster: ControlPlane, tmp: Path) -> Path:
    """A service account bound to the chart's read-only audit ClusterRole, and a kubeconfig with its token."""
    values = tmp / "reader-values.yaml"
    values.write_text(yaml.safe_dump({"audit": {"readerClusterRole": {"enabled": True}},
                                      "webhook": {"customResources": [GPUJOBS]}}))
    rendered = subprocess.run(
        [cluster.binary("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(values),
         "--show-only", "templates/audit-reader.yaml", "--set", "image.repository=localhost/gpu-webhook"],
        capture_output=True, text=True, timeout=120, env=NO_PROXY_ENV, check=True,
    )
    role = yaml.safe_load(rendered.stdout)
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(role), check=True)
    cluster.kubectl("create", "serviceaccount", "auditor", "-n", "default")
    cluster.kubectl("create", "clusterrolebinding", "auditor", f"--clusterrole={role['metadata']['name']}",
                    "--serviceaccount=default:auditor")
    token = cluster.kubectl("create", "token", "auditor", "-n", "default", "--duration=1h", check=True).stdout.strip()
    config = tmp / "auditor.kubeconfig"
    config.write_text(cluster.kubeconfig.read_text().replace("e2e-admin-token", token))
    return config


def versions(cluster: ControlPlane) -> dict[str, str]:
    listed = json.loads(cluster.kubectl("get", "pods,deployments,cronjobs,gpujobs", "-A", "-o", "json",
                                        check=True).stdout)
    return {item["metadata"]["uid"]: item["metadata"]["resourceVersion"] for item in listed["items"]}


def test_a_stricter_policy_shows_what_it_would_deny_read_only_and_changes_nothing(cluster, bed) -> None:
    config = reader_kubeconfig(cluster, bed["tmp"])
    auditor = "--as=system:serviceaccount:default:auditor"
    for verb, resource, allowed in [("list", "pods", "yes"), ("list", "gpujobs.audit.example.org", "yes"),
                                    ("create", "pods", "no"), ("patch", "deployments.apps", "no"),
                                    ("delete", "gpujobs.audit.example.org", "no"), ("list", "secrets", "no")]:
        answer = cluster.kubectl("auth", "can-i", verb, resource, "-A", auditor).stdout.strip()
        assert answer == allowed, (verb, resource)
    before = versions(cluster)
    status, stdout, stderr = audit(cluster, bed["stricter"], "-o", "jsonl", kubeconfig=config)
    assert status == 1, stderr
    assert found(stdout, "audit-old", "audit-warn") == {
        ("Pod", "audit-old", "over-cap", "spec", "per-pod-limit", "deny"),
        ("Deployment", "audit-old", "wrong-acc", "spec.template.spec.nodeSelector[accelerator]",
         "accelerator-not-allowed", "deny"),
        ("GpuJob", "audit-old", "big-worker", "spec.roles[1].template.spec", "per-pod-limit", "deny"),
        # newly refused: a T4 (allowed today), and audit-warn's objects (no warn overlay in the stricter policy)
        ("Pod", "audit-old", "t4", "spec.nodeSelector[accelerator]", "accelerator-not-allowed", "deny"),
        ("Pod", "audit-warn", "over-cap-warned", "spec", "per-pod-limit", "deny"),
        ("CronJob", "audit-warn", "h100-nightly", "spec.jobTemplate.spec.template.spec.nodeSelector[accelerator]",
         "accelerator-not-allowed", "deny"),
    }
    # Custom resources outside the reader role are skipped and said, never an error.
    assert all(line.startswith(("gpu-webhook: audit: not audited: ", "audit: ")) for line in stderr.splitlines())
    assert versions(cluster) == before, "the audit wrote nothing"


@pytest.mark.parametrize(("kind", "resource"), [("openreports", "reports.openreports.io"),
                                                ("wgpolicyk8s", "policyreports.wgpolicyk8s.io")])
def test_report_output_is_accepted_by_the_apiserver(cluster, bed, kind: str, resource: str) -> None:
    status, stdout, stderr = audit(cluster, bed["policy"], "-o", "report", "--report-kind", kind)
    assert status == 1, stderr
    applied = cluster.kubectl("apply", "-f", "-", stdin=stdout)
    assert applied.returncode == 0, applied.stderr
    try:
        stored = json.loads(cluster.kubectl("get", resource, "-n", "audit-old", "gpu-webhook-audit", "-o", "json",
                                            check=True).stdout)
        assert stored["summary"] == {"pass": 0, "fail": 3, "warn": 0, "error": 0, "skip": 0}
        assert {(r["resources"][0]["kind"], r["rule"], r["result"]) for r in stored["results"]} == {
            ("Deployment", "accelerator-not-allowed", "fail"), ("GpuJob", "per-pod-limit", "fail"),
            ("Pod", "per-pod-limit", "fail")}
        # The CRD's enums hold: a report with another result value is refused.
        bad = json.loads(json.dumps(stored))
        bad["results"][0]["result"] = "broken"
        refused = cluster.kubectl("replace", "-f", "-", stdin=json.dumps(bad))
        assert refused.returncode != 0 and "Unsupported value" in refused.stderr
    finally:
        cluster.kubectl("delete", resource, "-A", "-l", "app.kubernetes.io/managed-by=gpu-webhook")


def wait_for(what: str, check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def report(cluster: ControlPlane, namespace: str) -> dict[str, Any] | None:
    got = cluster.kubectl("get", "reports.openreports.io", "-n", namespace, "gpu-webhook-audit", "-o", "json")
    return json.loads(got.stdout) if got.returncode == 0 else None


def test_the_server_audit_writes_a_report_and_follows_a_fix(cluster, bed) -> None:
    namespace = "audit-fix"  # its objects were made before the webhook was registered
    tmp = bed["tmp"] / "server"
    tmp.mkdir()
    server = start_webhook(tmp, "--policy", str(bed["policy"]), "--kubeconfig", str(cluster.kubeconfig), "--audit",
                           "--audit-interval", "2s", "--audit-lease", "default/gpu-webhook-audit-e2e",
                           "--audit-exclude-namespace", "kube-system",
                           certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:
        first = wait_for("the first report", lambda: report(cluster, namespace))
        assert (first["apiVersion"], first["kind"], first["source"]) == ("openreports.io/v1alpha1", "Report",
                                                                       "gpu-webhook")
        assert first["summary"]["fail"] == 3
        uids = {item["metadata"]["name"]: item["metadata"]["uid"] for item in json.loads(cluster.kubectl(
            "get", "deployments,gpujobs,pods", "-n", namespace, "-o", "json", check=True).stdout)["items"]}
        results = {r["resources"][0]["name"]: r for r in first["results"]}
        assert {name: r["resources"][0]["uid"] for name, r in results.items()} == uids
        assert results["big-worker"]["properties"]["path"] == "spec.roles[1].template.spec"
        assert results["wrong-acc"]["message"].startswith("spec.template.spec.nodeSelector[accelerator]: ")
        assert server.metric("gpu_webhook_audit_violations", namespace=namespace, rule="per-pod-limit") == 2
        assert server.metric("gpu_webhook_audit_last_run_timestamp_seconds") > time.time() - 60
        # The workers' own counters are still shared through the multiprocess directory beside the audit's.
        server.post("/validate", admission_review(pod(container(limits={GPU: 1}), name="probe")))
        assert server.metric("gpu_webhook_requests_total", endpoint="validate") >= 1
        lease = json.loads(cluster.kubectl("get", "lease", "-n", "default", "gpu-webhook-audit-e2e", "-o", "json",
                                           check=True).stdout)
        assert "gpu-webhook.io/audit-finished" in lease["metadata"]["annotations"]

        # Fixed through the webhook (an UPDATE to an allowed accelerator): the next run drops its result and
        # keeps the others' first-found time.
        cluster.kubectl("patch", "deployment", "wrong-acc", "-n", namespace, "--type=merge", "-p",
                        json.dumps({"spec": {"template": {"spec": {"nodeSelector": {"accelerator": "nvidia-l4"}}}}}),
                        check=True)
        fixed = wait_for("the report to drop the fixed Deployment",
                         lambda: (r := report(cluster, namespace)) and r["summary"]["fail"] == 2 and r)
        assert {r["resources"][0]["name"] for r in fixed["results"]} == {"big-worker", "over-cap"}
        assert {r["timestamp"]["seconds"] for r in fixed["results"]} == {
            results["big-worker"]["timestamp"]["seconds"], results["over-cap"]["timestamp"]["seconds"]}
        wait_for("the metric to follow", lambda: server.metric(
            "gpu_webhook_audit_violations", namespace=namespace, rule="accelerator-not-allowed") == 0)

        # Nothing left to report in the namespace: its report goes.
        cluster.kubectl("delete", "gpujob", "big-worker", "-n", namespace, check=True)
        cluster.kubectl("delete", "pod", "over-cap", "-n", namespace, "--wait=false", check=True)
        wait_for("the stale report to be deleted", lambda: report(cluster, namespace) is None)
    finally:
        server.stop()
    events = [json.loads(line) for line in server.log_lines() if line.startswith("{")]
    assert any(e["event"] == "audit_loop_stopped" for e in events), "the audit process stopped with the server"
    lease = json.loads(cluster.kubectl("get", "lease", "-n", "default", "gpu-webhook-audit-e2e", "-o", "json",
                                       check=True).stdout)
    assert not lease["spec"].get("holderIdentity"), "the Lease was given back"


def audit_runs(servers: list) -> list[tuple[float, float, int]]:
    """(start, end, replica's port) of every audit run the servers' logs show finished, earliest first."""
    runs = []
    for server in servers:
        for line in server.log_lines():
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "audit_finished":
                end = datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()
                runs.append((end - event["seconds"], end, server.port))
    return sorted(runs)


def test_two_replicas_share_one_schedule_through_the_lease(cluster, bed) -> None:
    """Two servers with --audit and one Lease: runs never overlap, and the interval holds across both: one schedule,
    not one per replica (two schedules of 3 s would finish runs less than 3 s apart). Watched until 5 runs have
    finished, however long a busy machine takes to start the servers and run them."""
    servers = []
    try:
        for name in ("replica-a", "replica-b"):
            tmp = bed["tmp"] / name
            tmp.mkdir()
            servers.append(start_webhook(
                tmp, "--policy", str(bed["policy"]), "--kubeconfig", str(cluster.kubeconfig), "--audit",
                "--audit-interval", "3s", "--audit-lease", "default/gpu-webhook-audit-replicas",
                certs=make_certs(tmp / "tls", "127.0.0.1")))
        deadline = time.monotonic() + 120
        while len(audit_runs(servers)) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for server in servers:
            server.stop()
    runs = audit_runs(servers)
    assert len(runs) >= 5, runs
    assert all(earlier[1] <= later[0] for earlier, later in zip(runs, runs[1:], strict=False)), runs
    gaps = [later[1] - earlier[1] for earlier, later in zip(runs, runs[1:], strict=False)]
    assert min(gaps) >= 2.9, gaps
