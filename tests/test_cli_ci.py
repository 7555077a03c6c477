"""`gpu-webhook check` in pipelines: the pinned install, the pre-commit hook and the recipes of docs/cli.md "In CI".

The slow tests reach the package registry (pip resolves this package's dependencies) or run helm and kubectl
as tests/prepare builds them beside the e2e control plane.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.manifests import container, pod, workload
from tests.recipes import pins
from tests.tools import control_plane_bin, unavailable

REPO = Path(__file__).resolve().parent.parent
GPU = "nvidia.com/gpu"


# ------------------------------------------------------------------------------- the pinned install


def test_the_constraints_pin_every_runtime_dependency_at_the_image_lock_version():
    lock = pins(REPO / "requirements" / "image.lock")
    constraints = pins(REPO / "requirements" / "constraints.txt")
    assert constraints == lock, "requirements/constraints.txt is not the lock's pins: regenerate it (see its header)"
    text = (REPO / "requirements" / "constraints.txt").read_text()
    assert "--hash" not in text and all(line.startswith("#") or "==" in line for line in text.splitlines() if line)
    dependencies = [Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
                    ["dependencies"]]
    for requirement in dependencies:
        name = canonicalize_name(requirement.name)
        assert name in constraints, f"{requirement.name} is not pinned"
        assert requirement.specifier.contains(constraints[name]), f"{name}=={constraints[name]} breaks {requirement}"


@pytest.mark.slow
def test_pip_with_the_constraints_resolves_exactly_the_image_lock(tmp_path):
    """``pip install -c requirements/constraints.txt .``, resolved (a dry run, from the registry): every package it
    would install, at the lock's version."""
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
         str(report), "-c", str(REPO / "requirements" / "constraints.txt"), str(REPO)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    installed = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
                 for i in json.loads(report.read_text())["install"]}
    assert installed.pop("gpu-webhook")
    lock = pins(REPO / "requirements" / "image.lock")
    assert {name: lock.get(name) for name in installed} == installed
    assert set(lock) - set(installed) <= {"setuptools"}  # the build backend, locked for the image's build


# ---------------------------------------------------------------------------------------- pre-commit


def test_the_pre_commit_hook_runs_check_on_yaml_and_json():
    [hook] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert (hook["id"], hook["entry"], hook["language"]) == (
        "gpu-webhook-check", "gpu-webhook check --skip-non-kubernetes", "python")
    files = re.compile(hook["files"])
    assert [n for n in ("a.yaml", "b.yml", "c.json", "d.txt", "e.yaml.bak") if files.search(n)] == [
        "a.yaml", "b.yml", "c.json"]


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, timeout=60)


def _snapshot(destination: Path) -> Path:
    """This repository's package as it stands in the work tree, committed in a repository of its own: try-repo
    would take HEAD and the tracked changes only, never a new file that is not committed yet."""
    destination.mkdir()
    for name in ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml"):
        shutil.copy2(REPO / name, destination / name)
    shutil.copytree(REPO / "webhook", destination / "webhook", ignore=shutil.ignore_patterns("__pycache__"))
    _git(destination, "init", "-q")
    _git(destination, "add", ".")
    _git(destination, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "snapshot")
    return destination


# A platform team's repository, each kind of YAML and JSON file pre-commit hands the hook: manifests (a multi-document
# file, a Deployment beside its Service, kubectl's empty List), a Helm chart whose templates are not YAML until
# rendered, a GitHub Actions workflow, a GitLab CI file with its !reference tags, pre-commit's own config, a
# package.json and a kustomization.
PLATFORM_REPO = {
    "manifests/pods.yaml": """\
# GPU pods of team a
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: team-a}
spec:
  containers:
  - name: train
    image: nvcr.io/nvidia/pytorch:24.01-py3
    resources:
      limits: {nvidia.com/gpu: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: notebook, namespace: team-a}
spec:
  containers:
  - {name: jupyter, image: jupyter/base-notebook}
""",
    "manifests/train.yaml": """\
apiVersion: v1
kind: Service
metadata: {name: train}
spec:
  selector: {app: train}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: train}
spec:
  selector: {matchLabels: {app: train}}
  template:
    metadata: {labels: {app: train}}
    spec:
      containers:
      - name: train
        image: nvcr.io/nvidia/pytorch:24.01-py3
        resources:
          limits: {nvidia.com/gpu: 1}
          requests: {nvidia.com/gpu: 1}
""",
    "manifests/nothing.json": '{"apiVersion":"v1","items":[],"kind":"List","metadata":{"resourceVersion":""}}\n',
    "charts/train/Chart.yaml": "apiVersion: v2\nname: train\nversion: 0.1.0\nappVersion: \"1.0\"\n",
    "charts/train/values.yaml": """\
replicas: 1
image: {repository: nvcr.io/nvidia/pytorch, tag: 24.01-py3}
gpus: 1
sidecar: {enabled: false}
""",
    "charts/train/templates/_helpers.tpl": '{{- define "train.labels" -}}\napp: {{ .Chart.Name }}\n{{- end }}\n',
    "charts/train/templates/deployment.yaml": """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-train
  labels:
    {{- include "train.labels" . | nindent 4 }}
spec:
  replicas: {{ .Values.replicas }}
  template:
    spec:
      containers:
        - name: train
          image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
          resources:
            limits:
              nvidia.com/gpu: {{ .Values.gpus }}
{{- if .Values.sidecar.enabled }}
        - name: sidecar
          image: busybox
{{- end }}
""",
    ".github/workflows/ci.yaml": """\
name: ci
on:
  push: {branches: [main]}
  pull_request:
jobs:
  test:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: make test
""",
    ".gitlab-ci.yml": """\
.setup:
  before_script:
    - pip install -r requirements.txt
stages: [test, deploy]
test:
  stage: test
  script:
    - !reference [.setup, before_script]
    - make test
deploy:
  stage: deploy
  script: [kubectl apply -k .]
  rules:
    - if: $CI_COMMIT_BRANCH == "main"
""",
    ".pre-commit-config.yaml": """\
repos:
  - repo: local
    hooks:
      - id: yamllint
        name: yamllint
        entry: yamllint
        language: system
        types: [yaml]
""",
    "package.json": '{"name": "platform-tools", "private": true, "scripts": {"lint": "eslint ."}}\n',
    "kustomization.yaml": """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: team-a
resources: [manifests/pods.yaml, manifests/train.yaml]
""",
}
# A GPU pod that would be denied (requests without limits), appended to manifests/pods.yaml as its third document.
BAD_POD = """\
---
apiVersion: v1
kind: Pod
metadata: {name: bad-trainer, namespace: team-a}
spec:
  containers:
  - name: train
    image: nvcr.io/nvidia/pytorch:24.01-py3
    resources:
      requests: {nvidia.com/gpu: 1}
"""


