"""The audit without a cluster: discovery, pages, findings, reports, the command's output, the Lease and the loop.

The apiserver is ``tests.fakekube.FakeKube``; the e2e suite (tests/e2e/test_audit.py) runs the same code
against a real one.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import pytest
import yaml

from tests.fakekube import FakeKube
from tests.manifests import container, pod, pytorch_job, workload
from webhook.audit import reports
from webhook.audit import scan as audit
from webhook.audit.loop import AuditLoop, LoopSettings, parse_duration
from webhook.audit.scan import Audit, AuditError, ReportWriter, Resource, discover, pages, pod_bearing
from webhook.cli import audit as auditcmd
from webhook.core.policyfile import parse_policy
from webhook.kube.client import ApiError
from webhook.kube.lease import FINISHED, Lease, LeaseState, micro_time

GPU = "nvidia.com/gpu"
POLICY = parse_policy(
    "accelerator: {allowed: [nvidia-l4]}\nlimits: {perPod: 4}\nnamespaces: {lab: {enforcement: warn}}\n"
)
PYTORCH = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob", True)
WIDGETS = ("example.org", "v1", "widgets", "Widget", False)


def placed(obj: dict[str, Any], namespace: str | None) -> dict[str, Any]:
    obj = json.loads(json.dumps(obj))
    if namespace:
        obj["metadata"]["namespace"] = namespace
    return obj


def over_cap(name: str, namespace: str = "team-a") -> dict[str, Any]:
    return placed(pod(container("a", limits={GPU: 3}), container("b", limits={GPU: 2}), name=name), namespace)


def wrong_accelerator_deployment(name: str, namespace: str = "team-a") -> dict[str, Any]:
    bad = pod(container(limits={GPU: 1}), name="x", nodeSelector={"accelerator": "nvidia-a100"})
    return placed(workload("Deployment", bad, name=name), namespace)


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube(extra=[PYTORCH, WIDGETS])
    fake.add("", "pods", over_cap("over-cap"), placed(pod(container(limits={GPU: 1}), name="fine"), "team-a"),
             over_cap("soft", "lab"))
    fake.add("apps", "deployments", wrong_accelerator_deployment("wrong-acc"))
    job = pytorch_job(pod(container("pytorch", limits={GPU: 1})), pod(container("pytorch", limits={GPU: 8})))
    fake.add("kubeflow.org", "pytorchjobs", placed(job, "team-b"))
    fake.add("example.org", "widgets", {"metadata": {"name": "w1"}, "spec": {"size": 3}})
    fake.add("", "configmaps", {"metadata": {"name": "cm", "namespace": "team-a"}, "data": {"containers": "[]"}})
    return fake


def records(found: list[reports.Finding]) -> set[tuple[str, str, str, str, str, str]]:
    return {(f.kind, f.namespace, f.name, f.path, f.rule, f.action) for f in found}


# --- discovery and pages -------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True], ids=["aggregated", "legacy"])
def test_discovery_finds_pod_kinds_and_custom_resources_but_not_reports_or_other_builtins(legacy: bool) -> None:
    fake = FakeKube(extra=[PYTORCH, ("openreports.io", "v1alpha1", "reports", "Report", True)],
                    legacy_discovery=legacy)
    chosen = pod_bearing(discover(fake))
    names = [str(r) for r in chosen]
    assert names[:8] == ["podtemplates", "replicationcontrollers", "daemonsets.apps", "deployments.apps",
                         "replicasets.apps", "statefulsets.apps", "cronjobs.batch", "jobs.batch"]
    assert names[8:] == ["pods", "pytorchjobs.kubeflow.org"]  # pods after the templates that made them
    assert fake.requests == (2 if not legacy else 2 + 1 + 5)  # legacy: /api/v1 and each of 5 groups
    assert Resource("", "v1", "pods", "Pod", True).path("ns") == "/api/v1/namespaces/ns/pods"
    assert Resource("apps", "v1", "deployments", "Deployment", True).path() == "/apis/apps/v1/deployments"


def test_only_listed_custom_resources_when_patterns_are_given() -> None:
    fake = FakeKube(extra=[PYTORCH, WIDGETS])
    assert [r.plural for r in pod_bearing(discover(fake), ["kubeflow.org/*"]) if not r.builtin] == ["pytorchjobs"]
    assert [r.plural for r in pod_bearing(discover(fake), [""]) if not r.builtin] == []


def test_pages_follow_continue_tokens_and_report_what_remains(kube: FakeKube) -> None:
    kube.add("", "pods", *[placed(pod(name=f"p{i:02}"), "bulk") for i in range(7)])
    got = list(pages(kube, "/api/v1/namespaces/bulk/pods", limit=3))
    assert [len(items) for items, _ in got] == [3, 3, 1]
    assert [remaining for _, remaining in got] == [4, 1, 0]


def test_an_expired_continue_token_restarts_the_list_without_repeating_objects() -> None:
    fake = FakeKube()
    fake.add("", "pods", *[placed(pod(name=f"p{i:02}"), "bulk") for i in range(7)])
    fake.expire_after["pods"] = 1  # the second page's token is too old: 410 without a new token
    names = [i["metadata"]["name"] for items, _ in pages(fake, "/api/v1/pods", limit=3) for i in items]
    assert names == [f"p{i:02}" for i in range(7)]


# --- findings ------------------------------------------------------------------------------------


def test_the_audit_finds_what_validate_would_refuse_with_exact_paths(kube: FakeKube) -> None:
    run = Audit(kube, POLICY, page_size=2)
    found = list(run.findings())
    assert records(found) == {
        ("Pod", "team-a", "over-cap", "spec", "per-pod-limit", "deny"),
        ("Pod", "lab", "soft", "spec", "per-pod-limit", "warn"),
        ("Deployment", "team-a", "wrong-acc", "spec.template.spec.nodeSelector[accelerator]",
         "accelerator-not-allowed", "deny"),
        ("PyTorchJob", "team-b", "train", "spec.pytorchReplicaSpecs.Worker.template.spec", "per-pod-limit", "deny"),
    }
    assert run.progress.objects == 6  # 3 pods, 1 deployment, 1 job, 1 widget; no ConfigMap is read
    assert ("GET", "/api/v1/configmaps") not in kube.calls
    assert run.progress.denied_objects == 3 and run.progress.findings == len(found)
    first = next(f for f in found if f.name == "over-cap")
    assert first.record() == {"kind": "Pod", "apiVersion": "v1", "namespace": "team-a", "name": "over-cap",
                              "uid": "uid-team-a-over-cap", "path": "spec", "rule": "per-pod-limit",
                              "action": "deny", "message": "pod asks for 5 nvidia.com/gpu, over the limit of 4 per pod"}


def test_the_audit_says_when_a_denial_is_softened_outside_a_tenant_namespace() -> None:
    """The node agent's shape, a CPU pod naming every GPU, in a namespace no list names: a warning that says why it is
    not a denial; in a tenant's namespace, a denial."""
    fake = FakeKube()
    leaky = pod(container("agent", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), name="agent")
    fake.add("", "pods", placed(leaky, "monitoring"), placed({**leaky, "metadata": {"name": "tenant"}}, "team-a"))
    found = list(Audit(fake, parse_policy("isolation: {tenantNamespaces: [team-*]}")).findings())
    assert records(found) == {
        ("Pod", "monitoring", "agent", "spec.containers[0].env[0].value", "visible-devices-without-gpu", "warn"),
        ("Pod", "team-a", "tenant", "spec.containers[0].env[0].value", "visible-devices-without-gpu", "deny"),
    }
    said = {f.namespace: f.record()["message"] for f in found}
    assert said["monitoring"].endswith("; warn: not a tenant namespace (isolation.tenantNamespaces), and the pod "
                                       "asks for no GPU")
    assert "tenant namespace" not in said["team-a"]


