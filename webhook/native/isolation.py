"""The isolation rules of ``webhook.rules.isolation`` as findings: device variables, privileged containers, device
mounts, CDI annotations, hostPID, zero GPU counts, the NVIDIA runtime without a GPU."""

from __future__ import annotations

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
from webhook.native import params
from webhook.native.celtext import boolean, lit, lits, matches
from webhook.native.findings import Each, Finding
from webhook.native.reads import Reads, per_name
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, shown, stable_item, tolerates_gpu_taint
from webhook.rules.isolation import HOST_PID_GPU

# Paths with more segments than this are normalised conservatively (see normalised_path).
MAX_PATH_SEGMENTS = 40


def _hidden(ctx: Ctx) -> str:
    """``isolation.hides_gpus``: hideGpus applies in this namespace and the pod is no fractional scheduler's."""
    hides = ctx.ns(lambda p: boolean(p.hide_gpus != 'off'), live=f"{params.of('hideGpus')} != 'off'")
    return f"({hides} && !t.fractional)"


# Where an env source takes its variables from, in the order isolation._source looks.
_REFERENCES = (("configMapRef", "ConfigMap"), ("secretRef", "Secret"), ("configMapKeyRef", "ConfigMap"),
               ("secretKeyRef", "Secret"))


def _env_source(r: Reads, source: str) -> str:
    """``isolation._source``: where a valueFrom or envFrom entry takes its variables from (``ConfigMap "name"``...)."""
    pairs = "[" + ", ".join(f"[{lit(key)}, {lit(kind)}]" for key, kind in _REFERENCES) + "]"
    found = "R.filter(p, p[0] in S && type(S[p[0]]) == map && size(S[p[0]]) > 0)"
    name = "S[F[0][0]].name"
    named = f"'name' in S[F[0][0]] && type({name}) == string ? F[0][1] + ' ' + {shown(name, r.typed)} : F[0][1]"
    other = "'fieldRef' in S ? 'a field of the pod' : 'resourceFieldRef' in S ? 'a resource field' : 'a source'"
    return (f"[{source}].map(S, type(S) != map ? 'a source' : [{pairs}].map(R, [{found}].map(F, size(F) > 0 ? "
            f"({named}) : {other})[0])[0])[0]")


def _device_env(r: Reads, where: str) -> Each:
    """The device variables of container ``c``'s env (``e``, at index ``n``)."""
    env = r.get("c", "env", "list", "[]")
    named = "" if r.typed else "type(e) == map && 'name' in e && "
    return Each("e", env, f"{named}e.name in {lits(DEVICE_VARIABLES)} && {where}", "n")


def _untrusted_without_gpu(r: Reads, where: str = "") -> tuple[Each, ...]:
    """Containers of untrusted pods that hold no GPU (``GpuUse.holds``; a fractional scheduler's pod holds one)."""
    test = f"!(t.fractional || {r.holds()})" + (f" && {where}" if where else "")
    return (Each("t", "variables.templates", "!t.trusted"), *r.containers(where=test))


@native("visible-devices-without-gpu",
        fires=(Trigger("container", f"has(c.env) && c.env.exists(e, e.name in {lits(DEVICE_VARIABLES)})", "devices"),))
def visible_devices_without_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    value = "e.?value.orValue('')" if r.typed else "('value' in e ? e.value : '')"
    unset = "!has(e.valueFrom)" if r.typed else "!('valueFrom' in e && e.valueFrom != null)"
    message = (f"{r.label} + ' uses no GPU but sets ' + e.name + '=' + {shown('v')} + "
               f"': the NVIDIA runtime would show it ' + "
               f"(v == 'all' ? 'every GPU of its node' : 'the GPUs it names') + "
               f"', outside the scheduler\\'s accounting; remove it or set it to void'")
    env = r.get("c", "env", "list", "[]")
    has_device_env = f"{env}.exists(e, {r.is_map('e')}'name' in e && e.name in {lits(DEVICE_VARIABLES)})"
    return [Finding("visible-devices-without-gpu", (*_untrusted_without_gpu(r, has_device_env), _device_env(r, unset)),
                    f"!(type(v) == string && v in {lits(NO_DEVICES)})",
                    f"{Reads.PATH} + '.env[' + string(n) + '].value'",
                    f"{r.stable} + '.env[name=' + e.name + '].value'", shown("v"), message, (("v", value),))]


