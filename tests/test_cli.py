"""The command line: `certs` writes what the apiserver verifies; `check` lints like the server decides."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.manifests import EXAMPLES, container, pod, pytorch_job, seed_pod, workload

GPU = "nvidia.com/gpu"


def gpu_webhook(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webhook", *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


def test_certs_writes_a_ca_and_a_serving_cert_with_every_service_name_as_a_san(tmp_path):
    result = gpu_webhook("certs", "--service", "gpu-webhook", "--namespace", "gpu-system",
                         "--host", "127.0.0.1", "--host", "webhook.example", "--days", "30", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "gpu-webhook", "gpu-webhook.gpu-system", "gpu-webhook.gpu-system.svc",
        "gpu-webhook.gpu-system.svc.cluster.local", "webhook.example",
    ]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600


def write_manifests(path, *objects):
    path.write_text(yaml.safe_dump_all(list(objects)))
    return str(path)


def test_check_admits_the_seed_pod_with_exit_0():
    result = gpu_webhook("check", str(EXAMPLES / "cuda-vector-add.yaml"))
    assert (result.returncode, result.stdout) == (0, "")


def test_check_reports_an_absurd_quantity_in_a_custom_resource_instead_of_crashing(tmp_path):
    runner = {"apiVersion": "example.com/v1", "kind": "Runner", "metadata": {"name": "r"},
              "spec": {"podSpec": {"containers": [container(limits={GPU: "1e5000"})]}}}
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perContainer: 2}\n")
    result = gpu_webhook("check", "--policy", str(policy), write_manifests(tmp_path / "m.yaml", runner))
    assert (result.returncode, result.stderr) == (1, "")
    assert result.stdout.endswith('"1e5000" is not a sensible GPU count (at most 1000000)\n')


def test_check_prints_one_line_per_violation_and_exits_1(tmp_path):
    path = write_manifests(
        tmp_path / "m.yaml",
        seed_pod(),
        pod(container("a", requests={GPU: 1}), container("b", limits={GPU: "500m"}), name="bad"),
        workload("Deployment", pod(container(limits={GPU: 2}, requests={GPU: 1})), name="web"),
    )
    result = gpu_webhook("check", path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f'{path}: Pod/bad: spec.containers[0].resources.requests[{GPU}]: container "a": {GPU} is requested '
        "without a limit, set it in limits (requests default to limits)",
        f'{path}: Pod/bad: spec.containers[1].resources.limits[{GPU}]: container "b": "500m" is not a whole number '
        "(GPUs cannot be shared)",
        f'{path}: Deployment/web: spec.template.spec.containers[0].resources.requests[{GPU}]: container "main": '
        f'{GPU} requests (1) must equal limits (2)',
    ]


def test_check_reads_json_and_stdin_and_custom_resources():
    job = pytorch_job(seed_pod(), pod(container(limits={GPU: "1.5"})))
    result = gpu_webhook("check", "-", stdin=json.dumps(job))
    assert result.returncode == 1
    assert result.stdout.startswith("<stdin>: PyTorchJob/train: spec.pytorchReplicaSpecs.Worker.template.spec")


def test_check_expands_lists(tmp_path):
    listing = {"apiVersion": "v1", "kind": "List", "items": [pod(container(requests={GPU: 1}), name="in-list")]}
    result = gpu_webhook("check", write_manifests(tmp_path / "l.yaml", listing))
    assert result.returncode == 1 and "Pod/in-list" in result.stdout


def test_check_uses_the_policy_and_its_namespaces(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("limits: {perContainer: 1}\nnamespaces: {lab: {enforcement: warn}}\n")
    two = pod(container(limits={GPU: 2}), name="two")
    denied = gpu_webhook("check", "--policy", str(policy), write_manifests(tmp_path / "a.yaml", two))
    assert denied.returncode == 1 and "over the limit of 1 per container" in denied.stdout
    warned = gpu_webhook("check", "--policy", str(policy), "--namespace", "lab",
                         write_manifests(tmp_path / "b.yaml", two))
    assert warned.returncode == 0 and ": warning: " in warned.stdout


@pytest.mark.parametrize(
    ("content", "says"),
    [("a: [unclosed", "not valid YAML or JSON"), ("- just\n- a list\n", "is not a Kubernetes object")],
    ids=["bad yaml", "not an object"],
)
def test_check_exits_2_on_input_it_cannot_parse(tmp_path, content, says):
    path = tmp_path / "broken.yaml"
    path.write_text(content)
    result = gpu_webhook("check", str(path))
    assert result.returncode == 2 and says in result.stderr


def test_check_exits_2_on_a_missing_file_and_still_checks_the_others(tmp_path):
    bad = write_manifests(tmp_path / "bad.yaml", pod(container(requests={GPU: 1}), name="x"))
    result = gpu_webhook("check", str(tmp_path / "missing.yaml"), bad)
    assert result.returncode == 2
    assert "cannot read" in result.stderr and "Pod/x" in result.stdout


def test_check_exits_2_on_an_invalid_policy(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("enforcement: sometimes\n")
    result = gpu_webhook("check", "--policy", str(policy), str(EXAMPLES / "cuda-vector-add.yaml"))
    assert result.returncode == 2 and "enforcement" in result.stderr


def test_serve_needs_certificates_or_self_signed():
    result = gpu_webhook("serve")
    assert result.returncode == 2 and "--self-signed" in result.stderr


def test_check_runs_the_cluster_checks_against_saved_nodes(tmp_path):
    nodes = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"accelerator": "nvidia-l4"}},
         "status": {"allocatable": {GPU: "4"}}}]}
    policy = tmp_path / "p.yaml"
    policy.write_text("cluster: {enabled: true}\n")
    wants_a100 = pod(container(limits={GPU: 1}), name="a100", nodeSelector={"accelerator": "nvidia-a100"})
    result = gpu_webhook("check", "--policy", str(policy), "--nodes", write_manifests(tmp_path / "n.yaml", nodes),
                         write_manifests(tmp_path / "p.yaml.pods", wants_a100))
    assert result.returncode == 1
    assert "no node has accelerator=nvidia-a100, so the pod would stay Pending (nodes by accelerator: nvidia-l4: 1)" \
        in result.stdout


DRA_STATE = [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "dra-a"}, "status": {"allocatable": {"cpu": "8"}}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.example.com"},
     "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}],
              "extendedResourceName": "example.com/gpu"}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "dra-a-gpu"},
     "spec": {"driver": "gpu.example.com", "nodeName": "dra-a", "pool": {"name": "dra-a", "generation": 1},
              "devices": [{"name": f"gpu-{i}"} for i in range(4)]}},
]


def test_check_reads_resource_slices_and_device_classes_and_the_claims_beside_the_pods(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("resources: [example.com/gpu]\ncluster: {enabled: true}\ndra: {gpuClasses: [gpu.example.com]}\n")
    state = write_manifests(tmp_path / "state.yaml", {"apiVersion": "v1", "kind": "List", "items": DRA_STATE})
    fits = pod(container(limits={"example.com/gpu": 2}), name="fits")
    six = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "six"},
           "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
               "deviceClassName": "gpu.example.com", "count": 6}}]}}}}
    wants_six = pod(container(resources={"claims": [{"name": "gpu"}]}), name="wants-six",
                    resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "six"}])
    manifests = write_manifests(tmp_path / "m.yaml", fits, six, wants_six)
    result = gpu_webhook("check", "--policy", str(policy), "--cluster-state", state, manifests)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{manifests}: ResourceClaimTemplate/six: spec.spec.devices.requests[0].exactly.count: 6 devices of class "
        "gpu.example.com on one node, but the most any node has is 4 (1 node with such devices; counted its "
        "selectors (cel-python))",
        f"{manifests}: Pod/wants-six: spec.resourceClaims[0]: 6 devices of class gpu.example.com on one node, but the "
        "most any node has is 4 (1 node with such devices; counted its selectors (cel-python))",
    ]
    # Without the state the DRA GPUs are unknown, so fits is not judged by capacity either way; the pod-only
    # rules still run against the template found beside it.
    alone = gpu_webhook("check", "--policy", str(policy), manifests)
    assert alone.returncode == 0 and alone.stdout == ""


def test_claims_beside_the_pods_resolve_them_but_never_make_a_kind_complete(tmp_path):
    """A template the files do not hold may well exist in the cluster: only --cluster-state says what does not."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {enabled: true}\n")
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "other"},
             "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "x"}}]}}}}
    elsewhere = pod(container(resources={"claims": [{"name": "gpu"}]}), name="p",
                    resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "in-the-cluster"}])
    result = gpu_webhook("check", "--policy", str(policy), write_manifests(tmp_path / "m.yaml", other, elsewhere))
    assert result.returncode == 0 and "does not exist" not in result.stdout


