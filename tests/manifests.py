"""Builders for the objects the tests admit: small, explicit, and shaped like real manifests."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def seed_pod() -> dict[str, Any]:
    """The cuda-vector-add pod from the Kubernetes "Schedule GPUs" guide."""
    return yaml.safe_load((EXAMPLES / "cuda-vector-add.yaml").read_text())


def container(name: str = "main", limits: dict | None = None, requests: dict | None = None, **extra: Any) -> dict:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    resources = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    if resources:
        c["resources"] = resources
    c.update(extra)
    return c


def pod(*containers: dict, name: str = "p", annotations: dict | None = None, **spec: Any) -> dict:
    metadata: dict[str, Any] = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers) or [container()], **spec},
    }


def workload(kind: str, pod_obj: dict, name: str = "w") -> dict:
    """``pod_obj`` wrapped as the pod template of a built-in workload kind."""
    template = {"metadata": copy.deepcopy(pod_obj["metadata"]), "spec": copy.deepcopy(pod_obj["spec"])}
    api = {"Deployment": "apps/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1", "DaemonSet": "apps/v1",
           "Job": "batch/v1", "CronJob": "batch/v1", "ReplicationController": "v1", "PodTemplate": "v1"}[kind]
    obj: dict[str, Any] = {"apiVersion": api, "kind": kind, "metadata": {"name": name}}
    if kind == "PodTemplate":
        obj["template"] = template
    elif kind == "CronJob":
        obj["spec"] = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}
    else:
        obj["spec"] = {"template": template}
    return obj


def pytorch_job(master: dict, worker: dict, name: str = "train") -> dict:
    """A Kubeflow PyTorchJob: pod templates under spec.pytorchReplicaSpecs.<role>.template."""
    def replica(p: dict, n: int) -> dict:
        return {"replicas": n, "template": {"metadata": p["metadata"], "spec": p["spec"]}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(master, 1), "Worker": replica(worker, 2)}},
    }


def ray_cluster(head: dict, workers: list[dict], name: str = "ray") -> dict:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": {"spec": head["spec"]}},
            "workerGroupSpecs": [
                {"groupName": f"g{i}", "rayStartParams": {}, "template": {"spec": w["spec"]}}
                for i, w in enumerate(workers)
            ],
        },
    }


def ray_job(head: dict, workers: list[dict], name: str = "ray-job", submitter: dict | None = None) -> dict:
    """A KubeRay RayJob: the RayCluster it starts under spec.rayClusterSpec (head and worker groups as
    :func:`ray_cluster` has them), and the pod that submits the entrypoint under spec.submitterPodTemplate."""
    spec: dict[str, Any] = {"entrypoint": "python /home/ray/train.py", "shutdownAfterJobFinishes": True,
                            "rayClusterSpec": ray_cluster(head, workers)["spec"]}
    if submitter is not None:
        spec["submitterPodTemplate"] = {"spec": submitter["spec"]}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name}, "spec": spec}


def ray_service(head: dict, workers: list[dict], name: str = "ray-serve") -> dict:
    """A KubeRay RayService: the RayCluster it serves on under spec.rayClusterConfig."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {"serveConfigV2": "applications: []\n", "rayClusterConfig": ray_cluster(head, workers)["spec"]},
    }


def device_class(name: str, extended: str | None = None) -> dict[str, Any]:
    """A DeviceClass selecting the devices of the driver of the same name; ``extended``: its extendedResourceName."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f"device.driver == '{name}'"}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def runtime_class(name: str, **node_selector: str) -> dict[str, Any]:
    """A RuntimeClass whose handler has its name; ``node_selector``: its scheduling.nodeSelector."""
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": name,
            **({"scheduling": {"nodeSelector": node_selector}} if node_selector else {})}


def resource_slice(node: str, driver: str, devices: int, **attributes: str) -> dict[str, Any]:
    """What a DRA driver publishes for ``node``: one pool of ``devices`` devices, each with string ``attributes``."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {k: {"string": v} for k, v in attributes.items()}}
                                 for i in range(devices)]}}


def admission_request(obj: dict | None, operation: str = "CREATE", namespace: str = "default",
                      uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002") -> dict:
    kind = obj.get("kind", "") if obj else "Pod"
    api = obj.get("apiVersion", "v1") if obj else "v1"
    group, _, version = api.rpartition("/")
    return {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": kind.lower() + "s"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "tester"},
        "object": obj,
        "oldObject": None,
        "dryRun": False,
    }


def admission_review(obj: dict | None, api_version: str = "admission.k8s.io/v1", **kw: Any) -> dict:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": admission_request(obj, **kw)}


def runtime_class_view(classes: dict[str, dict[str, str]] | None, node_label: str = "accelerator"):
    """A cluster view that knows only RuntimeClasses (name -> scheduling.nodeSelector); None stays None."""
    if classes is None:
        return None
    from webhook.core.cluster import ClusterState

    state = ClusterState(node_label)
    state.load([{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                 "handler": "nvidia", **({"scheduling": {"nodeSelector": selector}} if selector else {})}
                for name, selector in classes.items()], known=["runtimeclasses"])
    return state.view()


_DEFAULTS: list[Any] = []


def found(obj: dict, policy: Any = None, namespace: str = "default", view: Any = None, *, group: str | None = None,
          kind: str | None = None, sort: bool = False, drop_off: bool = False) -> set[tuple[str, str]] | list:
    """(path, rule) of every violation ``webhook.rules.pods.violations`` finds in ``obj``, under ``policy`` (a
    PolicySet; the built-in defaults when None) for ``namespace``, with the cluster ``view`` given (None: cluster
    checks off). The object's group and kind come from it unless given. A set; with ``sort``, a sorted list;
    with ``drop_off``, without the rules the namespace's policy sets off (admission drops them too)."""
    from webhook.core.podspecs import group_of
    from webhook.core.policyfile import parse_policy
    from webhook.rules.pods import violations

    if policy is None:
        if not _DEFAULTS:
            _DEFAULTS.append(parse_policy("{}"))
        policy = _DEFAULTS[0]
    in_force = policy.for_namespace(namespace)
    group = group if group is not None else group_of(obj.get("apiVersion"))
    pairs = [
        (str(v.path), v.rule)
        for v in violations(obj, group, kind or obj["kind"], in_force, view, namespace)
        if not drop_off or in_force.action(v.rule) != "off"
    ]
    return sorted(pairs) if sort else set(pairs)


def tls_secret(name: str, namespace: str, cert_pem: bytes, key_pem: bytes) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret holding a PEM certificate and key."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace},
            "data": {"tls.crt": base64.b64encode(cert_pem).decode(), "tls.key": base64.b64encode(key_pem).decode()}}
