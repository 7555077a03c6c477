"""What ``gpu-webhook audit`` costs on a cluster of 10,000 pods and 1,000 workload objects.

    .venv/bin/python -m bench.audit_cost --server --grow 10000  # starts the e2e bed, fills it, measures, stops it
    .venv/bin/python -m bench.audit_cost --kubeconfig FILE    # an existing (test!) cluster: objects are created

Pods are created directly (no kubelet, no controller-manager: they stay Pending and nothing else writes), in
``--namespaces`` namespaces, by threads POSTing through one connection pool; one object in ten breaks the
bench policy (over the per-pod cap, or an accelerator outside the allowed list). Then the audit runs as its
own process, ``python -m webhook audit -o json``, as a user would run it, and this reports:

- wall time of that process (start to exit, imports included) and the audit's own time;
- peak RSS of that process (``ru_maxrss`` from ``wait4``), also for one namespace (500 pods) to show that
  memory follows the page size, not the cluster;
- apiserver requests: the audit's own count, and the delta of the apiserver's ``apiserver_request_total``
  (all verbs, and LIST alone) around the run.

With ``--grow N`` it then adds N pods and audits again (peak RSS must not follow the cluster's size). With
``--server`` it also runs ``serve --audit``, times ``/validate`` during the in-server audit and after it (what
the audit's process costs the admission path), and reads that process's peak RSS.
Results go to stdout as JSON and to bench/results/audit-cost.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from webhook.kube.client import ApiError, Kube

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "audit-cost.json"
LABEL = {"gpu-webhook.io/bench": "audit-cost"}
POLICY = "accelerator: {allowed: [nvidia-l4, nvidia-a100]}\nlimits: {perPod: 4}\n"
GPU = "nvidia.com/gpu"
WORKLOAD_KINDS = ["Deployment", "StatefulSet", "Job", "CronJob", "DaemonSet"]
PATHS = {"Deployment": "apis/apps/v1", "StatefulSet": "apis/apps/v1", "DaemonSet": "apis/apps/v1",
         "Job": "apis/batch/v1", "CronJob": "apis/batch/v1"}


def pod_spec(i: int) -> dict[str, Any]:
    """Six in ten ask for a GPU properly, three are CPU-only, one breaks the bench policy."""
    env = [{"name": "MODEL", "value": f"model-{i % 7}"}, {"name": "BATCH", "value": str(32 << (i % 3))},
           {"name": "NCCL_DEBUG", "value": "WARN"}]
    cpu = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": []}
    kind = i % 10
    if kind < 6:
        spec["nodeSelector"] = {"accelerator": "nvidia-l4" if i % 2 else "nvidia-a100"}
        resources = {"requests": {**cpu["requests"], GPU: "1"}, "limits": {**cpu["limits"], GPU: "1"}}
        spec["containers"].append({"name": "train", "image": "example.com/train:1.0", "env": env,
                                   "resources": resources})
    elif kind < 9:
        spec["containers"].append({"name": "web", "image": "example.com/web:1.0", "env": env, "resources": cpu})
    elif i % 20 < 10:  # over the per-pod cap of 4: 3 + 3
        for name in ("a", "b"):
            spec["containers"].append({"name": name, "image": "example.com/train:1.0", "env": env,
                                       "resources": {"limits": {GPU: "3"}}})
    else:  # an accelerator outside the allowed list
        spec["nodeSelector"] = {"accelerator": "nvidia-h100"}
        spec["containers"].append({"name": "train", "image": "example.com/train:1.0", "env": env,
                                   "resources": {"limits": {GPU: "1"}}})
    return spec


def generated_pod(i: int, namespace: str, shape: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"pod-{i:05d}", "namespace": namespace,
                         "labels": {**LABEL, "app": f"app-{i % 50}", "team": f"team-{i % 5}"},
                         "annotations": {"example.com/owner": f"user-{i % 40}@example.com"}},
            "spec": pod_spec(shape)}


def generated_workload(i: int, namespace: str, shape: int) -> dict[str, Any]:
    kind = WORKLOAD_KINDS[i % len(WORKLOAD_KINDS)]
    labels = {**LABEL, "app": f"w-{i:04d}"}
    spec = pod_spec(shape)
    if kind in ("Deployment", "StatefulSet", "DaemonSet"):
        spec["restartPolicy"] = "Always"
    template = {"metadata": {"labels": labels}, "spec": spec}
    body: dict[str, Any] = {"apiVersion": PATHS[kind].split("/", 1)[1], "kind": kind,
                            "metadata": {"name": f"{kind.lower()}-{i:04d}", "namespace": namespace, "labels": labels}}
    if kind == "CronJob":
        body["spec"] = {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template}}}
    elif kind == "Job":
        body["spec"] = {"template": template}
    else:
        body["spec"] = {"selector": {"matchLabels": labels}, "template": template}
    return body


def collection(obj: dict[str, Any]) -> str:
    base = "api/v1" if obj["kind"] == "Pod" else PATHS[obj["kind"]]
    plural = {"Pod": "pods"}.get(obj["kind"], obj["kind"].lower() + "s")
    return f"/{base}/namespaces/{obj['metadata']['namespace']}/{plural}"


def generate(kube: Kube, pods: int, workloads: int, namespaces: int, prefix: str = "bench",
             threads: int = 8, start: int = 0) -> dict[str, Any]:
    """Create the namespaces, pods and workload objects (existing ones are left as they are)."""
    names = [f"{prefix}-{n:02d}" for n in range(namespaces)]
    for name in names:
        try:
            kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except ApiError as exc:
            if exc.status != 409:
                raise
    # Object i goes to namespace i % n; its shape follows its place in that namespace (i // n), so every
    # namespace gets the same mix, one in ten breaking the policy.
    objects = [generated_pod(i, names[i % namespaces], i // namespaces) for i in range(start, start + pods)]
    objects += [generated_workload(i, names[i % namespaces], i // namespaces) for i in range(workloads)]

    def create(obj: dict[str, Any]) -> None:
        try:
            kube.create(collection(obj), obj)
        except ApiError as exc:
            if exc.status != 409:
                raise

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, objects))
    return {"pods": pods, "workloads": workloads, "namespaces": namespaces,
            "create_seconds": round(time.monotonic() - started, 1)}


def install_report_crds(kube: Kube) -> None:
    import yaml

    for crd in yaml.safe_load((ROOT / "tests" / "e2e" / "report-crds.yaml").read_text())["items"]:
        try:
            kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        except ApiError as exc:
            if exc.status != 409:
                raise
    time.sleep(2)  # until they are served


def apiserver_requests(kube: Kube) -> dict[str, float]:
    """Sums of apiserver_request_total: all requests, and LIST requests."""
    total = lists = 0.0
    for line in kube.get_text("/metrics").splitlines():
        if line.startswith("apiserver_request_total{"):
            value = float(line.rsplit(" ", 1)[1])
            total += value
            if 'verb="LIST"' in line:
                lists += value
    return {"all": total, "list": lists}


# Runs a command and prints its exit status and peak RSS as JSON. A small process of its own forks the
# audit: a child's ru_maxrss starts from its parent's RSS at fork (Linux keeps the high-water mark across
# exec), and this bench holds thousands of generated objects.
MEASURE = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"exit": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss}, out)
"""

