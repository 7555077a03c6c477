"""Survive the webhook: one replica SIGKILLed under load, webhook-only and in hybrid mode, on the node bed.

The release of test_node_release.py (its ``release`` fixture: the chart as README "Install on a cluster" installs
it, two replicas, the default ``webhook.failurePolicy`` Fail) takes ~16 dry-run GPU pod creations a second
(tests/e2e/load.py) while the container of the replica the apiserver is calling gets SIGKILL from containerd.
kube-proxy keeps sending new connections to the dead pod until its endpoint turns not-ready, and the apiserver
does not retry a webhook call, so a webhook-only release loses a few admissions: the documented limit of that
design. The figure is recorded, not asserted.

Then ``helm upgrade --set admissionPolicies.enabled=true --set admissionPolicies.webhookFailurePolicy=Ignore``
(the chart README's availability choice: the hard rules are native, the webhook keeps only what CEL cannot check):
the hook Job applies the generated ValidatingAdmissionPolicies and MutatingAdmissionPolicy and waits until the
apiserver enforces them, so from the moment helm returns a pod over the cap is refused (no window: the same load,
every other pod over the cap, started as helm returns, has no wrong decision in its first 5 s), and the same kill
under the same load must fail no admission. Then ``policy.cluster.enabled`` on (a Node object with the default
accelerator added): the policies read the cluster's facts, and the same kill, under a load of which every other pod
asks for a model no node has, fails nothing and admits none of those. Last, with every webhook pod gone, the native
rules still refuse a PyTorchJob with half a GPU, a pod over the per-container cap or asking for more GPUs than any
node has, a Deployment whose template names a RuntimeClass the cluster does not have, and a ResourceClaim naming an
absent DeviceClass, each naming the ValidatingAdmissionPolicy, and still inject the default accelerator.

Beside each kill, 10 s of the same load without one (``_steady``): client latencies and the apiserver's own admission
time per step and per webhook, from its metrics; the kill's latencies are split before the kill and from the kill
until recovery. test_node_hybrid_nomap.py reuses these helpers on a cluster that serves no MutatingAdmissionPolicy.

The tests share the release and run in file order. Figures are printed at the end (``-s``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable

import pytest

from tests.e2e.load import AdmissionLoad, LoadReport, Result, gpu_pod
from tests.e2e.node import NodeBed, until
from tests.e2e.test_node_release import (  # noqa: F401 (release is a fixture, used by name)
    DEPLOYMENT,
    NAMESPACE,
    RELEASE,
    SELECTOR,
    _admissions,
    _dry_run,
    _is_ready,
    _pods,
    _settle,
    _upgrade,
    release,
)
from tests.manifests import container, pod, pytorch_job, seed_pod, workload
from tests.native_corpus import claim, exactly

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420), pytest.mark.usefixtures("release")]

VAP = "ValidatingAdmissionPolicy 'gpu-webhook-live-deny'"
# The custom kinds' hard quantity rules: compiled in, no params, so they hold with or without GPUPolicy/default.
CUSTOM_VAP = "ValidatingAdmissionPolicy 'gpu-webhook-custom-seed-deny'"
RATE = 16.0  # dry-run GPU pod creations a second, as in the measurement this reproduces
FIGURES: dict[str, object] = {}


def _refusal(result: Result) -> bool:
    """A policy's answer (webhook or native), not an error: such a refusal is no failed admission."""
    return result.status in (400, 403, 422) and ("denied the request" in result.error
                                                 or "AdmissionPolicy" in result.error)


def _errors(report: LoadReport) -> list[Result]:
    return [r for r in report.failed if not _refusal(r)]


MUTATE_CALL = 'failed calling webhook "mutate.gpu-webhook.io"'
VALIDATE_CALL = 'failed calling webhook "validate'  # validate.gpu-webhook.io and the custom-kind webhook


def _cause(result: Result) -> str:
    """Why an admission failed, by the apiserver's message: which webhook call failed, or which policy refused."""
    for cause in (MUTATE_CALL, VALIDATE_CALL):
        if cause in result.error:
            return cause
    if "ValidatingAdmissionPolicy" in result.error:
        return "refused by a ValidatingAdmissionPolicy"
    if "denied the request" in result.error:
        return "refused by a webhook"
    return f"{result.status} {result.error[:80]}"


