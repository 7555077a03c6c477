"""Admission time per pod creation through a real kube-apiserver, five ways side by side in one run.

    .venv/bin/python -m bench.admission_paths                     # 3 rounds of 200 creates per configuration
    .venv/bin/python -m bench.admission_paths --creates 5 --rounds 1 --corpus 20 --memory-rounds 0  # smoke
    .venv/bin/python -m bench.admission_paths --before 90e4bde --policy default     # before/after, default policy

One control plane (tests/e2e/cluster.py: the main bed's kube-apiserver, v1.37.2 today, and etcd on loopback, built
by ``tests/prepare control-plane``; ``--kubernetes v1.30.14``: that version's kube-apiserver of the test matrix, built
by ``tests/prepare matrix``), one ``gpu-webhook serve`` on loopback (one worker), and five namespaces (seven
with ``--before``), one per configuration, all live at once so that rounds interleave without waiting for the
apiserver to pick up changes:

- ``bench-none``: nothing of ours applies (every webhook configuration excludes it, no binding selects it);
- ``bench-webhook``: the chart's webhook configurations (mutate + validate, ``helm template`` with ``webhook.url``);
- ``bench-inline``: today's generator with ``nativePolicies.params: inline`` (the policy's values written into the
  CEL), every object renamed ``inline-...`` and relabelled, bindings narrowed to the namespaces labelled
  ``gw-bench/native-inline=true``;
- ``bench-params``: the live mode (the default): the GPUPolicy CRD (``webhook.core.policycrd.crd()``),
  GPUPolicy/default holding the policy, then ``gpu-webhook admission-policies --policy P --apply``, each binding
  then narrowed by ``matchResources.namespaceSelector`` to the namespaces labelled ``gw-bench/native=true``;
- ``bench-hybrid``: the same live policies and the chart's configurations rendered with
  ``admissionPolicies.enabled=true`` (a second release name: its own configurations, with the hybrid
  ``matchConditions``);
- with ``--before REF``, ``bench-native-before`` and ``bench-hybrid-before``: the same two from the tree at REF
  (``git archive`` of its webhook/ and charts/): its ``admission-policies`` output, each object renamed
  ``before-...`` and relabelled so that today's generator neither prunes nor patches it, bindings narrowed to
  the namespaces labelled ``gw-bench/native-before=true``; its chart's hybrid configurations (release
  ``gw-hybrid-before``). The webhook server is today's in every configuration.

``--policy bench`` (the default) is the bench's policy below; ``--policy default`` is the embedded default policy,
for the generator, the webhook server and the charts alike.

``--cluster`` turns the cluster checks on (``cluster: {enabled: true}``) in that policy, everywhere: the webhook
server then reads GPUPolicy/default (``--policy-object``) and the cluster, and writes the cluster's facts into the
object's status, which the live policies read; the plane gets GPU nodes of every model the policy allows (8 GPUs
each), so that the measured pod can run. ``hybrid`` is then hybrid mode with the cluster checks (the webhook
configurations of ``policy.cluster.enabled``), against ``webhook``, the webhook with them.

Each round sends, per configuration in turn, ``--creates`` server-side dry-run creates of a 7-container GPU pod (one
kept-alive connection, one request at a time) and reads the apiserver's own
``apiserver_admission_step_admission_duration_seconds`` (sum and count of CREATEs, per step type) before and after:
the mean per step is the delta of the sum over the delta of the count. Also per create: the client's wall time,
the kube-apiserver's CPU time (utime+stime of /proc/<pid>/stat over the creates: request handling, decoding,
defaulting and the dry-run included, so "none" is the floor and the difference to it is admission's share), the
webhook server's (its process and children), and the apiserver's per-policy
``apiserver_validating_admission_policy_check_duration_seconds``. Reported: medians over rounds, client
percentiles over every create, ratios to "none". Then a corpus of mixed objects (GPU and CPU pods,
workloads, PyTorchJobs, pods with DRA claims, some breaking the policy) goes once to the webhook and once to the
hybrid namespace, and the webhook's decision log says how many admission requests each one cost it.

Then (``--memory-rounds``, default 1) the kube-apiserver's memory, one fresh control plane per mode and round:
none, inline, params (CRD + GPUPolicy/default + the live objects); VmRSS and the Go heap in use after 20 GPU pod
dry-runs and 5 s, before and after the mode's objects are applied and enforced.

Results go to stdout (JSON, then Markdown tables) and to bench/results/admission-paths.json.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import json
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.stats import percentile

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "admission-paths.json"
CHART = ROOT / "charts" / "gpu-webhook"
PYTORCHJOB_CRD = ROOT / "tests" / "e2e" / "pytorchjob-crd.yaml"
CONFIGS = ("none", "webhook", "inline", "params", "hybrid")
BEFORE_CONFIGS = ("none", "webhook", "native-before", "inline", "params", "hybrid-before", "hybrid")
NAMESPACES = {c: f"bench-{c}" for c in BEFORE_CONFIGS}
NATIVE_LABEL = "gw-bench/native"  # params and hybrid: today's admission-policies --apply (live, the default)
INLINE_LABEL = "gw-bench/native-inline"
BEFORE_LABEL = "gw-bench/native-before"
BEFORE_PREFIX = "before-"
BEFORE_COMPONENT = "admission-policies-before"  # not today's label: its --apply would prune them
INLINE_PREFIX = "inline-"
INLINE_COMPONENT = "admission-policies-inline"
MODES = ("none", "inline", "params")  # the apiserver's memory, one fresh control plane each
POLICY_SELECTOR = "app.kubernetes.io/name=gpu-webhook,app.kubernetes.io/component=admission-policies"
STEP = "apiserver_admission_step_admission_duration_seconds"
POLICY_CHECK = "apiserver_validating_admission_policy_check_duration_seconds"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The checks the generator leaves to the webhook are off: with either on (the default is warn), hybrid mode
# keeps sending every GPU object to /validate (charts/gpu-webhook/README.md), and the bench would measure the
# webhook twice.
POLICY = {
    "accelerator": {"allowed": ["nvidia-tesla-p100", "nvidia-tesla-k80", "nvidia-l4"], "default": "nvidia-tesla-k80"},
    "limits": {"perContainer": 4, "perPod": 8},
    "checks": {"processCountMismatch": "off", "replicaAcceleratorMismatch": "off"},
}
POLICIES: dict[str, dict[str, Any] | None] = {"bench": POLICY, "default": None}  # None: the embedded default
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

    def scrape(self) -> dict[str, Any]:
        """From one read of the apiserver's /metrics: {"steps": {step type: (sum seconds, count)}} of admitted
        CREATEs, and {"policies": {"validating/<policy>": (sum seconds, count)}} of the admission policies' checks
        (any operation: the bench sends only CREATEs)."""
        status, payload, _ = self.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        steps: dict[str, list[float]] = {}
        policies: dict[str, list[float]] = {}
        for line in payload.decode().splitlines():
            for suffix, slot in (("_sum{", 0), ("_count{", 1)):
                if line.startswith(STEP + suffix) and 'operation="CREATE"' in line and 'rejected="false"' in line:
                    step = line.split('type="', 1)[1].split('"', 1)[0]
                    steps.setdefault(step, [0.0, 0.0])[slot] += float(line.rsplit(" ", 1)[1])
                for kind in ("validating", "mutating"):
                    name = f"apiserver_{kind}_admission_policy_check_duration_seconds"
                    if line.startswith(name + suffix) and 'policy="' in line:
                        policy = line.split('policy="', 1)[1].split('"', 1)[0]
                        policies.setdefault(f"{kind}/{policy}", [0.0, 0.0])[slot] += float(line.rsplit(" ", 1)[1])
        return {"steps": {k: (v[0], v[1]) for k, v in steps.items()},
                "policies": {k: (v[0], v[1]) for k, v in policies.items()}}

    def step_totals(self) -> dict[str, tuple[float, float]]:
        """{step type: (sum seconds, count)} of admitted CREATEs, from the apiserver's /metrics."""
        return self.scrape()["steps"]

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5), after pid and comm


