"""Admission time per pod creation through a real kube-apiserver, four ways side by side in one run.

    .venv/bin/python -m bench.admission_paths                     # 3 rounds of 200 creates per configuration
    .venv/bin/python -m bench.admission_paths --creates 5 --rounds 1 --corpus 20   # smoke

One control plane (tests/e2e/cluster.py: kube-apiserver v1.36.3 and etcd on loopback, built by
``tests/prepare control-plane``), one ``gpu-webhook serve`` on loopback (one worker), and four namespaces, one per
configuration, all live at once so that rounds interleave without waiting for the apiserver to pick up changes:

- ``bench-none``: nothing of ours applies (every webhook configuration excludes it, no binding selects it);
- ``bench-webhook``: the chart's webhook configurations (mutate + validate, ``helm template`` with ``webhook.url``);
- ``bench-native``: ``gpu-webhook admission-policies --policy P --apply``, each binding then narrowed by
  ``matchResources.namespaceSelector`` to the namespaces labelled ``gw-bench/native=true``;
- ``bench-hybrid``: the same policies and the chart's configurations rendered with ``admissionPolicies.enabled=true``
  (a second release name: its own configurations, with the hybrid ``matchConditions``).

Each round sends, per configuration in turn (none, webhook, native, hybrid), ``--creates`` server-side dry-run
creates of a 7-container GPU pod (one kept-alive connection, one request at a time) and reads the apiserver's own
``apiserver_admission_step_admission_duration_seconds`` (sum and count of CREATEs, per step type) before and after:
the mean per step is the delta of the sum over the delta of the count. The client's wall time per request is
taken too. Reported: medians over rounds and ratios to "none". Then a corpus of mixed objects (GPU and CPU pods,
workloads, PyTorchJobs, pods with DRA claims, some breaking the policy) goes once to the webhook and once to the
hybrid namespace, and the webhook's decision log says how many admission requests each one cost it.

Results go to stdout (JSON, then a Markdown table) and to bench/results/admission-paths.json.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "admission-paths.json"
CHART = ROOT / "charts" / "gpu-webhook"
PYTORCHJOB_CRD = ROOT / "tests" / "e2e" / "pytorchjob-crd.yaml"
CONFIGS = ("none", "webhook", "native", "hybrid")
NAMESPACES = {c: f"bench-{c}" for c in CONFIGS}
NATIVE_LABEL = "gw-bench/native"
POLICY_SELECTOR = "app.kubernetes.io/name=gpu-webhook,app.kubernetes.io/component=admission-policies"
STEP = "apiserver_admission_step_admission_duration_seconds"
# The checks the generator leaves to the webhook are off: with either on (the default is warn), hybrid mode
# keeps sending every GPU object to /validate (charts/gpu-webhook/README.md), and the bench would measure the
# webhook twice.
POLICY = {
    "accelerator": {"allowed": ["nvidia-tesla-p100", "nvidia-tesla-k80", "nvidia-l4"], "default": "nvidia-tesla-k80"},
    "limits": {"perContainer": 4, "perPod": 8},
    "checks": {"processCountMismatch": "off", "replicaAcceleratorMismatch": "off"},
}
GPU = "nvidia.com/gpu"


def gpu_pod(name: str, containers: int = 7, gpus: str = "1", selector: str | None = None) -> dict[str, Any]:
    """A training pod: ``containers`` containers with cpu/memory and ``gpus`` GPUs each, env, a volume."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [{
            "name": f"worker-{i}", "image": "example.com/train:1.0",
            "command": ["python", "train.py", f"--rank={i}"],
            "env": [{"name": "RANK", "value": str(i)}, {"name": "NCCL_DEBUG", "value": "WARN"}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                          "limits": {"cpu": "2", "memory": "4Gi", GPU: gpus}},
        } for i in range(containers)],
    }
    if selector:
        spec["nodeSelector"] = {"accelerator": selector}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "train"}}, "spec": spec}


def cpu_pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "web", "image": "example.com/web:1.0",
                                     "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}


