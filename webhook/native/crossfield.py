"""The opt-in cross-field checks of ``webhook.rules.crossfield`` as findings: GPU and MIG mixed, init containers
holding GPUs, CPU pods on GPU nodes."""

from __future__ import annotations

from webhook.core.podspecs import CONTAINER_LISTS
from webhook.native.celtext import lit, lits
from webhook.native.findings import Each, Finding
from webhook.native.reads import Reads, held_counts, selector_path, sorted_by_name
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, is_gpu, plain, quoted, stable_item, tolerates_gpu_taint


@native("mixed-gpu-and-mig", fires=(Trigger("name", "name.startsWith('nvidia.com/mig-')", "mig"),))
def mixed_gpu_and_mig(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    slices = sorted_by_name(ctx, "gpus.filter(gpu, gpu.name.startsWith('nvidia.com/mig-'))")
    message = f"'container ' + {quoted(r.name)} + ' mixes nvidia.com/gpu with MIG slices (' + slices + ')'"
    loops = (Each("pod", "variables.templates", "pod.uses"), *r.containers())
    return [Finding("mixed-gpu-and-mig", loops, "gpus.exists(gpu, gpu.name == 'nvidia.com/gpu') && slices != ''",
                    r.resources_path, r.resources_stable, "slices", message,
                    (("gpus", r.counts()), ("slices", f"{slices}.map(gpu, gpu.name).join(', ')")))]


@native("init-container-gpus", fires=(Trigger("name", "field == 'initContainers'", "init"),))
def init_container_gpus(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    loops = (Each("pod", "variables.templates", "pod.uses && !pod.trusted"),
             *r.containers(("initContainers",), f"!{r.sidecar()}"))
    message = "'an init container asks for GPUs (' + held + '); they stay reserved for the pod\\'s lifetime'"
    return [Finding("init-container-gpus", loops, "held != ''", r.resources_path, r.resources_stable, "held", message,
                    (("held", held_counts(r, True)),))]


def _on_gpu_nodes(ctx: Ctx) -> str:
    """A template that tolerates a GPU taint or selects the accelerator label and names no GPU: cpu-pod-on-gpu-nodes
    speaks only of pods that name none (a GPU pod carries the accelerator selector the MutatingAdmissionPolicy
    injected)."""
    taints = sorted({t.key for t in ctx.policy.gpu_taints})
    listed = f" || toleration.key in {lits(taints)}" if taints else ""
    toleration = f"has(toleration.key) && (toleration.key.contains('/'){listed})"
    gpu_named = " || ".join(f"(has(container.resources.{s}) && container.resources.{s}.exists(name, "
                            f"{is_gpu(ctx, 'name')}))"
                            for s in ("limits", "requests"))
    label = lit(ctx.policy.node_label)
    return (f"((has(pod.spec.tolerations) && pod.spec.tolerations.exists(toleration, {toleration})) || "
            f"(has(pod.spec.nodeSelector) && {label} in pod.spec.nodeSelector)) && "
            f"!{_any_container(f'has(container.resources) && ({gpu_named})')}")


@native("cpu-pod-on-gpu-nodes", fires=(Trigger("template", _on_gpu_nodes, "gpu-nodes"),))
def cpu_pod_on_gpu_nodes(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    cpu_pod = Each("pod", "variables.templates", "!pod.uses && !pod.declares && !pod.holds && !pod.trusted")
    tolerations = Each("toleration", r.get("pod.spec", "tolerations", "list", "[]"),
                       f"{r.is_map('toleration')}{tolerates_gpu_taint(ctx, 'toleration')}", "i")
    path = "pod.path + '.tolerations[' + string(i) + ']'"
    stable = stable_item("pod.stable + '.tolerations'", "i", "toleration", "key")
    tolerated = Finding("cpu-pod-on-gpu-nodes", (cpu_pod, tolerations), "", path, stable, "toleration.key",
                        "'the pod uses no GPU but tolerates the ' + toleration.key + ' taint, so it can land on a "
                        "GPU node'")
    selector = r.get("pod.spec", "nodeSelector", "map", "{}")
    label = lit(ctx.policy.node_label)
    message = lit("the pod uses no GPU but selects " + ctx.policy.node_label + "=") + " + " + plain("selected")
    selects = Finding("cpu-pod-on-gpu-nodes", (cpu_pod,), f"{label} in {selector}", selector_path(ctx),
                      selector_path(ctx, "pod.stable"), plain("selected"), message,
                      (("selected", f"{selector}[{label}]"),))
    return [tolerated, selects]


def _any_container(test: str, lists: tuple[str, ...] = CONTAINER_LISTS) -> str:
    """Some container of template ``pod`` (in ``lists``), ``container``, passes ``test``."""
    return f"{lits(lists)}.exists(field, field in pod.spec && pod.spec[field].exists(container, {test}))"
