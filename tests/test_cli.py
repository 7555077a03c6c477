"""The command line: `certs` writes what the apiserver verifies; `check` lints like the server decides."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.manifests import EXAMPLES, container, pod, pytorch_job, seed_pod, workload
from webhook.cli.main import main
from webhook.manifests import yamlstream

GPU = "nvidia.com/gpu"


def gpu_webhook(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webhook", *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.process
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


@pytest.mark.process
def test_check_admits_the_seed_pod_with_exit_0():
    result = gpu_webhook("check", str(EXAMPLES / "cuda-vector-add.yaml"))
    assert (result.returncode, result.stdout) == (0, "")


@pytest.mark.process
def test_check_reports_an_absurd_quantity_in_a_custom_resource_instead_of_crashing(tmp_path):
    runner = {"apiVersion": "example.com/v1", "kind": "Runner", "metadata": {"name": "r"},
              "spec": {"podSpec": {"containers": [container(limits={GPU: "1e5000"})]}}}
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perContainer: 2}\n")
    result = gpu_webhook("check", "--policy", str(policy), write_manifests(tmp_path / "m.yaml", runner))
    assert (result.returncode, result.stderr) == (1, "1 object checked, 1 denied, 0 warned\n")
    assert result.stdout.endswith('"1e5000" is not a sensible GPU count (at most 1000000)\n')


@pytest.mark.process
def test_check_prints_one_line_per_violation_and_exits_1(tmp_path):
    path = write_manifests(
        tmp_path / "m.yaml",
        seed_pod(),
        pod(container("a", requests={GPU: 1}), container("b", limits={GPU: "500m"}), name="bad"),
        workload("Deployment", pod(container(limits={GPU: 2}, requests={GPU: 1})), name="web"),
    )
    result = gpu_webhook("check", path)
    assert result.returncode == 1
    # FILE:LINE:COLUMN of each field: the nvidia.com/gpu keys of the second and third documents
    assert result.stdout.splitlines() == [
        f'{path}:26:9: Pod default/bad: spec.containers[0].resources.requests[{GPU}]: container "a": {GPU} is '
        "requested without a limit, set it in limits (requests default to limits)",
        f'{path}:31:9: Pod default/bad: spec.containers[1].resources.limits[{GPU}]: container "b": "500m" is not a '
        "whole number (GPUs cannot be shared)",
        f"{path}:49:13: Deployment default/web: spec.template.spec.containers[0].resources.requests[{GPU}]: container "
        f'"main": {GPU} requests (1) must equal limits (2)',
    ]


@pytest.mark.process
def test_check_reads_json_and_stdin_and_custom_resources():
    job = json.dumps(pytorch_job(seed_pod(), pod(container(limits={GPU: "1.5"}))))
    result = gpu_webhook("check", "-", stdin=job)
    assert result.returncode == 1
    column = job.index(f'"{GPU}": "1.5"') + 1
    assert result.stdout.startswith(
        f"<stdin>:1:{column}: PyTorchJob default/train: spec.pytorchReplicaSpecs.Worker.template.spec")


@pytest.mark.process
def test_check_expands_lists(tmp_path):
    listing = {"apiVersion": "v1", "kind": "List", "items": [pod(container(requests={GPU: 1}), name="in-list")]}
    result = gpu_webhook("check", write_manifests(tmp_path / "l.yaml", listing))
    assert result.returncode == 1 and "Pod default/in-list" in result.stdout


@pytest.mark.process
def test_check_uses_the_policy_and_its_namespaces(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("limits: {perContainer: 1}\nnamespaces: {lab: {enforcement: warn}}\n")
    two = pod(container(limits={GPU: 2}), name="two")
    denied = gpu_webhook("check", "--policy", str(policy), write_manifests(tmp_path / "a.yaml", two))
    assert denied.returncode == 1 and "over the limit of 1 per container" in denied.stdout
    warned = gpu_webhook("check", "--policy", str(policy), "--namespace", "lab",
                         write_manifests(tmp_path / "b.yaml", two))
    assert warned.returncode == 0 and ": warning: " in warned.stdout


@pytest.mark.process
@pytest.mark.parametrize(
    ("content", "says"),
    [("a: [unclosed", "not valid YAML"), ("- just\n- a list\n", "is not a Kubernetes object")],
    ids=["bad yaml", "not an object"],
)
def test_check_exits_2_on_input_it_cannot_parse(tmp_path, content, says):
    path = tmp_path / "broken.yaml"
    path.write_text(content)
    result = gpu_webhook("check", str(path))
    assert result.returncode == 2 and says in result.stderr


@pytest.mark.process
def test_check_exits_2_on_a_missing_file_and_still_checks_the_others(tmp_path):
    bad = write_manifests(tmp_path / "bad.yaml", pod(container(requests={GPU: 1}), name="x"))
    result = gpu_webhook("check", str(tmp_path / "missing.yaml"), bad)
    assert result.returncode == 2
    assert "cannot read" in result.stderr and "Pod default/x" in result.stdout


@pytest.mark.process
def test_check_exits_2_on_an_invalid_policy(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("enforcement: sometimes\n")
    result = gpu_webhook("check", "--policy", str(policy), str(EXAMPLES / "cuda-vector-add.yaml"))
    assert result.returncode == 2 and "enforcement" in result.stderr


@pytest.mark.process
def test_serve_needs_certificates_or_self_signed():
    result = gpu_webhook("serve")
    assert result.returncode == 2 and "--self-signed" in result.stderr


@pytest.mark.process
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
    assert ("no node has accelerator=nvidia-a100, so the pod would stay Pending (values of accelerator on the "
            "nodes: 1)") in result.stdout


# ------------------------------------------------------------------ check, in process: input it refuses


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``gpu-webhook ARGS`` in this process: (exit code, stdout, stderr lines)."""
    def run(*args: str, stdin: str | None = None) -> tuple[int, str, list[str]]:
        if stdin is not None:
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err.splitlines()
    return run