def claim_pod(name: str) -> dict[str, Any]:
    body = cpu_pod(name)
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared-gpu"}]
    body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return body


def workload(kind: str, name: str, template: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    pod_template = {"metadata": {"labels": labels}, "spec": template["spec"]}
    if kind == "Job":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": pod_template}}
    pod_template["spec"] = {**template["spec"], "restartPolicy": "Always"}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, "template": pod_template}}


def pytorch_job(name: str, worker_gpus: str) -> dict[str, Any]:
    def replica(n: int, gpus: str) -> dict[str, Any]:
        return {"replicas": n, "template": {"spec": gpu_pod("x", containers=1, gpus=gpus)["spec"]}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1, "1"), "Worker": replica(2, worker_gpus)}}}


def corpus(size: int) -> list[dict[str, Any]]:
    """What a GPU cluster's admission stream looks like, roughly: per 20 objects, 7 GPU pods (2 over the
    per-container cap), 7 CPU-only pods, 3 workload objects (2 with GPUs), 2 PyTorchJobs (one with half a GPU),
    1 pod with a DRA claim."""
    objects: list[dict[str, Any]] = []
    for i in range(size):
        slot, name = i % 20, f"obj-{i:04d}"
        if slot < 5:
            objects.append(gpu_pod(name, containers=1 + slot % 3, selector="nvidia-l4" if slot % 2 else None))
        elif slot < 7:
            objects.append(gpu_pod(name, containers=1, gpus="5"))
        elif slot < 14:
            objects.append(cpu_pod(name))
        elif slot < 17:
            kind = ("Deployment", "Job", "StatefulSet")[slot - 14]
            template = cpu_pod(name) if slot == 16 else gpu_pod(name, containers=2)
            objects.append(workload(kind, name, template))
        elif slot < 19:
            objects.append(pytorch_job(name, "0.5" if slot == 18 else "2"))
        else:
            objects.append(claim_pod(name))
    return objects


