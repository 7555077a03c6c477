"""The chart's alerts and dashboard against a real Prometheus on the node bed (tests/e2e/node.py).

A release in hybrid mode (``admissionPolicies.enabled``) with ``policy.cluster.enabled`` (the webhook watches Nodes
and is sent the GPU pods with claims, whose claims its rules follow), its validating webhooks set
to failurePolicy Fail (``admissionPolicies.webhookFailurePolicy``, a user's choice: the chart's default is Ignore),
``audit.enabled`` (every 15 s) and a namespace in warn mode. A Prometheus server
(tests/e2e/build-prometheus.sh, run as a process of the bed, in its network namespace: no image registry exists)
scrapes every webhook pod's metrics port (file discovery, rewritten by the test from the pods the apiserver lists,
with the labels the chart's ServiceMonitor gives: job=<fullname>, namespace=<release namespace>) and the
kube-apiserver's /metrics with the bed's admin token (keeping the admission families only), every second; it
evaluates the chart's alert rules every second. The node gets the policy's default accelerator label and 8
``nvidia.com/gpu`` in its status, the warn namespace a Deployment over the cap (for the
audit to find). A steady stream of dry-run pod creations (tests/e2e/load.py, 4 a second) mixes pods the release
admits (one of them with a claim, which the webhook judges), refuses (native rules, one from the cluster's
facts) and warns about.

The rules are the chart's own (tests/monitoring.py renders them as the PrometheusRule template does), **time-scaled
by 1/60** (``SCALE``): every duration of a ``for:``, of a range selector and of an ``offset`` is divided by 60 (5m
becomes 5s, 1h 1m, 1d 24m); the expressions are otherwise unchanged. Numbers that stand for seconds inside an
expression are not durations and stay as they are, so GpuWebhookAuditOverdue is not exercised here.

Then the faults of issue 33, each followed by recovery:

1. the validating webhooks Fail (the mutation is native, its webhook Ignore), every webhook pod killed
   (``kubectl scale --replicas=0``, pods force-deleted) and every ValidatingAdmissionPolicyBinding the hook Job
   applied deleted: GpuWebhookCallsFailing (the apiserver refuses the pods with a claim, failing to call
   validate.gpu-webhook.io) and GpuWebhookNativePolicyNotEvaluated (for each policy evaluated before) must fire;
   both resolve once the pod and the bindings are back;
2. ``helm upgrade --set admissionPolicies.webhookFailurePolicy=Ignore`` (every webhook Ignore, the chart's default)
   and the pods killed again: GpuWebhookFailingOpen must fire (those pods admitted unchecked), and resolve once the
   pod is back.

Each alert must fire within its (scaled) time to become true plus its ``for`` plus SLACK seconds, and resolve
within SLACK seconds of its condition's window after recovery. The seconds are printed (``-s``).
GpuWebhookNativePolicyErrors must never have been active: the native policies' refusals are no CEL errors. Last, every
dashboard query (tests/monitoring.py dashboard_queries) must have returned data at some point of the run
(a range query over it): a query that names a metric nothing exports, or one that does not parse, fails.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import monitoring
from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.cluster import Process
from tests.e2e.load import AdmissionLoad, Result
from tests.e2e.node import NODE_NAME, NodeBed, until
from tests.manifests import container, pod, tls_secret, workload
from tests.tools import missing_binaries, prometheus_bin, unavailable
from webhook.serving import certs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

RELEASE, NAMESPACE = "gw-alerts", "gw-alerts"
FULLNAME = f"{RELEASE}-gpu-webhook"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
DEPLOYMENT = f"deployment/{FULLNAME}"
LAB = "gw-alerts-lab"  # enforcement: warn
POLICY_LABEL = "app.kubernetes.io/component=admission-policies"
ACCELERATOR = "nvidia-tesla-k80"  # the policy's default; the bed's node is labelled with it
PROMETHEUS_PORT = 19090
SCALE = 60  # every duration of the chart's rules is divided by this
# Seconds an alert may take beyond its scaled window and for: the kill itself (the pod stopped, its endpoint
# gone: about 10 s of the 15-16 s CallsFailing and FailingOpen took in the runs of 2026-12-05), scrapes, evaluations.
SLACK = 30.0
RATE = 4.0  # dry-run pod creations a second, during the whole scenario
POLICY = {"accelerator": {"allowed": ["nvidia-tesla-p100", "nvidia-tesla-k80", "nvidia-l4"], "default": ACCELERATOR},
          "limits": {"perContainer": 4, "perPod": 4},
          "namespaces": {LAB: {"enforcement": "warn"}},
          "cluster": {"enabled": True}}
FIGURES: dict[str, Any] = {}

# --- Prometheus, as a process of the bed ----------------------------------------------------------------------------

class Prometheus:
    """The server in the bed's network namespace, its file discovery of the webhook pods kept current by a thread,
    and its HTTP API as the host reaches it."""

    def __init__(self, bed: NodeBed, binary: Path, workdir: Path, values: dict[str, Any]):
        self.bed, self.binary, self.workdir = bed, binary, workdir
        self.url = f"http://{bed.node_ip}:{PROMETHEUS_PORT}"
        self.targets = workdir / "webhook-targets.json"
        self.process: Process | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._discover, name="prometheus-discovery", daemon=True)
        values = _merged(monitoring.chart_values(), values)  # what helm renders the release with
        self.groups = monitoring.time_scaled(monitoring.rule_groups(values, FULLNAME, NAMESPACE), SCALE)
        self.discovery_errors: list[str] = []

    def start(self) -> None:
        w = self.workdir
        (w / "token").write_text(self.bed.tokens["admin"])
        (w / "rules.yaml").write_text(yaml.safe_dump({"groups": self.groups}, sort_keys=False))
        self._write_targets([])
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(w / "rules.yaml")],
            "scrape_configs": [
                # What the chart's ServiceMonitor gives: job=<fullname>, namespace=<release namespace>, per pod.
                {"job_name": FULLNAME, "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}]},
                {"job_name": "apiserver", "scheme": "https",
                 "authorization": {"credentials_file": str(w / "token")},
                 "tls_config": {"ca_file": str(self.bed.ca_file)},
                 "static_configs": [{"targets": [f"{self.bed.node_ip}:6443"]}],
                 # Only the admission families the rules and the dashboard read: the rest of the apiserver's
                 # thousands of series would cost this 2-core machine a second's worth of CPU a second.
                 "metric_relabel_configs": [{"source_labels": ["__name__"], "action": "keep",
                                             "regex": "apiserver_(admission|validating_admission_policy|"
                                                      "mutating_admission_policy)_.*"}]},
            ],
        }
        (w / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.process = self.bed.spawn("prometheus", [
            str(self.binary), f"--config.file={w / 'prometheus.yml'}", f"--storage.tsdb.path={w / 'data'}",
            f"--web.listen-address={self.bed.node_ip}:{PROMETHEUS_PORT}", "--storage.tsdb.retention.time=1h",
            "--log.level=warn"])
        self.started = time.time()
        until("Prometheus ready", self._ready, 60, interval=0.5, diagnose=lambda: self.bed.logs("prometheus"))
        self.thread.start()

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {self.bed.logs('prometheus')}")
        try:
            return self._get("/-/ready").startswith("Prometheus Server is Ready")
        except OSError:
            return False

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10)
        if self.process is not None:
            self.process.stop(timeout=20)
            if self.process in self.bed.processes:
                self.bed.processes.remove(self.process)

    # discovery
    def _write_targets(self, ips: list[tuple[str, str]]) -> None:
        groups = [{"targets": [f"{ip}:8080"], "labels": {"namespace": NAMESPACE, "pod": name}} for name, ip in ips]
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets)  # the discovery never reads a half-written file

    def _discover(self) -> None:
        last: list[tuple[str, str]] | None = None
        while not self.stopping.wait(1.0):
            try:
                pods = self.bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]
            except Exception as exc:  # noted; the scrape keeps the last targets
                self.discovery_errors.append(repr(exc)[:200])
                continue
            ips = sorted((p["metadata"]["name"], p["status"]["podIP"]) for p in pods
                         if p["status"].get("podIP") and p["status"].get("phase") == "Running")
            if ips != last:
                self._write_targets(ips)
                last = ips

    # the API
    def _get(self, path: str, **params: str) -> str:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with opener.open(f"{self.url}{path}{query}", timeout=10) as response:
            return response.read().decode()

    def api(self, path: str, **params: str) -> Any:
        try:
            answer = json.loads(self._get(f"/api/v1/{path}", **params))
        except urllib.error.HTTPError as exc:
            answer = json.loads(exc.read().decode() or "{}")
            raise AssertionError(f"Prometheus refused {path} {params}: {answer.get('error')}") from exc
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def alerts(self) -> dict[str, list[dict]]:
        """Active alerts by name: {name: [{labels, state}, ...]}."""
        found: dict[str, list[dict]] = {}
        for alert in self.api("alerts")["alerts"]:
            found.setdefault(alert["labels"]["alertname"], []).append(alert)
        return found


# --- the release ----------------------------------------------------------------------------------------------------

def _values(image: str, bundle: certs.Bundle) -> dict[str, Any]:
    repository, tag = image.rsplit(":", 1)
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "replicaCount": 1,
            "certs": {"mode": "secret", "secret": {"name": f"{RELEASE}-tls",
                                                   "caBundle": base64.b64encode(bundle.ca_pem).decode()}},
            "admissionPolicies": {"enabled": True, "webhookFailurePolicy": "Fail"},
            "audit": {"enabled": True, "interval": "15s"},
            "policy": POLICY}


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _pods(bed: NodeBed) -> list[dict]:
    return bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]


def _ready_endpoints(bed: NodeBed) -> int:
    slices = bed.kubectl_json("get", "endpointslices", "-n", NAMESPACE,
                              "-l", f"kubernetes.io/service-name={FULLNAME}")["items"]
    return sum(1 for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready"))


def _dry_run(bed: NodeBed, document: dict, namespace: str = "default"):
    return bed.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
                       stdin=json.dumps(document))


def _webhook_judged(bed: NodeBed) -> bool:
    """The webhook answered with its cluster view loaded. In the warn namespace nothing is refused, so the request
    reaches the webhook (a native policy that denies would stop it first: the accelerator rule is native too), and
    the webhook's own warning, not a ValidatingAdmissionPolicy's, names the accelerator no node has. With the
    cluster checks the webhook is sent only templates with claims (or of custom kinds): a Deployment's, whose
    claim template need not exist."""
    template = _gpu_pod("probe", 1, "nvidia-l4")
    template["metadata"]["labels"] = {"app": "probe"}
    _claim(template, "resourceClaimTemplateName", "gw-e2e-probe")
    deployment = workload("Deployment", template, name="probe")
    deployment["spec"].update(replicas=0, selector={"matchLabels": {"app": "probe"}})
    said = _dry_run(bed, deployment, LAB).stderr
    return any(line.startswith("Warning: spec.template.spec: no node has accelerator=nvidia-l4")
               for line in said.splitlines())


def _gpu_pod(name: str, gpus: int, accelerator: str | None = None) -> dict:
    spec = {"nodeSelector": {"accelerator": accelerator}} if accelerator else {}
    return pod(container("cuda", image="gw-e2e.invalid/pause:1", limits={"nvidia.com/gpu": str(gpus)}),
               name=name, **spec)


def _claim(template: dict, source: str, name: str) -> None:
    """Give the pod template a claim its container uses (``source``: resourceClaimName or
    resourceClaimTemplateName): with the cluster checks, the validating webhook follows a pod's claims."""
    template["spec"]["resourceClaims"] = [{"name": "gpu", source: name}]
    template["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]


def _claiming_pod(name: str) -> dict:
    """A one-GPU pod with a claim (no such ResourceClaim exists, which admission does not require): the validating
    webhook's, admitted."""
    claiming = _gpu_pod(name, 1)
    _claim(claiming, "resourceClaimName", "gw-alerts-claim")
    return claiming


# The load's mix, by request index: admitted (the native mutation injects the default accelerator, which the
# node has); admitted by the webhook too (it has a claim); refused by the cluster-aware rule (an
# allowed accelerator no node has: the native policy, from the cluster's facts); refused by a native rule (over
# the per-container cap); admitted with warnings in the warn namespace (over the cap).
MIX = (("default", lambda i: _gpu_pod(f"ok-{i}", 1)),
       ("default", lambda i: _claiming_pod(f"claiming-{i}")),
       ("default", lambda i: _gpu_pod(f"absent-{i}", 1, "nvidia-l4")),
       ("default", lambda i: _gpu_pod(f"over-{i}", 5)),
       (LAB, lambda i: _gpu_pod(f"warned-{i}", 5)))


def _mix(index: int) -> tuple[str, dict]:
    namespace, make = MIX[index % len(MIX)]
    return namespace, make(index)


def _node_gpus(bed: NodeBed, op: str) -> None:
    """Add (or remove) 8 nvidia.com/gpu to the node's capacity, as a device plugin would advertise them."""
    patch = [{"op": op, "path": f"/status/{field}/nvidia.com~1gpu", **({"value": "8"} if op == "add" else {})}
             for field in ("capacity", "allocatable")]
    bed.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=json", "-p", json.dumps(patch),
                check=op == "add")


