"""The cluster rules that read the cluster's facts: ``status.cluster`` of GPUPolicy/default, through ``params``.

The status writer keeps a summary of the cluster there (``webhook.core.clustersummary``), so a policy that reads the
object live can also read which accelerator models the nodes carry and which RuntimeClasses and DeviceClasses exist.
CEL has no clock; ``params.FACTS`` is the summary while it is at most ``FRESH_FOR`` seconds older than the request
(see ``webhook.native.params``), else empty: with no summary, a stale one, or a section cut at its bound
(``truncated``), these rules refuse nothing and the webhook, where it runs, still decides.

Inline policies read no object, so there these rules stay with the webhook (:data:`INLINE_WHY`).
"""

from __future__ import annotations

from webhook.native import params
from webhook.native.celtext import lit
from webhook.native.claims import DEVICE_CLASS, DEVICE_COUNT, DEVICES, REQUESTS
from webhook.native.findings import Each, Finding
from webhook.native.pods import ANNOTATED, FIRST_COUNTED, ODD_COUNT, annotated, plain_sum, selected, total
from webhook.native.reads import Reads
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, is_gpu, quoted, ranked

INLINE_WHY = ("reads the cluster's facts in GPUPolicy/default's status.cluster, which only policies that read the "
              "object live can (nativePolicies.params: live)")


def _reads_facts(ctx: Ctx) -> bool:
    """Whether these rules are generated: the policies read the object live and ``cluster.enabled`` (compiled in)."""
    return ctx.live and ctx.policy.cluster_enabled


# What can make a rule fire (its trigger) reads the facts too (params.PARAM_FACTS): an ordinary GPU pod on a cluster
# that has what it asks for then skips the policies that hold these rules.


def _default_gpu(ctx: Ctx) -> str:
    default = params.expression("default")
    return f"{default} != '' && {params.unknown_fact(default, 'models')} && {is_gpu(ctx, 'name')}"


def _selects(ctx: Ctx) -> str:
    label = lit(ctx.policy.node_label)
    return (f"has(pod.spec.nodeSelector) && {label} in pod.spec.nodeSelector && "
            f"{params.unknown_fact(f'pod.spec.nodeSelector[{label}]', 'models')}")


def _accelerator(ctx: Ctx, r: Reads) -> str:
    """The accelerator of template ``pod`` as ``capacity.check_cluster`` takes it: the first of the annotation, the
    nodeSelector and the default that is a non-empty string; else null."""
    candidates = f"[{annotated(r)}, {selected(r)}, dyn({params.of('default')})]"
    return (f"dyn([{candidates}.filter(value, value != null && value != '')].map(found, "
            f"size(found) > 0 ? found[0] : null)[0])")


@native("unknown-accelerator", reads_facts=True,
        fires=(ANNOTATED, Trigger("template", _selects, "selector"), Trigger("name", _default_gpu, "default-gpu")))
def unknown_accelerator(ctx: Ctx) -> list[Finding]:
    """``capacity.check_cluster``: the accelerator the pod names (annotation, then nodeSelector) or the default
    mutation injects is a value of the node label that no node carries."""
    if not _reads_facts(ctx):
        return []
    r = Reads(ctx)
    label = ctx.policy.node_label
    models = f"{params.FACTS}.models"
    message = (f"{lit('no node has ' + label + '=')} + accelerator + "
               f"{lit(', so the pod would stay Pending (values of ' + label + ' on the nodes: ')} + "
               f"string(size({models})) + ')'")
    return [Finding("unknown-accelerator", (Each("pod", "variables.templates", "pod.uses"),),
                    f"accelerator != null && {params.facts_section('models')} && !(accelerator in {models})",
                    "pod.path", "pod.stable", "accelerator", message, (("accelerator", _accelerator(ctx, r)),))]


def _class_of_template(ctx: Ctx) -> str:
    """The RuntimeClass template ``pod`` names, else the namespace's isolation.runtimeClass ('' for none), as a
    matchCondition reads it (a trigger may fire where its rule finds nothing: a CPU pod, a fractional one)."""
    return (f"(has(pod.spec.runtimeClassName) ? pod.spec.runtimeClassName : "
            f"{params.expression('runtimeClass')})")