def collection(obj: dict[str, Any], namespace: str) -> str:
    group_version, kind = obj["apiVersion"], obj["kind"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    return f"{base}/namespaces/{namespace}/{kind.lower()}s"


class Api:
    """Requests to the apiserver as admin over one kept-alive HTTPS connection."""

    def __init__(self, url: str, token: str, ca_file: Path):
        host_port = url.split("://", 1)[1]
        host, port = host_port.rsplit(":", 1)
        self.host, self.port, self.token = host, int(port), token
        self.context = ssl.create_default_context(cafile=str(ca_file))
        self.connection: http.client.HTTPSConnection | None = None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes, float]:
        """(status, body, seconds) of one request; the connection is reopened once if the server closed it."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            if self.connection is None:
                self.connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=30)
            start = time.perf_counter()
            try:
                self.connection.request(method, path, body=data, headers=headers)
                response = self.connection.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException):
                self.connection.close()
                self.connection = None
                if attempt == 2:
                    raise
                continue
            return response.status, payload, time.perf_counter() - start
        raise AssertionError("unreachable")

    def dry_run(self, obj: dict[str, Any], namespace: str) -> tuple[int, dict[str, Any], float]:
        status, payload, seconds = self.request("POST", collection(obj, namespace) + "?dryRun=All", obj)
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = {"message": payload[:300].decode(errors="replace")}
        return status, answer, seconds

    def step_totals(self) -> dict[str, tuple[float, float]]:
        """{step type: (sum seconds, count)} of admitted CREATEs, from the apiserver's /metrics."""
        status, payload, _ = self.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        totals: dict[str, list[float]] = {}
        for line in payload.decode().splitlines():
            for suffix, slot in (("_sum{", 0), ("_count{", 1)):
                if line.startswith(STEP + suffix) and 'operation="CREATE"' in line and 'rejected="false"' in line:
                    step = line.split('type="', 1)[1].split('"', 1)[0]
                    totals.setdefault(step, [0.0, 0.0])[slot] += float(line.rsplit(" ", 1)[1])
        return {step: (pair[0], pair[1]) for step, pair in totals.items()}

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def render_webhooks(helm: str, release: str, url: str, ca: Path, exclude: list[str], hybrid: bool,
                    workdir: Path) -> list[dict[str, Any]]:
    """The chart's two webhook configurations in ``webhook.url`` mode, as ``helm template`` renders them."""
    values = {
        "webhook": {"url": url, "excludeNamespaces": exclude,
                    "customResources": [{"apiGroups": ["kubeflow.org"], "apiVersions": ["*"],
                                         "resources": ["pytorchjobs"]}]},
        "certs": {"mode": "secret", "secret": {"name": "unused-in-url-mode",
                                               "caBundle": base64.b64encode(ca.read_bytes()).decode()}},
        "policy": POLICY,
        "admissionPolicies": {"enabled": hybrid},
    }
    values_file = workdir / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", "gpu-system", "--values", str(values_file),
         "--show-only", "templates/webhooks.yaml", "--set", "image.repository=localhost/gpu-webhook",
         "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"],
        capture_output=True, text=True, timeout=120, check=False)
    if result.returncode:
        raise RuntimeError(f"helm template {release}: {result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def kubectl(plane: Any, *args: str, stdin: str | None = None) -> str:
    done = plane.kubectl(*args, stdin=stdin)
    if done.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def set_up(plane: Any, server: Any, workdir: Path) -> None:
    for config, namespace in NAMESPACES.items():
        labels = {NATIVE_LABEL: "true"} if config in ("native", "hybrid") else {}
        kubectl(plane, "apply", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}))
    kubectl(plane, "apply", "-f", str(PYTORCHJOB_CRD))
    kubectl(plane, "wait", "--for=condition=Established", "crd/pytorchjobs.kubeflow.org", "--timeout=30s")
    policy = workdir / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    done = subprocess.run([sys.executable, "-m", "webhook", "admission-policies", "--policy", str(policy),
                           "--apply", "--kubeconfig", str(plane.kubeconfig)],
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode:
        raise RuntimeError(f"admission-policies --apply: {done.stderr}")
    selector = {"spec": {"matchResources": {"namespaceSelector": {"matchLabels": {NATIVE_LABEL: "true"}}}}}
    for kind in ("validatingadmissionpolicybinding", "mutatingadmissionpolicybinding"):
        for name in kubectl(plane, "get", kind, "-l", POLICY_SELECTOR, "-o", "name").split():
            kubectl(plane, "patch", name, "--type=merge", "-p", json.dumps(selector))
    others = [NAMESPACES[c] for c in CONFIGS]
    for release, config, hybrid in (("gpu-webhook", "webhook", False), ("gw-hybrid", "hybrid", True)):
        documents = render_webhooks(plane.binary("helm"), release, server.address, server.ca,
                                    [n for n in others if n != NAMESPACES[config]], hybrid, workdir)
        kubectl(plane, "apply", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))


def probe(api: Api) -> dict[str, str]:
    """Who refuses a 5-GPU container and who injects the default accelerator, per namespace."""
    seen = {}
    for config, namespace in NAMESPACES.items():
        status, answer, _ = api.dry_run(gpu_pod("probe-over", containers=1, gpus="5"), namespace)
        message = answer.get("message", "") if status != 201 else ""
        refused_by = ("webhook" if 'admission webhook "validate.gpu-webhook.io"' in message
                      else "native" if "ValidatingAdmissionPolicy 'gpu-webhook-deny'" in message
                      else f"other: {message[:200]}" if message else "nobody")
        status, answer, _ = api.dry_run(gpu_pod("probe-default", containers=1), namespace)
        injected = ((answer.get("spec") or {}).get("nodeSelector") or {}).get("accelerator") if status == 201 else None
        seen[config] = f"{refused_by}/{injected}"
    return seen


EXPECTED = {"none": "nobody/None", "webhook": "webhook/nvidia-tesla-k80", "native": "native/nvidia-tesla-k80",
            "hybrid": "native/nvidia-tesla-k80"}


