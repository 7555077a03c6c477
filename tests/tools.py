"""Where the tools built by ``tests/prepare`` live, and what a test does when one is missing.

Tests never build anything: ``tests/prepare`` does, before pytest, each step with its own time limit.
A missing tool skips the tests that need it, with the command that builds it; in CI (``CI=true``) it
fails them, so a green CI run never hides an unbuilt bed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
VERSIONS_ENV = ROOT / "tests" / "e2e" / "versions.env"


def cache_root() -> Path:
    return Path(os.environ.get("GPU_WEBHOOK_CACHE") or Path.home() / ".cache" / "gpu-webhook")


def parse_versions(text: str) -> dict[str, str]:
    """KEY=value lines, as tests/e2e/go-build.sh parses them: ``#`` starts a comment, blanks around the line are
    dropped, the value is everything after the first ``=`` (a list keeps its inner spaces)."""
    pairs = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            pairs[key.strip()] = value.strip()
    return pairs


def versions() -> dict[str, str]:
    """The pins of tests/e2e/versions.env."""
    return parse_versions(VERSIONS_ENV.read_text(encoding="utf-8"))


def matrix_versions() -> list[str]:
    """MATRIX_KUBERNETES_VERSIONS of versions.env (space-separated): the extra kube-apiservers
    tests/e2e/build-apiserver-matrix.sh builds."""
    return versions().get("MATRIX_KUBERNETES_VERSIONS", "").split()


CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "helm")


def control_plane_bin() -> Path:
    """The directory build-control-plane.sh fills for the pinned versions (it may not exist yet)."""
    v = versions()
    key = "-".join(v.get(k, "?") for k in ("KUBERNETES_VERSION", "ETCD_VERSION", "HELM_VERSION"))
    return cache_root() / "control-plane" / key / "bin"


def apiserver_bin(version: str) -> Path:
    """The kube-apiserver of a Kubernetes version (it may not exist yet): the main control plane's for
    KUBERNETES_VERSION, else the one build-apiserver-matrix.sh builds for a MATRIX_KUBERNETES_VERSIONS entry."""
    if version == versions().get("KUBERNETES_VERSION"):
        return control_plane_bin() / "kube-apiserver"
    return cache_root() / "control-plane" / f"apiserver-{version}" / "bin" / "kube-apiserver"


def prometheus_bin() -> Path:
    """The directory build-prometheus.sh fills for PROMETHEUS_VERSION (it may not exist yet)."""
    return cache_root() / "prometheus" / versions().get("PROMETHEUS_VERSION", "?") / "bin"


def promtool() -> Path:
    """promtool, or skip (locally) / fail (CI) the test with the step that builds it."""
    directory = prometheus_bin()
    if missing_binaries(directory, ("promtool",)):
        unavailable("promtool", f"{directory / 'promtool'} is not built", "prometheus")
    return directory / "promtool"


def missing_binaries(directory: Path, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if not os.access(directory / name, os.X_OK)]


def unavailable(what: str, reason: str, step: str) -> NoReturn:
    """Skip (locally) or fail (CI) a test whose tool ``tests/prepare`` has not built."""
    message = f"{what} unavailable: {reason}; build it with `tests/prepare {step}`"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