def _runtime_class(r: Reads) -> tuple[tuple[str, str], ...]:
    """``runtime_class`` (the RuntimeClass template ``pod`` runs with: ``isolation.runtime_class_of``) and ``origin``
    (how the webhook names it): the class the pod names, else, where it names none, the namespace's
    isolation.runtimeClass on a pod that asks for a policy GPU through no fractional scheduler; else ''."""
    absent = ("!has(pod.spec.runtimeClassName)" if r.typed else
              "(!('runtimeClassName' in pod.spec) || pod.spec.runtimeClassName == null)")
    injected = params.of("runtimeClass")
    return (("named", r.get("pod.spec", "runtimeClassName", "string", "''")),
            ("runtime_class", f"named != '' ? named : {absent} && {injected} != '' && pod.counted && !pod.fractional "
                              f"? {injected} : ''"),
            ("origin", "(named != '' ? 'runtimeClassName ' : 'isolation.runtimeClass injects ') + runtime_class"))


@native("unknown-runtime-class", reads_facts=True, fires=(Trigger(
    "template", lambda ctx: f"[{_class_of_template(ctx)}].exists(name, name != '' && "
                            f"{params.unknown_fact('name', 'runtimeClasses')})"),))
def unknown_runtime_class(ctx: Ctx) -> list[Finding]:
    """``isolation.check_runtime_class``: the RuntimeClass a GPU pod names, or that isolation.runtimeClass gives it,
    does not exist. (The MutatingAdmissionPolicy injects only a class the facts list, so a Pod left without one is
    judged for the class it would have been given, as the webhook judges it.)"""
    if not _reads_facts(ctx):
        return []
    classes = f"{params.FACTS}.runtimeClasses"
    message = ("origin + ', but no such RuntimeClass exists, so the pod would be refused or never run "
               f"(RuntimeClasses in the cluster: ' + string(size({classes})) + ')'")
    return [Finding("unknown-runtime-class", (Each("pod", "variables.templates", "pod.holds"),),
                    f"runtime_class != '' && {params.facts_section('runtimeClasses')} && !(runtime_class in {classes})",
                    "pod.path + '.runtimeClassName'", "pod.stable + '.runtimeClassName'", "runtime_class", message,
                    _runtime_class(Reads(ctx)))]


def _contradicts(ctx: Ctx) -> str:
    """A template whose RuntimeClass (:func:`_class_of_template`) the facts list with a ``scheduling.nodeSelector``
    key the pod's nodeSelector sets otherwise, or the node label, which the pod may leave to the accelerator the
    mutation injects."""
    label = lit(ctx.policy.node_label)
    selector = "pod.spec.nodeSelector"
    wanted = f"{params.PARAM_FACTS}.?runtimeClasses[?name].?nodeSelector.orValue({{}})"
    return (f"[{_class_of_template(ctx)}].exists(name, name != '' && [{wanted}].exists(wanted, wanted.exists(key, "
            f"has({selector}) && key in {selector} ? {selector}[key] != wanted[key] : key == {label})))")


def _placed(ctx: Ctx, r: Reads) -> str:
    """The value of the node label in template ``pod``'s nodeSelector once mutated (``effective_node_selector``):
    its own, else, with no required node affinity on the label, the accelerator the mutation injects (the
    annotation's, else the default, if allowed); else null."""
    label = lit(ctx.policy.node_label)
    terms = r.at("pod.spec", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
                 "list", "[]")
    expressions = "term.?matchExpressions.orValue([])" if r.typed else (
        "(type(term) == map && 'matchExpressions' in term && type(term.matchExpressions) == list ? "
        "term.matchExpressions : [])")
    key = "requirement.key" if r.typed else "(type(requirement) == map ? requirement[?'key'].orValue('') : '')"
    by_affinity = f"{terms}.exists(term, {expressions}.exists(requirement, {key} == {label}))"
    allowed = params.of("allowed")
    injected = (f"[{annotated(r)}].map(asked, asked != null ? asked : dyn({params.of('default')}))"
                f".filter(model, model != '' && (size({allowed}) == 0 || model in {allowed}))")
    return (f"dyn([{selected(r)}].map(own, own != null ? own : !{by_affinity} ? "
            f"[{injected}].map(models, size(models) > 0 ? models[0] : null)[0] : null)[0])")