@native("visible-devices-unread", fires=(Trigger(
    "container", f"(has(c.envFrom) && size(c.envFrom) > 0) || (has(c.env) && c.env.exists(e, "
                 f"e.name in {lits(DEVICE_VARIABLES)} && has(e.valueFrom)))", "unread"),))
def visible_devices_unread(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    computed = "has(e.valueFrom)" if r.typed else "'valueFrom' in e && e.valueFrom != null"
    message = (f"{r.label} + ' uses no GPU and takes ' + e.name + ' from ' + {_env_source(r, 'e.valueFrom')} + "
               f"', which admission cannot read; anything but void or none there shows it GPUs it was not given'")
    env = r.get("c", "env", "list", "[]")
    from_value = Finding("visible-devices-unread", (*_untrusted_without_gpu(r, f"size({env}) > 0"),
                                                    _device_env(r, computed)), "",
                         f"{Reads.PATH} + '.env[' + string(n) + '].valueFrom'",
                         f"{r.stable} + '.env[name=' + e.name + '].valueFrom'", "e.name", message)
    named = (f"{env}.exists(e, {r.is_map('e')}{'' if r.typed else chr(39) + 'name' + chr(39) + ' in e && '}"
             f"e.name == {lit(VISIBLE_DEVICES)})")
    prefix = ("x.?prefix.orValue('')" if r.typed
              else "('prefix' in x && x.prefix != null && x.prefix != '' ? x.prefix : '')")
    usable = (f"{r.is_map('x')}{'' if r.typed else 'type(' + prefix + ') == string && '}"
              f"{lit(VISIBLE_DEVICES)}.startsWith({prefix}) && {prefix} != {lit(VISIBLE_DEVICES)}")
    env_from = r.get("c", "envFrom", "list", "[]")
    from_message = (f"{r.label} + ' uses no GPU and imports variables from ' + {_env_source(r, 'x')} + "
                    f"', which admission "
                    f"cannot read; if one is {VISIBLE_DEVICES} it may show it GPUs it was not given (set "
                    f"{VISIBLE_DEVICES}=void in env, or isolation.hideGpus)'")
    loops = (Each("t", "variables.templates", f"!t.trusted && !{_hidden(ctx)}"),
             *r.containers(where=f"size({env_from}) > 0 && !(t.fractional || {r.holds()}) && !{named}"),
             Each("x", env_from, usable, "j"))
    imports = Finding("visible-devices-unread", loops, "", f"{Reads.PATH} + '.envFrom[' + string(j) + ']'",
                      f"{r.stable} + '.envFrom[' + string(j) + ']'", _env_source(r, "x"), from_message)
    return [from_value, imports]


# A value that is not a positive count of at most 6 digits (a 0, an odd spelling): what zero-gpu-limit reads.
@native("zero-gpu-limit", fires=(Trigger("name", "!" + matches("v", "^[1-9][0-9]{0,5}$"), "zero"),))
def zero_gpu_limit(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + k + ': 0 allocates no GPU but may still tolerate GPU taints and select GPU "
               f"nodes; leave the resource out'")
    return per_name(r, "zero-gpu-limit", ("limits", "requests"), "k in variables.zero_counting", r.zero("x"),
                    message, "k", requests_only=True)


def _gpu_node_reasons(r: Reads) -> str:
    """``isolation.gpu_node_reasons`` of template ``t``, joined by ', ' (``''`` for none)."""
    ctx = r.ctx
    label = ctx.policy.node_label
    selector = r.get("t.spec", "nodeSelector", "map", "{}")
    selected = f"{selector}[{lit(label)}]"
    terms = r.at("t.spec", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
                 "list", "[]")
    expressions = r.get("term", "matchExpressions", "list", "[]")
    keyed = "" if r.typed else "type(x) == map && 'key' in x && type(x.key) == string && "
    by_affinity = f"{terms}.exists(term, {expressions}.exists(x, {keyed}x.key == {lit(label)}))"
    string = "" if r.typed else f" && type({selected}) == string"
    selects = (f"({lit(label)} in {selector}{string} ? {lit('selects ' + label + '=')} + {selected} : "
               f"{by_affinity} ? {lit('requires ' + label + ' by node affinity')} : '')")
    tolerations = r.get("t.spec", "tolerations", "list", "[]")
    key_unset = "!has(x.key) || x.key == ''" if r.typed else "!('key' in x) || x.key == null || x.key == ''"
    operator = "x.?operator.orValue('')" if r.typed else "('operator' in x ? x.operator : null)"
    every = f"({key_unset}) && {operator} == 'Exists'"
    blanket = f"({tolerations}.exists(x, {r.is_map('x')}{every}) ? ['tolerates every taint'] : [])"
    tolerates = (f"{tolerations}.filter(x, {r.is_map('x')}{tolerates_gpu_taint(ctx, 'x')})"
                 f".map(x, 'tolerates the ' + x.key + ' taint')")
    return f"([{selects}] + {blanket} + {tolerates}).filter(s, s != '').join(', ')"


@native("privileged-gpu", fires=(Trigger("container", "has(c.securityContext) && has(c.securityContext.privileged) && "
                                                          "c.securityContext.privileged", "privileged"),))
def privileged_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    privileged = r.at("c", "securityContext.privileged", "bool", "false")
    # Why it matters: the container's own GPU, its pod's, or the pod's way onto a GPU node (the reasons after
    # 'node:', none when it has no way there).
    why = f"(t.fractional || {r.holds()} ? 'holds' : t.holds ? 'pod' : 'node:' + {_gpu_node_reasons(r)})"
    said = (f"(w == 'holds' ? {r.label} + ' is privileged and holds a GPU: it sees every GPU of its node, not only "
            f"its own' : w == 'pod' ? {r.label} + ' is privileged in a pod with GPUs: it runs on a GPU node and sees "
            f"every GPU of it' : {r.label} + ' is privileged and its pod ' + w.substring(5) + ': on a GPU node it "
            f"sees every GPU, outside the scheduler\\'s accounting')")
    message = f"{said} + '; only trusted namespaces and service accounts (isolation.trusted) may'"
    loops = (Each("t", "variables.templates", "!t.trusted"), *r.containers(where=f"{privileged} == true"))
    return [Finding("privileged-gpu", loops, "w != 'node:'", f"{Reads.PATH} + '.securityContext.privileged'",
                    f"{r.stable} + '.securityContext.privileged'", lit("true"), message, (("w", why),))]


def normalised_path(path: str) -> str:
    """``isolation._normal``: ``posixpath.normpath("/" + path.lstrip("/"))`` in CEL (needs the lists library).

    Empty and ``.`` segments are dropped; ``..`` pops the segment before it (never above ``/``): a
    segment survives when no later point of the walk goes below its level, where the level after step
    k is the prefix sum minus its running minimum (the walk reflected at the root). Quadratic in the
    number of segments, so a path of more than MAX_PATH_SEGMENTS segments is taken as ``/`` (which
    every GPU rule treats as exposing the devices): no legitimate path is that deep.
    """
    segments = f"{path}.split('/').filter(s1, s1 != '' && s1 != '.')"
    steps = "SG.map(s1, s1 == '..' ? -1 : 1)"
    sums = f"[0] + {steps}.transformList(k1, d1, {steps}.slice(0, k1 + 1).sum())"
    levels = "PS.transformList(k1, d1, d1 - PS.slice(0, k1 + 1).min())"
    kept = "SG.transformList(k1, s1, s1 != '..' && HS.slice(k1 + 1, size(HS)).min() >= HS[k1 + 1], s1)"
    return (f"[{segments}].map(SG, size(SG) > {MAX_PATH_SEGMENTS} ? '/' : [{sums}].map(PS, [{levels}].map(HS, "
            f"'/' + {kept}.join('/'))[0])[0])[0]")


def _under(path: str, directories: tuple[str, ...]) -> str:
    return " || ".join(f"({path} == {lit(d)} || {path}.startsWith({lit(d + '/')}))" for d in directories)


@native("gpu-device-mount", needs=("lists", "two-variable comprehensions"), fires=(
    Trigger("template", "has(t.spec.volumes) && t.spec.volumes.exists(v, has(v.hostPath))", "host-paths"),
    Trigger("container", "has(c.volumeMounts) && c.volumeMounts.exists(v, "
                         "v.mountPath.contains('nvidia-container-devices'))", "mounts")))
def gpu_device_mount(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    host = r.at("x", "hostPath.path", "string", "null")
    exposes = (f"(N == '/' || N == '/dev' || N.startsWith({lit(NVIDIA_DEVICE_PREFIX)}) || "
               f"{_under('N', DEVICE_DIRECTORIES)})")
    # Only a path that names dev, climbs (..) or is all slashes and dots can normalise to a device directory or /.
    suspect = f"(h.contains('dev') || h.contains('..') || !{matches('h', '[^/.]')})"
    volumes = Each("x", r.get("t.spec", "volumes", "list", "[]"), f"{r.is_map('x')}{host} != null", "i")
    vmessage = ("'hostPath ' + " + shown("h") + " + ' exposes the node\\'s GPU devices to the pod, outside the "
                "scheduler\\'s accounting; GPUs come from resources'")
    untrusted = Each("t", "variables.templates", "!t.trusted")
    host_paths = Finding("gpu-device-mount", (untrusted, volumes), f"{suspect} && {exposes}",
                         "t.path + '.volumes[' + string(i) + '].hostPath.path'",
                         stable_item("t.stable + '.volumes'", "i", "x", "name") + " + '.hostPath.path'", "h", vmessage,
                         (("h", host), ("N", normalised_path("h"))))
    mount_path = r.get("x", "mountPath", "string", "null")
    mounts = Each("x", r.get("c", "volumeMounts", "list", "[]"),
                  f"{r.is_map('x')}{mount_path} != null && {mount_path}.contains('nvidia-container-devices')", "k")
    mmessage = (f"{r.label} + ': a mount at ' + {shown('h')} + ' asks the NVIDIA runtime (volume-mounts device list "
                f"strategy) for the GPUs it names, outside the scheduler\\'s accounting'")
    mount_list = Finding("gpu-device-mount", (untrusted, *r.containers(), mounts), _under("N", DEVICE_LIST_DIRECTORIES),
                         f"{Reads.PATH} + '.volumeMounts[' + string(k) + '].mountPath'",
                         stable_item(f"{r.stable} + '.volumeMounts'", "k", "x", "mountPath") + " + '.mountPath'", "h",
                         mmessage, (("h", mount_path), ("N", normalised_path("h"))))
    return [host_paths, mount_list]


CDI_KEY = " || ".join([f"k.startsWith({lit(p)})" for p in CDI_PREFIXES] + [f"k == {lit(k)}" for k in CDI_KEYS])


@native("cdi-annotation", fires=(
    Trigger("template", f"has(t.metadata.annotations) && t.metadata.annotations.exists(k, {CDI_KEY})", "cdi"),))
def cdi_annotation(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    annotations = r.get("t.meta", "annotations", "map", "{}")
    extra = ("(type(x) == string && x.contains('management.nvidia.com/') ? "
             "' (management.nvidia.com/gpu opens every GPU of the node)' : '')")
    message = (f"'annotation ' + k + '=' + {shown('x')} + ' asks the container runtime to inject CDI devices' + "
               f"{extra} + ', outside the scheduler\\'s accounting; only trusted namespaces and service accounts "
               f"(isolation.trusted) may'")
    path = "t.metaPath + '.annotations[' + k + ']'"
    loops = (Each("t", "variables.templates", "!t.trusted"), Each("k", annotations, CDI_KEY))
    return [Finding("cdi-annotation", loops, "", path, path, shown("x"), message, (("x", f"{annotations}[k]"),))]


@native("host-pid-gpu", fires=(Trigger("template", "has(t.spec.hostPID) && t.spec.hostPID"),))
def host_pid_gpu(ctx: Ctx) -> list[Finding]:
    host_pid = Reads(ctx).get("t.spec", "hostPID", "bool", "false")
    loops = (Each("t", "variables.templates", f"!t.trusted && t.holds && {host_pid} == true"),)
    return [Finding("host-pid-gpu", loops, "", "t.path + '.hostPID'", "t.stable + '.hostPID'", lit("true"),
                    lit(HOST_PID_GPU))]


@native("runtime-class-without-gpu", fires=(Trigger(
    "template", f"has(t.spec.runtimeClassName) && t.spec.runtimeClassName.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
    "runtime"),))
def runtime_class_without_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    name = r.get("t.spec", "runtimeClassName", "string", "''")
    message = (f"'runtimeClassName ' + n + ' on a pod that uses no GPU: the NVIDIA runtime shows it the GPUs its "
               f"image\\'s {VISIBLE_DEVICES} names (all, in CUDA images); use the default runtime'")
    loops = (Each("t", "variables.templates", "!t.trusted && !t.holds"),)
    return [Finding("runtime-class-without-gpu", loops, f"n.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
                    "t.path + '.runtimeClassName'", "t.stable + '.runtimeClassName'", "n", message, (("n", name),))]
