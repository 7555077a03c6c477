"""The AdmissionReview bodies the benchmark sends, shaped as the kube-apiserver sends them.

The objects start from the test builders (``tests/manifests.py``: the seed pod, a Deployment of it,
containers) and get what the apiserver has added by the time a webhook sees them: defaulted fields
(``imagePullPolicy``, ``terminationMessagePath``, ``dnsPolicy``, ...), the service-account token volume
and its mount in every container, the default not-ready/unreachable tolerations, ``managedFields``, and
the request's ``userInfo``, ``options``, ``requestKind``. A bare 1-container pod is ~0.4 KB; the
apiserver's is ~3 KB, and the cost of decoding and walking it is part of what is measured.

Each body has several variants differing only in ``request.uid`` (the apiserver never repeats one).
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from tests import manifests

# name -> what it is; the order is the order of tables and plots.
BODIES = {
    "seed": "the cuda-vector-add pod from the Kubernetes GPU guide (1 container, 1 GPU in limits)",
    "deployment": "a Deployment whose template is the seed pod",
    "pod10": "the seed pod with 10 GPU containers",
    "pod50": "the seed pod with 50 GPU containers",
    "nogpu": "a 1-container pod with cpu/memory only",
}
CONTAINER_SCALING = {"seed": 1, "pod10": 10, "pod50": 50}
UID_VARIANTS = 16

_TOKEN_VOLUME = "kube-api-access-x7k2p"


def _defaulted_container(c: dict[str, Any]) -> dict[str, Any]:
    c = copy.deepcopy(c)
    c.setdefault("imagePullPolicy", "IfNotPresent")
    c.setdefault("resources", {})
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("env", [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}])
    c.setdefault(
        "volumeMounts",
        [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "name": _TOKEN_VOLUME, "readOnly": True}],
    )
    return c


def _managed_fields(manager: str, api_version: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": api_version,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                "f:spec": {"f:containers": {}, "f:nodeSelector": {}, "f:restartPolicy": {}},
            },
            "manager": manager,
            "operation": "Update",
            "time": "2025-01-01T00:00:00Z",
        }
    ]


def apiserver_pod_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the defaults and admission-plugin additions a webhook sees on CREATE."""
    spec = copy.deepcopy(spec)
    spec["containers"] = [_defaulted_container(c) for c in spec["containers"]]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccount", "default")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault(
        "tolerations",
        [
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "tolerationSeconds": 300},
            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "tolerationSeconds": 300},
        ],
    )
    spec.setdefault(
        "volumes",
        [
            {
                "name": _TOKEN_VOLUME,
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}},
                        {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                                    "path": "namespace"}]}},
                    ],
                },
            }
        ],
    )
    return spec


def _with_metadata(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    metadata = obj.setdefault("metadata", {})
    metadata["namespace"] = namespace
    metadata.setdefault("labels", {"app": metadata.get("name", "app")})
    metadata["annotations"] = {
        **metadata.get("annotations", {}),
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(obj, separators=(",", ":"), sort_keys=True),
    }
    metadata["managedFields"] = _managed_fields("kubectl-client-side-apply", obj["apiVersion"])
    return obj


def seed_pod() -> dict[str, Any]:
    return manifests.seed_pod()


def many_container_pod(n: int) -> dict[str, Any]:
    """The seed pod with its one container repeated ``n`` times under distinct names."""
    base = manifests.seed_pod()
    template = base["spec"]["containers"][0]
    containers = [{**copy.deepcopy(template), "name": f"{template['name']}-{i}"} for i in range(n)]
    base["metadata"]["name"] = f"cuda-{n}-containers"
    base["spec"]["containers"] = containers
    return base


def no_gpu_pod() -> dict[str, Any]:
    return manifests.pod(
        manifests.container(
            "web", image="nginx:1.27", limits={"cpu": "500m", "memory": "256Mi"},
            requests={"cpu": "250m", "memory": "128Mi"}, ports=[{"containerPort": 80, "protocol": "TCP"}],
        ),
        name="web",
    )


def apiserver_object(obj: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    """A pod or workload as the apiserver hands it to admission on CREATE."""
    obj = copy.deepcopy(obj)
    _with_metadata(obj, namespace)
    if obj["kind"] == "Pod":
        obj["spec"] = apiserver_pod_spec(obj["spec"])
    else:
        template = obj["spec"]["template"]
        template["spec"] = apiserver_pod_spec(template["spec"])
        template["metadata"].setdefault("labels", {"app": obj["metadata"]["name"]})
        obj["spec"].setdefault("replicas", 1)
        obj["spec"].setdefault("selector", {"matchLabels": template["metadata"]["labels"]})
        obj["spec"].setdefault("strategy", {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
        obj["spec"].setdefault("revisionHistoryLimit", 10)
        obj["spec"].setdefault("progressDeadlineSeconds", 600)
    return obj


def objects() -> dict[str, dict[str, Any]]:
    seed = seed_pod()
    return {
        "seed": apiserver_object(seed),
        "deployment": apiserver_object(manifests.workload("Deployment", seed, name="cuda-vector-add")),
        "pod10": apiserver_object(many_container_pod(10)),
        "pod50": apiserver_object(many_container_pod(50)),
        "nogpu": apiserver_object(no_gpu_pod()),
    }


def review(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    document = manifests.admission_review(obj, namespace=obj["metadata"]["namespace"], uid=uid)
    request = document["request"]
    request["name"] = obj["metadata"]["name"]
    request["requestKind"] = request["kind"]
    request["requestResource"] = request["resource"]
    request["userInfo"] = {
        "username": "kubernetes-admin",
        "groups": ["kubeadm:cluster-admins", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=0f1e2d3c4b5a69788796a5b4c3d2e1f0"]},
    }
    request["options"] = {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "CreateOptions",
        "fieldManager": "kubectl-client-side-apply",
        "fieldValidation": "Strict",
    }
    return document


def bodies(variants: int = UID_VARIANTS) -> dict[str, list[bytes]]:
    """name -> ``variants`` encoded AdmissionReviews, identical but for ``request.uid``."""
    out: dict[str, list[bytes]] = {}
    for name, obj in objects().items():
        out[name] = [
            json.dumps(review(obj, str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpu-webhook-bench/{name}/{i}"))),
                       separators=(",", ":")).encode()
            for i in range(variants)
        ]
    return out
