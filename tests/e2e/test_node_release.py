"""The user's path on a real node (tests/e2e/node.py): one release of the chart, installed as README "Install on a
cluster" says (``certs.mode=secret`` with a pair from ``gpu-webhook certs``, two replicas), with the project's image
running as pods, then changed the ways an operator changes it while GPU pods keep being admitted:

- install: pods Ready through the chart's probes, the apiserver calling them through the Service (no
  ``webhook.url``), the seed pod admitted with requests and the accelerator nodeSelector, a fractional GPU in a
  PyTorchJob (a minimal CRD, listed in ``webhook.customResources``) refused;
- ``helm upgrade`` that replaces the pods, then an eviction of one pod, each under a steady load of dry-run GPU
  pod creations (tests/e2e/load.py): zero failed admissions;
- a policy change by ``helm upgrade`` and a CA rotation (overlap bundle, new Secret, old CA dropped) that reach
  the running pods without a restart, timed, under load;
- NOTES' port-forward to /readyz and /metrics;
- what the container really runs as (uid, capabilities, read-only root) and what it logs (JSON lines only);
- ``policy.cluster.enabled``: the pods list Nodes with the chart's token and RBAC, refuse an accelerator no node
  has, and admit it once such a Node exists.

The tests share the release and run in file order (each leaves it as the next expects). Figures are printed at
the end of the module (``-s`` shows them) and quoted in tests/e2e/README.md.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import errno
import hashlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.cluster import NO_PROXY_ENV
from tests.e2e.load import AdmissionLoad, LoadReport
from tests.e2e.node import SYNC_FREQUENCY, NodeBed, until
from tests.manifests import container, pod, pytorch_job, seed_pod, tls_secret
from tests.server import free_port, metric_sum
from webhook.serving import certs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(480)]

RELEASE, NAMESPACE = "gpu-webhook", "gpu-system"
DEPLOYMENT = f"deployment/{RELEASE}"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
CRD = Path(__file__).resolve().parent / "pytorchjob-crd.yaml"
FAKE_NODE = "gw-e2e-gpu-l4"
RATE = 15.0  # pod creations per second while the release changes
POLICY = {"accelerator": {"allowed": ["nvidia-tesla-p100", "nvidia-tesla-k80", "nvidia-l4"],
                          "default": "nvidia-tesla-k80"},
          "limits": {"perContainer": 4, "perPod": 4}}

# How long a poll waits for the release's pods to follow a change (an edit of GPUPolicy/default, a new Node)
# before it fails: not a figure asserted (those are printed, FIGURES), so a bound a loaded 2-core machine, running
# the whole suite beside other jobs, meets too; an idle one takes a few seconds.
CONVERGE = 120

# What the module measured, printed at its end.
FIGURES: dict[str, object] = {}


def _secret(bundle: certs.Bundle) -> dict:
    return tls_secret(f"{RELEASE}-tls", NAMESPACE, bundle.cert_pem, bundle.key_pem)


def _apply(bed: NodeBed, document: dict) -> None:
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(document), check=True)


def _pods(bed: NodeBed) -> list[dict]:
    return bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]


def _is_ready(p: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))


def _dry_run(bed: NodeBed, document: dict) -> subprocess.CompletedProcess:
    return bed.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(document))


def _settle(bed: NodeBed, timeout: float = 180) -> list[dict]:
    """Wait until the release runs exactly its two pods, Ready, none terminating; return them.

    Old pods keep answering on the apiserver's kept-alive connections until they exit: their preStop sleep, the
    drain, then until each connection has carried one more request (answered with ``Connection: close``) or the
    server's graceful timeout ends. Each round sends a GPU pod (dry run) so that connections get used; an idle
    one the apiserver does not pick (its pool reuses the most recent first) keeps its pod for about 26 s.
    The old pods are gone 16-41 s after ``helm upgrade`` on an idle machine (tests/e2e/README.md); ``timeout``
    leaves room for a machine running the whole suite beside other jobs (the time is a figure, not asserted).
    """
    probe = pod(container("cuda", limits={"nvidia.com/gpu": "1"}), name="settle")

    def settled() -> list[dict] | None:
        _dry_run(bed, probe)
        pods = _pods(bed)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp") and _is_ready(p)]
        return pods if len(pods) == 2 and len(live) == 2 else None

    return until("the release's two pods Ready and no other", settled, timeout, interval=0.3,
                 diagnose=lambda: bed.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout)


def _upgrade(bed: NodeBed, *args: str) -> float:
    start = time.monotonic()
    result = bed.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values", *args,
                      "--wait", "--timeout=180s")
    if result.returncode:
        jobs = bed.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout + bed.kubectl(
            "logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=admission-policies-job", "--tail=40",
            "--all-containers").stdout
        pytest.fail(f"helm upgrade {' '.join(args)} failed: {result.stderr}\nthe hook Job said:\n{jobs}",
                    pytrace=False)
    return time.monotonic() - start


def _assert_no_failures(report: LoadReport, what: str) -> None:
    print(f"{what}: {report.summary()}")
    assert report.sent >= RATE * 3, f"{what}: the load hardly ran: {report.summary()}"
    assert not report.failed, f"{what}: failed admissions: {report.summary()}\n" + "\n".join(
        f"  #{r.index} at +{r.sent - report.started:.2f}s: {r.status} {r.error}" for r in report.failed[:20])


def _load(bed: NodeBed) -> AdmissionLoad:
    return AdmissionLoad(bed.url, bed.tokens["admin"], bed.ca_file, rate=RATE)


_SERVED = """
import hashlib, socket, ssl, sys
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
for ip in sys.argv[1:]:
    try:
        with socket.create_connection((ip, 8443), timeout=3) as raw:
            with context.wrap_socket(raw) as tls:
                print(ip, hashlib.sha256(tls.getpeercert(True)).hexdigest())
    except OSError as exc:
        print(ip, type(exc).__name__)
