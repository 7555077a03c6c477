"""The GPUPolicy custom resource in the e2e bed: its CRD and the object ``default``, through the one client.

``crd()`` is a minimal stand-in: every spec is kept (``x-kubernetes-preserve-unknown-fields``), so a test can
store a spec the webhook must refuse; swap it for the generated CRD once that lands (keep a way to install one
that preserves unknown fields for the invalid-spec test)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from webhook.core import gpupolicy
from webhook.kube.client import ApiError, Kube

CRD_NAME = f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}"


def crd() -> dict[str, Any]:
    keep = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": gpupolicy.GROUP,
            "scope": "Cluster",
            "names": {"plural": gpupolicy.PLURAL, "singular": gpupolicy.SINGULAR, "kind": gpupolicy.KIND,
                      "listKind": f"{gpupolicy.KIND}List"},
            "versions": [{
                "name": gpupolicy.VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": keep, "status": keep}}},
            }],
        },
    }


def install_crd(cluster, definition: dict[str, Any] | None = None) -> None:
    """Apply ``definition`` (default: the minimal ``crd()``) and wait until the resource is served."""
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(definition or crd()), check=True)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s", check=True)
    deadline = time.monotonic() + 30
    while cluster.kubectl("get", CRD_NAME).returncode != 0:  # discovery catches up after Established
        assert time.monotonic() < deadline, "the GPUPolicy resource was not served within 30 s"
        time.sleep(0.2)


def path(name: str = gpupolicy.NAME) -> str:
    return f"{gpupolicy.PATH}/{name}"


def get(kube: Kube, name: str = gpupolicy.NAME) -> dict[str, Any] | None:
    try:
        return kube.get(path(name))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def put_spec(kube: Kube, spec: dict[str, Any], name: str = gpupolicy.NAME) -> dict[str, Any]:
    """Create the object with ``spec``, or replace its spec; the object as stored."""
    current = get(kube, name)
    if current is None:
        return kube.create(gpupolicy.PATH, {"apiVersion": gpupolicy.API_VERSION, "kind": gpupolicy.KIND,
                                            "metadata": {"name": name}, "spec": spec})
    # A JSON patch of the spec alone: no resourceVersion, so a status write in between is no conflict.
    return kube.request("PATCH", path(name), None, [{"op": "add", "path": "/spec", "value": spec}],
                        "application/json-patch+json")


def delete(kube: Kube, name: str = gpupolicy.NAME) -> None:
    try:
        kube.delete(path(name))
    except ApiError as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + 30
    while get(kube, name) is not None:
        assert time.monotonic() < deadline, f"GPUPolicy/{name} was not deleted within 30 s"
        time.sleep(0.1)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return None


def eventually(what: str, check: Callable[[], bool], timeout: float = 60.0, every: float = 0.1) -> float:
    """Seconds until ``check()`` held; fails after ``timeout``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
        time.sleep(every)
    return time.monotonic() - started


def eventually_status(kube: Kube, check: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """GPUPolicy/default once ``check`` holds of its status."""
    found: dict = {}

    def done() -> bool:
        nonlocal found
        found = get(kube) or {}
        return check(found.get("status") or {})

    eventually("the status written", done, timeout=timeout, every=0.2)
    return found


def chart_of(commit: str, into: Path, root: Path) -> Path:
    """The chart of ``commit`` of the repository at ``root``, unpacked under ``into``; skips the test when this clone
    does not hold that commit."""
    import pytest

    done = subprocess.run(["git", "archive", commit, "charts/gpu-webhook"], cwd=root, capture_output=True,
                          timeout=60, check=False)
    if done.returncode != 0:
        pytest.skip(f"the chart of {commit} is not in this clone: {done.stderr.decode()[:200]}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(into, filter="data")
    return into / "charts" / "gpu-webhook"
