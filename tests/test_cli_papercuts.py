"""`gpu-webhook check`, `audit` and `serve`: input read as kubectl reads it, every refusal in one line (issue 21)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.manifests import EXAMPLES, container, pod, pytorch_job
from tests.server import free_port
from tests.test_cli import cli  # noqa: F401  (the fixture: gpu-webhook in this process)

GPU = "nvidia.com/gpu"
REPO = Path(__file__).resolve().parent.parent


def bad_pod(name: str = "bad", **metadata: object) -> dict:
    obj = pod(container("c", requests={GPU: 1}), name=name)
    obj["metadata"].update(metadata)
    return obj


# --------------------------------------------------------------------------------------- JSON input


JSON_REFUSED = [  # (id, file name, content, the problem after "F: ", where it is)
    ("trailing comma", "m.json", '{\n  "apiVersion": "v1",\n  "kind": "Pod",\n}\n',
     "document 1: invalid JSON: trailing comma is not allowed", "(line 3, column 16)"),
    ("trailing comma, read from content", "m.yaml", '{"apiVersion": "v1", "kind": "Pod", "metadata": {},}',
     "document 1: invalid JSON: trailing comma is not allowed", "(line 1, column 51)"),
    ("NaN", "m.json", '{"kind": "Pod", "spec": {"x": NaN}}', "document 1: invalid JSON: ", "(line 1, column 31)"),
    ("a number beyond float64", "m.json", '{"kind": "Pod",\n "spec": {"x": 1e400}}', "document 1: invalid JSON: ",
     "(line 2, column 16)"),
    ("a lone surrogate", "m.json", '{"kind": "Pod", "metadata": {"name": "\\ud800"}}', "document 1: invalid JSON: ",
     "(line 1, column 39)"),
    ("a comment", "m.json", '{"kind": "Pod"} // pod\n', "document 2: invalid JSON: ", "(line 1, column 17)"),
    ("the second of a stream", "m.json", '{"kind": "Pod", "metadata": {"name": "a"}}\n{"kind": "Pod",]\n',
     "document 2: invalid JSON: ", "(line 2, column 16)"),
    ("YAML in a .json file", "m.json", "kind: Pod\n", "document 1: invalid JSON: ", "(line 1, column 1)"),
]


@pytest.mark.parametrize(("name", "content", "says", "where"), [c[1:] for c in JSON_REFUSED],
                         ids=[c[0] for c in JSON_REFUSED])
def test_json_is_read_as_strictly_as_kubectl_reads_it(cli, tmp_path, name, content, says, where):  # noqa: F811
    path = tmp_path / name
    path.write_text(content)
    code, out, err = cli("check", str(path))
    assert code == 2 and out == "", err
    assert err[0].startswith(f"{path}: {says}") and err[0].endswith(where) and len(err) == 2, err


def test_a_json_stream_is_checked_value_by_value_and_yaml_flow_style_stays_yaml(cli, tmp_path):  # noqa: F811
    stream = tmp_path / "stream.json"
    stream.write_text(json.dumps(bad_pod("a")) + "\n" + json.dumps(bad_pod("b"), indent=2))
    code, out, err = cli("check", "-o", "jsonl", str(stream))
    assert (code, err) == (1, ["2 objects checked, 2 denied, 0 warned"])
    assert [(f["name"], f["namespace"]) for f in map(json.loads, out.splitlines())] == [("a", "default"),
                                                                                         ("b", "default")]
    flow = tmp_path / "flow.yaml"
    flow.write_text("{kind: Pod, apiVersion: v1, metadata: {name: f}, spec: {containers: []}}\n")
    assert cli("check", str(flow))[0] == 0


def test_json_documents_know_their_line(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.json"
    path.write_text("\n\n" + json.dumps(pod(name="fine")) + "\n" + json.dumps(bad_pod(), indent=1) + "\n")
    code, out, _ = cli("check", "-o", "json", str(path))
    # the second value starts on line 4; the field that is wrong, its requests' nvidia.com/gpu, 13 lines below
    assert code == 1 and {(f["line"], f["column"]) for f in json.loads(out)["findings"]} == {(17, 7)}


# Runs a command and prints its CPU seconds and peak RSS. A small process of its own, because a child's ru_maxrss
# counts the memory it had before exec, and a child forked from pytest starts as big as pytest.
_MEASURE = """
import json, resource, subprocess, sys
with open("/dev/null", "w") as devnull:
    done = subprocess.run(sys.argv[1:], stdout=devnull, stderr=subprocess.PIPE, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([done.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, done.stderr]))