GOOD = "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec: {containers: [{name: c, image: i}]}\n"
BAD = ("apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\n"
       "spec: {containers: [{name: c, image: i, resources: {requests: {nvidia.com/gpu: 1}}}]}\n")
BAD_COLUMN = BAD.splitlines()[3].index("nvidia.com/gpu") + 1  # the field is on BAD's fourth line
BAD_LINE = (": Pod default/bad: spec.containers[0].resources.requests[nvidia.com/gpu]: container \"c\": "
            "nvidia.com/gpu is requested without a limit, set it in limits (requests default to limits)")
NOTHING = "0 objects checked, 0 denied, 0 warned"


def bad_line(path: object, content: str) -> str:
    """The line check prints for BAD where it is in ``content``."""
    line = content[:content.index(BAD)].count("\n") + 4
    return f"{path}:{line}:{BAD_COLUMN}{BAD_LINE}"


def alias_bomb(levels: int, fan: int, leaf: str = "[lol]") -> str:
    """A custom resource whose spec holds ``fan`` aliases of the level below, ``levels`` deep."""
    lines = [f"  l0: &l0 {leaf}"] + [
        f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, levels + 1)
    ]
    return "apiVersion: example.com/v1\nkind: Bomb\nmetadata: {name: lol}\nspec:\n" + "\n".join(lines) + "\n"


def nested_lists(depth: int) -> str:
    obj = json.dumps(yaml.safe_load(GOOD))
    for _ in range(depth):
        obj = "{kind: List, items: [" + obj + "]}"
    return obj + "\n"


REFUSED = [  # (id, file content, what stderr says before the summary, each line's start; F is the file)
    ("empty file", "", ["F: no Kubernetes objects"]),
    ("comments and markers only", "# nothing here\n---\n---\n", ["F: no Kubernetes objects"]),
    ("List item without kind", "kind: List\nitems: [{metadata: {name: x}}]\n",
     ["F: item 1 is not a Kubernetes object (no kind)"]),
    ("nested List item without kind", "kind: List\nitems: [{kind: List, items: [{kind: Pod}, 7]}]\n",
     ["F: item 1.2 is not a Kubernetes object (no kind)"]),
    ("List item in a later document", GOOD + "---\nkind: List\nitems: [[]]\n",
     ["F: document 2: item 1 is not a Kubernetes object (no kind)"]),
    ("document without kind", "- a\n", ["F: document 1 is not a Kubernetes object (no kind)"]),
    ("Lists nested too deep", nested_lists(9), ["F: item 1.1.1.1.1.1.1.1: Lists nested more than 8 deep"]),
    ("billion laughs", alias_bomb(9, 9),
     ["F: document 1: too many YAML aliases (32 nodes expand to 926177126, more than 10000)"]),
    ("alias amplifier", alias_bomb(4, 10, leaf="{containers: [{name: c, resources: {limits: {nvidia.com/gpu: 0.5}}}]}"),
     ["F: document 1: too many YAML aliases (32 nodes expand to 134582, more than 10000)"]),
    ("alias to itself", "apiVersion: x/v1\nkind: Rec\nmetadata: {name: r}\nspec: &s {containers: [{name: c}], a: *s}\n",
     ["F: document 1: a YAML alias refers to itself"]),
    ("merge-key bomb", "kind: Pod\nspec:\n  m0: &m0 {x: 1, y: 2}\n" + "".join(
        f"  m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 8)}]}}\n" for i in range(1, 9)
    ), ["F: document 1: too many YAML aliases"]),
    ("impossible date", "kind: Pod\nmetadata: {creationTimestamp: 2024-13-45}\n",
     ["F: document 1: not valid YAML: month must be in 1..12"]),
    ("python tag", "kind: Pod\nx: !!python/object/apply:os.system [true]\n",
     ["F: document 1: not valid YAML: could not determine a constructor for the tag "
      "'tag:yaml.org,2002:python/object/apply:os.system' (line 2, column 4)"]),
    ("undefined alias", GOOD + "---\nkind: Pod\nx: *nowhere\n",
     ["F: document 2: not valid YAML: found undefined alias"]),
]


