"""`gpu-webhook check` as a newcomer meets it (issue 33): each refusal says what to do, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.recipes import pins
from tests.test_cli import (
    GOOD,
    NOTHING,
    cli,  # noqa: F401  (the fixture: gpu-webhook in this process)
)
from webhook.core.catalog import RULES
from webhook.manifests import yamlstream

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------- a directory without -R


def test_a_directory_whose_manifests_are_in_subdirectories_suggests_recursive(cli, tmp_path):  # noqa: F811
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "pod.yaml").write_text(GOOD)
    (tmp_path / "README.md").write_text("# k8s")
    assert cli("check", str(tmp_path)) == (2, "", [
        f"{tmp_path}: no *.yaml, *.yml, *.json files; its subdirectories hold some: add -R to read them", NOTHING])
    assert cli("check", "-R", str(tmp_path))[0] == 0


def test_a_directory_with_no_manifests_anywhere_gets_no_hint(cli, tmp_path):  # noqa: F811
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("# notes")
    assert cli("check", str(tmp_path)) == (2, "", [f"{tmp_path}: no *.yaml, *.yml, *.json files", NOTHING])


# ------------------------------------------------------------------------------ the pre-commit hook


def test_the_pre_commit_hook_runs_once_and_installs_the_constraints_pins():
    """pre-commit runs a hook in several processes at once unless it is serial (the summary printed once per
    process), and installs the hook without the constraints file: the pins ride in ``additional_dependencies``."""
    [hook] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook.get("require_serial") is True
    pinned = [Requirement(d) for d in hook.get("additional_dependencies", [])]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pinned), pinned
    hook_pins = {canonicalize_name(r.name): next(iter(r.specifier)).version for r in pinned}
    assert hook_pins == pins(REPO / "requirements" / "constraints.txt"), (
        "the hook's additional_dependencies are not requirements/constraints.txt's pins")


# ------------------------------------------------------------------------------------ exit codes in --help


@pytest.mark.parametrize("command", [[], ["check"]], ids=["gpu-webhook", "check"])
def test_help_says_what_the_exit_codes_mean(cli, command):  # noqa: F811
    code, out, _ = cli(*command, "--help")
    assert code == 0
    said = out.split("exit codes:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in said[:3]] == ["0", "1", "2"], out
    assert "denied" in said[1] and "could not be used" in said[2]


def test_the_cli_reference_says_what_checks_exit_codes_mean():
    text = (REPO / "docs" / "cli.md").read_text()
    check = text.split("### `gpu-webhook check`", 1)[1].split("\n### ", 1)[0]
    assert "Exit codes:\n\n- `0`: nothing would be denied" in check and "- `1`: something would be denied" in check
    assert "- `2`: an input or the policy could not be used" in check


# ------------------------------------------------------------------------------------ files not UTF-8

POD = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n"


@pytest.mark.parametrize(("encoding", "data", "says"), [
    ("UTF-16 with a BOM", POD.encode("utf-16"), "not UTF-8 but UTF-16 LE (it starts with a byte order mark)"),
    ("UTF-16 BE with a BOM", b"\xfe\xff" + POD.encode("utf-16-be"),
     "not UTF-8 but UTF-16 BE (it starts with a byte order mark)"),
    ("UTF-32 with a BOM", POD.encode("utf-32"), "not UTF-8 but UTF-32 LE (it starts with a byte order mark)"),
    ("UTF-16 without a BOM", POD.encode("utf-16-le"), "not UTF-8 but likely UTF-16 LE (every other byte is zero)"),
    ("Latin-1", (POD + "  labels: {team: équipe}\n").encode("latin-1"), "not UTF-8: byte 0xe9 at line 5, column 18"),
])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_that_is_not_utf8_is_named_with_what_to_do(cli, tmp_path, encoding, data, says, suffix):  # noqa: F811
    if suffix == ".json" and encoding == "Latin-1":
        data = b'{"kind": "Pod",\n "metadata": {"name": "caf\xe9"}}\n'
        says = "not UTF-8: byte 0xe9 at line 2, column 27"
    path = tmp_path / f"m{suffix}"
    path.write_bytes(data)
    code, out, err = cli("check", str(path))
    assert (code, out) == (2, "")
    assert err == [f"{path}: {says}: save it as UTF-8", NOTHING]


def test_stdin_that_is_not_utf8_is_named_too(cli):  # noqa: F811
    stdin = POD.encode("utf-16").decode("utf-8", "surrogateescape")  # the bytes, as the fixture's text stdin holds them
    assert cli("check", "-", stdin=stdin)[2][0] == (
        "<stdin>: not UTF-8 but UTF-16 LE (it starts with a byte order mark): save it as UTF-8")


# ------------------------------------------------------------------------------ a key written twice

TWICE = [  # (id, file name, content, the problem after "F: ")
    ("two metadata blocks", "m.yaml",
     "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\nspec: {}\nmetadata:\n  name: b\n",
     'document 1: duplicate key "metadata" (line 6, column 1; first at line 3, column 1)'),
    ("nested, in a flow mapping", "m.yaml", "kind: Pod\nmetadata: {name: a, labels: {x: '1', x: '2'}}\n",
     'document 1: duplicate key "x" (line 2, column 38; first at line 2, column 30)'),
    ("in the second document", "m.yaml", "kind: Pod\nmetadata: {name: a}\n---\nkind: Pod\nkind: Pod\n",
     'document 2: duplicate key "kind" (line 5, column 1; first at line 4, column 1)'),
    ("in an item of a List", "m.yaml",
     "apiVersion: v1\nkind: List\nitems:\n- kind: Pod\n  metadata: {name: a}\n  metadata: {name: b}\n",
     'item 1: duplicate key "metadata" (line 6, column 3; first at line 5, column 3)'),
    ("JSON", "m.json", '{"apiVersion": "v1", "kind": "Pod",\n "metadata": {"name": "a"},\n "metadata": {}}\n',
     'document 1: duplicate key "metadata" (line 3, column 2; first at line 2, column 2)'),
    ("JSON, nested", "m.json", '{"kind": "Pod", "metadata": {"name": "a",\n  "name": "b"}}\n',
     'document 1: duplicate key "name" (line 2, column 3; first at line 1, column 30)'),
    ("JSON, in an item of a List", "m.json",
     '{"apiVersion": "v1", "kind": "List", "items": [{"kind": "Pod"},\n {"kind": "Pod", "kind": "Pod"}]}\n',
     'document 1: duplicate key "kind" (line 2, column 18; first at line 2, column 3)'),
]


@pytest.mark.parametrize("loader", ["libyaml", "python"])
@pytest.mark.parametrize(("name", "content", "says"), [c[1:] for c in TWICE], ids=[c[0] for c in TWICE])
def test_a_key_written_twice_is_refused_as_kubectl_refuses_it(cli, tmp_path, monkeypatch, loader, name, content,  # noqa: F811
                                                              says):
    if loader == "python":
        monkeypatch.setattr(yamlstream, "_SafeLoader", yaml.SafeLoader)
    path = tmp_path / name
    path.write_text(content)
    code, _, err = cli("check", str(path))
    assert code == 2
    assert f"{path}: {says}: kubectl refuses it; keep one" in err, err


def test_a_merge_key_may_still_be_overridden(cli, tmp_path):  # noqa: F811
    path = tmp_path / "m.yaml"
    path.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  <<: &base {name: base, namespace: a}\n"
                    "  name: mine\ndata:\n  <<: {k: '1'}\n  k: '2'\n")
    assert cli("check", str(path)) == (0, "", ["1 object with nothing to check; 0 objects checked, 0 denied, 0 warned"])


# ------------------------------------------------------------------------------ SARIF's rule help


def _sarif_rules(cli, tmp_path, *args: str) -> list[dict]:  # noqa: F811
    path = tmp_path / "pod.yaml"
    path.write_text(GOOD)
    code, out, _ = cli("check", "-o", "sarif", *args, str(path))
    assert code == 0
    return json.loads(out)["runs"][0]["tool"]["driver"]["rules"]


def test_sarif_carries_each_rules_help_and_links_no_address_it_was_not_given(cli, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv("GPU_WEBHOOK_DOCS_URL", raising=False)
    rules = _sarif_rules(cli, tmp_path)
    assert len(rules) == len(RULES) and not any("helpUri" in rule for rule in rules)
    assert "example/" not in json.dumps(rules)
    by_id = {rule["id"]: rule for rule in rules}
    privileged = RULES["privileged-gpu"]
    help_ = by_id["privileged-gpu"]["help"]
    assert help_["markdown"].startswith(f"Refuses {privileged.refuses}, reported at {privileged.reports}.")
    assert "change the manifest" in help_["markdown"] and f"`{privileged.setting}`" in help_["markdown"]
    assert "`" not in help_["text"] and privileged.setting in help_["text"]
    assert "enforcement" in by_id["requests-without-limits"]["help"]["markdown"]


def test_sarif_links_each_rules_page_under_the_docs_url_given(cli, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GPU_WEBHOOK_DOCS_URL", "https://docs.example.org/gpu")
    by_env = _sarif_rules(cli, tmp_path)
    assert by_env[0]["helpUri"].startswith("https://docs.example.org/gpu/")
    by_flag = _sarif_rules(cli, tmp_path, "--docs-url", "https://internal.example.net/webhook/")
    assert all(rule["helpUri"].startswith("https://internal.example.net/webhook/") for rule in by_flag)


def test_a_docs_url_that_is_no_address_is_one_line(cli, tmp_path, monkeypatch):  # noqa: F811
    code, _, err = cli("check", "--docs-url", "docs/", str(tmp_path))
    assert code == 2 and err[-1].endswith("argument --docs-url: 'docs/' is not an http:// or https:// address")
    monkeypatch.setenv("GPU_WEBHOOK_DOCS_URL", "ftp://x")
    assert cli("check", str(tmp_path)) == (
        2, "", ["gpu-webhook: check: GPU_WEBHOOK_DOCS_URL: 'ftp://x' is not an http:// or https:// address"])


# ------------------------------------------------------------------ admission-policies for a newer Kubernetes


def test_a_kube_version_newer_than_known_says_which_version_it_assumed(capsys):
    from webhook.cli.main import main
    from webhook.native.target import NEWEST

    assert main(["admission-policies", "--kube-version", f"1.{NEWEST + 1}.0"]) == 0
    newer = capsys.readouterr()
    assert newer.err.splitlines()[0] == (
        f"gpu-webhook: admission-policies: Kubernetes 1.{NEWEST + 1} is newer than this release knows: generating "
        f"for 1.{NEWEST}, the newest it knows")
    assert main(["admission-policies", "--kube-version", f"1.{NEWEST}"]) == 0
    known = capsys.readouterr()
    assert known.out == newer.out and "newer than" not in known.err


# ------------------------------------------------------------------ generated objects name their generator


@pytest.mark.parametrize("minor", [30, 34, 37])
def test_every_generated_object_names_the_gpu_webhook_version_that_made_it(minor):
    from webhook import __version__
    from webhook.core.policyfile import load_policy
    from webhook.native.generate import generate
    from webhook.native.target import for_version

    objects = generate(load_policy(None), for_version(f"1.{minor}")).objects
    assert objects and all(
        o["metadata"]["annotations"]["gpu-webhook.io/generator-version"] == __version__ for o in objects)


# ------------------------------------------------------------------ docs/troubleshooting.md quotes check


TROUBLE = {  # file -> content; each line check prints for it is quoted in docs/troubleshooting.md
    "values.yaml": "replicas: 2\nimage: x\n",
    "chart/Chart.yaml": None,
    "chart/templates/pod.yaml": "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{ .Release.Name }}\n"
                                "{{- if .Values.gpu }}\nspec: {}\n{{- end }}\n",
    "utf16/pod.yaml": POD.encode("utf-16"),
    "latin1/pod.yaml": (POD + "  labels: {team: équipe}\n").encode("latin-1"),
    "twice/pod.yaml": TWICE[0][2],
    "k8s/base/pod.yaml": GOOD,
}


@pytest.mark.parametrize("path", ["values.yaml", "chart/templates/pod.yaml", "utf16/pod.yaml", "latin1/pod.yaml",
                                  "twice/pod.yaml", "k8s"])
def test_the_troubleshooting_page_quotes_what_check_prints(cli, tmp_path, monkeypatch, path):  # noqa: F811
    if path.startswith("chart/") and not yamlstream.LIBYAML:
        pytest.skip("the page quotes libyaml's words")
    for name, content in TROUBLE.items():
        file = tmp_path / name
        file.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            file.write_bytes(content)
        else:
            file.write_text(content if content is not None else "apiVersion: v2\nname: c\nversion: 0.1.0\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("check", path)
    assert code == 2
    shown = err[0].replace("utf16/", "").replace("latin1/", "").replace("twice/", "")
    page = " ".join((REPO / "docs" / "troubleshooting.md").read_text().split())
    assert f"`{shown}`" in page