def test_namespace_selector_and_exclusions_narrow_the_lists(kube: FakeKube) -> None:
    kube.add("", "pods", placed({**over_cap("labelled"), "metadata": {"name": "labelled", "labels": {"team": "x"}}},
                                "team-a"))
    assert {f.name for f in Audit(kube, POLICY, namespace="lab").findings()} == {"soft"}
    assert {f.name for f in Audit(kube, POLICY, selector="team=x").findings()} == {"labelled"}
    excluded = Audit(kube, POLICY, exclude_namespaces=["team-a", "team-b"])
    assert {f.name for f in excluded.findings()} == {"soft"}
    assert ("GET", "/apis/example.org/v1/widgets") in kube.calls  # cluster-scoped: listed, no field selector


def test_a_forbidden_custom_resource_is_skipped_and_said_but_a_forbidden_pod_kind_fails(kube: FakeKube) -> None:
    kube.forbidden.add("pytorchjobs")
    run = Audit(kube, POLICY)
    assert "train" not in {f.name for f in run.findings()}
    assert run.progress.skipped == ["pytorchjobs.kubeflow.org (Forbidden)"]
    kube.forbidden.add("deployments")
    with pytest.raises(AuditError, match="cannot list deployments.apps: Forbidden"):
        list(Audit(kube, POLICY).findings())