@pytest.mark.parametrize(("content", "says"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_check_refuses_input_with_one_line_each_and_exit_2(cli, tmp_path, content, says):
    path = tmp_path / "m.yaml"
    path.write_text(content)
    code, _, err = cli("check", str(path))
    assert code == 2, err
    assert len(err) == len(says) + 1 and err[-1].endswith(" denied, 0 warned"), err
    for line, start in zip(err, says, strict=False):
        assert line.startswith(start.replace("F: ", f"{path}: ", 1)), line


# kubectl's answer when nothing matches: kubectl get pods,deployments -A -o json in a namespace without them.
EMPTY_LIST = '{"apiVersion":"v1","items":[],"kind":"List","metadata":{"resourceVersion":""}}\n'
EMPTY_ANSWERS = {  # the output format -> what it writes for no objects
    "text": lambda out: out == "",
    "jsonl": lambda out: out == "",
    "json": lambda out: json.loads(out) == {"findings": [], "problems": [], "policies": [], "summary": {
        "objects": 0, "nothingToCheck": 0, "excluded": 0, "policies": 0,
        "denied": 0, "warned": 0, "denials": 0, "warnings": 0, "problems": 0, "failOn": "deny",
        "exitCode": 0}},
    "junit": lambda out: 'tests="0" failures="0" errors="0"' in out and "<testcase" not in out,
    "sarif": lambda out: json.loads(out)["runs"][0]["results"] == []
    and json.loads(out)["runs"][0]["invocations"][0]["executionSuccessful"] is True,
}


@pytest.mark.parametrize("output", list(EMPTY_ANSWERS))
def test_an_empty_kubectl_list_is_0_objects_checked_in_every_format(cli, output):
    code, out, err = cli("check", "-o", output, "-", stdin=EMPTY_LIST)
    assert (code, err) == (0, [NOTHING]) and EMPTY_ANSWERS[output](out), out


@pytest.mark.parametrize("content", [EMPTY_LIST, "apiVersion: v1\nkind: List\nitems: []\n",
                                     "apiVersion: v1\nitems: []\nkind: PodList\nmetadata: {resourceVersion: ''}\n"],
                         ids=["kubectl -o json", "YAML", "kubectl -o yaml of a typed List"])
def test_an_empty_list_file_passes_and_an_empty_file_does_not(cli, tmp_path, content):
    path = tmp_path / "m.yaml"
    path.write_text(content)
    assert cli("check", str(path)) == (0, "", [NOTHING])
    path.write_text("")
    assert cli("check", str(path)) == (2, "", [f"{path}: no Kubernetes objects", NOTHING])


def test_check_refuses_empty_stdin(cli):
    assert cli("check", "-", stdin="") == (2, "", ["<stdin>: no Kubernetes objects", NOTHING])


def test_check_refuses_a_file_that_is_not_utf8(cli, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"kind: Pod\nmetadata: {name: \xff}\n")
    code, _, err = cli("check", str(path))
    assert code == 2 and err[0] == f"{path}: not UTF-8: byte 0xff at line 2, column 18: save it as UTF-8"


BROKEN = [  # (id, file content, the problem line after "F: ", objects checked)
    ("unclosed flow in the middle", GOOD + "---\nkind: [unclosed\n---\n" + BAD,
     "document 2: not valid YAML: while parsing a flow sequence (line 6, column 7): ", 2),
    ("bad indentation in the last", GOOD + "---\n" + BAD + "---\nkind: Pod\nmetadata:\n  name: a\n name: b\n",
     "document 3: not valid YAML: ", 2),
    ("tab in the first", "kind: Pod\nmetadata:\n\tname: a\n---\n" + BAD, "document 1: not valid YAML: ", 1),
]


@pytest.mark.parametrize("loader", ["libyaml", "python"])
@pytest.mark.parametrize(("content", "says", "checked"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_a_broken_document_is_named_by_number_and_line_and_the_others_are_still_checked(
    cli, tmp_path, monkeypatch, loader, content, says, checked
):
    if loader == "python":
        monkeypatch.setattr(yamlstream, "_SafeLoader", yaml.SafeLoader)
    elif not yamlstream.LIBYAML:
        pytest.skip("PyYAML without libyaml")
    path = tmp_path / "m.yaml"
    path.write_text(content)
    code, out, err = cli("check", str(path))
    assert code == 2
    assert out.splitlines() == [bad_line(path, content)]
    assert err[0].startswith(f"{path}: {says}") and "unicode string" not in err[0], err
    assert err[1:] == [f"{checked} object{'s' if checked > 1 else ''} checked, 1 denied, 0 warned"]


def test_broken_documents_report_lines_of_the_file_not_of_the_document(cli, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "---\n" + GOOD + "---\nkind: Pod\nmetadata: {name: [x}\n")
    _, _, err = cli("check", str(path))
    assert err[0].startswith(f"{path}: document 3: not valid YAML: while parsing a flow sequence (line 12, column 18)")


def test_anchors_within_bounds_are_checked_as_if_written_out(cli, tmp_path):
    shared = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
              "  - {name: a, resources: &r {requests: {nvidia.com/gpu: 1}}}\n  - {name: b, resources: *r}\n")
    written_out = shared.replace("&r ", "").replace("*r", "{requests: {nvidia.com/gpu: 1}}")
    (tmp_path / "shared.yaml").write_text(shared)
    (tmp_path / "written.yaml").write_text(written_out)
    with_alias, without = cli("check", str(tmp_path / "shared.yaml")), cli("check", str(tmp_path / "written.yaml"))
    assert with_alias[0] == without[0] == 1
    # The same findings; through the alias, the field is where the anchor wrote it (line 6) for both containers.
    column = {n: line.index(GPU) + 1 for n, line in enumerate(written_out.splitlines(), 1) if GPU in line}
    anchored = shared.splitlines()[5].index(GPU) + 1
    assert [line.split(":", 3)[1:3] for line in with_alias[1].splitlines()] == [["6", f"{anchored}"]] * 2
    assert [line.split(":", 3)[1:3] for line in without[1].splitlines()] == [[f"{n}", f"{c}"]
                                                                             for n, c in column.items()]
    assert ([line.split(":", 3)[3] for line in with_alias[1].splitlines()]
            == [line.split(":", 3)[3] for line in without[1].splitlines()])


def test_a_document_may_use_aliases_up_to_twice_its_size(cli, tmp_path):
    big = "[" + ", ".join(["x"] * 1500) + "]"
    pad = "spec:\n  pad: [" + ", ".join(["y"] * 15000) + "]\n"
    path = tmp_path / "m.yaml"
    for content, code in [
        (alias_bomb(1, 4, leaf=big), 0),  # about 7,500 nodes expanded: under the floor
        (alias_bomb(1, 9, leaf=big), 2),  # about 15,000 from 1,500
        (alias_bomb(1, 9, leaf=big).replace("spec:\n", pad), 0),  # about 30,000 from 16,500
    ]:
        path.write_text(content)
        assert cli("check", str(path))[0] == code, content[:200]


# ------------------------------------------------------------------ check: summary, output, directories, nodes


def test_check_always_prints_a_summary_of_objects_denied_and_warned(cli, tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("namespaces: {lab: {enforcement: warn}}\n")
    warned = BAD.replace("name: bad}", "name: bad, namespace: lab}")
    path = tmp_path / "m.yaml"
    path.write_text("\n---\n".join([GOOD, BAD, warned]))
    code, _, err = cli("check", "--policy", str(policy), str(path))
    assert (code, err) == (1, ["3 objects checked, 1 denied, 1 warned"])
    assert cli("check", str(EXAMPLES / "cuda-vector-add.yaml")) == (0, "", ["1 object checked, 0 denied, 0 warned"])


def test_check_expands_nested_lists(cli, tmp_path):
    path = tmp_path / "m.yaml"
    inner = json.dumps(yaml.safe_load(BAD))
    path.write_text(f"kind: List\nitems:\n- kind: List\n  items: [{inner}]\n")
    code, out, err = cli("check", str(path))
    column = len("  items: [") + inner.index('"nvidia.com/gpu"') + 1
    assert (code, out.splitlines(), err) == (1, [f"{path}:4:{column}{BAD_LINE}"],
                                             ["1 object checked, 1 denied, 0 warned"])


BAD_RECORD = {
    "line": 9, "column": BAD_COLUMN,  # after GOOD and "---": BAD's fourth line is the file's ninth
    "kind": "Pod", "name": "bad", "namespace": "default",
    "path": "spec.containers[0].resources.requests[nvidia.com/gpu]", "rule": "requests-without-limits",
    "action": "deny", "message": 'container "c": nvidia.com/gpu is requested without a limit, set it in limits '
    "(requests default to limits)",
}


def test_check_writes_one_json_object_per_violation_and_line_with_jsonl(cli, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "---\n" + BAD)
    code, out, _ = cli("check", "-o", "jsonl", str(path))
    assert code == 1
    assert [json.loads(line) for line in out.splitlines()] == [{"file": str(path), **BAD_RECORD}]


def test_check_json_is_one_document_with_the_findings_the_problems_and_a_summary(cli, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "---\n" + BAD + "---\nkind: [\n")
    code, out, err = cli("check", "-o", "json", str(path))
    assert code == 2 and err[-1] == "2 objects checked, 1 denied, 0 warned"
    assert json.loads(out) == {
        "findings": [{"file": str(path), **BAD_RECORD}],
        "problems": [{"file": str(path), "problem": err[0].removeprefix(f"{path}: ")}],
        "policies": [],
        "summary": {"objects": 2, "nothingToCheck": 0, "excluded": 0, "policies": 0,
                    "denied": 1, "warned": 0, "denials": 1, "warnings": 0, "problems": 1,
                    "failOn": "deny", "exitCode": 2},
    }


DIRECTORY_FILES = ["b.yaml", "a.yml", "c.json", "notes.txt", "sub/d.yaml", "sub/deeper/e.yml"]
DIRECTORIES = [  # (id, extra arguments, files checked in order)
    ("flat", [], ["a.yml", "b.yaml", "c.json"]),
    ("recursive", ["-R"], ["a.yml", "b.yaml", "c.json", "sub/d.yaml", "sub/deeper/e.yml"]),
    ("recursive, long form", ["--recursive"], ["a.yml", "b.yaml", "c.json", "sub/d.yaml", "sub/deeper/e.yml"]),
]


@pytest.mark.parametrize(("extra", "files"), [c[1:] for c in DIRECTORIES], ids=[c[0] for c in DIRECTORIES])
def test_check_reads_the_manifests_of_a_directory_like_kubectl(cli, tmp_path, extra, files):
    for name in DIRECTORY_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(yaml.safe_load(BAD)) if name.endswith(".json") else BAD)
    code, out, err = cli("check", *extra, str(tmp_path))
    assert code == 1
    in_json = json.dumps(yaml.safe_load(BAD)).index('"nvidia.com/gpu"') + 1
    assert out.splitlines() == [f"{tmp_path / name}:1:{in_json}{BAD_LINE}" if name.endswith(".json")
                                else bad_line(tmp_path / name, BAD) for name in files]
    assert err == [f"{len(files)} objects checked, {len(files)} denied, 0 warned"]


def test_check_refuses_a_directory_without_manifests(cli, tmp_path):
    (tmp_path / "README.md").write_text("# nothing")
    assert cli("check", str(tmp_path)) == (2, "", [f"{tmp_path}: no *.yaml, *.yml, *.json files", NOTHING])


NODES = {"apiVersion": "v1", "kind": "List", "items": [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"accelerator": "nvidia-l4"}},
     "status": {"allocatable": {GPU: "4"}}}]}