@pytest.fixture(scope="module")
def release(node_bed: NodeBed, webhook_image: str, tmp_path_factory):
    bed = node_bed
    tmp = tmp_path_factory.mktemp("alerts-release")
    installed = False
    try:
        for namespace in (NAMESPACE, LAB):
            bed.kubectl("create", "namespace", namespace, check=True)
        bed.kubectl("label", "node", NODE_NAME, f"accelerator={ACCELERATOR}", "--overwrite", check=True)
        # And GPUs: an extended resource in the node's status (the kubelet keeps it), so the webhook's cluster-aware
        # rule admits a one-GPU pod.
        _node_gpus(bed, "add")
        bundle = certs.generate(certs.service_names(FULLNAME, NAMESPACE))
        secret = tls_secret(f"{RELEASE}-tls", NAMESPACE, bundle.cert_pem, bundle.key_pem)
        bed.kubectl("create", "-f", "-", stdin=json.dumps(secret), check=True)
        values = _values(webhook_image, bundle)
        (tmp / "values.yaml").write_text(yaml.safe_dump(values))
        start = time.monotonic()
        result = bed.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values",
                          str(tmp / "values.yaml"), "--wait", "--timeout=180s", timeout=240)
        installed = True
        if result.returncode:
            pytest.fail(f"helm install failed: {result.stderr}\n"
                        f"{bed.kubectl('describe', 'pods', '-n', NAMESPACE).stdout[-4000:]}", pytrace=False)
        FIGURES["helm install --wait (s)"] = round(time.monotonic() - start, 1)
        until("the native policies enforcing", lambda: "ValidatingAdmissionPolicy" in _dry_run(
            bed, _gpu_pod("probe", 5)).stderr, 60, interval=0.5)
        until("the webhook judging an accelerator no node has", lambda: _webhook_judged(bed), 60, interval=0.5)
        # What the audit finds: a Deployment over the cap in the warn namespace (admitted with warnings).
        deployment = workload("Deployment", _gpu_pod("over-cap", 5), name="over-cap")
        deployment["spec"]["template"]["metadata"]["labels"] = {"app": "over-cap"}
        deployment["spec"].update(replicas=0, selector={"matchLabels": {"app": "over-cap"}})
        created = bed.kubectl("create", "-n", LAB, "-f", "-", stdin=json.dumps(deployment), check=True)
        FIGURES["over-cap Deployment in the warn namespace"] = created.stderr.strip()[:300]
        yield values
    finally:
        problems = []
        if installed:
            # Their graceful stop (preStop, drain) would cost half a minute: killed as the faults kill them.
            _kill_the_webhook(bed)
            uninstall = bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=120s",
                                 timeout=180)
            if uninstall.returncode:
                problems.append(f"helm uninstall: {uninstall.stderr}")
        forget_policy_crd(bed.kubectl)
        bed.kubectl("delete", "validatingadmissionpolicies,validatingadmissionpolicybindings,"
                    "mutatingadmissionpolicies,mutatingadmissionpolicybindings", "-l", POLICY_LABEL,
                    "--ignore-not-found")
        bed.kubectl("label", "node", NODE_NAME, "accelerator-")
        _node_gpus(bed, "remove")
        for namespace in (NAMESPACE, LAB):
            deleted = bed.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true",
                                  "--timeout=90s", timeout=120)
            if deleted.returncode:
                problems.append(f"kubectl delete namespace {namespace}: {deleted.stderr}")
        print(f"node alerts figures: {json.dumps(FIGURES, indent=1)}")
        assert not problems, problems