def descendants(pid: int) -> list[int]:
    """pid and every live process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(parents.get(current, []))
    return found


def tree_cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


MAP_V1 = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def render_webhooks(helm: str, release: str, url: str, ca: Path, exclude: list[str], hybrid: bool,
                    workdir: Path, policy: dict[str, Any] | None = POLICY, chart: Path = CHART,
                    served: tuple[str, str] = ("v1.37.0", MAP_V1)) -> list[dict[str, Any]]:
    """The chart's two webhook configurations in ``webhook.url`` mode, as ``helm template`` renders them for
    ``served``: the apiserver's version and the MutatingAdmissionPolicy it serves ("" for none)."""
    values: dict[str, Any] = {
        "webhook": {"url": url, "excludeNamespaces": exclude,
                    "customResources": [{"apiGroups": ["kubeflow.org"], "apiVersions": ["*"],
                                         "resources": ["pytorchjobs"]}]},
        "certs": {"mode": "secret", "secret": {"name": "unused-in-url-mode",
                                               "caBundle": base64.b64encode(ca.read_bytes()).decode()}},
        "admissionPolicies": {"enabled": hybrid},
    }
    if policy is not None:
        values["policy"] = policy
    values_file = workdir / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = subprocess.run(
        [helm, "template", release, str(chart), "--namespace", "gpu-system", "--values", str(values_file),
         "--show-only", "templates/webhooks.yaml", "--set", "image.repository=localhost/gpu-webhook",
         "--kube-version", served[0], *(["--api-versions", served[1]] if served[1] else [])],
        capture_output=True, text=True, timeout=120, check=False)
    if result.returncode:
        raise RuntimeError(f"helm template {release}: {result.stderr}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def kubectl(plane: Any, *args: str, stdin: str | None = None) -> str:
    done = plane.kubectl(*args, stdin=stdin)
    if done.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def export_tree(ref: str, into: Path) -> str:
    """webhook/ and charts/ of ``ref`` under ``into`` (``git archive``: no worktree, nothing written to the
    repository); the commit it names."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, "webhook", "charts"],
                             capture_output=True, timeout=60, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, timeout=60, check=True)
    return commit


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def generate_before(tree: Path, policy_file: Path | None) -> tuple[list[dict[str, Any]], str]:
    """The old tree's ``admission-policies`` output (offline: stdout), with what it said on stderr."""
    where = subprocess.run([sys.executable, "-c", "import webhook; print(webhook.__file__)"], cwd=tree,
                           env=tree_env(tree), capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the old tree's generator would import {where}, not the tree under {tree}")
    args = ["--policy", str(policy_file)] if policy_file else []
    done = subprocess.run([sys.executable, "-m", "webhook", "admission-policies", *args], cwd=tree,
                          env=tree_env(tree), capture_output=True, text=True, timeout=300, check=False)
    if done.returncode:
        raise RuntimeError(f"admission-policies of the old tree: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d], done.stderr


def rename_before(documents: list[dict[str, Any]], prefix: str = BEFORE_PREFIX,
                  label: str = BEFORE_LABEL, component: str = BEFORE_COMPONENT) -> list[dict[str, Any]]:
    """The old generator's objects (or the inline ones) under names of their own: ``prefix`` before every name and
    policyName, a component label (``component``) today's ``admission-policies --apply`` does not prune, bindings
    narrowed to the namespaces labelled ``label=true``."""
    renamed = []
    for document in documents:
        document = json.loads(json.dumps(document))  # a deep copy, YAML anchors undone
        metadata = document["metadata"]
        metadata["name"] = prefix + metadata["name"]
        metadata.setdefault("labels", {})["app.kubernetes.io/component"] = component
        if document["kind"].endswith("Binding"):
            document["spec"]["policyName"] = prefix + document["spec"]["policyName"]
            document["spec"].setdefault("matchResources", {})["namespaceSelector"] = {"matchLabels": {label: "true"}}
        renamed.append(document)
    return renamed


def inline_document(policy: dict[str, Any] | None) -> dict[str, Any]:
    """``policy`` (None: the embedded default, i.e. no keys) with ``nativePolicies.params: inline``."""
    document = json.loads(json.dumps(policy or {}))
    document.setdefault("nativePolicies", {})["params"] = "inline"
    return document


def generate_here(plane: Any, document: dict[str, Any]) -> list[dict[str, Any]]:
    """Today's generator on ``document``, for what the bed's apiserver serves (offline: nothing applied)."""
    from webhook.cli.policies import discover
    from webhook.core.policyfile import parse_policy
    from webhook.kube.client import Kube
    from webhook.native.generate import generate

    kube = Kube.connect(str(plane.kubeconfig), timeout=30.0)
    try:
        target = discover(kube)
    finally:
        kube.close()
    return generate(parse_policy(yaml.safe_dump(document)), target).objects


def install_policy_object(plane: Any, policy: dict[str, Any] | None) -> dict[str, Any]:
    """The GPUPolicy CRD (``webhook.core.policycrd.crd()``, as the chart installs it) and GPUPolicy/default holding
    ``policy`` (as the generator writes it, through ``policycrd.as_spec``), which the live policies read."""
    from webhook.core import policycrd
    from webhook.core.policyfile import parse_policy
    from webhook.native.generate import policy_object

    definition = policycrd.crd()
    kubectl(plane, "apply", "--server-side", "--field-manager=gw-bench", "-f", "-", stdin=json.dumps(definition))
    kubectl(plane, "wait", "--for=condition=Established", f"crd/{definition['metadata']['name']}", "--timeout=30s")
    obj = policy_object(parse_policy(yaml.safe_dump(policy or {})))
    obj["spec"] = policycrd.as_spec(obj["spec"])
    deadline = time.monotonic() + 30
    while True:  # discovery catches up a moment after Established
        done = plane.kubectl("apply", "--server-side", "--field-manager=gw-bench", "-f", "-", stdin=json.dumps(obj))
        if not done.returncode:
            return obj
        if time.monotonic() > deadline:
            raise RuntimeError(f"cannot apply GPUPolicy/default: {done.stderr}")
        time.sleep(0.5)


def apply_params(plane: Any, workdir: Path, policy: dict[str, Any] | None) -> str:
    """The params configuration: the CRD, GPUPolicy/default, then ``admission-policies --apply`` (live mode, the
    default); what it said on stderr."""
    install_policy_object(plane, policy)
    policy_file = None
    if policy is not None:
        policy_file = workdir / "policy.yaml"
        policy_file.write_text(yaml.safe_dump(policy))
    args = ["--policy", str(policy_file)] if policy_file else []
    # --apply waits until the apiserver enforces the policies; a loaded bench machine may need longer than its default.
    done = subprocess.run([sys.executable, "-m", "webhook", "admission-policies", *args,
                           "--apply", "--wait", "300", "--kubeconfig", str(plane.kubeconfig)],
                          capture_output=True, text=True, timeout=400, check=False)
    if done.returncode:
        raise RuntimeError(f"admission-policies --apply: {done.stderr}")
    return done.stderr


def apply_inline(plane: Any, policy: dict[str, Any] | None, label: str = INLINE_LABEL) -> list[str]:
    """The inline configuration: today's generator with ``nativePolicies.params: inline``, every object renamed
    ``inline-...`` and relabelled (``--apply`` neither prunes nor patches it), bindings narrowed to the namespaces
    labelled ``label=true``; server-side (the inline custom-kind policy is over 256 KiB, too large for the
    annotation a client-side apply writes). The objects applied."""
    objects = rename_before(generate_here(plane, inline_document(policy)), INLINE_PREFIX, label, INLINE_COMPONENT)
    kubectl(plane, "apply", "--server-side", "--field-manager=gw-bench", "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return [f"{d['kind']}/{d['metadata']['name']}" for d in objects]


def namespace(plane: Any, config: str) -> None:
    labels = ({NATIVE_LABEL: "true"} if config in ("params", "hybrid")
              else {INLINE_LABEL: "true"} if config == "inline"
              else {BEFORE_LABEL: "true"} if config in ("native-before", "hybrid-before") else {})
    kubectl(plane, "apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACES[config], "labels": labels}}))


def set_up(plane: Any, server: Any, workdir: Path, configs: tuple[str, ...] = CONFIGS,
           policy: dict[str, Any] | None = POLICY, before: Path | None = None) -> dict[str, Any]:
    """Namespaces, today's policies (live with GPUPolicy/default, and inline) and webhook configurations, and with
    ``before`` the old tree's; what the generators said on stderr."""
    for config in configs:
        namespace(plane, config)
    kubectl(plane, "apply", "-f", str(PYTORCHJOB_CRD))
    kubectl(plane, "wait", "--for=condition=Established", "crd/pytorchjobs.kubeflow.org", "--timeout=30s")
    said: dict[str, Any] = {"after": apply_params(plane, workdir, policy),
                            "inline_objects": apply_inline(plane, policy)}
    selector = {"spec": {"matchResources": {"namespaceSelector": {"matchLabels": {NATIVE_LABEL: "true"}}}}}
    served = served_by(plane)
    for kind in ("validatingadmissionpolicybinding", "mutatingadmissionpolicybinding")[:2 if served[1] else 1]:
        for name in kubectl(plane, "get", kind, "-l", POLICY_SELECTOR, "-o", "name").split():
            kubectl(plane, "patch", name, "--type=merge", "-p", json.dumps(selector))
    policy_file = None
    if policy is not None:
        policy_file = workdir / "policy.yaml"
        policy_file.write_text(yaml.safe_dump(policy))
    releases = [("gpu-webhook", "webhook", False, CHART), ("gw-hybrid", "hybrid", True, CHART)]
    if before is not None:
        documents, said["before"] = generate_before(before, policy_file)
        said["before_objects"] = [f"{d['kind']}/{d['metadata']['name']}" for d in rename_before(documents)]
        # Server-side: the old policies are large, and a client-side apply copies each into an annotation.
        kubectl(plane, "apply", "--server-side", "--field-manager=gw-bench", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": rename_before(documents)}))
        releases.append(("gw-hybrid-before", "hybrid-before", True, before / "charts" / "gpu-webhook"))
    others = [NAMESPACES[c] for c in configs]
    for release, config, hybrid, chart in releases:
        documents = render_webhooks(plane.binary("helm"), release, server.address, server.ca,
                                    [n for n in others if n != NAMESPACES[config]], hybrid, workdir, policy, chart,
                                    served)
        kubectl(plane, "apply", "-f", "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))
    return said


def served_by(plane: Any) -> tuple[str, str]:
    """The apiserver's version and the MutatingAdmissionPolicy group/version/kind it serves ("" for none), as
    ``helm template`` takes them."""
    version = json.loads(kubectl(plane, "get", "--raw", "/version"))["gitVersion"]
    group = json.loads(kubectl(plane, "get", "--raw", "/apis/admissionregistration.k8s.io"))
    for entry in group["versions"]:
        resources = json.loads(kubectl(plane, "get", "--raw", f"/apis/{entry['groupVersion']}"))["resources"]
        if any(r["kind"] == "MutatingAdmissionPolicy" for r in resources):
            return version, f"{entry['groupVersion']}/MutatingAdmissionPolicy"
    return version, ""


def conflict_pod(name: str) -> dict[str, Any]:
    """A GPU pod whose annotation and nodeSelector name different accelerators: refused by every policy."""
    body = gpu_pod(name, containers=1, selector="model-b")
    body["metadata"]["annotations"] = {"gpu-webhook/accelerator": "model-a"}
    return body


def refused_by(message: str) -> str:
    """Who refused the probe, from the apiserver's message: the webhook, a deny policy (any of a family's cut to
    size, ``-2``, ``-3``, as the family's first: the apiserver names whichever it evaluated first of those the probe
    violates, and with the cluster checks the cluster rules' policy refuses it too), something else, or nobody."""
    from webhook.native.probes import refusing_policy

    policy = re.sub(r"-[0-9]+$", "", refusing_policy(message) or "")
    return ("webhook" if 'admission webhook "validate.gpu-webhook.io"' in message
            else f"native:{policy}" if policy
            else f"other: {message[:200]}" if message else "nobody")


def probe(api: Api, configs: tuple[str, ...] = CONFIGS) -> dict[str, str]:
    """Who refuses a pod with conflicting accelerators and who injects the default accelerator, per namespace."""
    seen = {}
    for config in configs:
        namespace = NAMESPACES[config]
        status, answer, _ = api.dry_run(conflict_pod("probe-conflict"), namespace)
        refused = refused_by(answer.get("message", "") if status != 201 else "")
        status, answer, _ = api.dry_run(gpu_pod("probe-default", containers=1), namespace)
        injected = ((answer.get("spec") or {}).get("nodeSelector") or {}).get("accelerator") if status == 201 else None
        seen[config] = f"{refused}/{injected}"
    return seen


def default_accelerator(policy: dict[str, Any] | None) -> str | None:
    return ((policy or {}).get("accelerator") or {}).get("default") or None


def expected(configs: tuple[str, ...], policy: dict[str, Any] | None,
             before_objects: Sequence[str] = ()) -> dict[str, str]:
    """What the probe must see: refused by the webhook or the deny policy of the configuration's generator, the
    policy's default accelerator injected (the embedded default policy has none). The old tree's deny policy is
    ``gpu-webhook-live-deny`` where it generated the live policies (``before_objects``: ``kind/name`` of its
    objects), ``gpu-webhook-deny`` otherwise."""
    injected = default_accelerator(policy)
    live_before = f"ValidatingAdmissionPolicy/{BEFORE_PREFIX}gpu-webhook-live-deny" in before_objects
    before = f"native:{BEFORE_PREFIX}gpu-webhook-{'live-' if live_before else ''}deny"
    who = {"none": "nobody", "webhook": "webhook", "params": "native:gpu-webhook-live-deny",
           "inline": f"native:{INLINE_PREFIX}gpu-webhook-deny",
           "hybrid": "native:gpu-webhook-live-deny", "native-before": before, "hybrid-before": before}
    return {c: f"{who[c]}/{None if c == 'none' else injected}" for c in configs}


EXPECTED = expected(CONFIGS, POLICY)


def wait_configured(api: Api, configs: tuple[str, ...] = CONFIGS, policy: dict[str, Any] | None = POLICY,
                    timeout: float = 60, before_objects: Sequence[str] = ()) -> dict[str, str]:
    """The apiserver picks configurations and policies up asynchronously: wait until every namespace behaves."""
    want = expected(configs, policy, before_objects)
    deadline = time.monotonic() + timeout
    while True:
        seen = probe(api, configs)
        if seen == want:
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(f"the configurations never took effect: {seen}, expected {want}")
        time.sleep(0.5)


def admissions(server: Any) -> Counter[tuple[str, str, str]]:
    """(namespace, endpoint, kind) of every admission the webhook logged so far."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for line in server.log_lines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("event") == "admission":
                counts[(entry.get("namespace") or "", entry.get("endpoint") or "", entry.get("kind") or "")] += 1
    return counts


def webhook_requests(server: Any) -> Counter[tuple[str, str]]:
    """(namespace, endpoint) of every admission the webhook logged so far."""
    counts: Counter[tuple[str, str]] = Counter()
    for (namespace, endpoint, _), n in admissions(server).items():
        counts[(namespace, endpoint)] += n
    return counts


def deltas(after: dict[str, tuple[float, float]], before: dict[str, tuple[float, float]]) -> dict[str, Any]:
    moved = {}
    for key in sorted(set(after) | set(before)):
        total, count = after.get(key, (0.0, 0.0))
        total0, count0 = before.get(key, (0.0, 0.0))
        if count - count0 > 0:
            moved[key] = {"mean_ms": 1000 * (total - total0) / (count - count0), "count": count - count0}
    return moved


def measure_round(api: Api, server: Any, config: str, creates: int, round_no: int,
                  policy: dict[str, Any] | None = POLICY, apiserver_pid: int | None = None) -> dict[str, Any]:
    namespace = NAMESPACES[config]
    want = None if config == "none" else default_accelerator(policy)
    for i in range(3):  # warm: connections to the webhook, the policies' compiled programs
        api.dry_run(gpu_pod(f"warm-{i}"), namespace)
    load = os.getloadavg()[0]
    server_pids = descendants(server.proc.pid)
    before_hook = webhook_requests(server)
    before = api.scrape()
    cpu0 = cpu_seconds(apiserver_pid) if apiserver_pid else None
    hook0 = tree_cpu_seconds(server_pids)
    walls, failures = [], 0
    for i in range(creates):
        status, answer, seconds = api.dry_run(gpu_pod(f"r{round_no}-{i}"), namespace)
        walls.append(1000 * seconds)
        if status != 201 or (answer["spec"].get("nodeSelector") or {}).get("accelerator") != want:
            failures += 1
    cpu1 = cpu_seconds(apiserver_pid) if apiserver_pid else None
    hook1 = tree_cpu_seconds(server_pids)
    after = api.scrape()
    after_hook = webhook_requests(server)
    return {"config": config, "round": round_no, "creates": creates, "unexpected_answers": failures,
            "steps": deltas(after["steps"], before["steps"]),
            "policy_checks": deltas(after["policies"], before["policies"]),
            "wall_median_ms": statistics.median(walls), "wall_p99_ms": percentile(walls, 99),
            "walls_ms": walls, "load_average_1m": round(load, 2),
            "apiserver_cpu_ms": None if cpu0 is None or cpu1 is None else 1000 * (cpu1 - cpu0) / creates,
            "webhook_cpu_ms": 1000 * (hook1 - hook0) / creates,
            "webhook_requests": sum(after_hook.values()) - sum(before_hook.values())}


def _median_range(values: list[float]) -> tuple[float | None, list[float] | None]:
    return (statistics.median(values), [min(values), max(values)]) if values else (None, None)


def summarise(rounds: list[dict[str, Any]], configs: tuple[str, ...] = CONFIGS) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for config in configs:
        mine = [r for r in rounds if r["config"] == config]
        entry: dict[str, Any] = {"rounds": len(mine), "creates": sum(r["creates"] for r in mine),
                                 "unexpected_answers": sum(r["unexpected_answers"] for r in mine),
                                 "webhook_requests": sum(r["webhook_requests"] for r in mine)}
        for step in ("admit", "validate"):
            entry[f"{step}_ms"], entry[f"{step}_ms_range"] = _median_range(
                [r["steps"][step]["mean_ms"] for r in mine if step in r["steps"]])
        entry["total_ms"], entry["total_ms_range"] = _median_range(
            [sum(s["mean_ms"] for s in r["steps"].values()) for r in mine])
        entry["wall_ms"], entry["wall_ms_range"] = _median_range([r["wall_median_ms"] for r in mine])
        walls = [w for r in mine for w in r.get("walls_ms", [])]
        entry["wall_p50_ms"] = percentile(walls, 50) if walls else None
        entry["wall_p99_ms"] = percentile(walls, 99) if walls else None
        entry["apiserver_cpu_ms"], entry["apiserver_cpu_ms_range"] = _median_range(
            [r["apiserver_cpu_ms"] for r in mine if r.get("apiserver_cpu_ms") is not None])
        entry["webhook_cpu_ms"], entry["webhook_cpu_ms_range"] = _median_range(
            [r["webhook_cpu_ms"] for r in mine if r.get("webhook_cpu_ms") is not None])
        checks: dict[str, list[float]] = {}
        for r in mine:
            for name, moved in r.get("policy_checks", {}).items():
                checks.setdefault(name, []).append(moved["mean_ms"])
        entry["policy_checks_ms"] = {name: statistics.median(values) for name, values in sorted(checks.items())}
        entry["load_average_1m"] = [r.get("load_average_1m") for r in mine]
        summary[config] = entry
    base = summary["none"]
    for entry in summary.values():
        entry["total_x_none"] = entry["total_ms"] / base["total_ms"] if base["total_ms"] else None
        entry["wall_x_none"] = entry["wall_ms"] / base["wall_ms"] if base["wall_ms"] else None
        entry["apiserver_cpu_over_none_ms"] = (
            entry["apiserver_cpu_ms"] - base["apiserver_cpu_ms"]
            if entry["apiserver_cpu_ms"] is not None and base["apiserver_cpu_ms"] is not None else None)
    return summary


def traffic(api: Api, server: Any, size: int, configs: tuple[str, ...] = ("webhook", "hybrid")) -> dict[str, Any]:
    """The corpus, dry-run once in the webhook's namespace and once in each hybrid one: webhook requests each."""
    objects = corpus(size)
    kinds = Counter(o["kind"] for o in objects)
    result: dict[str, Any] = {"objects": len(objects), "kinds": dict(kinds)}
    for config in configs:
        namespace = NAMESPACES[config]
        before = admissions(server)
        outcomes: Counter[str] = Counter()
        for obj in objects:
            status, answer, _ = api.dry_run(obj, namespace)
            message = answer.get("message", "") if status != 201 else ""
            outcomes["admitted" if status == 201 else "refused by the webhook" if "gpu-webhook.io" in message
                     else "refused by a ValidatingAdmissionPolicy" if "ValidatingAdmissionPolicy" in message
                     else f"other {status}"] += 1
        after = admissions(server)
        moved = {key: after[key] - before[key] for key in after if key[0] == namespace and after[key] > before[key]}
        by_endpoint: Counter[str] = Counter()
        by_kind: Counter[str] = Counter()
        for (_, endpoint, kind), n in moved.items():
            by_endpoint[endpoint] += n
            by_kind[f"{endpoint} {kind}"] += n
        result[config] = {"webhook_requests": sum(by_endpoint.values()), "by_endpoint": dict(by_endpoint),
                          "by_endpoint_and_kind": dict(sorted(by_kind.items())), "outcomes": dict(outcomes)}
    hooked = result["webhook"]["webhook_requests"]
    for config in configs:
        if config != "webhook":
            share = result[config]["webhook_requests"] / hooked if hooked else None
            result[f"{config.replace('-', '_')}_share_of_webhook_only"] = share
    return result


def table(summary: dict[str, Any]) -> str:
    def ms(value: float | None, span: list[float] | None = None) -> str:
        return "-" if value is None else f"{value:.2f} ({span[0]:.2f}-{span[1]:.2f})" if span else f"{value:.2f}"

    lines = ["| configuration | mutating step ms | validating step ms | admission total ms | × none | "
             "client p50 / p99 ms | apiserver CPU ms / create (− none) | webhook CPU ms / create | "
             "webhook requests |", "|---|---|---|---|---|---|---|---|---|"]
    for config, e in summary.items():
        over = e.get("apiserver_cpu_over_none_ms")
        lines.append(f"| {config} | {ms(e['admit_ms'], e['admit_ms_range'])} | "
                     f"{ms(e['validate_ms'], e['validate_ms_range'])} | {ms(e['total_ms'], e['total_ms_range'])} | "
                     f"{e['total_x_none']:.1f} | {ms(e.get('wall_p50_ms'))} / {ms(e.get('wall_p99_ms'))} | "
                     f"{ms(e.get('apiserver_cpu_ms'))} ({'-' if over is None else f'{over:+.2f}'}) | "
                     f"{ms(e.get('webhook_cpu_ms'))} | {e['webhook_requests']} / {e['creates']} creates |")
    return "\n".join(lines)


MEMORY_GAUGES = ("go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes")


def process_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, MB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = round(int(rest.split()[0]) / 1024, 1)
    return found


def gauges(api: Api) -> dict[str, float]:
    """The apiserver's Go memory gauges (MB) from its /metrics."""
    status, payload, _ = api.request("GET", "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    found = {}
    for line in payload.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in MEMORY_GAUGES:
            found[name] = round(float(value) / 2**20, 1)
    return found


def memory_sample(api: Api, pid: int, namespace: str, creates: int, settle: float) -> dict[str, float]:
    """After ``creates`` dry-run creates of the GPU pod in ``namespace`` and ``settle`` seconds: RSS and heap."""
    for i in range(creates):
        api.dry_run(gpu_pod(f"mem-{i}"), namespace)
    time.sleep(settle)
    return {**process_memory(pid), **gauges(api)}


def memory(bin_dir: Path, workdir: Path, policy: dict[str, Any] | None, rounds: int, creates: int = 20,
           settle: float = 5.0, bed: Any = None) -> dict[str, Any]:
    """The kube-apiserver's memory with nothing of ours (none), the inline objects, and the live ones with the CRD and
    GPUPolicy/default (params): one fresh control plane per mode and round; in each, RSS (and the Go heap) after
    ``creates`` GPU pod dry-runs and ``settle`` s, before and after the mode's objects are applied and enforced."""
    from tests.e2e.cluster import ADMIN_TOKEN, ControlPlane

    samples = []
    for round_no in range(rounds):
        for mode in MODES:
            where = workdir / f"memory-{mode}-{round_no}"
            where.mkdir()
            plane = ControlPlane(bin_dir, where, bed)
            plane.start()
            api = Api(plane.url, ADMIN_TOKEN, plane.ca_file)
            try:
                pid = next(p.proc.pid for p in reversed(plane.processes) if p.name == "kube-apiserver")
                namespace(plane, mode)
                kubectl(plane, "apply", "-f", str(PYTORCHJOB_CRD))
                kubectl(plane, "wait", "--for=condition=Established", "crd/pytorchjobs.kubeflow.org",
                        "--timeout=30s")
                before = memory_sample(api, pid, NAMESPACES[mode], creates, settle)
                objects = 0
                if mode == "params":
                    apply_params(plane, where, policy)
                    objects = len(kubectl(plane, "get", "validatingadmissionpolicies,mutatingadmissionpolicies,"
                                          "validatingadmissionpolicybindings,mutatingadmissionpolicybindings",
                                          "-l", POLICY_SELECTOR, "-o", "name").split())
                elif mode == "inline":
                    objects = len(apply_inline(plane, policy))
                wait_configured(api, (mode,), policy)
                after = memory_sample(api, pid, NAMESPACES[mode], creates, settle)
                samples.append({"mode": mode, "round": round_no, "objects": objects, "before": before,
                                "after": after})
            finally:
                api.close()
                plane.stop()
    summary: dict[str, Any] = {}
    for mode in MODES:
        mine = [s for s in samples if s["mode"] == mode]
        summary[mode] = {
            "rss_mb": statistics.median(s["after"]["VmRSS"] for s in mine),
            "rss_over_start_mb": statistics.median(s["after"]["VmRSS"] - s["before"]["VmRSS"] for s in mine),
            "heap_inuse_mb": statistics.median(s["after"]["go_memstats_heap_inuse_bytes"] for s in mine),
            "heap_inuse_over_start_mb": statistics.median(
                s["after"]["go_memstats_heap_inuse_bytes"] - s["before"]["go_memstats_heap_inuse_bytes"]
                for s in mine),
            "objects": mine[0]["objects"],
        }
    for mode in MODES:
        for key in ("rss_mb", "heap_inuse_mb"):
            summary[mode][key.replace("_mb", "_over_none_mb")] = round(summary[mode][key] - summary["none"][key], 1)
    return {"rounds": rounds, "creates": creates, "settle_s": settle, "samples": samples, "summary": summary}


def memory_table(result: dict[str, Any]) -> str:
    lines = ["| mode | objects | apiserver RSS MB (over none) | RSS growth on apply MB | Go heap in use MB (over none) "
             "| heap growth on apply MB |", "|---|---|---|---|---|---|"]
    for mode, e in result["summary"].items():
        lines.append(f"| {mode} | {e['objects']} | {e['rss_mb']:.1f} ({e['rss_over_none_mb']:+.1f}) | "
                     f"{e['rss_over_start_mb']:+.1f} | "
                     f"{e['heap_inuse_mb']:.1f} ({e['heap_inuse_over_none_mb']:+.1f}) | "
                     f"{e['heap_inuse_over_start_mb']:+.1f} |")
    return "\n".join(lines)


def ratios(summary: dict[str, Any]) -> dict[str, float | None]:
    """Admission total of params over inline, and of each over the webhook's (issue 34's goal: params <= 1.2 x
    inline)."""
    def over(a: str, b: str) -> float | None:
        if a not in summary or b not in summary or not summary[b]["total_ms"]:
            return None
        return round(summary[a]["total_ms"] / summary[b]["total_ms"], 2)

    return {"params_over_inline": over("params", "inline"), "params_over_webhook": over("params", "webhook"),
            "inline_over_webhook": over("inline", "webhook"), "hybrid_over_webhook": over("hybrid", "webhook")}


CLUSTER_GPUS = 8  # per node: the measured pod asks for 7


def with_cluster(policy: dict[str, Any] | None) -> dict[str, Any]:
    """``policy`` (None: the embedded default) with the cluster checks on."""
    return {**(policy or {}), "cluster": {"enabled": True}}


def add_nodes(plane: Any, policy: dict[str, Any]) -> list[str]:
    """A node of each model the policy allows (one unlabelled where it names none), each with CLUSTER_GPUS GPUs and
    its status in the create, as a kubelet registers it."""
    models = (policy.get("accelerator") or {}).get("allowed") or [None]
    names = []
    for n, model in enumerate(models):
        name = f"gpu-{n}"
        resources = {"cpu": "64", "memory": "256Gi", "pods": "110", GPU: str(CLUSTER_GPUS)}
        labels = {"kubernetes.io/hostname": name, **({"accelerator": model} if model else {})}
        kubectl(plane, "create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": resources, "allocatable": resources}}))
        names.append(name)
    return names


def facts_written(plane: Any, nodes: int, timeout: float = 120) -> dict[str, Any]:
    """Wait until the webhook's status writer has written the cluster's facts (every node counted)."""
    deadline = time.monotonic() + timeout
    while True:
        done = plane.kubectl("get", "gpupolicy", "default", "-o", "json")
        cluster = ((json.loads(done.stdout).get("status") or {}).get("cluster") or {}) if not done.returncode else {}
        counted = sum(m.get("nodes", 0) for m in (cluster.get("models") or {}).values())
        if cluster.get("writtenAt") and (counted >= nodes or "extendedResources" in cluster and not cluster["models"]):
            return cluster
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster's facts were never written: {cluster}")
        time.sleep(0.5)


def run(plane: Any, creates: int, rounds: int, corpus_size: int, workdir: Path, policy_name: str = "bench",
        before_ref: str | None = None, cluster: bool = False) -> dict[str, Any]:
    from tests.e2e.cluster import ADMIN_TOKEN
    from tests.server import make_certs, start_webhook

    policy = with_cluster(POLICIES[policy_name]) if cluster else POLICIES[policy_name]
    configs = BEFORE_CONFIGS if before_ref else CONFIGS
    before_tree, before_commit = None, None
    if before_ref:
        before_tree = workdir / "before"
        before_commit = export_tree(before_ref, before_tree)
    args = ["--workers", "1"]
    facts: dict[str, Any] = {}
    if cluster:
        assert policy is not None
        facts["nodes"] = add_nodes(plane, policy)
        install_policy_object(plane, policy)
        args += ["--kubeconfig", str(plane.kubeconfig), "--policy-object", "default",
                 "--status-lease", "default/gpu-webhook-status"]
    elif policy is not None:
        policy_file = workdir / "webhook-policy.yaml"
        policy_file.write_text(yaml.safe_dump(policy))
        args += ["--policy", str(policy_file)]
    server = start_webhook(workdir, *args, certs=make_certs(workdir / "tls", "127.0.0.1"))
    api = Api(plane.url, ADMIN_TOKEN, plane.ca_file)
    apiserver_pid = next(p.proc.pid for p in reversed(plane.processes) if p.name == "kube-apiserver")
    try:
        if cluster:
            facts["written"] = facts_written(plane, len(facts["nodes"]))
        said = set_up(plane, server, workdir, configs, policy, before_tree)
        configured = wait_configured(api, configs, policy, before_objects=said.get("before_objects", []))
        started = time.monotonic()
        measured = [measure_round(api, server, config, creates, n, policy, apiserver_pid)
                    for n in range(rounds) for config in configs]
        summary = summarise(measured, configs)
        for r in measured:
            r.pop("walls_ms", None)  # the summary's percentiles hold them
        traffic_configs = ("webhook", "hybrid-before", "hybrid") if before_ref else ("webhook", "hybrid")
        result = {"rounds": measured, "summary": summary, "ratios": ratios(summary), "probe": configured,
                  "traffic": traffic(api, server, corpus_size, traffic_configs),
                  "seconds": round(time.monotonic() - started, 1), "policy": policy_name,
                  "policy_document": policy, "apiserver_version": plane.version(), "generators_said": said,
                  "cluster": facts or None}
        if before_ref:
            result["before"] = {"ref": before_ref, "commit": before_commit}
        return result
    finally:
        api.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=200, help="dry-run creates per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", type=int, default=200, help="objects in the webhook-traffic corpus")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="bench",
                        help="bench: the bench's policy (default); default: the embedded default policy")
    parser.add_argument("--before", metavar="REF", default=None,
                        help="also measure native-before and hybrid-before: the generator and chart of this commit")
    parser.add_argument("--cluster", action="store_true",
                        help="the cluster checks on, in every configuration, with GPU nodes and the facts written")
    parser.add_argument("--memory-rounds", type=int, default=1,
                        help="fresh control planes per mode (none, inline, params) for the apiserver's memory; 0: skip")
    parser.add_argument("--kubernetes", metavar="VERSION", default=None,
                        help="the kube-apiserver of this version of the test matrix (tests/prepare matrix) instead of "
                             "the main bed's; results go to a file named after it")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"default: {RESULTS.relative_to(ROOT)}, or admission-paths-default-policy.json "
                             "with --policy default")
    args = parser.parse_args(argv)
    if args.creates < 1 or args.rounds < 1 or args.corpus < 1 or args.memory_rounds < 0:
        parser.error("--creates, --rounds and --corpus must be at least 1, --memory-rounds at least 0")
    output = args.output or (RESULTS if args.policy == "bench"
                             else RESULTS.with_name("admission-paths-default-policy.json"))
    if args.cluster and not args.output:
        output = output.with_name(output.stem + "-cluster.json")
    from tests.e2e.cluster import Bed, ControlPlane
    from tests.tools import CONTROL_PLANE_BINARIES, apiserver_bin, control_plane_bin, matrix_versions, missing_binaries

    bed = None
    if args.kubernetes is not None:
        args.kubernetes = "v" + args.kubernetes.removeprefix("v")
        if args.kubernetes not in matrix_versions():
            parser.error(f"--kubernetes: {args.kubernetes} is not a version of the test matrix "
                         f"({', '.join(matrix_versions())})")
        if not apiserver_bin(args.kubernetes).is_file():
            print(f"the kube-apiserver {args.kubernetes} is not built: run `tests/prepare matrix`", file=sys.stderr)
            return 2
        bed = Bed(args.kubernetes)
        if not args.output:
            output = output.with_name(f"{output.stem}-{args.kubernetes}.json")
    bin_dir = control_plane_bin()
    missing = missing_binaries(bin_dir, CONTROL_PLANE_BINARIES)
    if missing:
        print(f"the e2e control plane is not built ({', '.join(missing)} missing in {bin_dir}): "
              "run `tests/prepare control-plane`", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="gw-admission-paths-"))
    plane = ControlPlane(bin_dir, workdir / "plane", bed)
    (workdir / "plane").mkdir()
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    try:
        plane.start()
        result = run(plane, args.creates, args.rounds, args.corpus, workdir, args.policy, args.before, args.cluster)
        plane.stop()
        if args.memory_rounds:
            result["memory"] = memory(bin_dir, workdir, POLICIES[args.policy], args.memory_rounds, bed=bed)
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "load_average_before": [round(x, 2) for x in load_before],
                         "load_average_after": [round(x, 2) for x in load]}
    result["started"] = started.isoformat(timespec="seconds")
    result["arguments"] = {"creates": args.creates, "rounds": args.rounds, "corpus": args.corpus,
                           "policy": args.policy, "before": args.before, "memory_rounds": args.memory_rounds,
                           "cluster": args.cluster, "kubernetes": args.kubernetes}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(table(result["summary"]))
    print(json.dumps(result["ratios"]))
    if "memory" in result:
        print(memory_table(result["memory"]))
    bad = sum(e["unexpected_answers"] for e in result["summary"].values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
