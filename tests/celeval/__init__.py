"""celeval from Python: the generated policies compiled and evaluated by k8s.io/apiserver's own admission CEL
packages (tests/celeval/main.go, built by ``tests/prepare celeval``), in the unit tier."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.tools import cache_root, unavailable

HERE = Path(__file__).resolve().parent

# Resources of the kinds the tests send (group/kind -> plural).
PLURALS = {"Pod": "pods", "PodTemplate": "podtemplates", "ReplicationController": "replicationcontrollers",
           "Deployment": "deployments", "ReplicaSet": "replicasets", "StatefulSet": "statefulsets",
           "DaemonSet": "daemonsets", "Job": "jobs", "CronJob": "cronjobs", "PyTorchJob": "pytorchjobs",
           "TFJob": "tfjobs", "MPIJob": "mpijobs", "RayCluster": "rayclusters", "RayJob": "rayjobs",
           "RayService": "rayservices", "JobSet": "jobsets", "LeaderWorkerSet": "leaderworkersets",
           "TrainJob": "trainjobs", "ResourceClaim": "resourceclaims",
           "ResourceClaimTemplate": "resourceclaimtemplates"}


def binary() -> Path:
    """The build of the sources as they are (the key build.sh computes), or skip/fail as tests/tools says."""
    key = hashlib.sha256(b"".join((HERE / n).read_bytes() for n in ("go.mod", "go.sum", "main.go"))).hexdigest()[:16]
    path = cache_root() / "celeval" / key / "celeval"
    if not path.is_file():
        unavailable("celeval", f"{path} is not built", "celeval")
    return path


@dataclass
class Request:
    """One admission request, as the apiserver would build it for ``obj``."""

    obj: Mapping[str, Any]
    namespace: str
    operation: str = "CREATE"
    old: Mapping[str, Any] | None = None
    id: str = ""
    # The param informer's trouble for this request: True or "unsynced", "unknown" (tests/celeval/main.go).
    params_unavailable: bool | str = False

    def to_json(self) -> dict[str, Any]:
        api = str(self.obj["apiVersion"])
        group, _, version = api.rpartition("/")
        kind = str(self.obj["kind"])
        return {"id": self.id, "operation": self.operation, "namespace": self.namespace,
                "name": self.obj.get("metadata", {}).get("name", ""),
                "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": PLURALS[kind]},
                "object": self.obj, "oldObject": self.old, "paramsUnavailable": self.params_unavailable}


@dataclass
class Answer:
    allowed: bool
    message: str
    warnings: list[str]
    decisions: list[dict[str, Any]]
    mutated: dict[str, Any] | None
    errors: list[str]
    decoded: dict[str, Any] | None = None
    cost: dict[str, int] = field(default_factory=dict)


@dataclass
class Evaluation:
    compile_errors: list[dict[str, str]]
    answers: list[Answer]


def evaluate(objects: Sequence[Mapping[str, Any]], requests: Sequence[Request], compatibility: str = "",
             timeout: float = 240, param_kinds: Sequence[Mapping[str, str]] = (), cost: bool = False) -> Evaluation:
    """Every request through the policies, as an apiserver whose new expressions get the CEL environment of
    ``compatibility`` (its minor minus one; the library's default when empty) would admit it. ``objects`` may
    hold params (any object outside admissionregistration.k8s.io); ``param_kinds`` declares the scope of a param
    kind without objects ({"apiVersion", "kind", "scope": "Namespaced" or "Cluster"}). ``cost``: each answer's
    ``cost`` holds the CEL cost per policy, which takes celeval a second evaluation of each policy (left empty
    otherwise)."""
    document = {"compatibility": compatibility, "objects": list(objects), "paramKinds": list(param_kinds), "cost": cost,
                "requests": [dict(r.to_json(), id=r.id or str(n)) for n, r in enumerate(requests)]}
    done = subprocess.run([str(binary())], input=json.dumps(document), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"celeval failed ({done.returncode}): {done.stderr.strip()}")
    out = json.loads(done.stdout)
    answers = [Answer(r["allowed"], r.get("message", ""), r["warnings"], r["decisions"], r.get("mutated"),
                      r["errors"], decoded=r.get("decoded"), cost=r["cost"]) for r in out["results"]]
    return Evaluation(out["compileErrors"], answers)