@native("runtime-class-conflict", reads_facts=True, fires=(Trigger("template", _contradicts),))
def runtime_class_conflict(ctx: Ctx) -> list[Finding]:
    """``isolation.check_runtime_class``: the ``scheduling.nodeSelector`` of the RuntimeClass a GPU pod runs with
    (:func:`_runtime_class`) sets a key the pod's nodeSelector (with the accelerator the mutation injects) sets
    otherwise, which the apiserver's RuntimeClass admission refuses; each key once, sorted, as
    ``runtime_class_conflicts`` words them."""
    if not _reads_facts(ctx):
        return []
    r = Reads(ctx)
    selector = r.get("pod.spec", "nodeSelector", "map", "{}")
    classes = f"{params.FACTS}.runtimeClasses"
    wanted = (f"dyn(runtime_class != '' && {params.facts_section('runtimeClasses')} && runtime_class in {classes} ? "
              f"{classes}[runtime_class].?nodeSelector.orValue({{}}) : {{}})")
    label = lit(ctx.policy.node_label)
    own = f"(key in {selector} && type({selector}[key]) == string ? {selector}[key] : null)"
    value = f"(key == {label} ? placed : {own})"
    keys = ranked(f"wanted.filter(key, {value} != null && {value} != wanted[key])")
    words = f"{keys}.map(key, key + '=' + wanted[key] + ' (pod: ' + {value} + ')').join(', ')"
    message = ("origin + ', whose scheduling.nodeSelector contradicts the pod\\'s: ' + conflicts + '; the apiserver "
               "would reject the pod'")
    return [Finding("runtime-class-conflict", (Each("pod", "variables.templates", "pod.holds"),),
                    "conflicts != ''", "pod.path + '.runtimeClassName'", "pod.stable + '.runtimeClassName'",
                    "runtime_class + ': ' + conflicts", message,
                    (*_runtime_class(r), ("wanted", wanted), ("placed", _placed(ctx, r)), ("conflicts", words)))]


def _over_a_node(ctx: Ctx) -> str:
    """The pod's GPU counts summed (:func:`plain_sum`, never less than a name's total) over the most of some GPU
    resource on one node, of all nodes or of one model (0 where the model has none)."""
    resources = f"{params.PARAM_FACTS}.?extendedResources.orValue({{}})"
    models = f"{params.PARAM_FACTS}.?models.orValue({{}})"
    return (f"[{plain_sum(ctx)}].exists(asked, asked > 0 && {resources}.exists(gpu, {is_gpu(ctx, 'gpu')} && "
            f"(asked > {resources}[gpu] || {models}.exists(model, "
            f"asked > {models}[model].?largest[?gpu].orValue(0)))))")


def _capacity(ctx: Ctx, rule: str, where: str, message: str, value: str) -> list[Finding]:
    """A finding per GPU name of a pod whose accelerator the nodes carry, or that names none (``check_cluster``
    judges the capacity only then), each name once (per-pod-limit's walk), with ``accelerator`` and ``count``, the
    pod's total of it as the scheduler holds it on one node (``pod_gpu_totals``), bound."""
    if not _reads_facts(ctx):
        return []
    r = Reads(ctx)
    models = f"{params.FACTS}.models"
    known = (f"{params.facts_section('extendedResources')} && (accelerator == null || "
             f"({params.facts_section('models')} && accelerator in {models}))")
    loops = (Each("pod", "variables.templates", "pod.uses"), Each("container", "pod.gpuCounts"),
             Each("gpu", "container.counts", FIRST_COUNTED))
    return [Finding(rule, loops, f"count > 0 && {known} && {where}", "pod.path", "pod.stable",
                    value, message, (("accelerator", _accelerator(ctx, r)), ("count", total("gpu.name"))))]


@native("unadvertised-resource", reads_facts=True, fires=(Trigger(
    "name", lambda ctx: f"{is_gpu(ctx, 'name')} && {params.PARAM_FACTS}.?extendedResources[?name].orValue(0) == 0"),))
