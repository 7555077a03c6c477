"""The checks of ``webhook.rules.sharing`` on the vendor names as findings: shared GPUs over one, fractional
requests, monitoring resources."""

from __future__ import annotations

import re

from webhook.core.resources import EXCLUSIVE, VOLCANO_COUNT
from webhook.native.celtext import GLOB_META, every_policy, lit, lits
from webhook.native.findings import Each, Finding
from webhook.native.reads import Reads, per_name, sorted_by_name
from webhook.native.registry import Trigger, native
from webhook.native.snippets import READ_BY_SHARING, Ctx, count


def _literal_gpu_names(ctx: Ctx) -> list[str]:
    """The policy's GPU names written without a glob in every namespace that are no vendor name the sharing rules
    read: a container naming only these (with plain counts) gives those rules nothing to find."""
    names = set.intersection(*(set(p.resources) for p in every_policy(ctx.policies)))
    return sorted(n for n in names if not any(c in n for c in GLOB_META) and not re.fullmatch(READ_BY_SHARING, n))


# A name the vendor-name checks may read: anything but the policy's plain GPU names.
VENDOR_NAME = Trigger("name", lambda ctx: f"!(k in {lits(_literal_gpu_names(ctx))})", "vendor")


@native("shared-gpu-over-one", fires=(VENDOR_NAME,))
def shared_gpu_over_one(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + string({count('x')}) + ' ' + k + ' asks for several replicas of a shared GPU, "
               f"which give no more compute than one (the kubelet refuses it with failRequestsGreaterThanOne); "
               f"ask for 1'")
    return per_name(r, "shared-gpu-over-one", ("limits", "requests"), "k in variables.shared",
                    f"{r.valid('x')} && {count('x')} > 1", message, f"string({count('x')})",
                    template="size(variables.shared) > 0", requests_only=True)


def _seen(r: Reads) -> str:
    """The fractional schedulers' names the container asks for (``sharing.requested``)."""
    lim, req = r.section("limits"), r.section("requests")
    test = "k in variables.vendor && k in variables.scheduler"
    return f"({lim}.filter(k, {test}) + {req}.filter(k, !(k in {lim}) && {test}))"


@native("fractional-gpu-request", fires=(VENDOR_NAME,))
def fractional_gpu_request(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + k + ' is a percentage, 0 to 100, not ' + {r.shown('x')}"
    out = per_name(r, "fractional-gpu-request", ("limits", "requests"), "k in variables.percent",
                   f"!({r.valid('x')}) || {count('x')} > 100", message, r.shown("x"),
                   template="size(variables.percent) > 0", requests_only=True)
    containers = (Each("t", "variables.templates", "size(variables.scheduler) > 0"), *r.containers())
    for absolute, percentage in EXCLUSIVE:
        both = lit(f": {absolute} and {percentage} both size the GPU memory; set one of them")
        out.append(Finding("fractional-gpu-request", containers, f"{lit(absolute)} in V && {lit(percentage)} in V",
                           r.resources_path, r.resources_stable, lit(absolute + " + " + percentage),
                           f"{r.label} + {both}",
                           (("V", _seen(r)),)))
    volcano = f"V.filter(k, k.startsWith('volcano.sh/vgpu-') && k != {lit(VOLCANO_COUNT)}).map(k, {{'name': k}})"
    message = (f"{r.label} + ': ' + W + "
               + lit(" without " + VOLCANO_COUNT + ": Volcano mounts no GPU without a vGPU count"))
    out.append(Finding("fractional-gpu-request", containers, f"W != '' && !({lit(VOLCANO_COUNT)} in V)",
                       r.resources_path, r.resources_stable, "W", message,
                       (("V", _seen(r)), ("W", f"{sorted_by_name(ctx, volcano)}.map(x, x.name).join(', ')"))))
    return out


@native("gpu-monitoring-resource", fires=(VENDOR_NAME,))
def gpu_monitoring_resource(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + k + ' gives access to every GPU of the node; only trusted namespaces and "
               f"service accounts (isolation.trusted) may ask for it'")
    return per_name(r, "gpu-monitoring-resource", ("limits", "requests"), "k in variables.monitoring",
                    f"!{r.zero('x')}", message, "k", template="size(variables.monitoring) > 0 && !t.trusted",
                    requests_only=True)
