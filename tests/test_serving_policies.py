"""What a serving process imports, and its policy checked in a child process: the same problems, word for word,
with jsonschema kept out of the master and its workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.manifests import admission_review, seed_pod
from webhook.core.policyfile import PolicyError, _schema_problems, load_policy
from webhook.serving import policies
from webhook.serving.watch import Reloader

ROOT = Path(__file__).resolve().parent.parent

# Loaded by nothing a worker does: the audit and its Lease and reports (their own process), the CLI, the schema
# check (a child), the kubernetes client (the audit and the informers' credentials), jsonpatch (tests and tools).
NEVER_IN_A_WORKER = ("jsonschema", "referencing", "rpds", "jsonpatch", "webhook.audit", "webhook.kube.lease",
                     "webhook.cli", "webhook.native", "kubernetes", "urllib3", "cryptography")

# What a worker does: import the server, load the policy, build the app, answer /validate and /mutate.
WORKER = """
import json, sys
from webhook.serving import server
from webhook.serving.app import create_app
from webhook.serving.policies import load

policy = load(sys.argv[1] or None)
client = create_app(lambda: policy, lambda: None).test_client()
review = json.loads(sys.argv[2])
for endpoint in ("/validate", "/mutate"):
    assert client.post(endpoint, json=review).status_code == 200
print(json.dumps(sorted(sys.modules)))
"""


def modules_of_a_worker(policy_file: str = "") -> set[str]:
    review = json.dumps(admission_review(seed_pod()))  # built here: the builders read YAML
    done = subprocess.run([sys.executable, "-c", WORKER, policy_file, review], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return set(json.loads(done.stdout))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.process
def test_a_worker_imports_only_what_serving_needs(tmp_path):
    assert loaded(modules_of_a_worker(), NEVER_IN_A_WORKER + ("yaml",)) == []
    policy = tmp_path / "policy.yaml"
    policy.write_text("limits: {perPod: 4}\n")
    # With a policy file, PyYAML reads it; the schema is still checked elsewhere.
    with_file = modules_of_a_worker(str(policy))
    assert "yaml" in with_file and loaded(with_file, NEVER_IN_A_WORKER) == []


POLICIES = [
    ("good", "limits: {perPod: 4}\nnamespaces: {research: {enforcement: warn}}\n"),
    ("schema", "enforcment: warn\nlimits: {perPod: two}\n"),
    ("beyond the schema", "namespaces: {Research: {}}\nresources: [cpu]\n"),
    ("not YAML", "limits: [\n"),
    ("duplicate key", "tolerations: true\ntolerations: false\n"),
    ("every kind at once", "accelerator: {allowed: [nvidia-l4], default: nvidia-a100}\nperContainer: 2\n"
                           "namespaces: {Research: {}, team-a: {accelerator: {default: nvidia-t4}}}\n"),
]


@pytest.mark.process
@pytest.mark.parametrize("text", [text for _, text in POLICIES], ids=[name for name, _ in POLICIES])
def test_a_policy_file_loads_as_load_policy_loads_it(tmp_path, text):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    try:
        expected = load_policy(path)
    except PolicyError as exc:
        with pytest.raises(PolicyError) as raised:
            policies.load(path)
        assert (raised.value.source, raised.value.problems) == (exc.source, exc.problems)
        assert exc.problems
    else:
        got = policies.load(path)
        assert got.document == expected.document
        assert got.for_namespace("research") == expected.for_namespace("research")
        assert got.default == expected.default


def test_no_file_is_the_defaults_which_pass_the_schema():
    assert _schema_problems({}) == []  # why the serving processes may skip the check for them
    assert policies.load(None).document == load_policy(None).document


@pytest.mark.process
def test_an_unreadable_file_and_a_failed_check_are_policy_errors(tmp_path, monkeypatch):
    with pytest.raises(PolicyError, match="cannot read"):
        policies.load(tmp_path / "missing.yaml")
    (tmp_path / "policy.yaml").write_text("{}\n")
    monkeypatch.setattr(sys, "executable", "/bin/false")  # a child that says nothing and exits 1
    with pytest.raises(PolicyError, match=r"its check failed \(exit 1\)"):
        policies.load(tmp_path / "policy.yaml")


@pytest.mark.process
def test_serve_checks_its_policy_without_importing_jsonschema_into_the_master(tmp_path):
    """The CLI's serve path loads the policy as the server does: a bad file is still refused in one line, and
    the process that goes on to become gunicorn's master has not imported jsonschema."""
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("limits: {perContainer: 2}\n")
    bad.write_text("limits: {perContainr: 2}\n")
    script = (
        "import sys\n"
        "from webhook.cli import main\n"
        "policies = main._policy_or_exit(sys.argv[1], serving=True)\n"
        "assert policies.default.per_container == 2\n"
        "print('jsonschema' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(good)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    refused = subprocess.run([sys.executable, "-c", script, str(bad)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "perContainr" in refused.stderr


@pytest.mark.process
def test_a_reload_refused_logs_every_problem_of_the_new_version(tmp_path, capsys):
    path = tmp_path / "policy.yaml"
    path.write_text("limits: {perPod: 4}\n")
    reloader = Reloader("policy", [path], lambda: policies.load(path))
    path.write_text("accelerator: {allowed: [nvidia-l4], default: nvidia-a100}\nnamespaces: {Research: {}}\n"
                    "perContainer: 2\n")
    capsys.readouterr()
    assert reloader.check() is False
    [line] = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert (line["event"], line["what"]) == ("reload_failed", "policy")
    assert line["error"] == f"{path}: invalid policy: " + "; ".join([
        "(top level): unknown key(s) 'perContainer' (a setting of limits.*: write it as limits.perContainer)",
        "accelerator.default: 'nvidia-a100' is not in the allowed list ['nvidia-l4']",
        "namespaces: 'Research' is not a namespace name (lowercase letters, digits and '-', at most 63)",
    ])
    assert reloader.value.default.per_pod == 4  # the last good policy stays
