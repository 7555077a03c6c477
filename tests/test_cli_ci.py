"""`gpu-webhook check` in pipelines: the pinned install, the pre-commit hook and the recipes of docs/cli.md "In CI".

The slow tests reach the package registry (pip resolves this package's dependencies) or run helm and kubectl
as tests/prepare builds them beside the e2e control plane.
"""

from __future__ import annotations

import json
import os
import re
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
    assert (hook["id"], hook["entry"], hook["language"]) == ("gpu-webhook-check", "gpu-webhook check", "python")
    files = re.compile(hook["files"])
    assert [n for n in ("a.yaml", "b.yml", "c.json", "d.txt", "e.yaml.bak") if files.search(n)] == [
        "a.yaml", "b.yml", "c.json"]


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
