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
VENDOR_NAME = Trigger("name", lambda ctx: f"!(name in {lits(_literal_gpu_names(ctx))})", "vendor")


@native("shared-gpu-over-one", fires=(VENDOR_NAME,))
def shared_gpu_over_one(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + string({count('value')}) + ' ' + name + ' asks for several replicas of a "
               f"shared GPU, which give no more compute than one (the kubelet refuses it with "
               f"failRequestsGreaterThanOne); ask for 1'")
    return per_name(r, "shared-gpu-over-one", ("limits", "requests"), "name in variables.shared",
                    f"{r.valid('value')} && {count('value')} > 1", message, f"string({count('value')})",
                    template="size(variables.shared) > 0", requests_only=True)


def _seen(r: Reads) -> str:
    """The fractional schedulers' names the container asks for (``sharing.requested``)."""
    lim, req = r.section("limits"), r.section("requests")
    test = "name in variables.vendor && name in variables.scheduler"
    return f"({lim}.filter(name, {test}) + {req}.filter(name, !(name in {lim}) && {test}))"


@native("fractional-gpu-request", fires=(VENDOR_NAME,))
def fractional_gpu_request(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = f"{r.label} + ': ' + name + ' is a percentage, 0 to 100, not ' + {r.shown('value')}"
    out = per_name(r, "fractional-gpu-request", ("limits", "requests"), "name in variables.percent",
                   f"!({r.valid('value')}) || {count('value')} > 100", message, r.shown("value"),
                   template="size(variables.percent) > 0", requests_only=True)
    containers = (Each("pod", "variables.templates", "size(variables.scheduler) > 0"), *r.containers())
    for absolute, percentage in EXCLUSIVE:
        both = lit(f": {absolute} and {percentage} both size the GPU memory; set one of them")
        out.append(Finding("fractional-gpu-request", containers,
                           f"{lit(absolute)} in seen && {lit(percentage)} in seen",
                           r.resources_path, r.resources_stable, lit(absolute + " + " + percentage),
                           f"{r.label} + {both}",
                           (("seen", _seen(r)),)))
    volcano = (f"seen.filter(name, name.startsWith('volcano.sh/vgpu-') && name != {lit(VOLCANO_COUNT)})"
               f".map(name, {{'name': name}})")
    message = (f"{r.label} + ': ' + vgpu + "
               + lit(" without " + VOLCANO_COUNT + ": Volcano mounts no GPU without a vGPU count"))
    out.append(Finding("fractional-gpu-request", containers, f"vgpu != '' && !({lit(VOLCANO_COUNT)} in seen)",
                       r.resources_path, r.resources_stable, "vgpu", message,
                       (("seen", _seen(r)),
                        ("vgpu", f"{sorted_by_name(ctx, volcano)}.map(record, record.name).join(', ')"))))
    return out


@native("gpu-monitoring-resource", fires=(VENDOR_NAME,))
def gpu_monitoring_resource(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + name + ' gives access to every GPU of the node; only trusted namespaces and "
               f"service accounts (isolation.trusted) may ask for it'")
    return per_name(r, "gpu-monitoring-resource", ("limits", "requests"), "name in variables.monitoring",
                    f"!{r.zero('value')}", message, "name", template="size(variables.monitoring) > 0 && !pod.trusted",
                    requests_only=True)
