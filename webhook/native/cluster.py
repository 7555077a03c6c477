"""The cluster rules that read the cluster's facts: ``status.cluster`` of GPUPolicy/default, through ``params``.

The status writer keeps a summary of the cluster there (``webhook.core.clustersummary``), so a policy that reads the
object live can also read which accelerator models the nodes carry and which RuntimeClasses exist. CEL has no
clock; ``params.FACTS`` is the summary while it is at most ``FRESH_FOR`` seconds older than the request (see
``webhook.native.params``), else empty: with no summary, a stale one, or a section cut at its bound (``truncated``),
these rules refuse nothing and the webhook, where it runs, still decides.

Inline policies read no object, so there these rules stay with the webhook (:data:`INLINE_WHY`).
"""

from __future__ import annotations

from webhook.native import params
from webhook.native.celtext import lit
from webhook.native.findings import Each, Finding
from webhook.native.pods import ANNOTATED, annotated, selected
from webhook.native.reads import Reads
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, is_gpu

INLINE_WHY = ("reads the cluster's facts in GPUPolicy/default's status.cluster, which only policies that read the "
              "object live can (nativePolicies.params: live)")


def _default_gpu(ctx: Ctx) -> str:
    return f"{params.expression('default')} != '' && {is_gpu(ctx, 'name')}"


def _selects(ctx: Ctx) -> str:
    return f"has(pod.spec.nodeSelector) && {lit(ctx.policy.node_label)} in pod.spec.nodeSelector"


@native("unknown-accelerator", reads_facts=True,
        fires=(ANNOTATED, Trigger("template", _selects, "selector"), Trigger("name", _default_gpu, "default-gpu")))
def unknown_accelerator(ctx: Ctx) -> list[Finding]:
    """``capacity.check_cluster``: the accelerator the pod names (annotation, then nodeSelector) or the default
    mutation injects is a value of the node label that no node carries."""
    if not (ctx.live and ctx.policy.cluster_enabled):  # cluster.enabled is compiled in
        return []
    r = Reads(ctx)
    label = ctx.policy.node_label
    # The first of the annotation, the nodeSelector and the default that is a non-empty string (accelerator_of).
    candidates = f"[{annotated(r)}, {selected(r)}, dyn({params.of('default')})]"
    chosen = (f"[{candidates}.filter(value, value != null && value != '')].map(found, "
              f"size(found) > 0 ? found[0] : null)[0]")
    models = f"{params.FACTS}.models"
    message = (f"{lit('no node has ' + label + '=')} + accelerator + "
               f"{lit(', so the pod would stay Pending (values of ' + label + ' on the nodes: ')} + "
               f"string(size({models})) + ')'")
    return [Finding("unknown-accelerator", (Each("pod", "variables.templates", "pod.uses"),),
                    f"accelerator != null && {params.facts_section('models')} && !(accelerator in {models})",
                    "pod.path", "pod.stable", "accelerator", message, (("accelerator", f"dyn({chosen})"),))]


@native("unknown-runtime-class", reads_facts=True, fires=(Trigger(
    "template", "has(pod.spec.runtimeClassName) && pod.spec.runtimeClassName != ''", "runtime-named"),))
def unknown_runtime_class(ctx: Ctx) -> list[Finding]:
    """``isolation.check_runtime_class``: the RuntimeClass a GPU pod names does not exist. (One the webhook's
    mutation would inject is named in the object by the time a Pod is validated.)"""
    if not (ctx.live and ctx.policy.cluster_enabled):  # cluster.enabled is compiled in
        return []
    r = Reads(ctx)
    name = r.get("pod.spec", "runtimeClassName", "string", "''")
    classes = f"{params.FACTS}.runtimeClasses"
    message = ("'runtimeClassName ' + runtime_class + ', but no such RuntimeClass exists, so the pod would be "
               f"refused or never run (RuntimeClasses in the cluster: ' + string(size({classes})) + ')'")
    return [Finding("unknown-runtime-class", (Each("pod", "variables.templates", "pod.holds"),),
                    f"runtime_class != '' && {params.facts_section('runtimeClasses')} && !(runtime_class in {classes})",
                    "pod.path + '.runtimeClassName'", "pod.stable + '.runtimeClassName'", "runtime_class", message,
                    (("runtime_class", name),))]