def write_platform(root: Path) -> Path:
    """PLATFORM_REPO's files under ``root``."""
    for name, content in PLATFORM_REPO.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    return root


def platform_repository(root: Path) -> Path:
    """PLATFORM_REPO as a fresh git repository, every file staged."""
    root.mkdir()
    _git(root, "init", "-q")
    write_platform(root)
    _git(root, "add", ".")
    return root


def test_the_hook_passes_a_platform_repository_and_judges_its_manifests(tmp_path, monkeypatch, capsys):
    """What the hook runs (its entry, on the files its pattern takes) on PLATFORM_REPO, in this process: every
    file that is not a Kubernetes object passes, the manifests are judged, and a bad one fails it."""
    from webhook.cli.main import main

    [hook] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    entry = hook["entry"].split()
    assert entry[:2] == ["gpu-webhook", "check"]
    monkeypatch.chdir(write_platform(tmp_path))
    files = [name for name in sorted(PLATFORM_REPO) if re.search(hook["files"], name)]
    assert len(files) == len(PLATFORM_REPO) - 1  # all but the chart's _helpers.tpl
    assert main([*entry[1:], *files]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "skipped 6 documents that are not Kubernetes objects and 1 Helm chart template (check what helm template "
        "renders)",
        # 2 pods and a Deployment; a Service and the Kustomization hold nothing to check; 0 in the List
        "2 objects with nothing to check; 3 objects checked, 0 denied, 0 warned",
    ]
    # Without the option, what the hook must let pass is refused, each file in one line.
    assert main(["check", *files]) == 2
    refused = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[0] for line in refused[:-1]] == [
        ".github/workflows/ci.yaml", ".gitlab-ci.yml", ".pre-commit-config.yaml", "charts/train/Chart.yaml",
        "charts/train/templates/deployment.yaml", "charts/train/values.yaml", "package.json"]
    assert "could not determine a constructor for the tag '!reference'" in refused[1]
    with open("manifests/pods.yaml", "a") as pods:
        pods.write(BAD_POD)
    assert main([*entry[1:], *files]) == 1
    line = Path("manifests/pods.yaml").read_text().splitlines().index("      requests: {nvidia.com/gpu: 1}") + 1
    assert capsys.readouterr().out.startswith(f"manifests/pods.yaml:{line}:18: Pod team-a/bad-trainer: ")