def test_cluster_checks_decide_from_the_nodes_listed_once(kube: FakeKube) -> None:
    kube.add("", "nodes", {"metadata": {"name": "n1", "labels": {"accelerator": "nvidia-l4"}},
                           "status": {"allocatable": {GPU: "4"}}})
    policies = parse_policy("cluster: {enabled: true}\n")
    found = list(Audit(kube, policies).findings())
    assert ("Deployment", "wrong-acc", "unknown-accelerator") in {(f.kind, f.name, f.rule) for f in found}
    assert kube.calls.count(("GET", "/api/v1/nodes")) == 1


# --- reports -------------------------------------------------------------------------------------


def finding(name: str, rule: str = "per-pod-limit", action: str = "deny", namespace: str = "ns") -> reports.Finding:
    return reports.Finding("v1", "Pod", namespace, name, f"uid-{name}", "spec", rule, action, "too many GPUs")


def test_a_report_has_one_result_per_violation_and_counts_them() -> None:
    collected = reports.Collected()
    collected.extend([finding("a"), finding("b", "accelerator-not-allowed", "warn"), finding("c", namespace="")])
    built = reports.build_all(reports.KINDS["openreports"], collected, now=1000)
    namespaced, cluster = sorted(built, key=lambda r: r["kind"], reverse=True)
    assert (namespaced["kind"], cluster["kind"]) == ("Report", "ClusterReport")
    assert namespaced["metadata"] == {"name": "gpu-webhook-audit", "namespace": "ns",
                                      "labels": {"app.kubernetes.io/managed-by": "gpu-webhook"}}
    assert namespaced["summary"] == {"pass": 0, "fail": 1, "warn": 1, "error": 0, "skip": 0}
    assert namespaced["source"] == "gpu-webhook"
    result = namespaced["results"][0]
    assert result == {
        "source": "gpu-webhook", "policy": "gpu-webhook", "rule": "per-pod-limit", "category": "GPU",
        "severity": "high", "timestamp": {"seconds": 1000, "nanos": 0}, "result": "fail",
        "resources": [{"apiVersion": "v1", "kind": "Pod", "name": "a", "namespace": "ns", "uid": "uid-a"}],
        "message": "spec: too many GPUs", "properties": {"path": "spec", "action": "deny"}, "scored": True,
    }
    assert namespaced["results"][1]["result"] == "warn" and "scored" not in namespaced["results"][1]
    assert "namespace" not in cluster["metadata"] and "namespace" not in cluster["results"][0]["resources"][0]


def test_wgpolicyk8s_reports_have_their_kinds_and_no_top_level_source() -> None:
    collected = reports.Collected()
    collected.add(finding("a"))
    [report] = reports.build_all(reports.KINDS["wgpolicyk8s"], collected, now=5)
    assert (report["apiVersion"], report["kind"]) == ("wgpolicyk8s.io/v1alpha2", "PolicyReport")
    assert "source" not in report and "configuration" not in report
    assert report["results"][0]["source"] == "gpu-webhook"


def test_results_past_the_limit_are_counted_not_listed() -> None:
    collected = reports.Collected(max_results=3)
    collected.extend(finding(f"p{i}") for i in range(5))
    [report] = reports.build_all(reports.KINDS["openreports"], collected, now=1)
    assert len(report["results"]) == 3 and report["summary"]["fail"] == 5
    assert report["metadata"]["annotations"] == {reports.TRUNCATED_ANNOTATION: "2"}


def test_a_finding_keeps_the_time_it_was_first_found() -> None:
    first = reports.build(reports.KINDS["openreports"], "ns", [finding("a")], 1, 0, now=100)
    seen = reports.first_seen(first)
    again = reports.build(reports.KINDS["openreports"], "ns", [finding("a"), finding("b")], 2, 0, now=200, seen=seen)
    assert [r["timestamp"]["seconds"] for r in again["results"]] == [100, 200]