def wait_configured(api: Api, timeout: float = 60) -> dict[str, str]:
    """The apiserver picks configurations and policies up asynchronously: wait until every namespace behaves."""
    deadline = time.monotonic() + timeout
    while True:
        seen = probe(api)
        if seen == EXPECTED:
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(f"the configurations never took effect: {seen}")
        time.sleep(0.5)


def webhook_requests(server: Any) -> Counter[tuple[str, str]]:
    """(namespace, endpoint) of every admission the webhook logged so far."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in server.log_lines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == "admission":
                counts[(entry.get("namespace") or "", entry.get("endpoint") or "")] += 1
    return counts


def measure_round(api: Api, server: Any, config: str, creates: int, round_no: int) -> dict[str, Any]:
    namespace = NAMESPACES[config]
    for i in range(3):  # warm: connections to the webhook, the policies' compiled programs
        api.dry_run(gpu_pod(f"warm-{i}"), namespace)
    before_hook = webhook_requests(server)
    before = api.step_totals()
    walls, failures = [], 0
    for i in range(creates):
        status, answer, seconds = api.dry_run(gpu_pod(f"r{round_no}-{i}"), namespace)
        walls.append(seconds)
        if status != 201 or config != "none" and (answer["spec"].get("nodeSelector") or {}).get("accelerator") != \
                "nvidia-tesla-k80":
            failures += 1
    after = api.step_totals()
    after_hook = webhook_requests(server)
    steps = {}
    for step in sorted(set(after) | set(before)):
        total, count = after.get(step, (0.0, 0.0))
        total0, count0 = before.get(step, (0.0, 0.0))
        if count - count0 > 0:
            steps[step] = {"mean_ms": 1000 * (total - total0) / (count - count0), "count": count - count0}
    return {"config": config, "round": round_no, "creates": creates, "unexpected_answers": failures,
            "steps": steps, "wall_median_ms": 1000 * statistics.median(walls),
            "webhook_requests": sum(after_hook.values()) - sum(before_hook.values())}


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for config in CONFIGS:
        mine = [r for r in rounds if r["config"] == config]
        entry: dict[str, Any] = {"rounds": len(mine), "creates": sum(r["creates"] for r in mine),
                                 "unexpected_answers": sum(r["unexpected_answers"] for r in mine),
                                 "webhook_requests": sum(r["webhook_requests"] for r in mine)}
        for step in ("admit", "validate"):
            values = [r["steps"][step]["mean_ms"] for r in mine if step in r["steps"]]
            entry[f"{step}_ms"] = statistics.median(values) if values else None
            entry[f"{step}_ms_range"] = [min(values), max(values)] if values else None
        per_round_total = [sum(s["mean_ms"] for s in r["steps"].values()) for r in mine]
        entry["total_ms"] = statistics.median(per_round_total)
        entry["total_ms_range"] = [min(per_round_total), max(per_round_total)]
        entry["wall_ms"] = statistics.median(r["wall_median_ms"] for r in mine)
        entry["wall_ms_range"] = [min(r["wall_median_ms"] for r in mine), max(r["wall_median_ms"] for r in mine)]
        summary[config] = entry
    base = summary["none"]
    for entry in summary.values():
        entry["total_x_none"] = entry["total_ms"] / base["total_ms"] if base["total_ms"] else None
        entry["wall_x_none"] = entry["wall_ms"] / base["wall_ms"] if base["wall_ms"] else None
    return summary


def traffic(api: Api, server: Any, size: int) -> dict[str, Any]:
    """The corpus, dry-run once in the webhook's namespace and once in the hybrid one: webhook requests each."""
    objects = corpus(size)
    kinds = Counter(o["kind"] for o in objects)
    result: dict[str, Any] = {"objects": len(objects), "kinds": dict(kinds)}
    for config in ("webhook", "hybrid"):
        namespace = NAMESPACES[config]
        before = webhook_requests(server)
        outcomes: Counter[str] = Counter()
        for obj in objects:
            status, answer, _ = api.dry_run(obj, namespace)
            message = answer.get("message", "") if status != 201 else ""
            outcomes["admitted" if status == 201 else "refused by the webhook" if "gpu-webhook.io" in message
                     else "refused by a ValidatingAdmissionPolicy" if "ValidatingAdmissionPolicy" in message
                     else f"other {status}"] += 1
        after = webhook_requests(server)
        by_endpoint = Counter({endpoint: after[(ns, endpoint)] - before[(ns, endpoint)]
                               for (ns, endpoint) in after if ns == namespace})
        result[config] = {"webhook_requests": sum(by_endpoint.values()), "by_endpoint": dict(by_endpoint),
                          "outcomes": dict(outcomes)}
    hooked = result["webhook"]["webhook_requests"]
    result["hybrid_share_of_webhook_only"] = result["hybrid"]["webhook_requests"] / hooked if hooked else None
    return result