WANTS_A100 = pod(container(limits={GPU: 1}), name="a100", nodeSelector={"accelerator": "nvidia-a100"})


def test_nodes_turn_the_cluster_checks_on(cli, tmp_path):
    code, out, _ = cli("check", "--nodes", write_manifests(tmp_path / "n.yaml", NODES),
                       write_manifests(tmp_path / "p.yaml", WANTS_A100))
    assert code == 1 and "no node has accelerator=nvidia-a100" in out


def test_the_policy_may_still_switch_a_cluster_check_off(cli, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {unknownAccelerator: off}\n")
    code, out, _ = cli("check", "--policy", str(policy), "--nodes", write_manifests(tmp_path / "n.yaml", NODES),
                       write_manifests(tmp_path / "p.yaml", WANTS_A100))
    assert (code, out) == (0, "")


NODE_FILES = [  # (id, nodes file content, the error after "gpu-webhook: --cluster-state: F: ")
    ("no Node objects", GOOD,
     "no Node objects (save them with kubectl get nodes,resourceslices,deviceclasses,resourceclaims,"
     "resourceclaimtemplates,runtimeclasses -A -o yaml)"),
    ("empty List", "kind: List\nitems: []\n", "no Node objects"),
    ("broken", "kind: [\n", "document 1: not valid YAML: "),
]


@pytest.mark.parametrize(("content", "says"), [c[1:] for c in NODE_FILES], ids=[c[0] for c in NODE_FILES])
def test_check_refuses_a_nodes_file_without_nodes(cli, tmp_path, content, says):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(content)
    code, out, err = cli("check", "--nodes", str(nodes), write_manifests(tmp_path / "p.yaml", WANTS_A100))
    assert (code, out, len(err)) == (2, "", 1)
    assert err[0].startswith(f"gpu-webhook: --cluster-state: {nodes}: {says}"), err


# ------------------------------------------------------------------ certs: refusals


CERTS_REFUSED = [  # (id, arguments after --service svc --namespace ns, stderr; D is the output directory)
    ("days past 9999", ["--days", "99999999"],
     "--days 99999999: the certificate would end after 9999-12-31, the last date it can hold"),
    ("zero days", ["--days", "0"], "--days 0: must be at least 1"),
    ("empty host", ["--host", ""], "--host '' is not a valid DNS name or IP address: an empty label"),
    ("space in host", ["--host", "bad host"],
     "--host 'bad host' is not a valid DNS name or IP address: label 'bad host' is not letters, digits and inner '-'"),
    ("underscore", ["--host", "my_svc.example"],
     "--host 'my_svc.example' is not a valid DNS name or IP address: label 'my_svc' is not letters, digits and "
     "inner '-'"),
    ("leading hyphen", ["--host=-a.example"],
     "--host '-a.example' is not a valid DNS name or IP address: label '-a' is not letters, digits and inner '-'"),
    ("label too long", ["--host", "a" * 64 + ".example"],
     f"--host '{'a' * 64}.example' is not a valid DNS name or IP address: label '{'a' * 20}'… is longer than 63 "
     "characters"),
    ("trailing dot", ["--host", "example.com."],
     "--host 'example.com.' is not a valid DNS name or IP address: an empty label"),
    ("wildcard inside", ["--host", "a.*.example"],
     "--host 'a.*.example' is not a valid DNS name: a wildcard '*' may only be the whole leftmost label"),
    ("partial wildcard", ["--host", "w*.example"],
     "--host 'w*.example' is not a valid DNS name: a wildcard '*' may only be the whole leftmost label"),
    ("bare wildcard", ["--host", "*"],
     "--host '*' is not a valid DNS name: a wildcard '*' may only be the whole leftmost label"),
    ("bad IPv4", ["--host", "10.0.0.300"],
     "--host '10.0.0.300' is not a valid IP address, nor a DNS name (its last label is a number)"),
    ("bad A-label", ["--host", "xn--zz.example"],
     "--host 'xn--zz.example' is not a valid DNS name or IP address: label 'xn--zz' is not a valid IDNA A-label"),
    ("invalid unicode", ["--host", "a\u200db.example"],
     "--host 'a\\u200db.example' is not a valid internationalized domain name: Joiner U+200D not allowed"),
    ("out-dir is a file", ["--out-dir", "D/file"], "--out-dir D/file: not a directory"),
    ("out-dir under a file", ["--out-dir", "D/file/sub"],
     "--out-dir D/file/sub: cannot write: [Errno 20] Not a directory: "),
]


@pytest.mark.parametrize(("extra", "says"), [c[1:] for c in CERTS_REFUSED], ids=[c[0] for c in CERTS_REFUSED])
def test_certs_refuses_bad_input_with_one_line_and_exit_2(cli, tmp_path, extra, says):
    (tmp_path / "file").write_text("not a directory")
    extra = [a.replace("D/", f"{tmp_path}/") for a in extra]
    if "--out-dir" not in extra:
        extra += ["--out-dir", str(tmp_path / "out")]
    code, out, err = cli("certs", "--service", "svc", "--namespace", "ns", *extra)
    assert (code, out, len(err)) == (2, "", 1), err
    assert err[0].startswith("gpu-webhook: " + says.replace("D/", f"{tmp_path}/")), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("service", "namespace", "says"), [
    ("", "ns", "--service '' is not a valid Service name"),
    ("9svc", "ns", "--service '9svc' is not a valid Service name"),
    ("Svc", "ns", "--service 'Svc' is not a valid Service name"),
    ("svc", "", "--namespace '' is not a valid namespace"),
    ("svc", "my.ns", "--namespace 'my.ns' is not a valid namespace"),
], ids=["empty service", "service starts with a digit", "upper case", "empty namespace", "dotted namespace"])
def test_certs_refuses_names_kubernetes_would_refuse(cli, tmp_path, service, namespace, says):
    code, _, err = cli("certs", "--service", service, "--namespace", namespace, "--out-dir", str(tmp_path))
    assert code == 2 and len(err) == 1 and err[0].startswith(f"gpu-webhook: {says}"), err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_certs_refuses_an_unwritable_out_dir(cli, tmp_path):
    tmp_path.chmod(0o555)
    try:
        code, _, err = cli("certs", "--service", "svc", "--namespace", "ns", "--out-dir", str(tmp_path / "x"))
    finally:
        tmp_path.chmod(0o755)
    assert code == 2 and err[0].startswith(f"gpu-webhook: --out-dir {tmp_path / 'x'}: cannot write: "), err


