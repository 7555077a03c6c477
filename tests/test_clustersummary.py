"""status.cluster of GPUPolicy/default: the summary of the cluster view (webhook.core.clustersummary), its bound,
and the status writer that keeps it current (webhook.serving.clusterfacts, webhook.serving.policystatus)."""

from __future__ import annotations

import json
import queue
import time
from collections import Counter

import jsonschema
import pytest

from tests.test_policy_object import FakeKube as StatusKube
from tests.test_policy_object import FakeLease, gpupolicy, make
from webhook.core import clustersummary as cs
from webhook.core.cluster import ClusterState
from webhook.core.policyfile import parse_policy
from webhook.kube.client import ApiError, NotServed
from webhook.serving import policystatus as ps
from webhook.serving.clusterfacts import KINDS, ClusterFacts, merge_patch
from webhook.serving.policyobject import StatusSettings
from webhook.telemetry import metrics

GPU = "nvidia.com/gpu"
SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
CLUSTER_ON = parse_policy("cluster: {enabled: true}\n", "policy")


def node(name, model=None, label="accelerator", **allocatable):
    labels = {"kubernetes.io/hostname": name, **({label: model} if model else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "8", **allocatable}}}


def device_class(name, selector=SELECTOR, extended=None, created="2026-01-01T00:00:00Z"):
    spec = {"selectors": [{"cel": {"expression": selector}}]} if selector else {}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def resource_slice(node_name, gpus, kind="gpu"):
    devices = [{"name": f"{kind}-{i}", "attributes": {"type": {"string": kind}}} for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-slice-{kind}"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def runtime_class(name, **selector):
    obj = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": name}
    if selector:
        obj["scheduling"] = {"nodeSelector": selector}
    return obj


CLUSTER = [
    node("l4-a", "nvidia-l4", **{GPU: "4", "example.com/fpga": "1"}),
    node("l4-b", "nvidia-l4", **{GPU: "2"}),
    node("h100-a", "nvidia-h100", **{GPU: "8", "nvidia.com/mig-1g.10gb": "7"}),
    node("dra-a", "nvidia-b200"),
    node("cpu-a"),
    resource_slice("dra-a", 8),
    resource_slice("dra-a", 2, kind="nic"),
    device_class("gpu.nvidia.com", extended="nvidia.com/gpu"),
    device_class("everything", selector=None),
    # cel-python has no semver(): the driver's devices are counted, as the webhook counts them.
    device_class("broken", selector="device.driver == 'gpu.nvidia.com' && "
                                    "device.attributes['gpu.nvidia.com'].type.isGreaterThan(semver('1.0.0'))"),
    runtime_class("nvidia", **{"nvidia.com/gpu.present": "true"}),
    runtime_class("runc"),
]


def state_of(objects, label="accelerator"):
    state = ClusterState(label)
    state.load(objects, known=cs.KINDS)
    return state


def summary_of(objects, known=cs.KINDS, is_gpu=CLUSTER_ON.default.is_gpu, label="accelerator"):
    state = state_of(objects, label)
    return cs.summarize(cs.view_of(state, known), known, is_gpu)


def test_the_summary_of_a_small_cluster_reads_as_the_spec():
    summary = summary_of(CLUSTER)
    assert summary == {
        "nodeLabel": "accelerator",
        # Per model: its nodes, and the most of each GPU resource on one of them (DRA's devices under the
        # class's extended resource name count, as the webhook's capacity checks count them).
        "models": {
            "nvidia-b200": {"nodes": 1, "largest": {"deviceclass.resource.kubernetes.io/gpu.nvidia.com": 8,
                                                    GPU: 8}},
            "nvidia-h100": {"nodes": 1, "largest": {GPU: 8, "nvidia.com/mig-1g.10gb": 7}},
            "nvidia-l4": {"nodes": 2, "largest": {GPU: 4}},
        },
        # Every extended resource a node offers, the most on one node; not only GPUs.
        "extendedResources": {
            "deviceclass.resource.kubernetes.io/broken": 10,
            "deviceclass.resource.kubernetes.io/everything": 10,
            "deviceclass.resource.kubernetes.io/gpu.nvidia.com": 8,
            "example.com/fpga": 1, GPU: 8, "nvidia.com/mig-1g.10gb": 7,
        },
        # The devices each class's selectors match, evaluated as the webhook evaluates them.
        "deviceClasses": {
            "broken": {"devices": 10, "largest": 10, "nodes": 1, "selectorsEvaluated": False},
            "everything": {"devices": 10, "largest": 10, "nodes": 1, "selectorsEvaluated": True},
            "gpu.nvidia.com": {"devices": 8, "largest": 8, "nodes": 1, "selectorsEvaluated": True,
                               "extendedResourceName": GPU},
        },
        "runtimeClasses": {"nvidia": {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
                           "runc": {"nodeSelector": {}}},
    }
    assert list(summary["models"]) == sorted(summary["models"])  # sorted, whatever the order of the objects
    assert summary_of(list(reversed(CLUSTER))) == summary


@pytest.mark.parametrize(("known", "sections"), [
    (cs.KINDS, {"nodeLabel", "models", "extendedResources", "deviceClasses", "runtimeClasses"}),
    # No DRA API (or no RBAC for it): no deviceClasses, and the models count the device plugin's GPUs alone.
    (("nodes", "runtimeclasses"), {"nodeLabel", "models", "extendedResources", "runtimeClasses"}),
    (("nodes", "deviceclasses", "runtimeclasses"), {"nodeLabel", "models", "extendedResources", "runtimeClasses"}),
    # Nodes unreadable: nothing about them, and no class can say what it reaches.
    (("resourceslices", "deviceclasses", "runtimeclasses"), {"runtimeClasses"}),
    ((), set()),
])
def test_a_kind_not_read_leaves_its_sections_out(known, sections):
    summary = summary_of(CLUSTER, known)
    assert set(summary) == sections
    if "models" in sections and "resourceslices" not in known:
        assert "nvidia-b200" in summary["models"] and summary["models"]["nvidia-b200"]["largest"] == {}


def test_no_models_is_an_empty_map_not_an_absent_one():
    assert summary_of([node("cpu")])["models"] == {}
    assert summary_of([node("cpu")], label="gpu.example.com/model")["nodeLabel"] == "gpu.example.com/model"


def test_each_section_is_cut_at_its_bound_keeping_the_most_and_says_so():
    nodes = [node(f"n{m}-{i}", f"model-{m:03d}", **{GPU: "1"}) for m in range(cs.MAX_MODELS + 6) for i in
             range(1 + (m % 3))]
    summary = summary_of(nodes)
    assert len(summary["models"]) == cs.MAX_MODELS and summary["truncated"] == ["models"]
    # The models with the most nodes are kept: every one with 3 nodes and 2 nodes is there.
    kept = summary["models"]
    assert all(f"model-{m:03d}" in kept for m in range(cs.MAX_MODELS + 6) if m % 3)

    many = [node("n", "m", **{f"example.com/r{i:02d}": "1" for i in range(cs.MAX_RESOURCES + 1)})]
    summary = summary_of(many, is_gpu=lambda name: True)
    assert len(summary["extendedResources"]) == cs.MAX_RESOURCES
    assert len(summary["models"]["m"]["largest"]) == cs.MAX_MODEL_RESOURCES
    assert summary["truncated"] == ["extendedResources", "models"]

    labels = {f"l{i:02d}": "x" for i in range(cs.MAX_SELECTOR_LABELS + 1)}
    classes = [runtime_class(f"rc{i:02d}") for i in range(cs.MAX_RUNTIME_CLASSES)] + [runtime_class("big", **labels)]
    summary = summary_of(classes)
    assert len(summary["runtimeClasses"]) == cs.MAX_RUNTIME_CLASSES and summary["truncated"] == ["runtimeClasses"]
    assert summary_of([runtime_class("big", **labels)])["runtimeClasses"] == {"big": {}}  # no half selector

    dra = [node("d"), resource_slice("d", 3), resource_slice("d", 2, kind="nic")]
    dra += [device_class(f"c{i:03d}") for i in range(cs.MAX_DEVICE_CLASSES)]
    summary = summary_of(dra + [device_class("zzz-most", selector=None)])
    assert "zzz-most" in summary["deviceClasses"] and len(summary["deviceClasses"]) == cs.MAX_DEVICE_CLASSES
    assert summary["truncated"] == ["deviceClasses", "extendedResources"]  # each class is a resource too


def longest(prefix, length):
    return (prefix + "x" * length)[:length]


def test_at_every_bound_with_the_longest_names_it_stays_under_its_size_and_the_crds_schema():
    def resource(i):
        return longest(f"d{i:03d}.example.com", 253) + "/" + longest(f"r{i:03d}", 63)

    objects = []
    for m in range(cs.MAX_MODELS + 1):
        objects.append(node(longest(f"n{m}", 253), longest(f"model-{m:03d}-", 63), label=resource(7777),
                            **{resource(m * 10 + r): "1000000" for r in range(cs.MAX_MODEL_RESOURCES + 1)}))
    for c in range(cs.MAX_DEVICE_CLASSES + 1):
        objects.append(device_class(longest(f"c{c:03d}", 253), extended=resource(9000 + c)))
    labels = {resource(8000 + i): longest("v", 63) for i in range(cs.MAX_SELECTOR_LABELS)}
    objects += [runtime_class(longest(f"rc{i:03d}", 253), **labels) for i in range(cs.MAX_RUNTIME_CLASSES + 1)]
    summary = summary_of(objects, is_gpu=lambda name: True, label=resource(7777))
    assert set(summary["truncated"]) == {"models", "extendedResources", "deviceClasses", "runtimeClasses"}
    written = {**summary, "writtenAt": "2026-01-01T00:00:00Z", "writer": longest("pod", cs.MAX_WRITER)}
    size = len(json.dumps(written, separators=(",", ":")))
    assert 400_000 < size <= cs.MAX_BYTES, size  # 444,203 bytes when written
    jsonschema.validate(written, cs.SCHEMA)
    # And the CRD's schema says the same: one entry over a cap is refused.
    over = json.loads(json.dumps(written))
    over["models"]["one-more"] = {"nodes": 1, "largest": {}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(over, cs.SCHEMA)


def test_its_size_follows_the_models_not_the_nodes():
    small = [node(f"n{i}", f"m{i % 4}", **{GPU: str(1 + i % 8)}) for i in range(40)]
    large = [node(f"n{i}", f"m{i % 4}", **{GPU: str(1 + i % 8)}) for i in range(4000)]
    a, b = (len(json.dumps(summary_of(nodes))) for nodes in (small, large))
    assert a > 0 and b - a < 16  # node counts grow a digit or two, nothing else


def test_the_stamps_are_not_facts():
    facts = summary_of(CLUSTER)
    assert cs.facts_of({**facts, "writtenAt": "2026-01-01T00:00:00Z", "writer": "a"}) == facts
    assert cs.facts_of(None) is None and cs.facts_of("junk") is None


@pytest.mark.parametrize(("old", "new", "patch"), [
    (None, {"a": 1}, {"a": 1}),
    ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
    ({"models": {"x": {"nodes": 1}, "y": {"nodes": 2}}}, {"models": {"y": {"nodes": 3}}},
     {"models": {"x": None, "y": {"nodes": 3}}}),
    ({"m": {}, "t": ["a"]}, {"m": {}, "t": ["b"]}, {"t": ["b"]}),
    ({"m": {"x": 1}}, {"m": {}}, {"m": {"x": None}}),
    ({"a": {"b": 1}}, {"a": 5}, {"a": 5}),
])
def test_the_merge_patch_removes_what_is_gone(old, new, patch):
    assert merge_patch(old, new) == patch


# -- the informers, over a fake source -----------------------------------------------------------------------


class FakeSource:
    """Lists by path; watches deliver what the test puts in a path's queue. Kinds may be forbidden (403) or not
    served (404)."""

    def __init__(self, objects, forbidden=(), unserved=()):
        self.by_path = {kind.path: [o for o in objects if o["kind"] == kind.kind] for kind in KINDS}
        self.forbidden, self.unserved = set(forbidden), set(unserved)
        self.events = {kind.path: queue.Queue() for kind in KINDS}
        self.lists: Counter[str] = Counter()  # lists asked for, by kind name

    def list(self, path):
        name = next(k.name for k in KINDS if k.path == path)
        self.lists[name] += 1
        if name in self.unserved:
            raise NotServed()
        if name in self.forbidden:
            raise ApiError(403, "Forbidden", f"cannot list resource {name!r}")
        return list(self.by_path[path]), "1"

    def watch(self, path, resource_version, timeout):
        try:
            yield self.events[path].get(timeout=0.05)
        except queue.Empty:
            return


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_an_unserved_dra_api_and_a_forbidden_kind_leave_their_sections_out_logged_once(capsys):
    source = FakeSource(CLUSTER, forbidden={"runtimeclasses"}, unserved={"resourceslices", "deviceclasses"})
    facts = ClusterFacts(source, every=0.0)
    try:
        facts.follow(CLUSTER_ON)
        summary = wait_for(lambda: facts.facts(CLUSTER_ON, 0.0))
        assert set(summary) == {"nodeLabel", "models", "extendedResources"}
        assert summary["models"]["nvidia-l4"] == {"nodes": 2, "largest": {GPU: 4}}
        # A node event: made again from the informer's index.
        source.events["/api/v1/nodes"].put({"type": "DELETED", "object": node("l4-b")})
        wait_for(lambda: facts.facts(CLUSTER_ON, 1.0)["models"]["nvidia-l4"]["nodes"] == 1)
        # The forbidden kind is retried meanwhile (its informer backs off 0.5 s first): the summary says so once.
        tried = source.lists["runtimeclasses"]
        wait_for(lambda: source.lists["runtimeclasses"] > tried)
        facts.facts(CLUSTER_ON, 2.0)
    finally:
        facts.stop()
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    partial = [e for e in events if e["event"] == "policy_status_cluster_partial"]
    assert len(partial) == 1
    assert partial[0]["absent"] == ["deviceClasses", "runtimeClasses"]
    assert partial[0]["kinds"]["resourceslices"] == "not served"
    assert "Forbidden" in partial[0]["kinds"]["runtimeclasses"]


def test_the_facts_are_made_again_at_most_once_per_interval_however_many_events():
    facts = ClusterFacts(FakeSource([]), every=10.0, start=False)
    facts.follow(CLUSTER_ON)
    for informer in facts.informers:
        informer.relist()
    assert facts.facts(CLUSTER_ON, 100.0) == {"nodeLabel": "accelerator", "models": {}, "extendedResources": {},
                                              "deviceClasses": {}, "runtimeClasses": {}}
    nodes = facts.state.indices["nodes"]
    for i in range(50):
        nodes.apply("ADDED", node(f"n{i}", "nvidia-l4", **{GPU: "8"}))
        facts.facts(CLUSTER_ON, 100.0 + i * 0.1)
    assert facts.computations == 1 and facts.stale
    assert facts.facts(CLUSTER_ON, 110.0)["models"] == {"nvidia-l4": {"nodes": 50, "largest": {GPU: 8}}}
    assert facts.computations == 2 and not facts.stale
    facts.facts(CLUSTER_ON, 200.0)  # nothing changed: nothing made
    assert facts.computations == 2
    # A node heartbeat changes nothing indexed: nothing to make.
    nodes.apply("MODIFIED", node("n0", "nvidia-l4", **{GPU: "8"}))
    assert not facts.stale


def test_a_costly_make_holds_the_next_one_back_for_ten_times_its_cpu():
    """The writer spends at most a tenth of a core on the facts: after a make of 0.5 s of CPU (15,000 nodes) the
    next waits 5 s, not the 2 s bound a small cluster gets."""
    spent = iter([0.0, 0.5, 10.0, 10.1])
    facts = ClusterFacts(FakeSource([]), every=2.0, start=False, cpu=lambda: next(spent))
    facts.follow(CLUSTER_ON)
    load(facts)
    facts.facts(CLUSTER_ON, 100.0)
    assert facts.gap == 5.0
    nodes = facts.state.indices["nodes"]
    nodes.apply("ADDED", node("n1", "nvidia-l4", **{GPU: "8"}))
    assert facts.facts(CLUSTER_ON, 104.9)["models"] == {} and facts.seconds_until_due(104.9) == pytest.approx(0.1)
    assert facts.facts(CLUSTER_ON, 105.0)["models"] == {"nvidia-l4": {"nodes": 1, "largest": {GPU: 8}}}
    assert facts.gap == 2.0 and facts.computations == 2  # a cheap make: back to the bound


def test_a_new_node_label_or_cluster_checks_off_stops_the_watches():
    facts = ClusterFacts(FakeSource([]), every=10.0, start=False)
    facts.follow(CLUSTER_ON)
    first = facts.state
    facts.follow(CLUSTER_ON)
    assert facts.state is first
    facts.follow(parse_policy("cluster: {enabled: true}\naccelerator: {nodeLabel: gpu.example.com/model}\n", "p"))
    assert facts.state is not first and facts.state.node_label == "gpu.example.com/model"
    informers = facts.informers
    facts.follow(parse_policy("{}", "p"))
    assert facts.state is None and all(i._stop.is_set() for i in informers)


# -- the writer ------------------------------------------------------------------------------------------------


def cluster_writer(spec=None, interval=10.0):
    obj = make(lambda text, source: parse_policy(text, source))
    obj.replace([gpupolicy(2, spec if spec is not None else {"cluster": {"enabled": True}}, rv="7")])
    facts = ClusterFacts(FakeSource(CLUSTER), every=interval, start=False)
    kube = StatusKube()
    writer = ps.StatusWriter(kube, StatusSettings(interval=2.0, cluster_interval=interval, lease_seconds=15),  # type: ignore[arg-type]
                             obj, FakeLease(), facts=facts)
    return writer, kube, obj, facts


def written_once():
    """A writer that has taken the Lease, written the facts once, and seen its status come back by the watch."""
    writer, kube, obj, facts = cluster_writer()
    writer.step(100.0)
    load(facts)
    echo(obj, kube)
    writer.step(103.0)
    echo(obj, kube, rv="9")
    return writer, kube, obj, facts


def load(facts):
    for informer in facts.informers:
        informer.relist()


def written_cluster(kube):
    return kube.patches[-1][2]["status"].get("cluster", "absent")


def echo(obj, kube, generation=2, rv="8"):
    """The watch brings back what was written, as the apiserver would have merged it."""
    status = kube.patches[-1][2]["status"]
    current = obj.snapshot().obj.get("status") or {}
    merged = dict(status)
    if "cluster" in status:
        merged["cluster"] = apply_patch(current.get("cluster"), status["cluster"])
    obj.apply("MODIFIED", gpupolicy(generation, obj.snapshot().obj["spec"], status=merged, rv=rv))


def apply_patch(target, patch):
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_patch(out.get(key), value)
    return out


def test_the_holder_writes_the_facts_with_its_stamps_and_again_for_the_stamps_only_at_the_heartbeat():
    writer, kube, obj, facts = cluster_writer()
    writer.step(100.0)  # the Lease taken, the informers started: the facts are not known yet
    assert facts.state is not None and written_cluster(kube) == "absent"
    echo(obj, kube)
    load(facts)
    writer.step(103.0)
    cluster = written_cluster(kube)
    assert cluster == {**summary_of(CLUSTER), "writtenAt": "1970-01-01T00:01:43Z", "writer": "me"}
    echo(obj, kube, rv="9")
    patches = len(kube.patches)
    for t in (106.0, 120.0, 222.0):  # time passes, nothing changes: no write, though writtenAt would differ
        writer.step(t)
    assert len(kube.patches) == patches
    assert writer.step(222.0) <= 1.0  # the heartbeat (103 + HEARTBEAT) is due within a second
    writer.step(103.0 + cs.HEARTBEAT)  # nothing changed, but the stamp is HEARTBEAT old: stamped again, and only that
    assert len(kube.patches) == patches + 1
    assert written_cluster(kube) == {"writtenAt": "1970-01-01T00:03:43Z"}
    echo(obj, kube, rv="10")
    writer.step(103.0 + cs.HEARTBEAT + 1)
    assert len(kube.patches) == patches + 1
    # A stamp does not hold back a change of a fact: a model that arrives right after it is written at once.
    facts.state.indices["nodes"].apply("ADDED", node("a100-a", "nvidia-a100", **{GPU: "8"}))
    writer.step(103.0 + cs.HEARTBEAT + 3)
    assert len(kube.patches) == patches + 2 and "nvidia-a100" in written_cluster(kube)["models"]


def test_the_cluster_facts_condition_says_whether_the_policies_act_on_the_facts():
    def facts(summary, enabled=True, now=1000.0):
        found = ps.facts_condition(summary, enabled, 4, now, [])
        return found["status"], found["reason"]

    written = {"models": {}, "writtenAt": "1970-01-01T00:10:00Z"}  # 600 s
    assert facts(written, now=600.0 + cs.FRESH_FOR) == ("True", "Current")
    assert facts(written, now=601.0 + cs.FRESH_FOR) == ("False", "Stale")
    assert facts(None) == ("False", "Missing")
    assert facts({"models": {}, "writtenAt": "not a time"}) == ("False", "Missing")
    assert facts(written, enabled=False) == ("False", "Disabled")


def test_every_replica_reports_the_age_of_the_facts_and_whether_they_are_stale():
    writer, kube, obj, facts = written_once()  # written at 103
    writer.lease.free = False
    writer.step(103.0 + cs.FRESH_FOR)
    assert metrics.CLUSTER_FACTS_AGE._value.get() == cs.FRESH_FOR
    assert metrics.CLUSTER_FACTS_STALE._value.get() == 0
    other, *_ = cluster_writer()  # another replica, not holding the Lease, over the same object
    other.obj, other.lease.free = obj, False
    other.step(104.0 + cs.FRESH_FOR)
    assert metrics.CLUSTER_FACTS_AGE._value.get() == cs.FRESH_FOR + 1
    assert metrics.CLUSTER_FACTS_STALE._value.get() == 1


def test_a_churn_of_nodes_is_written_at_most_once_per_interval_and_a_model_gone_is_removed():
    writer, kube, obj, facts = written_once()
    first = len(kube.patches)
    nodes = facts.state.indices["nodes"]
    t = 103.0
    for i in range(60):  # one node event every 0.5 s for 30 s: 30 nodes added, then removed
        t += 0.5
        nodes.apply("ADDED" if i < 30 else "DELETED", node(f"new-{i % 30}", "nvidia-a100", **{GPU: "8"}))
        writer.step(t)
        if len(kube.patches) > first:
            echo(obj, kube, rv=str(10 + i))
    writes = kube.patches[first:]
    assert 2 <= len(writes) <= 3  # 30 s at one per 10 s
    nodes.apply("DELETED", node("h100-a"))
    writer.step(t + 10.0)
    assert written_cluster(kube)["models"]["nvidia-h100"] is None  # the merge patch removes it
    echo(obj, kube, rv="99")
    assert "nvidia-h100" not in obj.snapshot().obj["status"]["cluster"]["models"]


def test_cluster_checks_turned_off_remove_the_facts_and_stop_the_watches():
    writer, kube, obj, facts = written_once()
    obj.apply("MODIFIED", gpupolicy(3, {}, status=obj.snapshot().obj["status"], rv="10"))
    writer.step(106.0)
    assert written_cluster(kube) is None and facts.state is None


def test_a_replica_that_does_not_hold_the_lease_watches_nothing():
    writer, kube, obj, facts = cluster_writer()
    writer.lease.free = False
    writer.step(100.0)
    assert facts.state is None and kube.patches == []
    writer.lease.free = True
    writer.step(101.0)
    assert facts.state is not None
    writer.lease.free = False
    writer.step(120.0)
    assert facts.state is None and not writer.holding


def test_the_bench_measures_a_small_cluster_through_the_real_writer():
    from bench.cluster_summary import measure

    found = measure(300, 0.5, events=100, rate=10.0, every=10.0)
    assert found["summary_bytes"] < 2000 and found["models"] == 4
    assert 1 <= found["churn_cluster_writes"] <= found["bound_writes"]
