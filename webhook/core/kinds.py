"""The one registry of kinds: where each kind keeps its pod templates and its GPU resource blocks.

Every engine reads it: ``check`` and the webhook (``webhook.core.podspecs``: pod templates by table or by a walk,
resource blocks by these paths), the generated admission policies (``webhook.native.kinds``: CEL cannot walk an
unknown object, so it reads the template paths) and the chart (which custom resources its webhook is sent).

A path is dot-separated field names, ``*`` for every value of a map (PyTorchJob's replica types) and ``[*]`` after
a name for every item of a list (RayCluster's worker groups). A template path points at a pod template
(``{metadata, spec}``) or a bare pod spec. A resource block path points at a ``{limits, requests}`` mapping that
an operator copies into the containers it makes (KServe's model, the NIM operator's ``spec.resources``): the GPU
quantity rules read it as they read a container's resources.

The policy adds kinds, or replaces a known one, with ``nativePolicies.customKinds``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CustomKind:
    group: str
    resource: str  # the plural, as the apiserver serves it
    templates: tuple[str, ...]
    version: str = "*"
    kind: str = ""  # what `check` and the webhook know an object by (its `kind`); docs and stderr too
    blocks: tuple[str, ...] = ()  # paths of resource blocks outside the templates

    @property
    def title(self) -> str:
        return f"{self.kind or self.resource}.{self.group}"


def _kubeflow(kind: str, resource: str, field: str, version: str = "*") -> CustomKind:
    return CustomKind("kubeflow.org", resource, (f"spec.{field}.*.template",), version, kind)


# Where each kind keeps its RayCluster spec (headGroupSpec, workerGroupSpecs): a RayCluster is one, a RayJob and a
# RayService embed one. A kind that embeds one more is one row here: the replica checks read its cluster there
# (webhook.rules.crossfield), hybrid mode sends it to the webhook for them and the generated policies find its pod
# templates there.
RAY_CLUSTER_SPECS: dict[tuple[str, str], tuple[str, ...]] = {
    ("ray.io", "RayCluster"): ("spec",),
    ("ray.io", "RayJob"): ("spec", "rayClusterSpec"),
    ("ray.io", "RayService"): ("spec", "rayClusterConfig"),
}


def _ray(kind: str, resource: str, extra: tuple[str, ...] = ()) -> CustomKind:
    """A Ray kind: the head's and the worker groups' templates in its RayCluster spec (``RAY_CLUSTER_SPECS``)."""
    cluster = ".".join(RAY_CLUSTER_SPECS[("ray.io", kind)])
    templates = (f"{cluster}.headGroupSpec.template", f"{cluster}.workerGroupSpecs[*].template", *extra)
    return CustomKind("ray.io", resource, templates, "*", kind)


# Kinds whose pod templates the generated policies read (and `check` and the webhook find by their walk).
KNOWN_KINDS: tuple[CustomKind, ...] = (
    _kubeflow("PyTorchJob", "pytorchjobs", "pytorchReplicaSpecs"),
    _kubeflow("TFJob", "tfjobs", "tfReplicaSpecs"),
    _kubeflow("MPIJob", "mpijobs", "mpiReplicaSpecs"),
    _kubeflow("XGBoostJob", "xgboostjobs", "xgbReplicaSpecs"),
    _kubeflow("PaddleJob", "paddlejobs", "paddleReplicaSpecs"),
    _ray("RayCluster", "rayclusters"),
    _ray("RayJob", "rayjobs", ("spec.submitterPodTemplate",)),
    _ray("RayService", "rayservices"),
    CustomKind("jobset.x-k8s.io", "jobsets", ("spec.replicatedJobs[*].template.spec.template",), "*", "JobSet"),
    CustomKind("leaderworkerset.x-k8s.io", "leaderworkersets",
               ("spec.leaderWorkerTemplate.leaderTemplate", "spec.leaderWorkerTemplate.workerTemplate"), "*",
               "LeaderWorkerSet"),
)

# Kinds that keep GPUs in resource blocks outside any pod template: `check` and the webhook read those blocks;
# the generated policies leave these kinds to the webhook. From each project's API reference: KServe's
# InferenceService (a component's model or framework spec is a container's fields: `spec.predictor.model`,
# `spec.predictor.pytorch`...; its own `containers` are a pod spec), the NIM operator's NIMService, the vLLM
# production stack's VLLMRuntime, Kubeflow Trainer v2's TrainJob, Kubeflow notebooks v2's WorkspaceKind.
BLOCK_KINDS: tuple[CustomKind, ...] = (
    CustomKind("serving.kserve.io", "inferenceservices", (), "*", "InferenceService",
               ("spec.predictor.*.resources", "spec.transformer.*.resources", "spec.explainer.*.resources")),
    CustomKind("apps.nvidia.com", "nimservices", (), "*", "NIMService", ("spec.resources",)),
    CustomKind("production-stack.vllm.ai", "vllmruntimes", (), "*", "VLLMRuntime",
               ("spec.deploymentConfig.resources",)),
    CustomKind("trainer.kubeflow.org", "trainjobs", (), "*", "TrainJob", ("spec.trainer.resourcesPerNode",)),
    CustomKind("kubeflow.org", "workspacekinds", (), "*", "WorkspaceKind",
               ("spec.podTemplate.options.podConfig.values[*].spec.resources",)),
)

# Kinds whose resource block holds its GPUs as a count field beside a resource-name field, not as limits and
# requests: (group, kind) -> (block path, count key, name key, the name when absent). The vLLM production stack's
# VLLMRuntime keeps `deploymentConfig.resources: {gpu: "1", gpuType: nvidia.com/gpu}`, and its operator writes the
# count into the pod's requests and limits alike.
COUNT_FIELDS: dict[tuple[str, str], tuple[str, str, str, str]] = {
    ("production-stack.vllm.ai", "VLLMRuntime"): ("spec.deploymentConfig.resources", "gpu", "gpuType",
                                                  "nvidia.com/gpu"),
}

# Built-in kinds: (group, kind, plural) -> template path; the Pod is its own template.
BUILTIN_KINDS: tuple[tuple[str, str, str, str], ...] = (
    ("", "Pod", "pods", ""),
    ("", "PodTemplate", "podtemplates", "template"),
    ("", "ReplicationController", "replicationcontrollers", "spec.template"),
    ("apps", "Deployment", "deployments", "spec.template"),
    ("apps", "ReplicaSet", "replicasets", "spec.template"),
    ("apps", "StatefulSet", "statefulsets", "spec.template"),
    ("apps", "DaemonSet", "daemonsets", "spec.template"),
    ("batch", "Job", "jobs", "spec.template"),
    ("batch", "CronJob", "cronjobs", "spec.jobTemplate.spec.template"),
)

_SEGMENT = re.compile(r"(?:[A-Za-z0-9_-]+(?:\[\*\])?|\*)")


def path_problem(path: object) -> str | None:
    """Why a template or resource block path cannot be used, or None."""
    if not isinstance(path, str) or not path:
        return "must be a non-empty string"
    segments = path.split(".")
    if not all(_SEGMENT.fullmatch(s) for s in segments):
        return (f"{path!r} is not a template path (field names separated by '.', '*' for every value of a map, "
                "'name[*]' for every item of a list)")
    if segments[0] == "*":
        return f"{path!r} must start with a field name"
    return None


def custom_kinds(document: Mapping[str, Any]) -> list[CustomKind]:
    """The known kinds and the policy's ``nativePolicies.customKinds`` (a kind given again replaces the known)."""
    extra = [
        CustomKind(entry["group"], entry["resource"], tuple(entry.get("templates", ())), entry.get("version", "*"),
                   entry.get("kind", ""), tuple(entry.get("resources", ())))
        for entry in (document.get("nativePolicies") or {}).get("customKinds", [])
    ]
    given = {(k.group, k.resource) for k in extra}
    return [k for k in (*KNOWN_KINDS, *BLOCK_KINDS) if (k.group, k.resource) not in given] + extra


def shape(path: str) -> tuple[str, ...]:
    """The structure of a path: ``field``, ``items`` (``name[*]``) or ``values`` (``*``) per segment."""
    if not path:
        return ()
    return tuple("values" if s == "*" else "items" if s.endswith("[*]") else "field" for s in path.split("."))


def wildcards(kind: CustomKind) -> int:
    """The most wildcards (``*``, ``[*]``) in one of the kind's template paths."""
    return max((sum(1 for s in shape(p) if s != "field") for p in kind.templates), default=0)


__all__ = ["BLOCK_KINDS", "BUILTIN_KINDS", "COUNT_FIELDS", "KNOWN_KINDS", "RAY_CLUSTER_SPECS", "CustomKind",
           "custom_kinds", "path_problem", "shape", "wildcards"]