@pytest.mark.parametrize(("host", "san"), [
    ("bücher.example", "xn--bcher-kva.example"),
    ("faß.example", "xn--fa-hia.example"),  # IDNA 2008: not "fass.example" as Python's IDNA 2003 codec has it
    ("*.日本.example", "*.xn--wgv71a.example"),
    ("WEBHOOK.Example", "webhook.example"),
], ids=["umlaut", "sharp s", "wildcard and CJK", "upper case"])
def test_certs_idna_encodes_and_lower_cases_dns_names(cli, tmp_path, host, san):
    code, _, err = cli("certs", "--service", "svc", "--namespace", "ns", "--host", host, "--out-dir", str(tmp_path))
    assert code == 0, err
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName)[-1] == san


def test_certs_refuses_to_overwrite_without_force(cli, tmp_path):
    args = ["certs", "--service", "svc", "--namespace", "ns", "--out-dir", str(tmp_path)]
    (tmp_path / "tls.crt").write_text("mine")
    assert cli(*args) == (2, "", [f"gpu-webhook: {tmp_path / 'tls.crt'} exists; --force overwrites it"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt"] and (tmp_path / "tls.crt").read_text() == "mine"
    (tmp_path / "tls.key").write_text("old key")
    (tmp_path / "tls.key").chmod(0o644)
    code, out, _ = cli(*args, "--force")
    assert code == 0 and out.splitlines() == [str(tmp_path / n) for n in ("ca.crt", "tls.crt", "tls.key")]
    x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    assert (tmp_path / "tls.key").stat().st_mode & 0o777 == 0o600


# ------------------------------------------------------------------ argument errors


ARGUMENT_ERRORS = [  # (id, arguments, the error line; the usage above it is the subcommand's)
    ("port too large", ["serve", "--self-signed", "--port", "99999"],
     "gpu-webhook serve: error: argument --port: '99999' is not a port number (1-65535)"),
    ("port zero", ["serve", "--self-signed", "--port", "0"],
     "gpu-webhook serve: error: argument --port: '0' is not a port number (1-65535)"),
    ("port not a number", ["serve", "--self-signed", "--port", "https"],
     "gpu-webhook serve: error: argument --port: 'https' is not a port number (1-65535)"),
    ("no certificate", ["serve"],
     "gpu-webhook serve: error: serve needs either --self-signed or both --cert-file and --key-file"),
    ("no workers", ["serve", "--self-signed", "--workers", "0"],
     "gpu-webhook serve: error: --workers and --threads must be at least 1"),
    ("an empty body limit", ["serve", "--self-signed", "--max-body-bytes", "0"],
     "gpu-webhook serve: error: argument --max-body-bytes: '0' is not a whole number of at least 1"),
    ("a body limit that is no count", ["serve", "--self-signed", "--max-body-bytes", "7MiB"],
     "gpu-webhook serve: error: argument --max-body-bytes: '7MiB' is not a whole number of at least 1"),
    ("a negative drain", ["serve", "--self-signed", "--drain-seconds", "-1"],
     "gpu-webhook serve: error: argument --drain-seconds: '-1' is not a number of seconds (0 or more)"),
    ("an endless drain", ["serve", "--self-signed", "--drain-seconds", "inf"],
     "gpu-webhook serve: error: argument --drain-seconds: 'inf' is not a number of seconds (0 or more)"),
    ("a status lease without the policy object", ["serve", "--self-signed", "--status-lease", "ns/lease"],
     "gpu-webhook serve: error: --status-lease goes with --policy-object"),
    ("a status lease that is no NAMESPACE/NAME", ["serve", "--self-signed", "--policy-object", "default",
                                                 "--status-lease", "lease"],
     "gpu-webhook serve: error: --status-lease takes NAMESPACE/NAME"),
    ("check in a namespace no namespace can be named", ["check", "--namespace", "Research", "f.yaml"],
     "gpu-webhook check: error: argument --namespace: 'Research' is not a namespace name (lowercase letters, digits "
     "and '-', at most 63)"),
    ("check failing on what it cannot fail on", ["check", "--fail-on", "error", "f.yaml"],
     "gpu-webhook check: error: argument --fail-on: invalid choice: 'error' (choose from 'deny', 'warning')"),
    ("certs without a service", ["certs", "--namespace", "ns", "--out-dir", "x"],
     "gpu-webhook certs: error: the following arguments are required: --service"),
    ("check with an unknown output", ["check", "-o", "yaml", "f.yaml"],
     "gpu-webhook check: error: argument -o/--output: invalid choice: 'yaml' (choose from 'text', 'json', 'jsonl', "
     "'junit', 'sarif')"),
]


@pytest.mark.parametrize(("args", "says"), [c[1:] for c in ARGUMENT_ERRORS], ids=[c[0] for c in ARGUMENT_ERRORS])
def test_argument_errors_print_the_subcommands_usage_and_exit_2(cli, args, says):
    code, out, err = cli(*args)
    assert (code, out) == (2, "")
    assert err[0].startswith(f"usage: gpu-webhook {args[0]} [-h]") and err[-1] == says, err


@pytest.mark.process
def test_check_reads_runtime_classes_beside_the_nodes(tmp_path):
    cluster = {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"accelerator": "nvidia-l4"}},
         "status": {"allocatable": {GPU: "4"}}},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia-h100"},
         "handler": "nvidia", "scheduling": {"nodeSelector": {"accelerator": "nvidia-h100"}}}]}
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {enabled: true}\naccelerator: {default: nvidia-l4}\n")
    conflicting = pod(container(limits={GPU: 1}), name="conflict", runtimeClassName="nvidia-h100")
    unknown = pod(container(limits={GPU: 1}), name="unknown", runtimeClassName="nvidia")
    result = gpu_webhook("check", "--policy", str(policy), "--nodes", write_manifests(tmp_path / "c.yaml", cluster),
                         write_manifests(tmp_path / "pods.yaml", conflicting, unknown))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"{tmp_path}/pods.yaml:12:3: Pod default/conflict: spec.runtimeClassName: "
                               "runtimeClassName nvidia-h100, whose scheduling.nodeSelector contradicts the pod's: "
                               "accelerator=nvidia-h100 (pod: nvidia-l4)") for line in lines), lines
    assert any("Pod default/unknown: spec.runtimeClassName: runtimeClassName nvidia, but no such RuntimeClass "
               "exists" in line and "(RuntimeClasses in the cluster: 1)" in line for line in lines), lines


