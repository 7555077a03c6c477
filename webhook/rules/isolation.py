"""GPU isolation: what lets a container see GPUs the scheduler never gave it, and the runtime around it.

With NVIDIA's defaults (the toolkit's ``accept-nvidia-visible-devices-envvar-when-unprivileged = true``,
the device plugin's ``deviceListStrategy: envvar``) the container runtime hands a container the GPUs
its ``NVIDIA_VISIBLE_DEVICES`` names, whoever set it: the device plugin, the image, or the manifest.
A container that asked for no GPU but says ``all`` sees every GPU of its node, outside the scheduler's
accounting. The same holds for privileged containers, device nodes mounted from the host, mounts into
``/var/run/nvidia-container-devices`` (the ``volume-mounts`` strategy) and CDI annotations that the
runtime or NVIDIA's NRI plugin turn into devices.

Every check is pure and has its own rule id and setting. Pods of ``isolation.trusted`` namespaces and
service accounts (the GPU Operator, DCGM exporter: they see every GPU by design) skip the tenant rules.
The runtime-class checks that need the cluster take ``runtime_classes`` (RuntimeClass name -> its
``scheduling.nodeSelector``; None when cluster checks are off) from the caller.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from webhook.core.clusterview import ClusterView
from webhook.core.field import Violation
from webhook.core.podspecs import Container, PodSpecRef, affinity_keys, as_list, as_mapping
from webhook.core.policy import Policy
from webhook.core.quantity import shown
from webhook.core.resources import (
    CDI_KEYS,
    CDI_PREFIXES,
    DEVICE_DIRECTORIES,
    DEVICE_LIST_DIRECTORIES,
    DEVICE_VARIABLES,
    NO_DEVICES,
    NVIDIA_DEVICE_PREFIX,
    NVIDIA_RUNTIME_PREFIX,
    VISIBLE_DEVICES,
)
from webhook.rules.context import GpuUse, Named, PodContext


def _source(env_source: Mapping[str, Any]) -> str:
    for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret"), ("configMapKeyRef", "ConfigMap"),
                      ("secretKeyRef", "Secret")):
        ref = as_mapping(env_source.get(key))
        if ref:
            name = ref.get("name")
            return f"{kind} {shown(name)}" if isinstance(name, str) else kind
    if "fieldRef" in env_source:
        return "a field of the pod"
    if "resourceFieldRef" in env_source:
        return "a resource field"
    return "a source"


def runtime_reads(spec: Mapping[str, Any], policy: Policy, use: GpuUse) -> str | None:
    """Who reads the pod's NVIDIA_VISIBLE_DEVICES, in words; None when no NVIDIA runtime does.

    ``isolation.nvidiaRuntime: legacy``: the NVIDIA runtime is the nodes' default (or CRI-O's hook) and reads the
    variable in every pod. ``cdi`` (the GPU Operator's default from v25.10): only a pod under a RuntimeClass
    ``nvidia*``, named or injected by ``isolation.runtimeClass``, runs with it."""
    if policy.nvidia_runtime == "legacy":
        return "the NVIDIA runtime reads it in every pod (isolation.nvidiaRuntime: legacy)"
    name, _ = runtime_class_of(spec, policy, use)
    if name is None or not name.startswith(NVIDIA_RUNTIME_PREFIX):
        return None
    return f"the pod runs under runtimeClassName {name}, whose NVIDIA runtime reads it (isolation.nvidiaRuntime: cdi)"


def check_visible_devices(container: Container, policy: Policy, holds_gpu: bool, hidden: bool,
                          reads: str | None) -> list[Violation]:
    """A container with no GPU that names GPUs in NVIDIA_VISIBLE_DEVICES or NVIDIA_MIG_CONFIG_DEVICES, where an
    NVIDIA runtime reads them (``reads``: who, in words, from ``runtime_reads``).

    Only ``env[].value`` can be read here. ``env[].valueFrom`` and ``envFrom`` (a ConfigMap or Secret read
    by the kubelet) are reported under ``visible-devices-unread``; ``hidden`` (isolation.hideGpus will set
    the variable in env, which wins over envFrom) makes envFrom harmless. The image's own ENV is never
    visible at admission: ``isolation.hideGpus`` covers it.
    """
    if holds_gpu or reads is None:
        return []
    out: list[Violation] = []
    path, label = container.path, container.label
    named: set[str] = set()
    for j, item in enumerate(as_list(container.fields.get("env"))):
        if not isinstance(item, Mapping) or item.get("name") not in DEVICE_VARIABLES:
            continue
        name = str(item["name"])
        named.add(name)
        where = path.child("env").item(j, "name", name)
        source = item.get("valueFrom")
        if source is not None:
            if policy.checks("visible-devices-unread"):
                out.append(
                    Violation(
                        where.child("valueFrom"),
                        "visible-devices-unread",
                        f"{label} uses no GPU and takes {name} from {_source(as_mapping(source))}, which admission "
                        f"cannot read, and {reads}: anything but void or none there shows it GPUs it was not given",
                        name,
                    )
                )
            continue
        value = item.get("value", "")
        if isinstance(value, str) and value in NO_DEVICES:
            continue
        if policy.checks("visible-devices-without-gpu"):
            sees = "every GPU of its node" if value == "all" else "the GPUs it names"
            out.append(
                Violation(
                    where.child("value"),
                    "visible-devices-without-gpu",
                    f"{label} uses no GPU but sets {name}={shown(value)}, and {reads}: it would see {sees}, outside "
                    "the scheduler's accounting; remove it or set it to void",
                    shown(value),
                )
            )
    if VISIBLE_DEVICES in named or hidden or not policy.checks("visible-devices-unread"):
        return out
    for k, item in enumerate(as_list(container.fields.get("envFrom"))):
        if not isinstance(item, Mapping):
            continue
        prefix = item.get("prefix") or ""
        if not isinstance(prefix, str) or not VISIBLE_DEVICES.startswith(prefix) or prefix == VISIBLE_DEVICES:
            continue  # every variable it brings starts with a prefix that no device variable has
        source = _source(item)
        out.append(
            Violation(
                path.child("envFrom").index(k),
                "visible-devices-unread",
                f"{label} uses no GPU and imports variables from {source}, which admission cannot read, and "
                f"{reads}: if one is {VISIBLE_DEVICES} it may show it GPUs it was not given (set "
                f"{VISIBLE_DEVICES}=void in env, or isolation.hideGpus)",
                source,
            )
        )
    return out


def check_zero_gpu_limits(container: Container, names: tuple[Named, ...], policy: Policy) -> list[Violation]:
    """A GPU count of 0 allocates nothing, yet brings GPU tolerations (ExtendedResourceToleration, our own
    injection) and the accelerator selector: a pod with no GPU placed on a GPU node."""
    if not policy.checks("zero-gpu-limit"):
        return []
    out = []
    for n in names:
        if n.nonzero or (n.section == "requests" and n.name in container.limits):
            continue
        if not (n.gpu or (n.entry is not None and n.entry.kind.counts)):
            continue
        out.append(
            Violation(
                container.resources_path.child(n.section).key(n.name),
                "zero-gpu-limit",
                f"{container.label}: {n.name}: 0 allocates no GPU but may still tolerate GPU taints "
                "and select GPU nodes; leave the resource out",
                n.name,
            )
        )
    return out


def gpu_node_reasons(spec: Mapping[str, Any], policy: Policy) -> list[str]:
    """Why a pod may land on a GPU node although it asks for no GPU: selectors and tolerations."""
    reasons = []
    selected = as_mapping(spec.get("nodeSelector")).get(policy.node_label)
    if isinstance(selected, str):
        reasons.append(f"selects {policy.node_label}={selected}")
    elif policy.node_label in affinity_keys(spec):
        reasons.append(f"requires {policy.node_label} by node affinity")
    tolerations = [as_mapping(t) for t in as_list(spec.get("tolerations"))]
    # Said once however many tolerations match every taint (one per effect is common), before the keyed ones.
    if any(t.get("key") in (None, "") and t.get("operator") == "Exists" for t in tolerations):
        reasons.append("tolerates every taint")
    reasons.extend(f"tolerates the {t['key']} taint" for t in tolerations if policy.tolerates_gpu_taint(t))
    return reasons


def check_privileged(ctx: PodContext) -> list[Violation]:
    """Privileged containers see every device of their node: with a GPU, beside GPU containers, or in a pod
    that selects or tolerates GPU nodes, that is every GPU. The caller skips trusted pods."""
    policy, use = ctx.policy, ctx.use
    if not policy.checks("privileged-gpu"):
        return []
    reasons = None
    out = []
    for container in ctx.containers:
        if not privileged(container):
            continue
        label = container.label
        if use.holds(container.list_name, container.position):
            why = f"{label} is privileged and holds a GPU: it sees every GPU of its node, not only its own"
        elif use.any:
            why = f"{label} is privileged in a pod with GPUs: it runs on a GPU node and sees every GPU of it"
        else:
            reasons = gpu_node_reasons(ctx.spec, policy) if reasons is None else reasons
            if not reasons:
                continue
            why = (f"{label} is privileged and its pod {', '.join(reasons)}: on a GPU node it sees every GPU, "
                   "outside the scheduler's accounting")
        out.append(
            Violation(
                container.path.child("securityContext").child("privileged"),
                "privileged-gpu",
                f"{why}; only trusted namespaces and service accounts (isolation.trusted) may",
                "true",
            )
        )
    return out


HOST_PID_GPU = ("the pod shares its node's process namespace (hostPID) and uses GPUs: it sees and can signal every "
                "process of the node, other tenants' GPU jobs included; only trusted namespaces and service accounts "
                "(isolation.trusted), such as a GPU monitoring agent, may")


def check_host_pid(ctx: PodContext) -> list[Violation]:
    """``hostPID: true`` on a pod that uses GPUs. The caller skips trusted pods."""
    if not ctx.policy.checks("host-pid-gpu") or ctx.spec.get("hostPID") is not True or not ctx.use.any:
        return []
    return [Violation(ctx.path.child("hostPID"), "host-pid-gpu", HOST_PID_GPU, "true")]


def _normal(path: str) -> str:
    # normpath keeps a leading "//" (POSIX allows it a meaning); Linux gives it none.
    return posixpath.normpath("/" + path.lstrip("/"))


def exposes_gpu_devices(host_path: str) -> bool:
    """A host path that is a GPU device node, holds some, or is a directory above them (/, /dev)."""
    path = _normal(host_path)
    if path in ("/", "/dev") or path.startswith(NVIDIA_DEVICE_PREFIX):
        return True
    return any(path == d or path.startswith(d + "/") for d in DEVICE_DIRECTORIES)


def _in_device_list(mount_path: str) -> bool:
    if "nvidia-container-devices" not in mount_path:  # normalising keeps every name: no need to normalise
        return False
    path = _normal(mount_path)
    return any(path == d or path.startswith(d + "/") for d in DEVICE_LIST_DIRECTORIES)


def privileged(container: Container) -> bool:
    return as_mapping(container.fields.get("securityContext")).get("privileged") is True


def _mounted_by_privileged(ctx: PodContext, volume: object) -> bool:
    """Some privileged container (init and ephemeral ones included) mounts the volume named ``volume``."""
    return any(
        privileged(c) and any(as_mapping(m).get("name") == volume for m in as_list(c.fields.get("volumeMounts")))
        for c in ctx.containers
    )


def check_device_mounts(ctx: PodContext) -> list[Violation]:
    """GPU device nodes by hostPath where a privileged container mounts them, and mounts where the volume-mounts
    strategy reads the GPUs to inject. The caller skips trusted pods.

    The device cgroup lets a container open only the devices the runtime granted it (the device plugin's, DRA's,
    CDI's), whatever its mounts show: a hostPath of ``/dev`` or ``/`` in a container that is not privileged shows the
    device nodes but cannot open them. A privileged container may open every device."""
    if not ctx.policy.checks("gpu-device-mount"):
        return []
    out = []
    for i, volume in enumerate(as_list(ctx.spec.get("volumes"))):
        volume = as_mapping(volume)
        host_path = as_mapping(volume.get("hostPath")).get("path")
        if isinstance(host_path, str) and exposes_gpu_devices(host_path) and _mounted_by_privileged(
                ctx, volume.get("name")):
            out.append(
                Violation(
                    ctx.path.child("volumes").item(i, "name", volume.get("name")).child("hostPath").child("path"),
                    "gpu-device-mount",
                    f"hostPath {shown(host_path)} is mounted by a privileged container, which can open the node's "
                    "GPU devices through it, outside the scheduler's accounting; GPUs come from resources",
                    host_path,
                )
            )
    for container in ctx.containers:
        for k, mount in enumerate(as_list(container.fields.get("volumeMounts"))):
            mount_path = as_mapping(mount).get("mountPath")
            if isinstance(mount_path, str) and _in_device_list(mount_path):
                out.append(
                    Violation(
                        container.path.child("volumeMounts").item(k, "mountPath", mount_path).child("mountPath"),
                        "gpu-device-mount",
                        f"{container.label}: a mount at {shown(mount_path)} asks the NVIDIA runtime "
                        "(volume-mounts device list strategy) for the GPUs it names, outside the scheduler's "
                        "accounting",
                        mount_path,
                    )
                )
    return out


def is_cdi_annotation(key: object) -> bool:
    return isinstance(key, str) and (key.startswith(CDI_PREFIXES) or key in CDI_KEYS)


def check_cdi_annotations(ref: PodSpecRef, policy: Policy) -> list[Violation]:
    """CDI device names in pod annotations: the container runtime (or NVIDIA's NRI plugin) injects them,
    ``nvidia.com/gpu=all`` included, whatever the scheduler allocated. The caller skips trusted pods."""
    if not policy.checks("cdi-annotation"):
        return []
    out = []
    for key, value in as_mapping(ref.metadata.get("annotations")).items():
        if not is_cdi_annotation(key):
            continue
        management = isinstance(value, str) and "management.nvidia.com/" in value
        extra = " (management.nvidia.com/gpu opens every GPU of the node)" if management else ""
        out.append(
            Violation(
                ref.metadata_path.child("annotations").key(key),
                "cdi-annotation",
                f"annotation {key}={shown(value)} asks the container runtime to inject CDI devices{extra}, outside "
                "the scheduler's accounting; only trusted namespaces and service accounts (isolation.trusted) may",
                shown(value),
            )
        )
    return out


def check_runtime_class_without_gpu(ref: PodSpecRef, policy: Policy, use: GpuUse) -> list[Violation]:
    """``runtimeClassName: nvidia*`` on a pod with no GPU: the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES
    from the image (CUDA images say all). The caller skips trusted pods."""
    name = ref.spec.get("runtimeClassName")
    if use.any or not isinstance(name, str) or not name.startswith(NVIDIA_RUNTIME_PREFIX):
        return []
    if not policy.checks("runtime-class-without-gpu"):
        return []
    return [
        Violation(
            ref.path.child("runtimeClassName"),
            "runtime-class-without-gpu",
            f"runtimeClassName {name} on a pod that uses no GPU: the NVIDIA runtime shows it the GPUs its image's "
            f"{VISIBLE_DEVICES} names (all, in CUDA images); use the default runtime",
            name,
        )
    ]


def effective_node_selector(spec: Mapping[str, Any], metadata: Mapping[str, Any], policy: Policy) -> dict[str, str]:
    """The pod's nodeSelector once mutation has added the accelerator (annotation, else default)."""
    selector = {k: v for k, v in as_mapping(spec.get("nodeSelector")).items() if isinstance(v, str)}
    if policy.node_label not in selector and policy.node_label not in affinity_keys(spec):
        injected = policy.injected_accelerator(as_mapping(metadata.get("annotations")).get(policy.annotation))
        if injected is not None:
            selector[policy.node_label] = injected
    return selector


def runtime_class_conflicts(class_selector: Mapping[str, str], pod_selector: Mapping[str, str]) -> list[str]:
    """``key: class value != pod value`` for each key both set differently: the apiserver's RuntimeClass
    admission merges the two and rejects the pod on any conflict."""
    return [
        f"{key}={value} (pod: {pod_selector[key]})"
        for key, value in sorted(class_selector.items())
        if key in pod_selector and pod_selector[key] != value
    ]


def runtime_class_of(spec: Mapping[str, Any], policy: Policy, use: GpuUse) -> tuple[str | None, bool]:
    """(RuntimeClass the pod will run with, whether isolation.runtimeClass injects it)."""
    named = spec.get("runtimeClassName")
    if isinstance(named, str) and named:
        return named, False
    if named is None and policy.runtime_class and use.counted and not use.fractional:
        return policy.runtime_class, True
    return None, False


def check_runtime_class(
    ref: PodSpecRef, policy: Policy, use: GpuUse, runtime_classes: Mapping[str, Mapping[str, str]] | None
) -> list[Violation]:
    """Cluster-aware: the GPU pod's RuntimeClass (named, or what isolation.runtimeClass injects) exists,
    and its scheduling.nodeSelector agrees with the pod's, our accelerator selector included. A Pod that
    fails either is refused by the apiserver; a Deployment's pods fail to be created, again and again."""
    if runtime_classes is None or not use.any:
        return []
    name, injected = runtime_class_of(ref.spec, policy, use)
    if name is None:
        return []
    where = ref.path.child("runtimeClassName")
    origin = f"isolation.runtimeClass injects {name}" if injected else f"runtimeClassName {name}"
    if name not in runtime_classes:
        if not policy.checks("unknown-runtime-class"):
            return []
        return [
            Violation(
                where,
                "unknown-runtime-class",
                f"{origin}, but no such RuntimeClass exists, so the pod would be refused or never run "
                f"(RuntimeClasses in the cluster: {len(runtime_classes)})",
                name,
            )
        ]
    conflicts = runtime_class_conflicts(runtime_classes[name], effective_node_selector(ref.spec, ref.metadata, policy))
    if not conflicts or not policy.checks("runtime-class-conflict"):
        return []
    return [
        Violation(
            where,
            "runtime-class-conflict",
            f"{origin}, whose scheduling.nodeSelector contradicts the pod's: {', '.join(conflicts)}; the "
            "apiserver would reject the pod",
            f"{name}: {', '.join(conflicts)}",
        )
    ]


def hides_gpus(policy: Policy, use: GpuUse) -> bool:
    """Whether isolation.hideGpus will set NVIDIA_VISIBLE_DEVICES in the env of this pod's CPU containers."""
    return policy.hide_gpus != "off" and not use.fractional


def check_container_isolation(
    container: Container, names: tuple[Named, ...], ctx: PodContext, hidden: bool, reads: str | None
) -> list[Violation]:
    """The isolation rules on one container (``pods`` calls it from its own pass over the containers, with the
    container's ``names``); ``hidden``: whether isolation.hideGpus sets the pod's variable (``hides_gpus``);
    ``reads``: who reads the device variables (``runtime_reads``)."""
    out = check_zero_gpu_limits(container, names, ctx.policy)
    if not ctx.trusted:
        holds = ctx.use.holds(container.list_name, container.position)
        out.extend(check_visible_devices(container, ctx.policy, holds, hidden, reads))
    return out


def check_isolation(ctx: PodContext) -> list[Violation]:
    """The isolation rules on one pod spec as a whole; the per-container ones are ``check_container_isolation``."""
    out: list[Violation] = []
    if not ctx.trusted:
        out.extend(check_privileged(ctx))
        out.extend(check_host_pid(ctx))
        out.extend(check_device_mounts(ctx))
        out.extend(check_cdi_annotations(ctx.ref, ctx.policy))
        out.extend(check_runtime_class_without_gpu(ctx.ref, ctx.policy, ctx.use))
    out.extend(check_runtime_class(ctx.ref, ctx.policy, ctx.use, runtime_classes(ctx.view, ctx.policy)))
    return out


RuntimeClasses = Mapping[str, Mapping[str, str]]  # RuntimeClass name -> its scheduling.nodeSelector


def runtime_classes(view: ClusterView | None, policy: Policy) -> RuntimeClasses | None:
    """RuntimeClass name -> its scheduling.nodeSelector, when the cluster checks know the RuntimeClasses."""
    if view is None or not policy.cluster_enabled or "runtimeclasses" not in view.known:
        return None
    return view.runtime_class_node_selectors