def _causes(results: list[Result]) -> dict[str, int]:
    return dict(Counter(_cause(r) for r in results if not r.ok))


# The apiserver's admission histograms: (short name, family, the label that names a series, the labels a series
# must have).
ADMISSION_METRICS = (
    ("step", "apiserver_admission_step_admission_duration_seconds", "type",
     {"operation": "CREATE", "rejected": "false"}),
    ("webhook", "apiserver_admission_webhook_admission_duration_seconds", "name", {"operation": "CREATE"}),
)


def _admission_totals(bed: NodeBed) -> dict[str, list[float]]:
    """The apiserver's own admission time so far, {"<short name> <series>": [seconds, count]}: the two steps
    (admit: the mutating phase, webhooks and MutatingAdmissionPolicy; validate: the validating one, webhooks and
    ValidatingAdmissionPolicies) and each webhook. The
    load's Pod CREATEs are almost all the CREATEs in a few seconds (the node's Events are the rest)."""
    totals: dict[str, list[float]] = {}
    for line in bed.kubectl("get", "--raw", "/metrics", check=True).stdout.splitlines():
        for short, family, key, wanted in ADMISSION_METRICS:
            for slot, suffix in enumerate(("_sum{", "_count{")):
                if not line.startswith(family + suffix):
                    continue
                series, value = line.rsplit(" ", 1)
                labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
                if all(labels.get(k) == v for k, v in wanted.items()) and key in labels:
                    what = f"{short} {labels[key]}"
                    totals.setdefault(what, [0.0, 0.0])[slot] += float(value)
    return totals


def _latencies(report: LoadReport, results: list[Result] | None = None) -> str:
    chosen = report.results if results is None else results
    return (f"{len(chosen)} requests: p50 {report.latency_ms(0.5, chosen)}, p99 {report.latency_ms(0.99, chosen)}, "
            f"max {report.latency_ms(1.0, chosen)} ms")


def _steady(bed: NodeBed, seconds: float = 10.0) -> dict[str, object]:
    """The same load for ``seconds`` with nothing killed: client latencies, and the apiserver's mean admission time
    per step over the same requests (its admission metrics, read before and after)."""
    before = _admission_totals(bed)
    with AdmissionLoad(bed.url, bed.tokens["admin"], bed.ca_file, rate=RATE) as load:
        time.sleep(seconds)
    report = load.stop()
    after = _admission_totals(bed)
    means = {}
    for what, (total, count) in after.items():
        calls = count - before.get(what, [0.0, 0.0])[1]
        if calls:
            means[what] = f"{calls:.0f} x {1000 * (total - before.get(what, [0.0, 0.0])[0]) / calls:.1f}"
    return {"latency ms": _latencies(report), "failed": _causes(report.results),
            "apiserver admission, calls x mean ms": means,
            "load average (1 min)": round(os.getloadavg()[0], 1)}