@pytest.mark.process
def test_check_says_which_cpu_container_would_see_every_gpu(tmp_path):
    leaky = pod(container("notebook", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), name="leaky")
    manifests = write_manifests(tmp_path / "leaky.yaml", leaky)
    said = ('container "notebook" uses no GPU but sets NVIDIA_VISIBLE_DEVICES="all", and the NVIDIA runtime reads it '
            "in every pod (isolation.nvidiaRuntime: legacy): it would see every GPU of its node, outside the "
            "scheduler's accounting; remove it or set it to void")
    # a tenant's namespace: refused
    policy = tmp_path / "policy.yaml"
    policy.write_text("isolation: {tenantNamespaces: [default]}\n")
    result = gpu_webhook("check", "--policy", str(policy), manifests)
    assert result.returncode == 1
    assert result.stdout == f"{tmp_path}/leaky.yaml:9:7: Pod default/leaky: spec.containers[0].env[0].value: {said}\n"
    # no tenant namespace named: a warning that says why it is not a denial
    result = gpu_webhook("check", manifests)
    assert result.returncode == 0
    assert result.stdout == (f"{tmp_path}/leaky.yaml:9:7: Pod default/leaky: spec.containers[0].env[0].value: "
                             f"warning: {said}; warn: not a tenant namespace (isolation.tenantNamespaces), and the pod "
                             "asks for no GPU\n")