def unadvertised_resource(ctx: Ctx) -> list[Finding]:
    """``capacity.check_cluster``: a GPU resource no node offers at all (allocatable or a DeviceClass's)."""
    resources = f"{params.FACTS}.extendedResources"
    return _capacity(ctx, "unadvertised-resource", f"{resources}[?gpu.name].orValue(0) == 0",
                     "'no node advertises ' + gpu.name + ' in allocatable or through a DeviceClass'", "gpu.name")


@native("exceeds-node-capacity", reads_facts=True, fires=(ODD_COUNT, Trigger("template", _over_a_node)))
def exceeds_node_capacity(ctx: Ctx) -> list[Finding]:
    """``capacity.check_cluster``: more of a GPU resource than the largest node (of the pod's accelerator) has."""
    label = ctx.policy.node_label
    resources = f"{params.FACTS}.extendedResources"
    model = f"{params.FACTS}.models[accelerator]"
    largest = f"(accelerator != null ? {model}.largest[?gpu.name].orValue(0) : {resources}[gpu.name])"
    where = (f"(accelerator != null ? {lit('nodes with ' + label + '=')} + accelerator + ': ' + "
             f"string({model}.nodes) : 'all nodes')")
    message = (f"'the pod needs ' + string(count) + ' ' + gpu.name + ' on one node; ' + {where} + "
               f"', largest allocatable ' + gpu.name + ': ' + string({largest})")
    return _capacity(ctx, "exceeds-node-capacity",
                     f"{resources}[?gpu.name].orValue(0) != 0 && count > {largest}", message,
                     "string(count) + ' ' + gpu.name")


@native("unknown-device-class", claims=True, reads_facts=True)
def unknown_device_class(ctx: Ctx) -> list[Finding]:
    """``draobjects.check_device_class_exists``: a device request of a claim or claim template names a DeviceClass
    the cluster does not have."""
    if not _reads_facts(ctx):
        return []
    classes = f"{params.FACTS}.deviceClasses"
    message = (f"'device class ' + {quoted('device_class')} + ' does not exist, so the claim can never be allocated "
               f"(DeviceClasses in the cluster: ' + string(size({classes})) + ')'")
    return [Finding("unknown-device-class", (REQUESTS, DEVICES),
                    f"device_class != null && device_class != '' && {params.facts_section('deviceClasses')} && "
                    f"!(device_class in {classes})",
                    "device.path + '.deviceClassName'", "device.stable + '.deviceClassName'", "device_class", message,
                    (("device_class", DEVICE_CLASS),))]


@native("exceeds-device-capacity", claims=True, reads_facts=True)
def exceeds_device_capacity(ctx: Ctx) -> list[Finding]:
    """``draobjects.exceeds_devices`` on a claim's device request: more devices of a class on one node than the most
    any node has, as the facts count them. A request with selectors of its own, and a class whose selectors the
    writer could not evaluate, are left to the webhook (it counts them by evaluating the selectors); so is the sum
    over a pod's claims, which reads the claims."""
    if not _reads_facts(ctx):
        return []
    entry = f"{params.FACTS}.deviceClasses[device_class]"
    where = (f"device_class != null && {params.facts_section('deviceClasses')} && "
             f"device_class in {params.FACTS}.deviceClasses && {entry}.selectorsEvaluated && "
             "device.body.?allocationMode.orValue('') != 'All' && "
             "!device.body.?selectors.orValue([]).exists(selector, has(selector.cel)) && "
             f"count > {entry}.largest")
    message = (f"string(count) + ' device' + (count != 1 ? 's' : '') + ' of class ' + device_class + "
               f"' on one node, but the most any node has is ' + string({entry}.largest) + ' (' + "
               f"string({entry}.nodes) + ' node' + ({entry}.nodes != 1 ? 's' : '') + ' with such devices)'")
    return [Finding("exceeds-device-capacity", (REQUESTS, DEVICES), where, "device.path + '.count'",
                    "device.stable + '.count'", "string(count) + ' ' + device_class", message,
                    (("device_class", DEVICE_CLASS), ("count", DEVICE_COUNT)))]