def test_the_writer_applies_reports_keeps_first_found_times_and_deletes_stale_ones(kube: FakeKube) -> None:
    writer = ReportWriter(kube)
    path = "/apis/openreports.io/v1alpha1/namespaces/{}/reports/gpu-webhook-audit"
    kube.resources += [("openreports.io", "v1alpha1", "reports", "Report", True),
                       ("openreports.io", "v1alpha1", "clusterreports", "ClusterReport", False)]
    one = reports.Collected()
    one.extend([finding("a", namespace="x"), finding("b", namespace="y")])
    assert writer.sync(one, now=100).written == 2
    assert set(kube.stored) == {path.format("x"), path.format("y")}
    two = reports.Collected()
    two.extend([finding("a", namespace="x"), finding("c", namespace="x")])
    result = writer.sync(two, now=200)
    assert (result.written, result.deleted) == (1, 1)
    assert set(kube.stored) == {path.format("x")}
    times = {r["resources"][0]["name"]: r["timestamp"]["seconds"] for r in kube.stored[path.format("x")]["results"]}
    assert times == {"a": 100, "c": 200}


def test_the_writer_says_when_the_report_api_is_missing(kube: FakeKube) -> None:
    with pytest.raises(audit.ReportsUnavailable, match="openreports.io"):
        ReportWriter(kube).sync(reports.Collected(), now=1)


# --- the command ---------------------------------------------------------------------------------


def run_command(kube: FakeKube, monkeypatch: pytest.MonkeyPatch, output: str, **kw: Any) -> tuple[int, str, str]:
    monkeypatch.setattr(auditcmd.Kube, "connect", classmethod(lambda cls, kubeconfig=None: kube))
    out, err = io.StringIO(), io.StringIO()
    status = auditcmd.run(POLICY, output=output, out=out, err=err, **kw)
    return status, out.getvalue(), err.getvalue()


