"""The opt-in cross-field checks of ``webhook.rules.crossfield`` as findings: GPU and MIG mixed, init containers
holding GPUs, CPU pods on GPU nodes."""

from __future__ import annotations

from webhook.core.podspecs import CONTAINER_LISTS
from webhook.native.celtext import lit, lits
from webhook.native.findings import Each, Finding
from webhook.native.reads import Reads, held_counts, selector_path, sorted_by_name
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, is_gpu, plain, quoted, stable_item, tolerates_gpu_taint


@native("mixed-gpu-and-mig", fires=(Trigger("name", "k.startsWith('nvidia.com/mig-')", "mig"),))
def mixed_gpu_and_mig(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    slices = sorted_by_name(ctx, "G.filter(x, x.name.startsWith('nvidia.com/mig-'))")
    message = f"'container ' + {quoted(r.name)} + ' mixes nvidia.com/gpu with MIG slices (' + S + ')'"
    loops = (Each("t", "variables.templates", "t.uses"), *r.containers())
    return [Finding("mixed-gpu-and-mig", loops, "G.exists(x, x.name == 'nvidia.com/gpu') && S != ''",
                    r.resources_path, r.resources_stable, "S", message,
                    (("G", r.counts()), ("S", f"{slices}.map(x, x.name).join(', ')")))]


@native("init-container-gpus", fires=(Trigger("name", "l == 'initContainers'", "init"),))
def init_container_gpus(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    loops = (Each("t", "variables.templates", "t.uses && !t.trusted"),
             *r.containers(("initContainers",), f"!{r.sidecar()}"))
    message = "'an init container asks for GPUs (' + h + '); they stay reserved for the pod\\'s lifetime'"
    return [Finding("init-container-gpus", loops, "h != ''", r.resources_path, r.resources_stable, "h", message,
                    (("h", held_counts(r, True)),))]


def _on_gpu_nodes(ctx: Ctx) -> str:
    """A template that tolerates a GPU taint or selects the accelerator label and names no GPU: cpu-pod-on-gpu-nodes
    speaks only of pods that name none (a GPU pod carries the accelerator selector the MutatingAdmissionPolicy
    injected)."""
    taints = sorted({t.key for t in ctx.policy.gpu_taints})
    toleration = "has(x.key) && (x.key.contains('/')" + (f" || x.key in {lits(taints)}" if taints else "") + ")"
    gpu_named = " || ".join(f"(has(c.resources.{s}) && c.resources.{s}.exists(k, {is_gpu(ctx, 'k')}))"
                            for s in ("limits", "requests"))
    label = lit(ctx.policy.node_label)
    return (f"((has(t.spec.tolerations) && t.spec.tolerations.exists(x, {toleration})) || "
            f"(has(t.spec.nodeSelector) && {label} in t.spec.nodeSelector)) && "
            f"!{_any_container(f'has(c.resources) && ({gpu_named})')}")


@native("cpu-pod-on-gpu-nodes", fires=(Trigger("template", _on_gpu_nodes, "gpu-nodes"),))
def cpu_pod_on_gpu_nodes(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    cpu_pod = Each("t", "variables.templates", "!t.uses && !t.declares && !t.holds && !t.trusted")
    tolerations = Each("x", r.get("t.spec", "tolerations", "list", "[]"),
                       f"{r.is_map('x')}{tolerates_gpu_taint(ctx, 'x')}", "i")
    path = "t.path + '.tolerations[' + string(i) + ']'"
    stable = stable_item("t.stable + '.tolerations'", "i", "x", "key")
    tolerated = Finding("cpu-pod-on-gpu-nodes", (cpu_pod, tolerations), "", path, stable, "x.key",
                        "'the pod uses no GPU but tolerates the ' + x.key + ' taint, so it can land on a GPU node'")
    selector = r.get("t.spec", "nodeSelector", "map", "{}")
    label = lit(ctx.policy.node_label)
    message = lit("the pod uses no GPU but selects " + ctx.policy.node_label + "=") + " + " + plain("v")
    selects = Finding("cpu-pod-on-gpu-nodes", (cpu_pod,), f"{label} in {selector}", selector_path(ctx),
                      selector_path(ctx, "t.stable"), plain("v"), message, (("v", f"{selector}[{label}]"),))
    return [tolerated, selects]


def _any_container(test: str, lists: tuple[str, ...] = CONTAINER_LISTS) -> str:
    """Some container of template ``t`` (in ``lists``), ``c``, passes ``test``."""
    return f"{lits(lists)}.exists(l, l in t.spec && t.spec[l].exists(c, {test}))"