@pytest.mark.slow
@pytest.mark.timeout(900)  # pre-commit builds a virtualenv and pip installs the package and its dependencies
def test_pre_commit_try_repo_on_a_platform_repository(tmp_path):
    """``pre-commit try-repo`` of this repository's hook with ``--all-files`` on PLATFORM_REPO: it passes while the
    manifests are good (CI files, Helm values and templates, package.json are no manifests), fails naming the
    manifest and field when one would be denied, and fails on a manifest that is not valid YAML."""
    hooks = _snapshot(tmp_path / "gpu-webhook")
    work = platform_repository(tmp_path / "platform")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "PRE_COMMIT_COLOR": "never"}
    pre_commit = [sys.executable, "-m", "pre_commit", "try-repo", str(hooks), "gpu-webhook-check", "--all-files"]

    def hook() -> subprocess.CompletedProcess:
        return subprocess.run(pre_commit, cwd=work, env=env, capture_output=True, text=True, timeout=900)

    good = hook()
    assert good.returncode == 0 and "gpu-webhook check" in good.stdout and "Passed" in good.stdout, (
        good.stdout[-3000:] + good.stderr[-3000:])
    with open(work / "manifests" / "pods.yaml", "a") as pods:
        pods.write(BAD_POD)
    _git(work, "add", ".")
    bad = hook()
    assert bad.returncode == 1 and "Failed" in bad.stdout, bad.stdout[-3000:] + bad.stderr[-3000:]
    line = (work / "manifests" / "pods.yaml").read_text().splitlines().index("      requests: {nvidia.com/gpu: 1}")
    assert (f"manifests/pods.yaml:{line + 1}:18: Pod team-a/bad-trainer: "
            "spec.containers[0].resources.requests[nvidia.com/gpu]: container \"train\": nvidia.com/gpu is requested "
            "without a limit") in bad.stdout
    assert bad.stdout.count(": Pod ") == 1 and ".gitlab-ci.yml" not in bad.stdout and "charts/" not in bad.stdout
    (work / "manifests" / "pods.yaml").write_text(PLATFORM_REPO["manifests/pods.yaml"])
    (work / "manifests" / "broken.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [broken}\n")
    _git(work, "add", ".")
    broken = hook()
    assert broken.returncode == 1 and "Failed" in broken.stdout
    assert "manifests/broken.yaml: document 1: not valid YAML" in broken.stdout, broken.stdout[-3000:]


# ------------------------------------------------------------------------------ the recipes of "In CI"


def _tool(name: str) -> str:
    path = control_plane_bin() / name
    if not os.access(path, os.X_OK):
        unavailable(name, f"{path} is not built", "control-plane")
    return str(path)


def _piped(producer: list[str], *check_args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``PRODUCER | gpu-webhook check CHECK_ARGS -`` through a real pipe."""
    with subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO) as first:
        second = subprocess.run([sys.executable, "-m", "webhook", "check", *check_args, "-"], stdin=first.stdout,
                                capture_output=True, text=True, timeout=120, cwd=REPO)
        problems = first.stderr.read() if first.stderr else b""
        assert first.wait(timeout=60) == 0, problems
    return second


def _chart(root: Path) -> Path:
    chart = root / "my-chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: my-chart\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("gpus: {requests: 1, limits: 2}\n")
    deployment = workload("Deployment", pod(container("train", limits={GPU: 0}, requests={GPU: 0})), name="train")
    text = yaml.safe_dump(deployment).replace("nvidia.com/gpu: 0", "nvidia.com/gpu: {{ .Values.gpus.limits }}", 1)
    text = text.replace("nvidia.com/gpu: 0", "nvidia.com/gpu: {{ .Values.gpus.requests }}", 1)
    (chart / "templates" / "deployment.yaml").write_text(text)
    return chart


@pytest.mark.slow
def test_helm_template_piped_into_check(tmp_path):
    helm = _tool("helm")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}, "HOME": str(tmp_path)}
    chart = _chart(tmp_path)
    denied = _piped([helm, "template", "my-release", str(chart)], "-o", "junit", env=env)
    assert denied.returncode == 1, denied.stderr
    assert 'name="Pod default/train"' not in denied.stdout and 'name="Deployment default/train"' in denied.stdout
    fixed = _piped([helm, "template", "my-release", str(chart), "--set", "gpus.requests=2"], env=env)
    assert (fixed.returncode, fixed.stdout, fixed.stderr) == (0, "", "1 object checked, 0 denied, 0 warned\n")
    ours = _piped([helm, "template", "gpu-webhook", str(REPO / "charts" / "gpu-webhook"), "--set",
                   "image.repository=registry.example/gpu-webhook"], env=env)
    assert ours.returncode == 0 and ours.stderr.endswith(" denied, 0 warned\n"), ours.stderr


@pytest.mark.slow
def test_kustomize_piped_into_check(tmp_path):
    kubectl = _tool("kubectl")
    base, overlay = tmp_path / "base", tmp_path / "overlays" / "prod"
    base.mkdir()
    overlay.mkdir(parents=True)
    (base / "deployment.yaml").write_text(yaml.safe_dump(
        workload("Deployment", pod(container("train", limits={GPU: 1})), name="train")))
    (base / "kustomization.yaml").write_text("resources: [deployment.yaml]\n")
    (overlay / "kustomization.yaml").write_text(
        "resources: [../../base]\nnamespace: prod\npatches:\n- target: {kind: Deployment, name: train}\n  patch: |\n"
        "    - op: add\n      path: /spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu\n"
        "      value: \"500m\"\n")
    result = _piped([kubectl, "kustomize", str(overlay)], "-o", "sarif")
    assert result.returncode == 1, result.stderr
    [finding] = json.loads(result.stdout)["runs"][0]["results"]
    assert finding["ruleId"] == "invalid-quantity"
    assert finding["message"]["text"].startswith("Deployment prod/train: spec.template.spec.containers[0]")