SUMMARY = re.compile(r"audit: ([\d,]+) objects in (\d+) resources, ([\d,]+) violations .* (\d+) API requests, "
                     r"([\d.]+) s")


def run_audit(kubeconfig: str, policy: str, namespace: str | None = None, selector: str | None = None,
              output: str = "json", admin: Kube | None = None) -> dict[str, Any]:
    """One ``gpu-webhook audit`` process: wall time, peak RSS, its request count, the apiserver's delta."""
    command = [sys.executable, "-m", "webhook", "audit", "--kubeconfig", kubeconfig, "--policy", policy,
               "-o", output]
    if namespace:
        command += ["--namespace", namespace]
    if selector:
        command += ["--selector", selector]
    before = apiserver_requests(admin) if admin else None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".json") as measured:
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", MEASURE, measured.name, *command], stdout=out, stderr=err, cwd=ROOT,
                       check=True)
        wall = time.monotonic() - started
        usage = json.loads(Path(measured.name).read_text())
        out.seek(0)
        lines = out.read().decode().splitlines()
        err.seek(0)
        errors = err.read().decode()
    after = apiserver_requests(admin) if admin else None
    match = SUMMARY.search(errors)
    if match is None:
        raise RuntimeError(f"audit exited {usage['exit']} without a summary:\n{errors}")
    result: dict[str, Any] = {
        "exit": usage["exit"],
        "objects": int(match[1].replace(",", "")),
        "resources": int(match[2]),
        "violations": int(match[3].replace(",", "")),
        "output_lines": len(lines),
        "client_requests": int(match[4]),
        "audit_seconds": float(match[5]),
        "wall_seconds": round(wall, 2),
        "peak_rss_mib": round(usage["maxrss_kib"] / 1024, 1),
    }
    if before and after:
        result["apiserver_requests_delta"] = after["all"] - before["all"]
        result["apiserver_list_delta"] = after["list"] - before["list"]
    return result