def _kill_a_replica_under_load(bed: NodeBed, sent: Callable[[int], tuple[str, dict]] | None = None
                               ) -> dict[str, object]:
    """SIGKILL the container of the replica that served most admissions in the last seconds; load (the pods
    ``sent`` gives, else GPU pods) from 2 s before until it has restarted, is Ready and both endpoints are ready
    again (bounded)."""
    pods = _settle(bed)
    with AdmissionLoad(bed.url, bed.tokens["admin"], bed.ca_file, rate=RATE, pods=sent) as load:
        time.sleep(2.5)
        since = time.time() - 2.5
        served = {p["metadata"]["name"]: _admissions(bed, p, "validate", since) + _admissions(bed, p, "mutate", since)
                  for p in pods}
        victim = max(pods, key=lambda p: served[p["metadata"]["name"]])
        name = victim["metadata"]["name"]
        restarts = victim["status"]["containerStatuses"][0]["restartCount"]
        container_id = victim["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        killed_at = time.monotonic()
        bed.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)

        def recovered() -> bool:
            current = bed.kubectl_json("get", "pod", name, "-n", NAMESPACE)
            status = current["status"]["containerStatuses"][0]
            if status["restartCount"] <= restarts or not _is_ready(current):
                return False
            slices = bed.kubectl_json("get", "endpointslices", "-n", NAMESPACE,
                                      "-l", f"kubernetes.io/service-name={RELEASE}")["items"]
            return sum(1 for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")) == 2

        until(f"{name} restarted and Ready, both endpoints ready", recovered, 90, interval=0.3)
        back = time.monotonic() - killed_at
        time.sleep(1)
    report = load.stop()
    window = report.between(killed_at, killed_at + back + 1)
    before = [r for r in report.results if r.sent < killed_at]
    errors = _errors(report)
    print(f"kill {name}: {report.summary()}")
    for r in errors[:20]:
        print(f"  #{r.index} at +{r.sent - killed_at:.2f}s after the kill: {r.status} {r.error[:200]}")
    assert report.sent >= 40, f"the load hardly ran: {report.summary()}"
    slowest = sorted(report.results, key=lambda r: r.sent - r.done)[:5]
    return {"victim served (last 2.5 s)": served, "requests sent": report.sent,
            "requests from the kill until recovered": len(window), "failed (errors)": len(errors),
            "refused by a policy": len(report.failed) - len(errors), "failed by cause": _causes(report.results),
            "back after (s)": round(back, 1), "killed at (s into the load)": round(killed_at - report.started, 2),
            "first error after the kill (s)": round(errors[0].sent - killed_at, 2) if errors else None,
            "errors": sorted({f"{r.error[:60]} ... {r.error[-60:]}" for r in errors}),
            "p99 ms": report.latency_ms(0.99),
            "latency ms before the kill": _latencies(report, before),
            "latency ms from the kill until recovered": _latencies(report, window),
            "slowest (sent s after the kill, ms, status)": [
                (round(r.sent - killed_at, 2), round(1000 * (r.done - r.sent)), r.status) for r in slowest],
            "load average (1 min)": round(os.getloadavg()[0], 1),
            "seconds": round(report.stopped - report.started, 1), "report": report}


def test_webhook_only_a_killed_replica_costs_admissions(node_bed):
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for hook in node_bed.kubectl_json("get", kind, RELEASE)["webhooks"]:
            assert hook["failurePolicy"] == "Fail", hook["name"]
    FIGURES["webhook only, steady (10 s)"] = _steady(node_bed)
    start = time.monotonic()
    figures = _kill_a_replica_under_load(node_bed)
    figures.pop("report")
    figures["scenario (s)"] = round(time.monotonic() - start, 1)
    FIGURES["webhook only, one replica SIGKILLed"] = figures
    print(json.dumps(FIGURES, indent=1))
    # A webhook-only design may lose the admissions in flight to a dead pod: recorded, not asserted.


def test_hybrid_the_hook_job_applies_the_native_policies(node_bed):
    helm = _upgrade(node_bed, "--set", "admissionPolicies.enabled=true",
                    "--set", "admissionPolicies.webhookFailurePolicy=Ignore")
    FIGURES["hybrid upgrade: helm upgrade --wait, hook Job included (s)"] = round(helm, 1)
    returned = time.monotonic()
    # From the moment helm returns, no window: the hook Job's --wait held it until a dry-run probe of each generated
    # policy was refused, so a pod the native rules must refuse is refused from the first request on.
    window = _right_after_helm_returns(node_bed)
    FIGURES["hybrid upgrade: the first 5 s after helm returned"] = window
    assert window["must be refused, admitted"] == 0, window
    assert window["errors"] == [] and window["must be admitted, refused"] == 0, window
    names = node_bed.kubectl("get", "validatingadmissionpolicies,mutatingadmissionpolicies", "-o", "name",
                             "-l", "app.kubernetes.io/component=admission-policies", check=True).stdout.split()
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-webhook-live-deny" in names, names
    assert "mutatingadmissionpolicy.admissionregistration.k8s.io/gpu-webhook-live" in names, names
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for hook in node_bed.kubectl_json("get", kind, RELEASE)["webhooks"]:
            assert hook["failurePolicy"] == "Ignore", hook["name"]
    mutate = node_bed.kubectl_json("get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][0]
    assert any(c["expression"] == "false" for c in mutate["matchConditions"]), mutate["matchConditions"]

    _native_takes_over(node_bed, returned, FIGURES)


OVER_CAP = pod(container("cuda", limits={"nvidia.com/gpu": "5"}), name="over-cap")  # over the per-container cap


def _right_after_helm_returns(bed: NodeBed, seconds: float = 5.0) -> dict[str, object]:
    """The load of the kills (16 dry-run creates a second), started as soon as helm returned, every other pod one
    the live ValidatingAdmissionPolicy must refuse (5 GPUs in a container, over the cap); the others must be
    admitted. Counts the wrong decisions of the first ``seconds``."""
    def pods(index: int) -> tuple[str, dict]:
        if index % 2:
            return "default", {**OVER_CAP, "metadata": {"name": f"over-cap-{index}"}}
        return "default", gpu_pod(f"fits-{index}")

    with AdmissionLoad(bed.url, bed.tokens["admin"], bed.ca_file, rate=RATE, pods=pods) as load:
        time.sleep(seconds)
    report = load.stop()
    refuse = [r for r in report.results if r.index % 2]
    admit = [r for r in report.results if not r.index % 2]
    wrong = [r for r in refuse if r.ok]
    not_native = [r for r in refuse if not r.ok and VAP not in r.error]
    errors = [f"#{r.index} at +{r.sent - report.started:.2f}s: {r.status} {r.error[:160]}"
              for r in report.failed if not _refusal(r)]
    assert len(refuse) >= 10 and len(admit) >= 10, report.summary()
    return {"requests": report.sent, "must be refused": len(refuse),
            "must be refused, admitted": len(wrong),
            "first admitted (s after the load started)": round(wrong[0].sent - report.started, 2) if wrong else None,
            "refused, not by the ValidatingAdmissionPolicy": len(not_native),
            "must be admitted, refused": sum(1 for r in admit if not r.ok),
            "errors": errors[:10], "latency ms": _latencies(report)}


def _native_takes_over(node_bed: NodeBed, returned: float, figures: dict) -> None:
    """Wait until the generated ValidatingAdmissionPolicy refuses a 5-GPU container; record how long that took
    after ``helm upgrade`` returned (``returned``, monotonic) and the first 10 s of steady load from then."""
    def native_refuses() -> bool:
        refused = _dry_run(node_bed, pod(container("cuda", limits={"nvidia.com/gpu": "5"}), name="five"))
        return refused.returncode != 0 and VAP in refused.stderr

    until("the apiserver enforcing the generated ValidatingAdmissionPolicy", native_refuses, 30, interval=0.5)
    figures["hybrid: native refusal seen after helm upgrade returned (s)"] = round(time.monotonic() - returned, 1)
    figures["hybrid, steady: the first 10 s once the policy refuses"] = _steady(node_bed)


def test_hybrid_a_killed_replica_costs_no_admission(node_bed):
    FIGURES["hybrid, steady (10 s)"] = _steady(node_bed)
    start = time.monotonic()
    figures = _kill_a_replica_under_load(node_bed)
    report = figures.pop("report")
    assert isinstance(report, LoadReport)
    figures["scenario (s)"] = round(time.monotonic() - start, 1)
    FIGURES["hybrid (webhookFailurePolicy Ignore), one replica SIGKILLed"] = figures
    print(json.dumps(FIGURES, indent=1))
    assert figures["failed (errors)"] == 0, figures
    # The policies did the mutation: every admitted pod got the default accelerator.
    assert {r.accelerator for r in report.results if r.ok} == {"nvidia-tesla-k80"}, figures


K80_NODE = "gw-e2e-k80"  # a Node object (no kubelet) with the policy's default accelerator and 4 GPUs
L4_POD = pod(container("cuda", limits={"nvidia.com/gpu": "1"}), name="l4", nodeSelector={"accelerator": "nvidia-l4"})
NO_L4 = "no node has accelerator=nvidia-l4"  # allowed by the policy, on no node of the bed


@pytest.fixture(scope="module")
def k80_node(node_bed):
    from tests.e2e.test_placement import add_gpu_node

    add_gpu_node(node_bed, K80_NODE, "nvidia-tesla-k80", gpus=4)
    # No kubelet runs it: nothing may be scheduled there (the chart's hook Job once was, and never ran).
    node_bed.kubectl("taint", "node", K80_NODE, "gw-e2e/no-kubelet=true:NoSchedule", check=True)
    node_bed.kubectl("apply", "-f", "-", check=True, stdin=json.dumps(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}))
    try:
        yield K80_NODE
    finally:
        node_bed.kubectl("delete", "node", K80_NODE, "--ignore-not-found")
        node_bed.kubectl("delete", "runtimeclass", "nvidia", "--ignore-not-found")


def _cluster_load(index: int) -> tuple[str, dict]:
    """Every other pod must be refused by a cluster rule (an accelerator no node has); of the rest, every other
    has a claim (no such ResourceClaim exists, which admission does not require), which sends it to the validating
    webhook: the webhook follows a pod's claims."""
    if index % 2:
        return "default", {**L4_POD, "metadata": {"name": f"l4-{index}"}}
    if index % 4 == 2:
        claiming = gpu_pod(f"claiming-{index}")
        claiming["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gw-e2e-claim"}]
        claiming["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        return "default", claiming
    return "default", gpu_pod(f"fits-{index}")


def test_hybrid_with_the_cluster_checks_a_killed_replica_costs_no_admission_and_no_wrong_decision(node_bed,
                                                                                                    k80_node):
    """Issue 32's availability: ``policy.cluster.enabled`` in hybrid mode, the chart's default failure policies. The
    policies read the cluster's facts from GPUPolicy/default's status, so a GPU pod asking for a model no node has
    is refused by the apiserver alone, and the webhooks are sent only what the rules they keep read (pods with
    claims). The kill under the same load fails nothing and admits nothing wrong."""
    helm = _upgrade(node_bed, "--set", "policy.cluster.enabled=true")
    FIGURES["hybrid + cluster checks: helm upgrade --wait (s)"] = round(helm, 1)

    def facts() -> dict:
        return ((node_bed.kubectl_json("get", "gpupolicy", "default").get("status") or {}).get("cluster") or {})

    until("status.cluster naming the k80 node", lambda: "nvidia-tesla-k80" in (facts().get("models") or {}), 60,
          interval=0.5)
    until("the policies refusing an accelerator no node has", lambda: NO_L4 in _dry_run(node_bed, L4_POD).stderr, 60,
          interval=0.5)
    conditions = {hook["name"]: [c["name"] for c in hook.get("matchConditions", [])]
                  for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
                  for hook in node_bed.kubectl_json("get", kind, RELEASE)["webhooks"]}
    assert conditions["validate.gpu-webhook.io"][-1] == "left-to-the-webhook", conditions
    assert conditions["mutate.gpu-webhook.io"][-1] == "pod-with-claims", conditions
    FIGURES["hybrid + cluster checks, steady (10 s)"] = _steady(node_bed)
    figures = _kill_a_replica_under_load(node_bed, _cluster_load)
    report = figures.pop("report")
    assert isinstance(report, LoadReport)
    refuse = [r for r in report.results if r.index % 2]
    admit = [r for r in report.results if not r.index % 2]
    figures["must be refused (no node has the model), admitted"] = sum(1 for r in refuse if r.ok)
    figures["must be refused, refused by the ValidatingAdmissionPolicy"] = sum(
        1 for r in refuse if not r.ok and NO_L4 in r.error and "ValidatingAdmissionPolicy" in r.error)
    figures["must be admitted, refused"] = sum(1 for r in admit if not r.ok)
    FIGURES["hybrid + cluster checks, one replica SIGKILLed"] = figures
    print(json.dumps(FIGURES, indent=1))
    assert len(refuse) >= 20 and len(admit) >= 20, figures
    assert figures["failed (errors)"] == 0, figures
    assert figures["must be refused (no node has the model), admitted"] == 0, figures
    assert figures["must be refused, refused by the ValidatingAdmissionPolicy"] == len(refuse), figures
    assert figures["must be admitted, refused"] == 0, figures
    # The MutatingAdmissionPolicy gave every admitted pod the default accelerator, which the facts know.
    assert {r.accelerator for r in admit} == {"nvidia-tesla-k80"}, figures


def test_with_every_webhook_pod_gone_the_native_rules_still_refuse(node_bed):
    node_bed.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=0", check=True)
    node_bed.kubectl("delete", "pods", "-n", NAMESPACE, "-l", SELECTOR, "--grace-period=0", "--force",
                     "--wait=false", check=True)
    until("every webhook pod gone", lambda: not _pods(node_bed), 60, interval=0.5)

    def endpoints() -> list:
        slices = node_bed.kubectl_json("get", "endpointslices", "-n", NAMESPACE,
                                       "-l", f"kubernetes.io/service-name={RELEASE}")["items"]
        return [e for s in slices for e in s.get("endpoints") or []]

    # The EndpointSlice controller drops the endpoints a moment after the pods are gone (the cold CI run saw
    # one still listed when it looked at once).
    until("no webhook endpoint left", lambda: not endpoints(), 60, interval=0.5)

    master = seed_pod()
    master["spec"]["nodeSelector"] = {"accelerator": "nvidia-tesla-k80"}  # a model the nodes have (cluster checks)
    job = pytorch_job(master, pod(container("pytorch", limits={"nvidia.com/gpu": "0.5"})))
    refused = _dry_run(node_bed, job)
    assert refused.returncode and CUSTOM_VAP in refused.stderr, refused.stderr
    assert ("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits[nvidia.com/gpu]"
            in refused.stderr and "0.5" in refused.stderr), refused.stderr
    over = _dry_run(node_bed, pod(container("cuda", limits={"nvidia.com/gpu": "5"}), name="five-gpus"))
    # With the cluster checks on, more GPUs than the k80 node has is refused too, by the policy cut holding that rule.
    assert over.returncode and VAP.rstrip("'") in over.stderr and "5" in over.stderr, over.stderr
    # A RuntimeClass and a DeviceClass the cluster does not have (the facts hold every one it has). A Pod naming an
    # absent RuntimeClass is refused by the apiserver's own RuntimeClass plugin before any policy, so a Deployment's
    # template shows ours; a ResourceClaim's DeviceClass nothing else checks.
    template = seed_pod()
    template["metadata"]["labels"] = {"app": "absent-class"}
    template["spec"].update(runtimeClassName="absent", nodeSelector={"accelerator": "nvidia-tesla-k80"})
    template["spec"].pop("restartPolicy", None)  # a Deployment's pods restart Always
    deployment = workload("Deployment", template, name="absent-class")
    deployment["spec"]["selector"] = {"matchLabels": {"app": "absent-class"}}
    unknown_class = _dry_run(node_bed, deployment)
    assert unknown_class.returncode and "ValidatingAdmissionPolicy" in unknown_class.stderr, unknown_class.stderr
    assert ("spec.template.spec.runtimeClassName" in unknown_class.stderr
            and "no such RuntimeClass exists" in unknown_class.stderr), unknown_class.stderr
    unknown_device = _dry_run(node_bed, claim("absent-device-class", exactly(device_class="absent.example.com")))
    assert unknown_device.returncode and "ValidatingAdmissionPolicy" in unknown_device.stderr, unknown_device.stderr
    assert "absent.example.com" in unknown_device.stderr and "does not exist" in unknown_device.stderr, (
        unknown_device.stderr)
    # And what is valid is admitted, mutated by the MutatingAdmissionPolicy, with no webhook pod to call.
    unselected = seed_pod()
    del unselected["spec"]["nodeSelector"]
    admitted = _dry_run(node_bed, unselected)
    assert admitted.returncode == 0, admitted.stderr
    assert json.loads(admitted.stdout)["spec"]["nodeSelector"] == {"accelerator": "nvidia-tesla-k80"}
    # The cluster checks too (on since the test before), from the facts the writer left, while they are fresh.
    l4 = _dry_run(node_bed, L4_POD)
    assert l4.returncode and VAP.rstrip("'") in l4.stderr and NO_L4 in l4.stderr, l4.stderr  # or a -2 cut of it
    FIGURES["no webhook pod: refusals"] = [refused.stderr.strip()[:300], over.stderr.strip()[:300],
                                           l4.stderr.strip()[:300]]
    print(json.dumps(FIGURES, indent=1))