def test_the_table_is_grouped_by_namespace_and_rule(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.add("", "pods", over_cap("over-cap-2"))
    status, out, err = run_command(kube, monkeypatch, "table")
    assert status == 1
    lines = out.splitlines()
    assert lines[0].split() == ["NAMESPACE", "RULE", "ACTION", "OBJECT", "PATH", "MESSAGE"]
    cells = [line.split()[:3] for line in lines[1:]]
    assert cells[0] == ["lab", "per-pod-limit", "warn"]
    assert cells[1] == ["team-a", "accelerator-not-allowed", "deny"]
    assert cells[2] == ["per-pod-limit", "deny", "Pod/over-cap"]  # same namespace: its cell is blank
    assert cells[3][0] == "deny"  # same namespace and rule: both blank
    assert cells[4][0] == "team-b"
    assert err.splitlines()[-1].startswith("audit: 7 objects in 11 resources, 5 violations (4 objects would be denied)")


def test_json_lines_and_exit_zero_when_only_warnings(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, _ = run_command(kube, monkeypatch, "jsonl", namespace="lab")
    assert status == 0
    [record] = [json.loads(line) for line in out.splitlines()]
    assert record["name"] == "soft" and record["action"] == "warn" and set(record) == {
        "kind", "apiVersion", "namespace", "name", "uid", "path", "rule", "action", "message"}


def test_fail_on_warning_makes_a_warning_exit_1(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_command(kube, monkeypatch, "jsonl", namespace="lab")[0] == 0
    assert run_command(kube, monkeypatch, "jsonl", namespace="lab", fail_on="warning")[0] == 1
    assert run_command(kube, monkeypatch, "jsonl", namespace="team-b", fail_on="warning")[0] == 1  # a denial


def test_json_is_one_document_with_a_summary(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, err = run_command(kube, monkeypatch, "json")
    document = json.loads(out)
    assert status == 1 and set(document) == {"findings", "summary"}
    assert {(f["namespace"], f["name"], f["action"]) for f in document["findings"]} == {
        ("team-a", "over-cap", "deny"), ("lab", "soft", "warn"), ("team-a", "wrong-acc", "deny"),
        ("team-b", "train", "deny")}
    summary = document["summary"]
    assert (summary["objects"], summary["violations"], summary["deniedObjects"], summary["exitCode"]) == (6, 4, 3, 1)
    assert err.splitlines()[-1].startswith(f"audit: 6 objects in {summary['resources']} resources, 4 violations")


def test_report_output_is_a_list_kubectl_can_apply(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, _ = run_command(kube, monkeypatch, "report", report_kind="wgpolicyk8s")
    document = yaml.safe_load(out)
    assert status == 1 and document["kind"] == "List"
    assert [(r["kind"], r["metadata"]["namespace"]) for r in document["items"]] == [
        ("PolicyReport", "lab"), ("PolicyReport", "team-a"), ("PolicyReport", "team-b")]
    assert not [c for c in kube.calls if c[0] != "GET"], "the command only reads"


def test_an_unlistable_pod_kind_is_one_line_and_exit_2(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.forbidden.add("pods")
    status, out, err = run_command(kube, monkeypatch, "table")
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        'gpu-webhook: audit: cannot list pods: Forbidden: pods is forbidden: User "reader" cannot list resource "pods"'
    ]


def test_no_cluster_reachable_is_one_line_and_exit_2(tmp_path: Any) -> None:
    from tests.server import free_port

    config = tmp_path / "kubeconfig"
    config.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{free_port()}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    assert auditcmd.run(POLICY, kubeconfig=str(config), out=out, err=err) == 2
    assert time.monotonic() - started < 5
    [line] = err.getvalue().splitlines()
    assert line.startswith("gpu-webhook: audit: cannot discover the cluster's resources: Unreachable: cannot reach")
    assert auditcmd.run(POLICY, kubeconfig=str(tmp_path / "missing"), out=out, err=err) == 2
    assert err.getvalue().splitlines()[-1].endswith(": no such file")  # not the kubernetes loader's words


# --- the Lease and the loop ----------------------------------------------------------------------


LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpu-system/leases"


def test_one_holder_at_a_time_and_the_finish_time_is_kept() -> None:
    fake = FakeKube()
    a, b = (Lease(fake, "gpu-system", "audit", who, duration=60) for who in ("a", "b"))
    assert a.acquire(now=1000) and not b.acquire(now=1001)
    assert a.renew(now=1030)
    assert not b.acquire(now=1089)  # renewed at 1030: held until 1090
    a.release(now=1040, finished=True)
    state = a.read()
    assert state is not None and state.holder is None and state.finished_by == "a"
    assert fake.stored[f"{LEASES}/audit"]["metadata"]["annotations"][FINISHED] == micro_time(1040)
    assert b.acquire(now=1041) and not a.renew(now=1042)


def test_a_holder_that_stopped_renewing_loses_the_lease() -> None:
    fake = FakeKube()
    a, b = (Lease(fake, "gpu-system", "audit", who, duration=60) for who in ("a", "b"))
    assert a.acquire(now=time.time() - 100)
    assert b.acquire(now=time.time())
    assert fake.stored[f"{LEASES}/audit"]["spec"]["leaseTransitions"] == 1
    assert not a.renew(now=time.time())


def test_lease_state_reads_what_client_go_writes() -> None:
    state = LeaseState.of({"spec": {"holderIdentity": "x", "leaseDurationSeconds": 15,
                                    "renewTime": "2026-12-03T10:35:02.096429Z"}})
    assert state.renewed == pytest.approx(1796294102.096429)
    assert state.held_by_another("y", now=state.renewed + 10) and not state.held_by_another("y", state.renewed + 16)


@pytest.mark.parametrize(("text", "seconds"), [("1h", 3600), ("30m", 1800), ("1h30m", 5400), ("90s", 90),
                                               ("500ms", 0.5), ("2.5s", 2.5), ("45", 45)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1d", "h", "10m5", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_the_loop_runs_when_due_writes_reports_and_counts_requests(kube: FakeKube) -> None:
    kube.resources += [("openreports.io", "v1alpha1", "reports", "Report", True),
                       ("openreports.io", "v1alpha1", "clusterreports", "ClusterReport", False)]
    settings = LoopSettings(interval=600, lease_namespace="gpu-system", lease_name="audit")
    loop = AuditLoop(settings, kube, identity="me")
    loop.policies = POLICY
    loop.load_policy = lambda: POLICY  # type: ignore[method-assign]
    now = time.time()
    assert loop.due_in(now) == 0
    assert loop.lease.acquire(now) and loop.run_held()
    loop.lease.release(time.time(), finished=True)
    assert loop.due_in(time.time()) == pytest.approx(600, abs=2)
    written = {p.split("/")[5] for p in kube.stored if "/reports/" in p}
    assert written == {"lab", "team-a", "team-b"}
    assert loop.published.series == {("lab", "per-pod-limit", "warn"), ("team-a", "per-pod-limit", "deny"),
                                     ("team-a", "accelerator-not-allowed", "deny"), ("team-b", "per-pod-limit", "deny")}


def test_the_loop_stops_between_pages_when_the_lease_is_lost(kube: FakeKube) -> None:
    loop = AuditLoop(LoopSettings(page_size=1), kube, identity="me")
    loop.load_policy = lambda: POLICY  # type: ignore[method-assign]
    loop.lost.set()
    with pytest.raises(audit.Stopped):
        loop.run_once()
    assert not [c for c in kube.calls if c[0] != "GET"], "nothing is written by a run that lost its Lease"


def test_loop_settings_travel_as_json() -> None:
    settings = LoopSettings(interval=60, exclude_namespaces=("a",), custom=("x/y",), kubeconfig="/k")
    assert LoopSettings.from_json(settings.command()[-1]) == settings


def test_api_errors_carry_the_status() -> None:
    error = ApiError(410, "Expired", "too old", {"metadata": {"continue": "t"}})
    assert (error.status, str(error), error.body["metadata"]["continue"]) == (410, "Expired: too old", "t")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_line_is_drawn_on_a_terminal_only_and_cleared(kube: FakeKube,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auditcmd.Kube, "connect", classmethod(lambda cls, kubeconfig=None: kube))
    monkeypatch.setattr(auditcmd.time, "monotonic", iter(range(0, 10_000)).__next__)  # every page is drawn
    err = Terminal()
    auditcmd.run(POLICY, output="json", out=io.StringIO(), err=err)
    text = err.getvalue()
    assert "\raudit: pods 3/3 | " in text and "violations" in text
    progress, summary = text.rsplit("\r", 1)[0], text.rsplit("\r", 1)[1]
    assert summary.startswith("audit: 6 objects") and progress  # the line was cleared before the summary
    plain = io.StringIO()
    auditcmd.run(POLICY, output="json", out=io.StringIO(), err=plain)
    assert "\r" not in plain.getvalue()


def test_serve_audit_refuses_to_start_without_a_cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from webhook.cli import main as cli

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    from tests.server import free_port

    status = cli.main(["serve", "--self-signed", "--port", str(free_port()), "--audit", "--kubeconfig",
                       str(tmp_path / "none")])
    assert status == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"gpu-webhook: cannot serve: --audit: kubeconfig {tmp_path / 'none'}: no such file"


def test_the_client_waits_out_429_as_retry_after_says_and_counts_every_request() -> None:
    import http.server
    import threading

    from webhook.kube.client import Kube

    hits: list[str] = []

    class Throttling(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            hits.append(self.path)
            body = b"" if len(hits) <= 2 else json.dumps({"kind": "APIVersions"}).encode()
            self.send_response(429 if len(hits) <= 2 else 200)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Throttling)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    class Settings:
        host = f"http://127.0.0.1:{server.server_port}"
        verify_ssl = False
        ssl_ca_cert = cert_file = key_file = proxy = None

        def auth_settings(self) -> dict[str, Any]:
            return {}

    kube = Kube(Settings())
    try:
        assert kube.get("/api") == {"kind": "APIVersions"}
        assert kube.requests == 3 and hits == ["/api"] * 3
    finally:
        kube.close()
        server.shutdown()
        server.server_close()


def test_each_run_audits_against_the_policy_object_and_the_file_when_it_is_missing(kube: FakeKube, tmp_path) -> None:
    """serve --policy-object: the audit judges by what the webhook enforces, GPUPolicy/default, read at each run;
    without it, the file; an invalid one leaves the last good policy."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text("limits: {perPod: 2}\n")
    loop = AuditLoop(LoopSettings(policy_file=str(policy_file), policy_object="default"), kube, identity="me")
    assert loop.load_policy().default.per_pod == 2  # no object: the file
    path = "/apis/gpu-webhook.io/v1alpha1/gpupolicies/default"
    kube.stored[path] = {"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "default"},
                         "spec": {"limits": {"perPod": 8}}}
    assert loop.load_policy().default.per_pod == 8
    kube.stored[path]["spec"] = {"limits": {"perPod": "many"}}
    assert loop.load_policy().default.per_pod == 8  # refused: the last good one stays