@pytest.fixture(scope="module")
def prometheus(node_bed: NodeBed, release, tmp_path_factory):
    directory = prometheus_bin()
    if missing_binaries(directory, ("prometheus",)):
        unavailable("Prometheus server", f"{directory / 'prometheus'} is not built", "prometheus")
    server = Prometheus(node_bed, directory / "prometheus", tmp_path_factory.mktemp("prometheus"), release)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _outcome(result: Result) -> str:
    if result.ok:
        return f"admitted{' with warnings' if result.warnings else ''}"
    for what in ("failed calling webhook", "ValidatingAdmissionPolicy", "denied the request"):
        if what in result.error:
            return f"{result.status} {what}"
    return f"{result.status} {result.error[:80]}"


@pytest.fixture(scope="module")
def load(node_bed: NodeBed, prometheus):
    with AdmissionLoad(node_bed.url, node_bed.tokens["admin"], node_bed.ca_file, rate=RATE, senders=3,
                       timeout=15, pods=_mix) as running:
        yield running
    report = running.stop()
    FIGURES["load"] = {"sent": report.sent, "by outcome": dict(Counter(_outcome(r) for r in report.results))}


# --- the faults -----------------------------------------------------------------------------------------------------

def _kill_the_webhook(bed: NodeBed) -> float:
    """Scale the Deployment to 0 and force-delete its pods; returns when (monotonic) the kill was ordered."""
    killed = time.monotonic()
    bed.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=0", check=True)
    bed.kubectl("delete", "pods", "-n", NAMESPACE, "-l", SELECTOR, "--grace-period=0", "--force",
                "--wait=false", check=True)
    return killed