def table(summary: dict[str, Any]) -> str:
    def ms(value: float | None, span: list[float] | None) -> str:
        return "-" if value is None else f"{value:.2f} ({span[0]:.2f}-{span[1]:.2f})" if span else f"{value:.2f}"

    lines = ["| configuration | mutating step ms | validating step ms | admission total ms | × none | "
             "client wall ms | × none | webhook requests |", "|---|---|---|---|---|---|---|---|"]
    for config, e in summary.items():
        lines.append(f"| {config} | {ms(e['admit_ms'], e['admit_ms_range'])} | "
                     f"{ms(e['validate_ms'], e['validate_ms_range'])} | {ms(e['total_ms'], e['total_ms_range'])} | "
                     f"{e['total_x_none']:.1f} | {ms(e['wall_ms'], e['wall_ms_range'])} | {e['wall_x_none']:.2f} | "
                     f"{e['webhook_requests']} / {e['creates']} creates |")
    return "\n".join(lines)


def run(plane: Any, creates: int, rounds: int, corpus_size: int, workdir: Path) -> dict[str, Any]:
    from tests.e2e.cluster import ADMIN_TOKEN
    from tests.server import make_certs, start_webhook

    policy = workdir / "webhook-policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    server = start_webhook(workdir, "--policy", str(policy), "--workers", "1",
                           certs=make_certs(workdir / "tls", "127.0.0.1"))
    api = Api(plane.url, ADMIN_TOKEN, plane.ca_file)
    try:
        set_up(plane, server, workdir)
        configured = wait_configured(api)
        started = time.monotonic()
        measured = [measure_round(api, server, config, creates, n) for n in range(rounds) for config in CONFIGS]
        result = {"rounds": measured, "summary": summarise(measured), "probe": configured,
                  "traffic": traffic(api, server, corpus_size), "seconds": round(time.monotonic() - started, 1)}
        return result
    finally:
        api.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=200, help="dry-run creates per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", type=int, default=200, help="objects in the webhook-traffic corpus")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.creates < 1 or args.rounds < 1 or args.corpus < 1:
        parser.error("--creates, --rounds and --corpus must be at least 1")
    from tests.e2e.cluster import ControlPlane
    from tests.tools import CONTROL_PLANE_BINARIES, control_plane_bin, missing_binaries

    bin_dir = control_plane_bin()
    missing = missing_binaries(bin_dir, CONTROL_PLANE_BINARIES)
    if missing:
        print(f"the e2e control plane is not built ({', '.join(missing)} missing in {bin_dir}): "
              "run `tests/prepare control-plane`", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="gw-admission-paths-"))
    plane = ControlPlane(bin_dir, workdir / "plane")
    (workdir / "plane").mkdir()
    started = datetime.datetime.now(datetime.UTC)
    try:
        plane.start()
        result = run(plane, args.creates, args.rounds, args.corpus, workdir)
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "load_average_after": [round(x, 2) for x in load]}
    result["started"] = started.isoformat(timespec="seconds")
    result["arguments"] = {"creates": args.creates, "rounds": args.rounds, "corpus": args.corpus}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(table(result["summary"]))
    bad = sum(e["unexpected_answers"] for e in result["summary"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