"""


def _measured(*args: str) -> tuple[float, int, str]:
    """CPU seconds, peak resident kilobytes and the summary line of ``python -m webhook ARGS``."""
    result = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "webhook", *args],
                            capture_output=True, text=True, cwd=REPO, timeout=240, check=True)
    code, cpu, rss, stderr = json.loads(result.stdout)
    assert code == 1, stderr
    return cpu, rss, stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_json_list_of_20000_pods_costs_no_more_than_the_same_pods_as_yaml_documents(tmp_path):
    """As ``kubectl get pods -A -o json`` writes it (4-space indents): before, PyYAML read the List whole, 3x the
    time and 5x the memory of the same pods as documents."""
    pods = [pod(container("main", limits={GPU: 1}, requests={GPU: 1 if i % 10 else 2}), name=f"pod-{i}",
                nodeSelector={"accelerator": "nvidia-l4"}) for i in range(20_000)]
    for p in pods:
        p["metadata"].update(namespace="team-a", labels={"app": "train", "index": str(p["metadata"]["name"])})
    listing, documents = tmp_path / "pods.json", tmp_path / "pods.yaml"
    listing.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}, indent=4))
    documents.write_text(yaml.safe_dump_all(pods))
    # The same command on the first ten pods: what the process costs before the input does.
    small = tmp_path / "ten.json"
    small.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": pods[:10]}, indent=4))
    _, small_rss, _ = _measured("check", str(small))
    list_cpu, list_rss, list_summary = _measured("check", str(listing))
    docs_cpu, docs_rss, docs_summary = _measured("check", str(documents))
    assert list_summary == docs_summary == "20000 objects checked, 2000 denied, 0 warned"
    print(f"List (JSON): {list_cpu:.1f} s CPU, {list_rss / 1024:.1f} MB; documents (YAML): {docs_cpu:.1f} s CPU, "
          f"{docs_rss / 1024:.1f} MB; ten pods: {small_rss / 1024:.1f} MB")
    assert list_cpu <= docs_cpu
    # Neither holds the input: 20,000 pods (19 MB of JSON) cost at most 2 MB more than ten do. Which of the two
    # peaks a few hundred kilobytes higher is the allocator's noise.
    assert list_rss - small_rss <= 2048 and docs_rss - small_rss <= 2048, (small_rss, list_rss, docs_rss)


# ----------------------------------------------------------------------------------- objects and names


def test_text_names_the_namespace_as_kubernetes_writes_a_namespaced_name(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all([bad_pod("here", namespace="lab"), bad_pod("default-ns")]))
    code, out, _ = cli("check", "--namespace", "team-b", str(path))
    assert code == 1
    assert [line.split(": ")[1] for line in out.splitlines()] == ["Pod lab/here", "Pod team-b/default-ns"]


@pytest.mark.parametrize(("namespace", "says"), [
    (2024, "metadata.namespace: 2024 is a number, not a namespace name (quote it)"),
    (True, "metadata.namespace: true is a boolean, not a namespace name (quote it)"),
    ("Research", 'metadata.namespace: "Research" is not a namespace name (lowercase letters, digits and \'-\', at '
     "most 63)"),
], ids=["a YAML number", "a YAML boolean", "upper case"])
def test_a_namespace_kubectl_would_refuse_is_one_line_naming_the_field(cli, tmp_path, namespace, says):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(bad_pod(namespace=namespace)))
    code, out, err = cli("check", str(path))
    assert (code, out, err) == (2, "", [f"{path}: {says}", "0 objects checked, 0 denied, 0 warned"])


def test_check_refuses_a_namespace_option_that_is_no_namespace_name(cli):  # noqa: F811
    code, out, err = cli("check", "--namespace", "Research", str(EXAMPLES / "cuda-vector-add.yaml"))
    assert (code, out) == (2, "")
    assert err[-1] == ("gpu-webhook check: error: argument --namespace: 'Research' is not a namespace name "
                       "(lowercase letters, digits and '-', at most 63)")


def test_the_summary_counts_an_object_with_a_denial_and_a_warning_in_both(cli, tmp_path):  # noqa: F811
    both = pod(container("c", requests={GPU: 1}), name="both", initContainers=[container("i", limits={GPU: 1})])
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(both))
    code, out, err = cli("check", str(path))
    assert code == 1 and sum(": warning: " in line for line in out.splitlines()) == 1
    assert err == ["1 object checked, 1 denied, 1 warned"]


def test_a_boolean_is_spelled_as_yaml_spells_it(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(pod(container("c", limits={GPU: True}), name="p")))
    code, out, _ = cli("check", str(path))
    assert code == 1 and out.rstrip().endswith(': container "c": true is not a quantity'), out


def test_requests_and_limits_read_the_same_whatever_the_type_written(cli, tmp_path):  # noqa: F811
    as_numbers = pod(container("c", limits={GPU: 1}, requests={GPU: 2}), name="p")
    as_strings = pod(container("c", limits={GPU: "1"}, requests={GPU: "2"}), name="p")
    lines = []
    for obj in (as_numbers, as_strings):
        path = tmp_path / "m.yaml"
        path.write_text(yaml.safe_dump(obj))
        lines.append(cli("check", str(path))[1])
    assert lines[0] == lines[1] and lines[0].rstrip().endswith("nvidia.com/gpu requests (2) must equal limits (1)")


# ------------------------------------------------------------------------------------ AdmissionReviews


def review(operation: str, obj: dict | None, old: dict | None = None, namespace: str = "team-a") -> dict:
    request: dict = {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": namespace,
                     "operation": operation, "name": "p"}
    if obj is not None:
        request["object"] = obj
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_the_examples_reviews_are_decided_as_validate_decides_them(cli):  # noqa: F811
    code, out, err = cli("check", "-R", str(EXAMPLES))
    assert code == 1 and "AdmissionReview" not in out and "request.object" not in out
    bad = [line for line in out.splitlines() if "reviews/bad-gpu.json" in line]
    assert [line.split(": ")[1:3] for line in bad] == [
        ["Pod default/bad-gpu", "spec.containers[0].resources.requests[nvidia.com/gpu]"],
        ["Pod default/bad-gpu", "spec.containers[0].resources.requests[nvidia.com/gpu]"],
        ["Pod default/bad-gpu", "spec.containers[1].resources.requests[nvidia.com/gpu]"],
    ]


def test_a_review_is_judged_on_its_operation_and_namespace(cli, tmp_path):  # noqa: F811
    broken = bad_pod("p")
    relabelled = json.loads(json.dumps(broken))
    relabelled["metadata"]["labels"] = {"a": "b"}
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump_all([
        review("CREATE", broken),  # denied, in the review's namespace
        review("UPDATE", relabelled, old=broken),  # the violation was there before: admitted, as /validate does
        review("DELETE", None),  # not checked by /validate
    ]))
    code, out, err = cli("check", str(path))
    # the DELETE brings no object: nothing to check
    assert code == 1 and err == ["1 object with nothing to check; 2 objects checked, 1 denied, 0 warned"]
    assert [line.split(": ")[1] for line in out.splitlines()] == ["Pod team-a/p"]


def test_a_review_without_a_request_is_refused(cli, tmp_path):  # noqa: F811
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}))
    assert cli("check", str(path)) == (2, "", [f"{path}: AdmissionReview without a request",
                                               "0 objects checked, 0 denied, 0 warned"])


# ------------------------------------------------------------------------------ policy and kubeconfig


def test_a_policy_that_is_not_yaml_is_one_line_with_line_and_column(cli, tmp_path):  # noqa: F811
    policy = tmp_path / "p.yaml"
    policy.write_text("limits:\n  perPod: [4\n")
    code, out, err = cli("check", "--policy", str(policy), str(EXAMPLES / "cuda-vector-add.yaml"))
    assert (code, out) == (2, "")
    assert err == [f"gpu-webhook: {policy}: invalid policy: not valid YAML: while parsing a flow sequence "
                   "(line 2, column 11): expected ',' or ']', but got '<stream end>' (line 3, column 1)"]


def test_audit_with_a_missing_kubeconfig_says_so_in_one_line(cli, tmp_path):  # noqa: F811
    missing = tmp_path / "nonexistent"
    assert cli("audit", "--kubeconfig", str(missing)) == (
        2, "", [f"gpu-webhook: audit: kubeconfig {missing}: no such file"])


def test_a_kubeconfig_that_is_not_yaml_is_one_line_with_line_and_column(cli, tmp_path):  # noqa: F811
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nclusters: [\n  - name: c\nkind: Config\n")
    assert cli("audit", "--kubeconfig", str(config)) == (2, "", [
        f"gpu-webhook: audit: cannot load {config}: not valid YAML: while parsing a flow node (line 3, column 3): "
        "expected the node content, but found '-' (line 3, column 3)"])


@pytest.mark.process
def test_serve_with_cluster_checks_and_no_cluster_stops_at_once(tmp_path):
    """Before, the informers retried forever without a kubeconfig, and /readyz never passed."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {enabled: true}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    started = time.monotonic()
    serve = [sys.executable, "-m", "webhook", "serve", "--self-signed", "--port", str(free_port()), "--policy"]
    result = subprocess.run(
        [*serve, str(policy)], capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )
    assert result.returncode == 2 and time.monotonic() - started < 30
    assert result.stderr.splitlines() == [
        "gpu-webhook: cannot serve: cluster.enabled: no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and "
        "not running in a cluster"]
    missing = subprocess.run(
        [sys.executable, "-m", "webhook", "serve", "--self-signed", "--port", str(free_port()), "--policy", str(policy),
         "--kubeconfig", str(tmp_path / "none")], capture_output=True, text=True, timeout=60, env=env, cwd=REPO,
    )
    assert (missing.returncode, missing.stderr.splitlines()) == (
        2, [f"gpu-webhook: cannot serve: cluster.enabled: kubeconfig {tmp_path / 'none'}: no such file"])