"""


def _served_certificates(bed: NodeBed, ips: list[str]) -> dict[str, str]:
    """sha256 of the certificate each pod serves on its HTTPS port (from inside the bed's network)."""
    out = bed.netns_run([sys.executable, "-c", _SERVED, *ips], timeout=30).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


def _fingerprint(pem: bytes) -> str:
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def _reloads(bed: NodeBed, p: dict, what: str, since: float = 0.0) -> list[float]:
    """When (time.time()) the pod's workers logged reloading ``what`` since ``since``."""
    times = [datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp()
             for e in (json.loads(m) for _, m in _log_messages(bed, p))
             if e.get("event") == "reloaded" and e.get("what") == what]
    return [t for t in times if t >= since - 0.001]  # the log's times are in milliseconds


def _admissions(bed: NodeBed, p: dict, endpoint: str, since: float, decision: str | None = None) -> int:
    """How many admissions (of Pods, with ``decision`` if given) the pod logged at ``endpoint`` since ``since``
    (time.time())."""
    return sum(1 for e in (json.loads(m) for _, m in _log_messages(bed, p))
               if e.get("event") == "admission" and e.get("endpoint") == endpoint
               and (decision is None or (e.get("decision") == decision and e.get("kind") == "Pod"))
               and datetime.datetime.fromisoformat(e["time"].replace("Z", "+00:00")).timestamp() >= since)


def _reloaded(bed: NodeBed, p: dict, what: str, since: float = 0.0) -> bool:
    return bool(_reloads(bed, p, what, since))


def _log_messages(bed: NodeBed, p: dict) -> list[tuple[str, str]]:
    """(stream, message) of every line the kubelet logged for the pod's container (CRI log format), oldest first:
    ``<restart count>.log``, so a container that restarted (a killed one) counts with its current log too."""
    meta = p["metadata"]
    directory = bed.workdir / "pod-logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / "webhook"
    lines = [line for path in sorted(directory.glob("*.log"), key=lambda f: int(f.stem))
             for line in path.read_text().splitlines()]
    messages: list[tuple[str, str]] = []
    partial = ""
    for line in lines:
        _time, stream, tag, message = line.split(" ", 3)
        partial += message
        if tag == "F":
            messages.append((stream, partial))
            partial = ""
    return messages


@pytest.fixture(scope="module")
def release(node_bed: NodeBed, webhook_image: str, tmp_path_factory):
    """The README's install in certs.mode=secret, two replicas, the PyTorchJob CRD in webhook.customResources."""
    bed = node_bed
    tmp = tmp_path_factory.mktemp("release")
    installed = False
    try:
        bed.kubectl("apply", "-f", str(CRD), check=True)
        bed.kubectl("wait", "--for=condition=Established", "crd/pytorchjobs.kubeflow.org", "--timeout=30s",
                    check=True)
        bed.kubectl("create", "namespace", NAMESPACE, check=True)
        bundle = certs.generate(certs.service_names(RELEASE, NAMESPACE))
        bed.kubectl("create", "-f", "-", stdin=json.dumps(_secret(bundle)), check=True)
        repository, tag = webhook_image.rsplit(":", 1)
        values = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "replicaCount": 2,
            "certs": {"mode": "secret", "secret": {"name": f"{RELEASE}-tls",
                                                   "caBundle": base64.b64encode(bundle.ca_pem).decode()}},
            "webhook": {"customResources": [{"apiGroups": ["kubeflow.org"], "apiVersions": ["*"],
                                             "resources": ["pytorchjobs"]}]},
            "policy": POLICY,
        }
        (tmp / "values.yaml").write_text(yaml.safe_dump(values))
        start = time.monotonic()
        result = bed.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                          "--values", str(tmp / "values.yaml"), "--wait", "--timeout=180s")
        installed = True
        FIGURES["helm install --wait, 2 replicas (s)"] = round(time.monotonic() - start, 1)
        FIGURES["image import (s)"] = round(bed.timings.get("webhook image import", 0.0), 1)
        if result.returncode:
            pytest.fail(f"helm install failed: {result.stderr}\n"
                        f"{bed.kubectl('describe', 'pods', '-n', NAMESPACE).stdout}", pytrace=False)
        rollout = bed.kubectl("rollout", "status", "-n", NAMESPACE, DEPLOYMENT, "--timeout=60s")
        # helm saw the pods Ready; kube-proxy programs the new Service's endpoints a moment later (until then
        # its REJECT rule answers the apiserver: "connection refused").
        answered = time.monotonic()

        def unanswered() -> str:
            return "".join((_dry_run(bed, seed_pod()).stderr,
                            bed.kubectl("get", "endpointslices", "-n", NAMESPACE, "-o", "yaml").stdout,
                            bed.kube_services("filter"),
                            bed.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").stdout,
                            bed.logs("kube-controller-manager")))

        until("the apiserver reaching the webhook through the Service",
              lambda: _dry_run(bed, seed_pod()).returncode == 0, 30, interval=0.2, diagnose=unanswered)
        FIGURES["Service answering after helm install returned (s)"] = round(time.monotonic() - answered, 1)
        yield {"ca": bundle.ca_pem, "cert": bundle.cert_pem, "rollout status": rollout.stdout}
    finally:
        problems = []
        bed.kubectl("delete", "node", FAKE_NODE, "--ignore-not-found")
        start = time.monotonic()
        if installed:
            uninstall = bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=180s")
            forget_policy_crd(bed.kubectl)
            if uninstall.returncode:
                problems.append(f"helm uninstall: {uninstall.stderr}")
            FIGURES["helm uninstall --wait (s)"] = round(time.monotonic() - start, 1)
        # The pods stop gracefully (preStop, drain, idle connections: about 26 s). Deleting the namespace while
        # they do costs more: its controller rechecks after the pods' whole grace period (30 s) and then some.
        # The bounds here are 5-6 times what an idle machine takes (32-33 s for the whole teardown).
        try:
            until("the release's pods gone", lambda: not _pods(bed), 180, interval=0.5)
        except TimeoutError as exc:
            problems.append(str(exc))
        FIGURES["pods gone after helm uninstall (s)"] = round(time.monotonic() - start, 1)
        for args in (("namespace", NAMESPACE), ("-f", str(CRD))):
            deleted = bed.kubectl("delete", *args, "--ignore-not-found", "--wait=true", "--timeout=180s", timeout=210)
            if deleted.returncode:
                problems.append(f"kubectl delete {' '.join(args)}: {deleted.stderr}")
        FIGURES["teardown: uninstall, namespace and CRD deleted (s)"] = round(time.monotonic() - start, 1)
        print(f"node release figures: {json.dumps(FIGURES, indent=1)}")
        assert not problems, problems