DRA_STATE = [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "dra-a"}, "status": {"allocatable": {"cpu": "8"}}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.example.com"},
     "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}],
              "extendedResourceName": "example.com/gpu"}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "dra-a-gpu"},
     "spec": {"driver": "gpu.example.com", "nodeName": "dra-a", "pool": {"name": "dra-a", "generation": 1},
              "devices": [{"name": f"gpu-{i}"} for i in range(4)]}},
]


@pytest.mark.process
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
        f"{manifests}:22:11: ResourceClaimTemplate default/six: spec.spec.devices.requests[0].exactly.count: 6 "
        "devices of class gpu.example.com on one node, but the most any node has is 4 (1 node with such devices)",
        f"{manifests}:38:5: Pod default/wants-six: spec.resourceClaims[0]: 6 devices of class gpu.example.com on one "
        "node, but the most any node has is 4 (1 node with such devices)",
    ]
    # Without the state the DRA GPUs are unknown, so fits is not judged by capacity either way; the pod-only
    # rules still run against the template found beside it.
    alone = gpu_webhook("check", "--policy", str(policy), manifests)
    assert alone.returncode == 0 and alone.stdout == ""


@pytest.mark.process
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


@pytest.mark.process
def test_the_readme_dra_example(tmp_path):
    """docs/dra.md, Offline: the same lines, and the inference pod refused against the Node alone."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {enabled: true}\n")
    state, manifests = str(EXAMPLES / "dra" / "cluster-state.yaml"), str(EXAMPLES / "dra" / "training.yaml")
    with_dra = gpu_webhook("check", "--policy", str(policy), "--cluster-state", state, manifests)
    assert with_dra.returncode == 1
    lines = with_dra.stdout.splitlines()
    assert [line.split(": ", 3)[1:3] for line in lines] == [
        ["ResourceClaimTemplate default/eight-gpus", "spec.spec.devices.requests[0].exactly.count"],
        ["Pod default/trainer", "spec.resourceClaims[0]"],
        ["Pod default/trainer", "spec.containers[0].resources.claims[0]"],
    ]
    readme = (EXAMPLES.parent / "docs" / "dra.md").read_text()
    for line in lines:
        assert line.replace(str(EXAMPLES.parent) + "/", "") in readme
    nodes_only = tmp_path / "nodes.yaml"
    nodes_only.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                          "items": yaml.safe_load(Path(state).read_text())["items"][:1]}))
    before = gpu_webhook("check", "--policy", str(policy), "--nodes", str(nodes_only), manifests)
    assert "Pod default/inference: spec: no node advertises nvidia.com/gpu" in before.stdout


def test_every_kubeconfig_option_and_the_metrics_port_help_say_what_the_code_does():
    """The help is the reference users read (docs/cli.md is generated from it): every --kubeconfig names the order
    webhook.kube.client finds credentials in, the same for each subcommand, and --metrics-port says that only
    /metrics leaves the TLS port (the probes answer on both: test_http's metrics-port test)."""
    from webhook.cli.main import _parser

    subcommands = next(a for a in _parser()._actions if a.dest == "command").choices

    def option_help(command: str, option: str) -> str:
        (action,) = [a for a in subcommands[command]._actions if option in a.option_strings]
        return " ".join(str(action.help).split())

    helps = {command: option_help(command, "--kubeconfig") for command in ("serve", "audit", "admission-policies")}
    for command, text in helps.items():
        assert "$KUBECONFIG, the in-cluster service account, ~/.kube/config" in text, (command, text)
    metrics = option_help("serve", "--metrics-port")
    assert "/healthz and /readyz" in metrics and "on both" in metrics, metrics