# -------------------------------------------------------------------------------- the missing template


def test_the_suggested_cluster_state_command_lets_the_missing_template_warning_fire(cli, tmp_path):  # noqa: F811
    """``kubectl get nodes,...,runtimeclasses`` saved no claims or templates, so a template missing from the cluster
    was never judged missing; the command now suggested saves them."""
    from webhook.manifests import inputs

    assert "resourceclaims,resourceclaimtemplates" in inputs.SAVE_CLUSTER_STATE
    kinds = inputs.CLUSTER_STATE_KINDS.split(",")
    # What that command saves from a cluster with one Node and one template (its List holds every kind asked).
    state = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {"allocatable": {GPU: "4"}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "other", "namespace": "default"},
         "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "x"}}]}}}},
    ]}
    assert {"nodes", "resourceclaimtemplates"} <= set(kinds)
    state_file = tmp_path / "state.yaml"
    state_file.write_text(yaml.safe_dump(state))
    wants = pod(container(resources={"claims": [{"name": "gpu"}]}), name="p",
                resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "missing"}])
    manifests = tmp_path / "m.yaml"
    manifests.write_text(yaml.safe_dump(wants))
    code, out, _ = cli("check", "--cluster-state", str(state_file), str(manifests))
    assert code == 0 and "warning: ResourceClaimTemplate \"missing\" does not exist in namespace \"default\"" in out


def test_a_pytorch_master_is_held_to_nproc_per_node(cli, tmp_path):  # noqa: F811
    job = pytorch_job(pod(container("pytorch", limits={GPU: 2})), pod(container("pytorch", limits={GPU: 4})))
    job["spec"]["nprocPerNode"] = "4"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    code, out, _ = cli("check", str(path))
    line = path.read_text().splitlines().index("  nprocPerNode: '4'") + 1
    assert code == 0 and out.splitlines() == [
        f"{path}:{line}:3: PyTorchJob default/train: spec.nprocPerNode: warning: 4 processes per node but the Master "
        "container has 2 GPUs"]
