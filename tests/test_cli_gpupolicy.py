"""``gpu-webhook check`` and the GPUPolicy objects among its inputs, in every output format.

An invalid GPUPolicy is an input problem at FILE:LINE:COLUMN with its field (exit 2); a valid one is a policy,
counted apart from the objects decided, with what to do with it; it is never the policy of the run by itself,
and ``--policy`` naming its file makes it the one."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from webhook.cli.formats import OUTPUTS
from webhook.cli.main import main
from webhook.core import policycheck

INVALID = """\
apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata:
  name: default
spec:
  limits:
    perContainer: -2
  enforcement: block
"""
# Where each problem is written: its key's line and column.
INVALID_AT = [
    (7, 5, "GPUPolicy default: spec.limits.perContainer: -2 is less than the minimum of 0"),
    (8, 3, "GPUPolicy default: spec.enforcement: block is not a setting (use deny or warn)"),
]
VALID = """\
apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata:
  name: default
spec:
  limits: {perContainer: 1}
"""
# Two GPUs in one container: admitted by the defaults, refused by VALID.
POD = """\
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  containers:
  - name: c
    image: i
    resources: {limits: {nvidia.com/gpu: 2}}
"""


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


@pytest.fixture
def invalid(tmp_path):
    (tmp_path / "policy").mkdir()
    path = tmp_path / "policy" / "gpupolicy.yaml"
    path.write_text(INVALID)
    return path


@pytest.fixture
def beside(tmp_path):
    """A directory with a valid GPUPolicy and a pod it would refuse."""
    (tmp_path / "gpupolicy.yaml").write_text(VALID)
    (tmp_path / "pod.yaml").write_text(POD)
    return tmp_path


# --- the problems ------------------------------------------------------------------------------------------


def test_problems_of_a_gpupolicy_name_the_apiservers_and_the_loaders_refusals_once_each():
    obj = yaml.safe_load(INVALID)
    assert policycheck.is_gpupolicy(obj) and policycheck.problems(obj) == [
        policycheck.Problem(("spec", "limits", "perContainer"),
                            "spec.limits.perContainer: -2 is less than the minimum of 0"),
        policycheck.Problem(("spec", "enforcement"), "spec.enforcement: block is not a setting (use deny or warn)"),
    ]
    assert policycheck.problems(yaml.safe_load(VALID)) == []
    assert not policycheck.is_gpupolicy({"apiVersion": "example.com/v1", "kind": "GPUPolicy"})


@pytest.mark.parametrize(("spec", "expected"), [
    # The CRD's alone: a bare off (false), which the policy file takes; bounds no policy file has.
    ({"checks": {"mixedGpuAndMig": False}},
     [(("spec", "checks", "mixedGpuAndMig"), "spec.checks.mixedGpuAndMig: false is not a setting: write \"off\", "
                                             "quoted (a bare off is read as false, which the CRD refuses)")]),
    ({"resources": [f"example.com/gpu-{i}" for i in range(300)]},
     [(("spec", "resources"), "spec.resources: 300 items, more than the 256 the CRD allows")]),
    ({"accelerator": {"default": "x" * 70}},
     [(("spec", "accelerator", "default"), "spec.accelerator.default: 70 characters, more than the 63 the CRD "
                                           "allows")]),
    # The loader's alone: an unknown key (pointed at), the checks after the schema.
    ({"limits": {"perContainer": 1, "perNode": 2}},
     [(("spec", "limits", "perNode"), "spec.limits: unknown key(s) 'perNode' (did you mean 'perPod'?)")]),
    ({"resources": ["gpu"]},
     [(("spec", "resources", "0"), "spec.resources[0]: 'gpu' has no domain (GPUs are extended resources such as "
                                   "nvidia.com/gpu)")]),
])
def test_what_either_would_refuse_is_named_at_its_field(spec, expected):
    obj = {"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "default"}, "spec": spec}
    assert [(p.at, p.message) for p in policycheck.problems(obj)] == expected


@pytest.mark.parametrize(("obj", "message"), [
    ({"apiVersion": "gpu-webhook.io/v1", "kind": "GPUPolicy", "metadata": {"name": "default"}, "spec": {}},
     "apiVersion: gpu-webhook.io/v1: the CRD serves gpu-webhook.io/v1alpha1 only"),
    ({"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy", "spec": {}},
     "metadata.name: missing (the one named 'default' is enforced)"),
    ({"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "default"}},
     "spec: missing: the spec is the policy (spec: {} for the defaults)"),
    ({"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy", "metadata": {"name": "default"}, "spec": [1]},
     "spec: [1] is not of type 'object'"),
])
def test_the_object_around_the_spec_is_checked_too(obj, message):
    assert [p.message for p in policycheck.problems(obj)] == [message]


# --- check, every output format -------------------------------------------------------------------------------


def _where(path, line, column, message):
    return f"{path}:{line}:{column}: {message}"


@pytest.mark.parametrize("output", OUTPUTS)
def test_an_invalid_gpupolicy_is_an_input_problem_at_its_field(cli, invalid, output):
    code, out, err = cli("check", "-R", "-o", output, str(invalid.parent.parent))
    assert code == 2
    assert err[:2] == [_where(invalid, *found) for found in INVALID_AT]
    assert err[-1] == "0 objects checked, 0 denied, 0 warned"  # not "nothing to check": it is no workload
    if output == "json":
        document = json.loads(out)
        assert document["problems"] == [
            {"file": str(invalid), "problem": message, "line": line, "column": column}
            for line, column, message in INVALID_AT]
        assert document["summary"]["exitCode"] == 2 and document["summary"]["policies"] == 0
    elif output == "junit":
        errors = ET.fromstring(out).findall(".//error")
        assert [e.text for e in errors] == [_where(invalid, *found) for found in INVALID_AT]
    elif output == "sarif":
        [run] = json.loads(out)["runs"]
        notes = run["invocations"][0]["toolExecutionNotifications"]
        assert [(n["level"], n["locations"][0]["physicalLocation"]["region"]) for n in notes] == [
            ("error", {"startLine": line, "startColumn": column}) for line, column, _ in INVALID_AT]
        assert "spec.limits.perContainer" in notes[0]["message"]["text"]
        assert run["invocations"][0]["executionSuccessful"] is False and run["results"] == []
    else:  # text and jsonl write violations on stdout; the problems are on stderr alone
        assert out == ""


@pytest.mark.parametrize("output", OUTPUTS)
def test_a_valid_gpupolicy_beside_workloads_is_a_policy_with_what_to_do_with_it(cli, beside, output):
    code, out, err = cli("check", "-o", output, str(beside))
    policy = beside / "gpupolicy.yaml"
    note = f"a valid policy, not applied to the other objects: to check them with it, give --policy {policy}"
    assert code == 0  # the pod is decided with the defaults, which have no cap
    assert err == [f"{policy}:1:1: GPUPolicy default: {note}",
                   "1 GPUPolicy valid; 1 object checked, 0 denied, 0 warned"]
    if output == "json":
        document = json.loads(out)
        assert document["policies"] == [
            {"file": str(policy), "line": 1, "column": 1, "kind": "GPUPolicy", "name": "default", "note": note}]
        assert (document["summary"]["policies"], document["summary"]["objects"], document["problems"]) == (1, 1, [])
    elif output == "junit":
        [case] = [c for c in ET.fromstring(out).iter("testcase") if c.get("name") == "GPUPolicy default"]
        assert case.find("failure") is None and case.find("error") is None
        assert case.findtext("system-out") == note
    elif output == "sarif":
        [run] = json.loads(out)["runs"]
        [notification] = run["invocations"][0]["toolExecutionNotifications"]
        assert notification["level"] == "note" and notification["message"]["text"].endswith(note)
        assert notification["locations"][0]["physicalLocation"]["region"] == {"startLine": 1, "startColumn": 1}
        assert run["invocations"][0]["executionSuccessful"] is True
    else:
        assert out == ""


@pytest.mark.parametrize("output", OUTPUTS)
def test_policy_naming_the_same_file_checks_the_workloads_with_it(cli, beside, output):
    policy = beside / "gpupolicy.yaml"
    code, out, err = cli("check", "--policy", str(policy), "-o", output, str(beside))
    assert code == 1  # the pod's 2 GPUs are over VALID's cap of 1
    assert f"{policy}:1:1: GPUPolicy default: a valid policy: the one these objects are checked with (--policy)" in err
    assert err[-1] == "1 GPUPolicy valid; 1 object checked, 1 denied, 0 warned"
    if output == "text":
        assert "is over the limit of 1 per container" in out and f"{beside / 'pod.yaml'}:8:" in out
    elif output == "jsonl":
        [record] = map(json.loads, out.splitlines())
        assert record["rule"] == "per-container-limit"
    elif output == "json":
        document = json.loads(out)
        assert [f["rule"] for f in document["findings"]] == ["per-container-limit"]
        assert document["summary"]["policies"] == 1
    elif output == "junit":
        failures = ET.fromstring(out).findall(".//failure")
        assert [f.get("type") for f in failures] == ["per-container-limit"]
    else:
        [run] = json.loads(out)["runs"]
        assert [r["ruleId"] for r in run["results"]] == ["per-container-limit"]


def test_a_gpupolicy_in_a_file_with_workloads_is_told_to_go_alone_and_a_name_other_than_default_is_said(cli, tmp_path):
    path = tmp_path / "all.yaml"
    path.write_text(VALID.replace("name: default", "name: team") + "---\n" + POD)
    code, _, err = cli("check", str(path))
    assert code == 0
    assert err[0] == (f"{path}:1:1: GPUPolicy team: a valid policy, not applied to the other objects: to check them "
                      "with it, give --policy a file that holds it alone (in a cluster only the one named 'default' "
                      "is enforced)")


def test_a_gpupolicy_on_stdin_is_checked_and_an_unknown_version_is_named(cli):
    code, _, err = cli("check", "-", stdin=VALID.replace("v1alpha1", "v1beta1"))
    assert code == 2
    assert err[0] == "<stdin>:1:1: GPUPolicy default: apiVersion: gpu-webhook.io/v1beta1: the CRD serves " \
                     "gpu-webhook.io/v1alpha1 only"


def test_the_cli_page_shows_what_check_prints_for_an_invalid_gpupolicy(cli, tmp_path, monkeypatch):
    page = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    part = page.split("- **GPUPolicy objects.**", 1)[1]
    shown = part.split("```console\n", 1)[1].split("```", 1)[0]
    lines = [line.strip() for line in shown.splitlines() if line.strip()]
    assert lines[0] == "$ gpu-webhook check -R manifests/"
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "gpupolicy.yaml").write_text(INVALID)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("check", "-R", "manifests/")
    assert (code, out, err) == (2, "", lines[1:])


def test_a_gpupolicy_in_a_list_is_checked_at_its_place_in_the_list(cli, tmp_path):
    """What `kubectl get gpupolicy -o yaml` writes: a List, which --policy does not read."""
    spec = yaml.safe_load(INVALID)
    listed = {"apiVersion": "v1", "kind": "List", "items": [yaml.safe_load(VALID), spec]}
    path = tmp_path / "saved.yaml"
    path.write_text(yaml.safe_dump(listed, sort_keys=False))
    code, _, err = cli("check", str(path))
    text = path.read_text().splitlines()
    line = next(i for i, written in enumerate(text, 1) if "perContainer: -2" in written)
    assert code == 2
    assert err[0] == f"{path}:{line}:{text[line - 1].index('perContainer') + 1}: GPUPolicy default: " \
                     "spec.limits.perContainer: -2 is less than the minimum of 0"
    assert err[2].endswith("GPUPolicy default: a valid policy, not applied to the other objects: to check them with "
                           "it, give --policy a file that holds it alone")
    assert err[-1] == "1 GPUPolicy valid; 0 objects checked, 0 denied, 0 warned"
