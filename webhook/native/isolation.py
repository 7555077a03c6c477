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
from webhook.native.reads import Reads, per_name, some_container
from webhook.native.registry import Trigger, native
from webhook.native.snippets import Ctx, shown, stable_item, tolerates_gpu_taint
from webhook.rules.isolation import HOST_PID_GPU

# Paths with more segments than this are normalised conservatively (see normalised_path).
MAX_PATH_SEGMENTS = 40


def _hidden(ctx: Ctx) -> str:
    """``isolation.hides_gpus``: hideGpus applies in this namespace and the pod is no fractional scheduler's."""
    hides = ctx.ns(lambda p: boolean(p.hide_gpus != 'off'), live=f"{params.of('hideGpus')} != 'off'")
    return f"({hides} && !pod.fractional)"


# Where an env source takes its variables from, in the order isolation._source looks.
_REFERENCES = (("configMapRef", "ConfigMap"), ("secretRef", "Secret"), ("configMapKeyRef", "ConfigMap"),
               ("secretKeyRef", "Secret"))


def _env_source(r: Reads, source: str) -> str:
    """``isolation._source``: where a valueFrom or envFrom entry takes its variables from (``ConfigMap "name"``...)."""
    pairs = "[" + ", ".join(f"[{lit(key)}, {lit(kind)}]" for key, kind in _REFERENCES) + "]"
    found = "pairs.filter(pair, pair[0] in source && type(source[pair[0]]) == map && size(source[pair[0]]) > 0)"
    name = "source[found[0][0]].name"
    named = (f"'name' in source[found[0][0]] && type({name}) == string ? found[0][1] + ' ' + {shown(name, r.typed)} "
             f": found[0][1]")
    other = ("'fieldRef' in source ? 'a field of the pod' : 'resourceFieldRef' in source ? 'a resource field' : "
             "'a source'")
    return (f"[{source}].map(source, type(source) != map ? 'a source' : [{pairs}].map(pairs, [{found}].map(found, "
            f"size(found) > 0 ? ({named}) : {other})[0])[0])[0]")


def _device_env(r: Reads, where: str) -> Each:
    """The device variables of container ``container``'s env (``env``, at index ``index``)."""
    env = r.get("container", "env", "list", "[]")
    named = "" if r.typed else "type(env) == map && 'name' in env && "
    return Each("env", env, f"{named}env.name in {lits(DEVICE_VARIABLES)} && {where}", "index")


def _runtime_class(r: Reads) -> str:
    """``isolation.runtime_class_of`` of template ``pod``: the RuntimeClass it names, else the one
    isolation.runtimeClass injects into a pod that asks for a policy GPU through no fractional scheduler; ``''``."""
    named = r.get("pod.spec", "runtimeClassName", "string", "''")
    absent = ("!has(pod.spec.runtimeClassName)" if r.typed else
              "(!('runtimeClassName' in pod.spec) || pod.spec.runtimeClassName == null)")
    injected = r.ctx.ns(lambda p: lit(p.runtime_class), live=params.of("runtimeClass"))
    if injected == "''":
        return named
    injects = f"{absent} && {injected} != '' && pod.counted && !pod.fractional"
    return f"({named} != '' ? {named} : {injects} ? {injected} : '')"


def _runtime_reads(r: Reads) -> tuple[str, str]:
    """``isolation.runtime_reads`` of template ``pod``: (whether an NVIDIA runtime reads its device variables, the words
    that say who)."""
    if r.ctx.policies.document["isolation"]["nvidiaRuntime"] == "legacy":
        return "true", lit("the NVIDIA runtime reads it in every pod (isolation.nvidiaRuntime: legacy)")
    name = _runtime_class(r)
    return (f"{name}.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
            f"'the pod runs under runtimeClassName ' + {name} + ', whose NVIDIA runtime reads it "
            f"(isolation.nvidiaRuntime: cdi)'")