def _revive_the_webhook(bed: NodeBed) -> float:
    """Scale back to 1 and wait until its endpoint is ready (bounded); returns when (monotonic) it was."""
    bed.kubectl("scale", DEPLOYMENT, "-n", NAMESPACE, "--replicas=1", check=True)
    until("the webhook pod Ready behind its Service", lambda: _ready_endpoints(bed) == 1, 90, interval=0.5,
          diagnose=lambda: bed.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout)
    return time.monotonic()


def _bindings(bed: NodeBed) -> list[dict]:
    return bed.kubectl_json("get", "validatingadmissionpolicybindings", "-l", POLICY_LABEL)["items"]


def _restore(bed: NodeBed, items: list[dict]) -> None:
    for item in items:
        meta = item["metadata"]
        item["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    bed.kubectl("create", "-f", "-", check=True,
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def _wait_states(server: Prometheus, expected: dict[str, tuple[float, float]], firing: bool) -> dict[str, float]:
    """Poll the alerts until each name in ``expected`` ({name: (since, bound)}) is firing (``firing``) or gone,
    each within its bound (seconds after its ``since``, monotonic); return the seconds each took."""
    seen: dict[str, float] = {}
    deadline = max(since + bound for since, bound in expected.values())
    history: list[str] = []
    while len(seen) < len(expected) and time.monotonic() < deadline + 1:
        active = server.alerts()
        now = time.monotonic()
        for name, (since, _) in expected.items():
            mine = active.get(name, [])
            done = any(a["state"] == "firing" for a in mine) if firing else not mine
            if done and name not in seen:
                seen[name] = round(now - since, 1)
        history.append(f"{now:.0f}: " + ", ".join(f"{n} {sorted(a['state'] for a in v)}" for n, v in active.items()))
        time.sleep(0.5)
    late = {name: f"{'fired' if firing else 'resolved'} after {seen[name]} s, bound {bound:.0f} s"
            for name, (_, bound) in expected.items() if name in seen and seen[name] > bound}
    missing = sorted(set(expected) - set(seen))
    assert not missing and not late, (f"{'firing' if firing else 'resolved'} missing: {missing}; late: {late}; "
                                      f"recent alerts:\n" + "\n".join(history[-10:]))
    return seen


def _evaluated_policies(server: Prometheus) -> set[str]:
    """The native policies the apiserver evaluated since Prometheus started (what NotEvaluated would miss)."""
    window = f"{int(time.time() - server.started) + 1}s"
    result = server.query('sum by (policy) (increase(apiserver_validating_admission_policy_check_total'
                          f'{{policy=~"gpu-webhook-.*", error_type=~".+"}}[{window}])) > 0')
    return {r["metric"]["policy"] for r in result}


def _timing(server: Prometheus, alert: str) -> tuple[list[float], float]:
    """The (scaled) seconds of the alert's range selectors, and of its for:."""
    (rule,) = [r for g in server.groups for r in g["rules"] if r.get("alert") == alert]
    ranges = [monitoring.promql_seconds(m) for m in re.findall(r"\[([0-9a-z]+)", rule["expr"])]
    return ranges, monitoring.promql_seconds(rule.get("for", "0s"))


def _refuse_a_malformed_request(bed: NodeBed) -> None:
    """A request line the webhook's connection layer answers itself (400): gpu_webhook_connection_refusals_total."""
    (p,) = [p for p in _pods(bed) if p["status"].get("podIP")]
    code = ("import socket, sys\n"
            "s = socket.create_connection((sys.argv[1], 8080), timeout=5)\n"
            "s.sendall(b'NOT HTTP AT ALL\\r\\n\\r\\n')\n"
            "print(s.recv(200).decode(errors='replace').splitlines()[0])\n")
    answer = bed.netns_run([sys.executable, "-c", code, p["status"]["podIP"]], timeout=20).stdout
    assert " 400 " in answer, answer


def _failure_policies(bed: NodeBed) -> dict[str, str]:
    return {hook["name"]: hook["failurePolicy"] for kind in ("mutatingwebhookconfiguration",
                                                           "validatingwebhookconfiguration")
            for hook in bed.kubectl_json("get", kind, FULLNAME)["webhooks"]}


def _fire_bound(server: Prometheus, alert: str, stops: bool = False) -> float:
    """Seconds the alert may take to fire after its fault. A fault that starts failures makes the rate positive at
    once: its for:. One that stops a counter (``stops``) makes the condition hold once the shorter window (1h,
    scaled) saw no increase: that window, then its for:. Plus SLACK."""
    windows, wait = _timing(server, alert)
    return (min(windows) if stops else 0.0) + wait + SLACK


def _resolve_bound(server: Prometheus, alert: str, restarts: bool = False) -> float:
    """Seconds the alert may take to resolve after recovery: the last failure leaves its longest window, or
    (``restarts``: a counter moving again) at once; plus SLACK."""
    windows, _ = _timing(server, alert)
    return (0.0 if restarts else max(windows)) + SLACK


def _active(server: Prometheus) -> dict[str, list[str]]:
    """The active alerts, for the figures: {name: ["<state> <the webhook or policy it is about>", ...]}."""
    return {name: sorted(f"{a['state']} {a['labels'].get('name') or a['labels'].get('policy', '')}".strip()
                         for a in alerts) for name, alerts in server.alerts().items()}


def _policy_checks(server: Prometheus) -> float:
    """The apiserver's count of evaluations of the generated policies, as Prometheus last scraped it."""
    result = server.query('sum(apiserver_validating_admission_policy_check_total{policy=~"gpu-webhook-.*"})')
    return float(result[0]["value"][1]) if result else 0.0


def _firing(server: Prometheus, alert: str) -> list[dict]:
    return [a for a in server.alerts().get(alert, []) if a["state"] == "firing"]


def test_each_alert_fires_within_its_for_and_resolves(node_bed, prometheus, load):
    bed, server = node_bed, prometheus
    start = time.monotonic()
    _refuse_a_malformed_request(bed)
    # Steady traffic first: the rates have some history, the native policies have been evaluated.
    until("the webhook's and the apiserver's series in Prometheus", lambda: server.query(
        f'gpu_webhook_requests_total{{job="{FULLNAME}", namespace="{NAMESPACE}"}}') and server.query(
        'apiserver_validating_admission_policy_check_total{policy=~"gpu-webhook-.*"}'), 60, interval=1,
        diagnose=lambda: json.dumps(server.api("targets")["activeTargets"])[:3000])
    policies = until("the native policies' evaluations counted by Prometheus",
                     lambda: (found := _evaluated_policies(server)) >= {"gpu-webhook-live-deny"} and found, 30)
    FIGURES["alerts active before the faults"] = _active(server)
    # Refusals and warnings by the native policies are no CEL errors (1.37 counts them as error_type invalid_error).
    assert "GpuWebhookNativePolicyErrors" not in server.alerts(), _active(server)
    FIGURES["native policy checks before the faults"] = {
        " ".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): r["value"][1] for r in server.query(
            "sum by (policy, error_type, enforcement_action, state) "
            '(apiserver_validating_admission_policy_check_total{policy=~"gpu-webhook-.*"})')}

    # 1. The validating webhooks Fail (the mutation native, its webhook Ignore): no webhook pod and no
    # ValidatingAdmissionPolicyBinding.
    hooks = _failure_policies(bed)
    FIGURES["fault 1: failurePolicy"] = hooks
    assert hooks["mutate.gpu-webhook.io"] == "Ignore" and hooks["validate.gpu-webhook.io"] == "Fail", hooks
    saved = _bindings(bed)
    assert saved, "the hook Job applied no ValidatingAdmissionPolicyBinding"
    killed = _kill_the_webhook(bed)
    bed.kubectl("delete", "validatingadmissionpolicybindings", "-l", POLICY_LABEL, "--wait=false", check=True)
    unbound = time.monotonic()
    fired = _wait_states(server, {
        "GpuWebhookCallsFailing": (killed, _fire_bound(server, "GpuWebhookCallsFailing")),
        "GpuWebhookNativePolicyNotEvaluated": (unbound, _fire_bound(server, "GpuWebhookNativePolicyNotEvaluated",
                                                                    stops=True))}, True)
    # Each policy evaluated before is reported (one seen a moment later fires a moment later: the same slack).
    until(f"GpuWebhookNativePolicyNotEvaluated firing for each of {sorted(policies)}", lambda: policies <= {
        a["labels"]["policy"] for a in _firing(server, "GpuWebhookNativePolicyNotEvaluated")}, SLACK, interval=0.5)
    FIGURES["fault 1: webhook pods killed, bindings deleted: fired after (s)"] = fired
    FIGURES["fault 1: alerts active"] = _active(server)

    # The bindings first, then the pod; GpuWebhookCallsFailing counts from the pod Ready, and
    # GpuWebhookNativePolicyNotEvaluated from when Prometheus sees the apiserver evaluate the policies again (on a
    # busy machine the apiserver takes its time to bind them anew: the alert cannot resolve before).
    checks = _policy_checks(server)
    _restore(bed, saved)
    back = _revive_the_webhook(bed)
    until("the apiserver evaluating the restored policies, in Prometheus", lambda: _policy_checks(server) > checks,
          180, interval=0.5)
    evaluated = time.monotonic()  # after the pod Ready: until() waited past it
    FIGURES["fault 1: restored policies evaluated again after the pod Ready (s)"] = round(evaluated - back, 1)
    resolved = _wait_states(server, {
        "GpuWebhookCallsFailing": (back, _resolve_bound(server, "GpuWebhookCallsFailing")),
        "GpuWebhookNativePolicyNotEvaluated": (evaluated, _resolve_bound(
            server, "GpuWebhookNativePolicyNotEvaluated", restarts=True))}, False)
    FIGURES["fault 1: resolved after (s, from the pod Ready)"] = resolved

    # 2. admissionPolicies.webhookFailurePolicy=Ignore: every webhook fails open; the pods killed again.
    upgraded = time.monotonic()
    result = bed.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", "--set",
                      "admissionPolicies.webhookFailurePolicy=Ignore", "--wait", "--timeout=120s", timeout=180)
    assert result.returncode == 0, result.stderr
    FIGURES["helm upgrade to webhookFailurePolicy=Ignore (s)"] = round(time.monotonic() - upgraded, 1)
    hooks = _failure_policies(bed)
    assert set(hooks.values()) == {"Ignore"}, hooks
    until("the webhook answering after the upgrade", lambda: _webhook_judged(bed), 60, interval=0.5)
    killed = _kill_the_webhook(bed)
    fired = _wait_states(server, {"GpuWebhookFailingOpen": (killed, _fire_bound(server, "GpuWebhookFailingOpen"))},
                         True)
    FIGURES["fault 2: webhook pods killed, every webhook Ignore: fired after (s)"] = fired
    FIGURES["fault 2: alerts active"] = _active(server)
    back = _revive_the_webhook(bed)
    resolved = _wait_states(server, {
        "GpuWebhookFailingOpen": (back, _resolve_bound(server, "GpuWebhookFailingOpen"))}, False)
    FIGURES["fault 2: resolved after (s, from the pod Ready)"] = resolved
    # Never, during the whole run, did the refusals and warnings of the native policies pass for CEL errors.
    errors = server.api("query_range", query='ALERTS{alertname="GpuWebhookNativePolicyErrors"}',
                        start=f"{server.started:.3f}", end=f"{time.time():.3f}", step="1s")["result"]
    assert not errors, errors
    FIGURES["scenario (s)"] = round(time.monotonic() - start, 1)
    FIGURES["discovery errors"] = server.discovery_errors[:5]
    print(json.dumps(FIGURES, indent=1))


def test_every_dashboard_query_returned_data(prometheus):
    """Each panel's and variable's query, over the whole run at a 2 s step: some step has data."""
    end = time.time()
    empty, counted = [], 0
    for key, expr in monitoring.dashboard_queries().items():
        data = prometheus.api("query_range", query=expr, start=f"{prometheus.started:.3f}", end=f"{end:.3f}",
                              step="2s")
        counted += 1
        if not data["result"]:
            empty.append(f"{key}: {expr}")
    FIGURES["dashboard queries with data"] = f"{counted - len(empty)} of {counted}"
    print(json.dumps(FIGURES, indent=1))
    assert not empty, "dashboard queries that returned no data during the run:\n" + "\n".join(empty)