def test_the_pods_become_ready_through_the_charts_probes(node_bed, release, webhook_image):
    assert "successfully rolled out" in release["rollout status"], release["rollout status"]
    pods = _pods(node_bed)
    assert len(pods) == 2
    for p in pods:
        (status,) = p["status"]["containerStatuses"]
        assert status["image"] == webhook_image and status["ready"] and "running" in status["state"]
        assert status["restartCount"] == 0
        spec = p["spec"]["containers"][0]
        assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
        assert spec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
        # The kubelet's probe is what made it Ready: the same GET answers 200 on the pod's metrics port.
        code, body = node_bed.http_in_netns(f"http://{p['status']['podIP']}:8080/readyz")
        assert code == 200, body
    # The EndpointSlice controller follows the pods' Ready condition a moment later (a cold run read it between
    # the two): the Service's ready endpoints become exactly the two pods.
    ips = {p["status"]["podIP"] for p in pods}

    def ready_endpoints() -> set[str]:
        slices = node_bed.kubectl_json("get", "endpointslices", "-n", NAMESPACE,
                                       "-l", f"kubernetes.io/service-name={RELEASE}")["items"]
        return {a for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")
                for a in e["addresses"]}

    until("the Service's ready endpoints to be the two pods", lambda: ready_endpoints() == ips, 30,
          diagnose=lambda: f"ready endpoints {sorted(ready_endpoints())}, pods {sorted(ips)}")