def _untrusted_without_gpu(r: Reads, where: str = "") -> tuple[Each, ...]:
    """Containers of untrusted pods that hold no GPU (``GpuUse.holds``; a fractional scheduler's pod holds one),
    where an NVIDIA runtime reads their device variables."""
    test = f"!(pod.fractional || {r.holds()})" + (f" && {where}" if where else "")
    reads, _ = _runtime_reads(r)
    pods = "!pod.trusted" if reads == "true" else f"!pod.trusted && {reads}"
    return (Each("pod", "variables.templates", pods), *r.containers(where=test))


@native("visible-devices-without-gpu",
        fires=(Trigger("container", f"has(container.env) && container.env.exists(env, env.name in "
                                    f"{lits(DEVICE_VARIABLES)})", "devices"),))
def visible_devices_without_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    value = "env.?value.orValue('')" if r.typed else "('value' in env ? env.value : '')"
    unset = "!has(env.valueFrom)" if r.typed else "!('valueFrom' in env && env.valueFrom != null)"
    _, who = _runtime_reads(r)
    message = (f"{r.label} + ' uses no GPU but sets ' + env.name + '=' + {shown('value')} + ', and ' + {who} + "
               f"': it would see ' + "
               f"(value == 'all' ? 'every GPU of its node' : 'the GPUs it names') + "
               f"', outside the scheduler\\'s accounting; remove it or set it to void'")
    env = r.get("container", "env", "list", "[]")
    has_device_env = f"{env}.exists(env, {r.is_map('env')}'name' in env && env.name in {lits(DEVICE_VARIABLES)})"
    return [Finding("visible-devices-without-gpu", (*_untrusted_without_gpu(r, has_device_env), _device_env(r, unset)),
                    f"!(type(value) == string && value in {lits(NO_DEVICES)})",
                    f"{Reads.PATH} + '.env[' + string(index) + '].value'",
                    f"{r.stable} + '.env[name=' + env.name + '].value'", shown("value"), message, (("value", value),))]


@native("visible-devices-unread", fires=(Trigger(
    "container", f"(has(container.envFrom) && size(container.envFrom) > 0) || (has(container.env) && "
                 f"container.env.exists(env, env.name in {lits(DEVICE_VARIABLES)} && has(env.valueFrom)))", "unread"),))