def test_the_readme_dra_example(tmp_path):
    """README, DRA, Offline: the same lines, and the inference pod refused against the Node alone."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {enabled: true}\n")
    state, manifests = str(EXAMPLES / "dra" / "cluster-state.yaml"), str(EXAMPLES / "dra" / "training.yaml")
    with_dra = gpu_webhook("check", "--policy", str(policy), "--cluster-state", state, manifests)
    assert with_dra.returncode == 1
    lines = with_dra.stdout.splitlines()
    assert [line.split(": ", 3)[1:3] for line in lines] == [
        ["ResourceClaimTemplate/eight-gpus", "spec.spec.devices.requests[0].exactly.count"],
        ["Pod/trainer", "spec.resourceClaims[0]"],
        ["Pod/trainer", "spec.containers[0].resources.claims[0]"],
    ]
    readme = (EXAMPLES.parent / "README.md").read_text()
    for line in lines:
        assert line.replace(str(EXAMPLES.parent) + "/", "") in readme
    nodes_only = tmp_path / "nodes.yaml"
    nodes_only.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                          "items": yaml.safe_load(Path(state).read_text())["items"][:1]}))
    before = gpu_webhook("check", "--policy", str(policy), "--nodes", str(nodes_only), manifests)
    assert "Pod/inference: spec: no node advertises nvidia.com/gpu" in before.stdout