def test_the_apiserver_calls_the_pods_through_the_service(node_bed, release):
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for hook in node_bed.kubectl_json("get", kind, RELEASE)["webhooks"]:
            config = hook["clientConfig"]
            assert "url" not in config and config["service"]["name"] == RELEASE, hook["name"]
            assert config["service"]["namespace"] == NAMESPACE and config["caBundle"]
    result = _dry_run(node_bed, seed_pod())
    assert result.returncode == 0, result.stderr
    admitted = json.loads(result.stdout)["spec"]
    assert admitted["nodeSelector"] == {"accelerator": "nvidia-tesla-p100"}
    assert admitted["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"},
                                                      "requests": {"nvidia.com/gpu": "1"}}
    unselected = seed_pod()
    del unselected["spec"]["nodeSelector"]
    result = _dry_run(node_bed, unselected)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spec"]["nodeSelector"] == {"accelerator": "nvidia-tesla-k80"}  # the default
    refused = _dry_run(node_bed, pod(container("cuda", limits={"nvidia.com/gpu": "5"}), name="five-gpus"))
    assert refused.returncode and 'admission webhook "validate.gpu-webhook.io" denied' in refused.stderr
    assert "5" in refused.stderr and "4" in refused.stderr, refused.stderr
    # The decisions were the pods': they logged them.
    logged = [json.loads(m) for p in _pods(node_bed) for _, m in _log_messages(node_bed, p)]
    names = {(e.get("endpoint"), e.get("name")) for e in logged if e.get("event") == "admission"}
    assert {("mutate", "cuda-vector-add"), ("validate", "cuda-vector-add"), ("validate", "five-gpus")} <= names


def test_a_fractional_gpu_in_a_pytorchjob_is_refused(node_bed, release):
    # The seed pod is the master, a worker asks for half a GPU.
    job = pytorch_job(seed_pod(), pod(container("pytorch", limits={"nvidia.com/gpu": "0.5"})))
    refused = _dry_run(node_bed, job)
    assert refused.returncode, refused.stdout
    assert 'admission webhook "validate-custom.gpu-webhook.io" denied' in refused.stderr, refused.stderr
    assert ("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits[nvidia.com/gpu]"
            in refused.stderr and "0.5" in refused.stderr), refused.stderr
    whole = pytorch_job(seed_pod(), pod(container("pytorch", limits={"nvidia.com/gpu": "2"})))
    admitted = _dry_run(node_bed, whole)
    assert admitted.returncode == 0, admitted.stderr


def test_a_rolling_update_under_load_fails_no_admission(node_bed, release):
    before = {p["metadata"]["uid"] for p in _pods(node_bed)}
    with _load(node_bed) as load:
        time.sleep(2)
        start = time.monotonic()
        helm = _upgrade(node_bed, "--set-string", f"podAnnotations.gw-e2e/rollout={int(time.time())}")
        node_bed.kubectl("rollout", "status", "-n", NAMESPACE, DEPLOYMENT, "--timeout=120s", check=True)
        rolled = time.monotonic() - start
        pods = _settle(node_bed)
        gone = time.monotonic() - start
        time.sleep(1)
    report = load.stop()
    _assert_no_failures(report, "rolling update")
    assert not before & {p["metadata"]["uid"] for p in pods}, "helm upgrade did not replace the pods"
    FIGURES["rolling update"] = {"requests sent": report.sent, "failed": len(report.failed), "rate/s": RATE,
                                 "helm upgrade --wait (s)": round(helm, 1), "rollout complete (s)": round(rolled, 1),
                                 "old pods gone (s)": round(gone, 1), "p99 latency (ms)": report.latency_ms(0.99)}