def admission_latency(server: Any, seconds: float) -> list[float]:
    """Sequential /validate calls on one keep-alive connection for ``seconds``; milliseconds each."""
    from tests.manifests import admission_review, container, pod

    body = json.dumps(admission_review(pod(container(limits={GPU: 1}), name="probe"))).encode()
    conn: http.client.HTTPSConnection = server.connection()
    took = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        took.append((time.perf_counter() - started) * 1000)
        assert response.status == 200
        time.sleep(0.005)
    conn.close()
    return took


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 2), "max_ms": round(ordered[-1], 2)}


def server_audit(kubeconfig: str, policy: str, workdir: Path) -> dict[str, Any]:
    """``serve --audit`` on this cluster: /validate latency while its first audit runs, and after."""
    from tests.server import start_webhook

    server = start_webhook(workdir, "--policy", policy, "--kubeconfig", kubeconfig, "--audit",
                           "--audit-interval", "1h", "--audit-lease", "default/bench-audit-cost")
    try:
        during: list[float] = []
        child = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            lines = [json.loads(line) for line in server.log_lines() if line.startswith("{")]
            child = child or next((e["pid"] for e in lines if e["event"] == "audit_process_started"), None)
            finished = next((e for e in lines if e["event"] == "audit_finished"), None)
            if finished:
                break
            peak = _vm_hwm(child)
            during += admission_latency(server, 1.0)
        else:
            raise RuntimeError("the in-server audit did not finish within 600 s")
        peak = _vm_hwm(child) or peak
        after = admission_latency(server, max(5.0, len(during) / 200))
        return {"audit_finished": finished, "audit_process_peak_rss_mib": peak,
                "validate_during_audit": _percentiles(during), "validate_after_audit": _percentiles(after)}
    finally:
        server.stop()


def _vm_hwm(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="an existing test cluster (default: start the e2e bed)")
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--workloads", type=int, default=1_000)
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--server", action="store_true", help="also measure serve --audit (admission latency)")
    parser.add_argument("--grow", type=int, default=0, metavar="PODS",
                        help="then add this many pods and audit again (memory must not follow the cluster's size)")
    args = parser.parse_args()
    plane = None
    if args.kubeconfig is None:
        from tests.e2e.cluster import ControlPlane
        from tests.tools import control_plane_bin

        plane = ControlPlane(control_plane_bin(), Path(tempfile.mkdtemp(prefix="gpu-webhook-audit-cost-")))
        plane.start()
        args.kubeconfig = str(plane.kubeconfig)
    workdir = Path(tempfile.mkdtemp(prefix="audit-cost-"))
    try:
        policy = workdir / "policy.yaml"
        policy.write_text(POLICY)
        admin = Kube.connect(args.kubeconfig, pool_size=8)
        if plane is not None:  # the reports the in-server audit writes need their CRDs
            install_report_crds(admin)
        result: dict[str, Any] = {"generated": generate(admin, args.pods, args.workloads, args.namespaces)}
        result["audit"] = run_audit(args.kubeconfig, str(policy), admin=admin)
        result["audit_one_namespace"] = run_audit(args.kubeconfig, str(policy), namespace="bench-00", admin=admin)
        result["audit_table"] = run_audit(args.kubeconfig, str(policy), output="table")
        if args.server:
            result["server"] = server_audit(args.kubeconfig, str(policy), workdir)
        if args.grow:
            result["grown"] = generate(admin, args.grow, 0, args.namespaces, start=args.pods)
            result["audit_grown"] = run_audit(args.kubeconfig, str(policy), admin=admin)
        result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if plane is not None:
            plane.stop()


if __name__ == "__main__":
    main()