def visible_devices_unread(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    computed = "has(env.valueFrom)" if r.typed else "'valueFrom' in env && env.valueFrom != null"
    _, who = _runtime_reads(r)
    message = (f"{r.label} + ' uses no GPU and takes ' + env.name + ' from ' + {_env_source(r, 'env.valueFrom')} + "
               f"', which admission cannot read, and ' + {who} + ': anything but void or none there shows it GPUs it "
               f"was not given'")
    env = r.get("container", "env", "list", "[]")
    from_value = Finding("visible-devices-unread", (*_untrusted_without_gpu(r, f"size({env}) > 0"),
                                                    _device_env(r, computed)), "",
                         f"{Reads.PATH} + '.env[' + string(index) + '].valueFrom'",
                         f"{r.stable} + '.env[name=' + env.name + '].valueFrom'", "env.name", message)
    named = (f"{env}.exists(env, {r.is_map('env')}{'' if r.typed else chr(39) + 'name' + chr(39) + ' in env && '}"
             f"env.name == {lit(VISIBLE_DEVICES)})")
    prefix = ("env_from.?prefix.orValue('')" if r.typed
              else "('prefix' in env_from && env_from.prefix != null && env_from.prefix != '' ? env_from.prefix : '')")
    usable = (f"{r.is_map('env_from')}{'' if r.typed else 'type(' + prefix + ') == string && '}"
              f"{lit(VISIBLE_DEVICES)}.startsWith({prefix}) && {prefix} != {lit(VISIBLE_DEVICES)}")
    env_from = r.get("container", "envFrom", "list", "[]")
    from_message = (f"{r.label} + ' uses no GPU and imports variables from ' + {_env_source(r, 'env_from')} + "
                    f"', which admission cannot read, and ' + {who} + ': if one is {VISIBLE_DEVICES} it may show it "
                    f"GPUs it was not given (set {VISIBLE_DEVICES}=void in env, or isolation.hideGpus)'")
    reads, _ = _runtime_reads(r)
    pods = f"!pod.trusted && !{_hidden(ctx)}" + ("" if reads == "true" else f" && {reads}")
    loops = (Each("pod", "variables.templates", pods),
             *r.containers(where=f"size({env_from}) > 0 && !(pod.fractional || {r.holds()}) && !{named}"),
             Each("env_from", env_from, usable, "j"))
    imports = Finding("visible-devices-unread", loops, "", f"{Reads.PATH} + '.envFrom[' + string(j) + ']'",
                      f"{r.stable} + '.envFrom[' + string(j) + ']'", _env_source(r, "env_from"), from_message)
    return [from_value, imports]


# A value that is not a positive count of at most 6 digits (a 0, an odd spelling): what zero-gpu-limit reads.
@native("zero-gpu-limit", fires=(Trigger("name", "!" + matches("value", "^[1-9][0-9]{0,5}$"), "zero"),))
def zero_gpu_limit(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    message = (f"{r.label} + ': ' + name + ': 0 allocates no GPU but may still tolerate GPU taints and select GPU "
               f"nodes; leave the resource out'")
    return per_name(r, "zero-gpu-limit", ("limits", "requests"), "name in variables.zero_counting", r.zero("value"),
                    message, "name", requests_only=True)


def _gpu_node_reasons(r: Reads) -> str:
    """``isolation.gpu_node_reasons`` of template ``pod``, joined by ', ' (``''`` for none)."""
    ctx = r.ctx
    label = ctx.policy.node_label
    selector = r.get("pod.spec", "nodeSelector", "map", "{}")
    selected = f"{selector}[{lit(label)}]"
    terms = r.at("pod.spec", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
                 "list", "[]")
    expressions = r.get("term", "matchExpressions", "list", "[]")
    keyed = "" if r.typed else "type(requirement) == map && 'key' in requirement && type(requirement.key) == string && "
    by_affinity = f"{terms}.exists(term, {expressions}.exists(requirement, {keyed}requirement.key == {lit(label)}))"
    string = "" if r.typed else f" && type({selected}) == string"
    selects = (f"({lit(label)} in {selector}{string} ? {lit('selects ' + label + '=')} + {selected} : "
               f"{by_affinity} ? {lit('requires ' + label + ' by node affinity')} : '')")
    tolerations = r.get("pod.spec", "tolerations", "list", "[]")
    key_unset = ("!has(toleration.key) || toleration.key == ''" if r.typed
                 else "!('key' in toleration) || toleration.key == null || toleration.key == ''")
    operator = ("toleration.?operator.orValue('')" if r.typed
                else "('operator' in toleration ? toleration.operator : null)")
    every = f"({key_unset}) && {operator} == 'Exists'"
    blanket = f"({tolerations}.exists(toleration, {r.is_map('toleration')}{every}) ? ['tolerates every taint'] : [])"
    tolerates = (f"{tolerations}.filter(toleration, {r.is_map('toleration')}{tolerates_gpu_taint(ctx, 'toleration')})"
                 f".map(toleration, 'tolerates the ' + toleration.key + ' taint')")
    return f"([{selects}] + {blanket} + {tolerates}).filter(reason, reason != '').join(', ')"


@native("privileged-gpu", fires=(Trigger(
    "container", "has(container.securityContext) && has(container.securityContext.privileged) && "
                 "container.securityContext.privileged", "privileged"),))
def privileged_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    privileged = r.at("container", "securityContext.privileged", "bool", "false")
    # Why it matters: the container's own GPU, its pod's, or the pod's way onto a GPU node (the reasons after
    # 'node:', none when it has no way there).
    why = f"(pod.fractional || {r.holds()} ? 'holds' : pod.holds ? 'pod' : 'node:' + {_gpu_node_reasons(r)})"
    said = (f"(why == 'holds' ? {r.label} + ' is privileged and holds a GPU: it sees every GPU of its node, not only "
            f"its own' : why == 'pod' ? {r.label} + ' is privileged in a pod with GPUs: it runs on a GPU node and sees "
            f"every GPU of it' : {r.label} + ' is privileged and its pod ' + why.substring(5) + ': on a GPU node it "
            f"sees every GPU, outside the scheduler\\'s accounting')")
    message = f"{said} + '; only trusted namespaces and service accounts (isolation.trusted) may'"
    loops = (Each("pod", "variables.templates", "!pod.trusted"), *r.containers(where=f"{privileged} == true"))
    return [Finding("privileged-gpu", loops, "why != 'node:'", f"{Reads.PATH} + '.securityContext.privileged'",
                    f"{r.stable} + '.securityContext.privileged'", lit("true"), message, (("why", why),))]


def normalised_path(path: str) -> str:
    """``isolation._normal``: ``posixpath.normpath("/" + path.lstrip("/"))`` in CEL (needs the lists library).

    Empty and ``.`` segments are dropped; ``..`` pops the segment before it (never above ``/``): a
    segment survives when no later point of the walk goes below its level, where the level after step
    k is the prefix sum minus its running minimum (the walk reflected at the root). Quadratic in the
    number of segments, so a path of more than MAX_PATH_SEGMENTS segments is taken as ``/`` (which
    every GPU rule treats as exposing the devices): no legitimate path is that deep.
    """
    segments = f"{path}.split('/').filter(segment, segment != '' && segment != '.')"
    steps = "segments.map(segment, segment == '..' ? -1 : 1)"
    sums = f"[0] + {steps}.transformList(at, step, {steps}.slice(0, at + 1).sum())"
    levels = "depths.transformList(at, step, step - depths.slice(0, at + 1).min())"
    kept = ("segments.transformList(at, segment, segment != '..' && "
            "heights.slice(at + 1, size(heights)).min() >= heights[at + 1], segment)")
    return (f"[{segments}].map(segments, size(segments) > {MAX_PATH_SEGMENTS} ? '/' : [{sums}].map(depths, "
            f"[{levels}].map(heights, '/' + {kept}.join('/'))[0])[0])[0]")


def _under(path: str, directories: tuple[str, ...]) -> str:
    return " || ".join(f"({path} == {lit(d)} || {path}.startsWith({lit(d + '/')}))" for d in directories)


@native("gpu-device-mount", needs=("lists", "two-variable comprehensions"), fires=(
    Trigger("template", "has(pod.spec.volumes) && pod.spec.volumes.exists(volume, has(volume.hostPath))", "host-paths"),
    Trigger("container", "has(container.volumeMounts) && container.volumeMounts.exists(mount, "
                         "mount.mountPath.contains('nvidia-container-devices'))", "mounts")))
def gpu_device_mount(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    host = r.at("volume", "hostPath.path", "string", "null")
    exposes = (f"(normal == '/' || normal == '/dev' || normal.startsWith({lit(NVIDIA_DEVICE_PREFIX)}) || "
               f"{_under('normal', DEVICE_DIRECTORIES)})")
    # Only a path that names dev, climbs (..) or is all slashes and dots can normalise to a device directory or /.
    suspect = f"(host_path.contains('dev') || host_path.contains('..') || !{matches('host_path', '[^/.]')})"
    volumes = Each("volume", r.get("pod.spec", "volumes", "list", "[]"), f"{r.is_map('volume')}{host} != null", "i")
    vmessage = ("'hostPath ' + " + shown("host_path") + " + ' is mounted by a privileged container, which can open the "
                "node\\'s GPU devices through it, outside the scheduler\\'s accounting; GPUs come from resources'")
    untrusted = Each("pod", "variables.templates", "!pod.trusted")
    privileged = r.at("container", "securityContext.privileged", "bool", "false")
    volume_name = r.get("volume", "name", "string", "null")
    mount_name = r.get("mount", "name", "string", "null")
    mounts_it = f"{r.get('container', 'volumeMounts', 'list', '[]')}.exists(mount, {r.is_map('mount')}" \
                f"{mount_name} == {volume_name})"
    # isolation._mounted_by_privileged: through a hostPath, only a privileged container can open a device
    mounted = some_container(r, "pod.spec", f"{privileged} == true && {mounts_it}")
    host_paths = Finding("gpu-device-mount", (untrusted, volumes), f"{suspect} && {exposes} && {mounted}",
                         "pod.path + '.volumes[' + string(i) + '].hostPath.path'",
                         stable_item("pod.stable + '.volumes'", "i", "volume", "name") + " + '.hostPath.path'",
                         "host_path", vmessage,
                         (("host_path", host), ("normal", normalised_path("host_path"))))
    mount_path = r.get("mount", "mountPath", "string", "null")
    mounts = Each("mount", r.get("container", "volumeMounts", "list", "[]"),
                  f"{r.is_map('mount')}{mount_path} != null && {mount_path}.contains('nvidia-container-devices')",
                  "index")
    mmessage = (f"{r.label} + ': a mount at ' + {shown('mount_path')} + ' asks the NVIDIA runtime (volume-mounts "
                f"device list strategy) for the GPUs it names, outside the scheduler\\'s accounting'")
    mount_list = Finding("gpu-device-mount", (untrusted, *r.containers(), mounts),
                         _under("normal", DEVICE_LIST_DIRECTORIES),
                         f"{Reads.PATH} + '.volumeMounts[' + string(index) + '].mountPath'",
                         stable_item(f"{r.stable} + '.volumeMounts'", "index", "mount", "mountPath")
                         + " + '.mountPath'", "mount_path", mmessage,
                         (("mount_path", mount_path), ("normal", normalised_path("mount_path"))))
    return [host_paths, mount_list]


CDI_KEY = " || ".join([f"key.startsWith({lit(p)})" for p in CDI_PREFIXES] + [f"key == {lit(k)}" for k in CDI_KEYS])


@native("cdi-annotation", fires=(
    Trigger("template", f"has(pod.metadata.annotations) && pod.metadata.annotations.exists(key, {CDI_KEY})", "cdi"),))
def cdi_annotation(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    annotations = r.get("pod.meta", "annotations", "map", "{}")
    extra = ("(type(value) == string && value.contains('management.nvidia.com/') ? "
             "' (management.nvidia.com/gpu opens every GPU of the node)' : '')")
    message = (f"'annotation ' + key + '=' + {shown('value')} + ' asks the container runtime to inject CDI devices' + "
               f"{extra} + ', outside the scheduler\\'s accounting; only trusted namespaces and service accounts "
               f"(isolation.trusted) may'")
    path = "pod.metaPath + '.annotations[' + key + ']'"
    loops = (Each("pod", "variables.templates", "!pod.trusted"), Each("key", annotations, CDI_KEY))
    return [Finding("cdi-annotation", loops, "", path, path, shown("value"), message,
                    (("value", f"{annotations}[key]"),))]


@native("host-pid-gpu", fires=(Trigger("template", "has(pod.spec.hostPID) && pod.spec.hostPID"),))
def host_pid_gpu(ctx: Ctx) -> list[Finding]:
    host_pid = Reads(ctx).get("pod.spec", "hostPID", "bool", "false")
    loops = (Each("pod", "variables.templates", f"!pod.trusted && pod.holds && {host_pid} == true"),)
    return [Finding("host-pid-gpu", loops, "", "pod.path + '.hostPID'", "pod.stable + '.hostPID'", lit("true"),
                    lit(HOST_PID_GPU))]


@native("runtime-class-without-gpu", fires=(Trigger(
    "template", f"has(pod.spec.runtimeClassName) && pod.spec.runtimeClassName.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
    "runtime"),))
def runtime_class_without_gpu(ctx: Ctx) -> list[Finding]:
    r = Reads(ctx)
    name = r.get("pod.spec", "runtimeClassName", "string", "''")
    message = (f"'runtimeClassName ' + runtime_class + ' on a pod that uses no GPU: the NVIDIA runtime shows it "
               f"the GPUs its image\\'s {VISIBLE_DEVICES} names (all, in CUDA images); use the default runtime'")
    loops = (Each("pod", "variables.templates", "!pod.trusted && !pod.holds"),)
    return [Finding("runtime-class-without-gpu", loops, f"runtime_class.startsWith({lit(NVIDIA_RUNTIME_PREFIX)})",
                    "pod.path + '.runtimeClassName'", "pod.stable + '.runtimeClassName'", "runtime_class", message,
                    (("runtime_class", name),))]