def test_evicting_a_pod_under_load_fails_no_admission(node_bed, release):
    def evict(name: str) -> subprocess.CompletedProcess:
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NAMESPACE}}
        return node_bed.kubectl("create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction",
                                "-f", "-", stdin=json.dumps(eviction))

    victim, other = _settle(node_bed)
    first, second = victim["metadata"]["name"], other["metadata"]["name"]

    def budget_allows_one() -> bool:
        status = node_bed.kubectl_json("get", "pdb", RELEASE, "-n", NAMESPACE).get("status", {})
        return status.get("currentHealthy") == 2 and status.get("disruptionsAllowed") == 1

    until("the PodDisruptionBudget counting both pods", budget_allows_one, 30, interval=0.3)
    with _load(node_bed) as load:
        time.sleep(2)
        start = time.monotonic()
        evicted = evict(first)
        assert evicted.returncode == 0, evicted.stderr
        # The budget (minAvailable 1) now allows no other disruption until the replacement is Ready.
        refused = evict(second)
        assert refused.returncode and "disruption budget" in refused.stderr, (refused.stdout, refused.stderr)
        # The evicted pod's last words: its log, read until the pod is gone (its container has exited then; the
        # kubelet's container garbage collection removes the file later, within a minute).
        last: list[tuple[str, str]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            gone = node_bed.kubectl("get", "pod", first, "-n", NAMESPACE).returncode != 0
            try:
                # Once the pod is gone the kubelet removes its log directory: a read then finds nothing, which
                # must not replace what was read before.
                last = _log_messages(node_bed, victim) or last
            except FileNotFoundError:
                break
            if gone:
                break
            time.sleep(0.3)
        pods = _settle(node_bed)
        replaced = time.monotonic() - start
        time.sleep(1)
    report = load.stop()
    _assert_no_failures(report, "eviction")
    assert first not in {p["metadata"]["name"] for p in pods}
    # It drained (after the preStop sleep), then stopped; its shutdown is JSON lines too.
    events = [json.loads(message) for _, message in last]
    names = [e["event"] for e in events]
    assert "draining" in names and "stopped" in names[names.index("draining"):], names[-10:]
    draining = next(e for e in events if e["event"] == "draining")
    stopped = [e for e in events if e["event"] == "stopped"]
    FIGURES["eviction of one pod"] = {"requests sent": report.sent, "failed": len(report.failed),
                                      "replaced and gone (s)": round(replaced, 1),
                                      "drain (s)": draining["seconds"],
                                      "connections cut at the end": [e["connections_cut"] for e in stopped]}


def test_a_policy_change_reaches_the_running_pods_without_a_restart(node_bed, release):
    before = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"] for p in _settle(node_bed)}
    with _load(node_bed) as load:
        time.sleep(1)
        assert {r.accelerator for r in load.snapshot() if r.ok} == {"nvidia-tesla-k80"}
        start, wall = time.monotonic(), time.time()
        helm = _upgrade(node_bed, "--set", "policy.accelerator.default=nvidia-l4")

        def all_new() -> bool:
            recent = [r for r in load.snapshot() if r.sent > time.monotonic() - 1.5]
            return bool(recent) and all(r.accelerator == "nvidia-l4" for r in recent)

        # The kubelet updates the ConfigMap volume at each pod's next sync (syncFrequency, SYNC_FREQUENCY here),
        # the server sees the new bytes within its 1 s poll.
        until("every admission decided by the new policy", all_new, 90, interval=0.5)
        until("both pods logged the policy reload",
              lambda: all(_reloaded(node_bed, p, "policy", wall) for p in _pods(node_bed)), 30, interval=0.5)
    report = load.stop()
    _assert_no_failures(report, "policy change")
    after = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"] for p in _pods(node_bed)}
    assert after == before, "the pods were replaced or restarted"
    new = [r for r in report.results if r.accelerator == "nvidia-l4"]
    old = [r for r in report.results if r.accelerator == "nvidia-tesla-k80" and r.sent >= start]
    first_new = min(r.done for r in new) - start
    last_old = max((r.done for r in old), default=start) - start
    FIGURES["policy change (ConfigMap)"] = {"kubelet syncFrequency": SYNC_FREQUENCY,
                                            "helm upgrade (s)": round(helm, 1),
                                            "first admission by the new policy (s)": round(first_new, 1),
                                            "last admission by the old policy (s)": round(last_old, 1),
                                            "each pod's workers reloaded (s)": sorted(
                                                round(max(_reloads(node_bed, p, "policy", wall)) - wall, 1)
                                                for p in _pods(node_bed)),
                                            "mutations per pod during the load": sorted(
                                                _admissions(node_bed, p, "mutate", wall - 1) for p in _pods(node_bed)),
                                            "requests sent": report.sent, "failed": len(report.failed)}


@contextlib.contextmanager
def _port_forward(bed: NodeBed, target: str) -> Iterator[int]:
    """``kubectl port-forward TARGET PORT:metrics``, as the chart's NOTES say; yields the local port."""
    port = free_port()
    forward = subprocess.Popen([bed.binary("kubectl"), f"--kubeconfig={bed.kubeconfig}", "-n", NAMESPACE,
                                "port-forward", target, f"{port}:metrics", "--address=127.0.0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=NO_PROXY_ENV)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080", or why not
        assert line.startswith(f"Forwarding from 127.0.0.1:{port} -> 8080"), line
        yield port
    finally:
        forward.terminate()
        forward.communicate(timeout=10)


def _get(port: int, path: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.read().decode()


PATCHED_PODS = {"decision": "patched", "endpoint": "mutate", "kind": "Pod"}


def test_the_notes_port_forward_reaches_readyz_and_metrics(node_bed, release):
    """NOTES step 5: kubectl port-forward to the Service's metrics port (apiserver, kubelet, containerd's stream
    server into the pod's network), then plain-HTTP /readyz and /metrics from the host."""
    with _port_forward(node_bed, f"service/{RELEASE}") as port:
        assert _get(port, "/readyz") == (200, "ok\n")
        status, metrics = _get(port, "/metrics")
        assert status == 200
        # Whichever pod kubectl picked, it reloaded the policy in the test before.
        assert 'gpu_webhook_reloads_total{result="success",what="policy"}' in metrics, metrics[-2000:]
    # The apiserver may have sent every mutation to one pod (it keeps its connections): the pods together count
    # them, and each pod's count is the number of patched Pods its own log says it decided.
    patched = {}
    for p in _pods(node_bed):
        with _port_forward(node_bed, f"pod/{p['metadata']['name']}") as port:
            count = metric_sum(_get(port, "/metrics")[1], "gpu_webhook_requests_total", **PATCHED_PODS)
        patched[p["metadata"]["name"]] = (int(count), _admissions(node_bed, p, "mutate", 0, "patched"))
    assert sum(n for n, _ in patched.values()) > 0, patched
    assert all(n == logged for n, logged in patched.values()), patched


def test_a_ca_rotation_reaches_the_running_pods_under_load(node_bed, release):
    """certs/README.md's rotation with a new CA: both CAs in the caBundle, then the new pair in the Secret, then
    the old CA dropped; the pods reload the Secret's files, no request fails."""
    pods = _settle(node_bed)
    uids = {p["metadata"]["uid"] for p in pods}
    ips = [p["status"]["podIP"] for p in pods]
    old = _fingerprint(release["cert"])
    assert set(_served_certificates(node_bed, ips).values()) == {old}
    bundle = certs.generate(certs.service_names(RELEASE, NAMESPACE))
    new = _fingerprint(bundle.cert_pem)
    with _load(node_bed) as load:
        time.sleep(1)
        overlap = base64.b64encode(release["ca"] + bundle.ca_pem).decode()
        _upgrade(node_bed, "--set", f"certs.secret.caBundle={overlap}")
        time.sleep(2)  # the apiserver's webhook client follows the configurations asynchronously
        start, wall = time.monotonic(), time.time()
        _apply(node_bed, _secret(bundle))
        served = until("the new certificate served by every pod",
                       lambda: (s := _served_certificates(node_bed, ips)) and set(s.values()) == {new} and s,
                       90, interval=0.5, diagnose=lambda: str(_served_certificates(node_bed, ips)))
        rotated = time.monotonic() - start
        _upgrade(node_bed, "--set", f"certs.secret.caBundle={base64.b64encode(bundle.ca_pem).decode()}")
        time.sleep(2)  # admissions through the configurations that trust the new CA only
    report = load.stop()
    _assert_no_failures(report, "CA rotation")
    assert len(served) == 2
    assert {p["metadata"]["uid"] for p in _pods(node_bed)} == uids, "the pods were replaced"
    release.update(ca=bundle.ca_pem, cert=bundle.cert_pem)
    FIGURES["CA rotation (Secret)"] = {"kubelet syncFrequency": SYNC_FREQUENCY,
                                       "new certificate served by both pods (s)": round(rotated, 1),
                                       "each pod's workers reloaded (s)": sorted(
                                           round(max(_reloads(node_bed, p, "certificate", wall)) - wall, 1)
                                           for p in _pods(node_bed)),
                                       "requests sent": report.sent, "failed": len(report.failed)}


def test_the_container_runs_read_only_as_65532_without_capabilities(node_bed, release):
    for p in _pods(node_bed):
        container_id = p["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
        lines = node_bed.ctr("tasks", "ps", container_id).stdout.split("\n")[1:]
        pids = [int(line.split()[0]) for line in lines if line.strip()]
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ") for pid in pids}
        # gunicorn's master and two workers (server.workers=2), and the policy status writer the master started
        # (policyObject.enabled): nothing else.
        served = [pid for pid, command in commands.items() if "gpu-webhook serve" in command]
        assert len(served) >= 3, f"gunicorn's master and two workers expected: {commands}"
        assert all(pid in served or " -m webhook.serving.policystatus " in command
                   for pid, command in commands.items()), commands
        for pid in pids:
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if ":\t" in line)
            assert status["Uid"].split() == ["65532"] * 4 and status["Gid"].split() == ["65532"] * 4, status
            for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert int(status[cap], 16) == 0, (pid, cap, status[cap])
            assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", status  # 2: a filter (RuntimeDefault)
        mounts = {}
        for line in Path(f"/proc/{pids[0]}/mountinfo").read_text().splitlines():
            fields = line.split(" ")
            mounts[fields[4]] = fields[5].split(",")
        assert "ro" in mounts["/"], mounts["/"]
        assert "rw" in mounts["/tmp"] and "ro" in mounts["/tls"] and "ro" in mounts["/etc/gpu-webhook"]
        # Even root, going through the container's own root, cannot write there.
        with pytest.raises(OSError) as failure:
            Path(f"/proc/{pids[0]}/root/gw-e2e-write-probe").open("x").close()
        assert failure.value.errno == errno.EROFS


def test_the_container_logs_only_json_lines(node_bed, release):
    # One admission now, so that some pod has decided something. Which pod decides it is kube-proxy's choice for
    # the apiserver's connection, which then carries every call: a pod that replaced an evicted or killed one may
    # have decided nothing, so each pod is held to its own start and the pods together to the rest.
    admitted = _dry_run(node_bed, seed_pod())
    assert admitted.returncode == 0, admitted.stderr
    every: set[str] = set()
    for p in _pods(node_bed):
        messages = _log_messages(node_bed, p)
        events = []
        for stream, message in messages:
            try:
                event = json.loads(message)
            except ValueError:
                pytest.fail(f"{p['metadata']['name']} logged a line that is not JSON ({stream}): {message!r}")
            assert isinstance(event, dict) and {"time", "level", "event"} <= event.keys(), message
            events.append(event["event"])
        assert {"serving", "reloaded"} <= set(events), set(events)
        every |= set(events)
    assert "admission" in every, every
    # The same lines through the apiserver and the kubelet.
    shown = node_bed.kubectl("logs", "-n", NAMESPACE, _pods(node_bed)[0]["metadata"]["name"], "--tail=5", check=True)
    assert all(json.loads(line)["event"] for line in shown.stdout.splitlines())


# pytest-timeout counts fixtures too: this test is the module's last, so the release's teardown (~33 s idle) is in
# its time besides its own ~60 s. Every wait in either has a bound of its own and says what it waited for; this
# only stops a hang, and leaves room for a loaded machine.
@pytest.mark.timeout(900)
def test_cluster_checks_follow_the_nodes_with_the_charts_token_and_rbac(node_bed, release):
    l4 = pod(container("cuda", limits={"nvidia.com/gpu": "1"}), name="l4-pod",
             nodeSelector={"accelerator": "nvidia-l4"})
    start = time.monotonic()
    helm = _upgrade(node_bed, "--set", "policy.cluster.enabled=true")  # a new pod template: the token volume
    pods = _settle(node_bed)
    FIGURES["policy.cluster.enabled upgrade"] = {"helm upgrade --wait (s)": round(helm, 1),
                                                 "old pods gone (s)": round(time.monotonic() - start, 1)}
    for p in pods:
        volumes = {v["name"]: v for v in p["spec"]["volumes"]}
        assert volumes["kube-api-access"]["projected"]["sources"][0]["serviceAccountToken"]
        assert p["spec"]["serviceAccountName"] == RELEASE and p["spec"]["automountServiceAccountToken"] is False

        def nodes_listed(p: dict = p) -> bool:
            events = [json.loads(m) for _, m in _log_messages(node_bed, p)]
            return any(e["event"] == "informer_listed" and e["resource"] == "nodes" for e in events)

        # The new pods start on GPUPolicy/default as it was (cluster checks off); the post-upgrade hook then writes
        # the new spec, and each pod's view follows that edit.
        until(f"{p['metadata']['name']} listing the nodes", nodes_listed, CONVERGE, interval=0.5)

    def decided() -> subprocess.CompletedProcess | None:
        """A refusal by the webhook, None while it admits (a worker whose view has not loaded yet checks nothing)
        or while the apiserver could not call it in time (a busy machine: timeoutSeconds is 5)."""
        r = _dry_run(node_bed, l4)
        return r if r.returncode and "failed calling webhook" not in r.stderr else None

    refused = until("the pod asking for an absent accelerator refused", decided, CONVERGE, interval=0.5)
    assert "no node has accelerator=nvidia-l4" in refused.stderr, refused.stderr
    try:
        node_bed.kubectl("create", "-f", "-", check=True, stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": FAKE_NODE, "labels": {"accelerator": "nvidia-l4"}}}))
        created = time.monotonic()
        resources = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
        node_bed.kubectl("patch", "node", FAKE_NODE, "--subresource=status", "--type=merge", "-p", json.dumps(
            {"status": {"capacity": resources, "allocatable": resources,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                        "message": "no kubelet: an object for the webhook's node watch"}]}}),
            check=True)
        taints = node_bed.kubectl_json("get", "node", FAKE_NODE)["spec"].get("taints") or []
        kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
        if kept != taints:  # the node lifecycle controller may have removed it already
            node_bed.kubectl("patch", "node", FAKE_NODE, "--type=merge", "-p", json.dumps({"spec": {"taints": kept}}),
                             check=True)
        admitted = until("the pod asking for nvidia-l4 admitted", lambda: _dry_run(node_bed, l4).returncode == 0
                         and time.monotonic(), CONVERGE, interval=0.2)
        FIGURES["Node created -> pod admitted (s)"] = round(admitted - created, 1)
        # Every pod follows the watch. Each of the 4 workers (2 pods x 2) has its own watch and rebuilds its view
        # on a thread of its own: the first admission says that one worker saw the Node, not that all did, and on
        # a busy machine another may take a few seconds more. Four in a row once they all caught up, then four
        # more, each admitted.
        until("four admissions in a row of the pod asking for nvidia-l4",
              lambda: all(_dry_run(node_bed, l4).returncode == 0 for _ in range(4)), CONVERGE, interval=0.2)
        for _ in range(4):
            assert _dry_run(node_bed, l4).returncode == 0

        # The status writer (one per pod, the Lease holder writes) keeps the cluster's facts in GPUPolicy/default:
        # the new model with its node count and GPUs, at most 10 s after a change.
        def summarized() -> dict | None:
            cluster = (node_bed.kubectl_json("get", "gpupolicy", "default").get("status") or {}).get("cluster") or {}
            return cluster if "nvidia-l4" in (cluster.get("models") or {}) else None

        summary = until("status.cluster naming nvidia-l4", summarized, CONVERGE, interval=0.5)
        FIGURES["Node created -> status.cluster (s)"] = round(time.monotonic() - created, 1)
        assert summary["models"]["nvidia-l4"] == {"nodes": 1, "largest": {"nvidia.com/gpu": 4}}, summary
        assert summary["nodeLabel"] == "accelerator" and summary["extendedResources"]["nvidia.com/gpu"] >= 4, summary
        # Written by the Lease holder: its identity is the pod's hostname (its name) and a random suffix.
        names = {p["metadata"]["name"] for p in _pods(node_bed)}
        assert summary["writer"].rsplit("_", 1)[0] in names, (summary["writer"], names)
    finally:
        node_bed.kubectl("delete", "node", FAKE_NODE, "--ignore-not-found", check=True)
