"""serve --policy-object's pure parts: the GPUPolicy's state machine (present, missing, refused; the last good policy
kept), the status the writer would write and whether it changed, the writer's turns with a fake apiserver and Lease,
and the field selector on the list+watch."""

from __future__ import annotations

import pytest

from webhook.core.policyfile import PolicyError, build_policy, parse_policy
from webhook.kube.client import ApiError
from webhook.kube.informer import Informer, KubeSource
from webhook.native import generate as generate_mod
from webhook.native.generate import generate
from webhook.native.rules import native_rules
from webhook.native.target import DEFAULT, for_version
from webhook.serving import policystatus as ps
from webhook.serving.policyobject import RESOURCE, PolicyObject, Snapshot, StatusSettings, spec_text
from webhook.telemetry import metrics

DEFAULTS = build_policy(None, "default policy", schema_checked=True)
TARGET_137 = for_version("1.37")


class Checks:
    """check_spec in-process (the schema included), counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, text, source):
        self.calls += 1
        return parse_policy(text, source)


def gpupolicy(generation, spec, name="default", status=None, rv="1"):
    obj = {"apiVersion": "gpu-webhook.io/v1alpha1", "kind": "GPUPolicy",
           "metadata": {"name": name, "generation": generation, "resourceVersion": rv}, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def allowed_list(policy_set):
    return list(policy_set.default.allowed)


@pytest.fixture
def checks():
    return Checks()


def make(checks, **kw):
    return PolicyObject("default", lambda: DEFAULTS, check=checks, publish=False, **kw)


def test_missing_at_the_first_list_serves_the_fallback(checks):
    obj = make(checks)
    assert not obj.listed
    obj.replace([])
    snap = obj.snapshot()
    assert snap.listed and not snap.present and snap.enforced == 0
    assert obj.value is DEFAULTS and checks.calls == 0


def test_a_good_spec_is_swapped_in_and_a_bad_one_keeps_the_last_good(checks):
    swapped = []
    obj = make(checks, on_swap=swapped.append)
    obj.replace([gpupolicy(1, {"accelerator": {"allowed": ["nvidia-l4"]}})])
    good = obj.value
    assert good is not DEFAULTS and obj.enforced == 1 and swapped == [good]

    obj.apply("MODIFIED", gpupolicy(2, {"limits": {"perContainer": "lots"}}))
    snap = obj.snapshot()
    assert obj.value is good and snap.enforced == 1 and snap.refused == 2
    assert any("perContainer" in p for p in snap.problems)

    obj.apply("MODIFIED", gpupolicy(3, {"accelerator": {"allowed": ["nvidia-h100"]}}))
    assert obj.enforced == 3 and obj.problems == () and obj.value is not good


def test_a_refused_spec_at_start_leaves_the_fallback(checks):
    obj = make(checks)
    obj.replace([gpupolicy(4, {"nonsense": True})])
    assert obj.value is DEFAULTS and obj.present and obj.enforced == 0 and obj.refused == 4 and obj.problems


def test_a_change_that_leaves_the_spec_checks_nothing(checks):
    obj = make(checks)
    obj.replace([gpupolicy(1, {"accelerator": {"allowed": ["nvidia-l4"]}})])
    policy = obj.value
    obj.apply("MODIFIED", gpupolicy(1, {"accelerator": {"allowed": ["nvidia-l4"]}}, status={"webhook": {}}, rv="9"))
    assert checks.calls == 1 and obj.value is policy
    assert obj.snapshot().obj["metadata"]["resourceVersion"] == "9"


def test_deleted_keeps_the_last_good_and_made_again_as_it_was_checks_nothing(checks):
    obj = make(checks)
    obj.replace([gpupolicy(5, {"accelerator": {"allowed": ["nvidia-l4"]}})])
    policy = obj.value
    obj.apply("DELETED", gpupolicy(5, {"accelerator": {"allowed": ["nvidia-l4"]}}))
    snap = obj.snapshot()
    assert not snap.present and snap.obj is None and obj.value is policy and snap.enforced == 5
    obj.apply("ADDED", gpupolicy(1, {"accelerator": {"allowed": ["nvidia-l4"]}}))
    assert obj.present and obj.enforced == 1 and checks.calls == 1


def test_other_objects_are_ignored(checks):
    obj = make(checks)
    obj.replace([gpupolicy(1, {}, name="other")])
    assert not obj.present
    obj.apply("ADDED", gpupolicy(1, {}, name="other"))
    assert not obj.present and checks.calls == 0


def test_the_informer_feeds_it_over_a_fake_source(checks):
    class Source:
        def list(self, path):
            assert path == RESOURCE.path == "/apis/gpu-webhook.io/v1alpha1/gpupolicies"
            return [gpupolicy(1, {})], "10"

        def watch(self, path, resource_version, timeout):
            yield {"type": "MODIFIED", "object": gpupolicy(2, {"accelerator": {"allowed": ["a"]}}, rv="11")}
            yield {"type": "DELETED", "object": gpupolicy(2, {"accelerator": {"allowed": ["a"]}}, rv="12")}

    obj = make(checks)
    informer = Informer(RESOURCE, Source(), obj)
    informer.step()
    assert informer.loaded and informer.resource_version == "12"
    assert not obj.present and obj.enforced == 2 and allowed_list(obj.value) == ["a"]


def test_the_source_lists_and_watches_one_object_by_field_selector():
    class Response:
        def __init__(self, body):
            self.body = body

        def read(self):
            return self.body

        def stream(self, *a, **kw):
            yield self.body + b"\n"

        def release_conn(self):
            pass

    class Kube:
        queries = []

        def stream(self, path, query, read_timeout):
            self.queries.append(dict(query))
            if query.get("watch"):
                return Response(b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"3"}}}')
            return Response(b'{"items":[],"metadata":{"resourceVersion":"2"}}')

    kube = Kube()
    source = KubeSource(kube=kube, field_selector="metadata.name=default")  # type: ignore[arg-type]
    assert source.list(RESOURCE.path) == ([], "2")
    assert list(source.watch(RESOURCE.path, "2", 240))[0]["type"] == "BOOKMARK"
    assert all(q["fieldSelector"] == "metadata.name=default" for q in kube.queries)
    assert "fieldSelector" not in KubeSource(kube=kube)._selector  # type: ignore[arg-type]


# -- the status ---------------------------------------------------------------------------------------------------


def snap(generation=3, enforced=3, problems=(), refused=0, obj=None):
    return Snapshot(True, True, generation, enforced, tuple(problems), refused, obj)


def test_accepted_and_its_transition_time():
    status = ps.desired_status({}, snap(), None, None, now=1000.0)
    accepted = status["conditions"][0]
    assert accepted == {"type": "Accepted", "status": "True", "reason": "Valid",
                        "message": "the webhook enforces generation 3", "lastTransitionTime": "1970-01-01T00:16:40Z",
                        "observedGeneration": 3}
    assert status["webhook"] == {"observedGeneration": 3}
    again = ps.desired_status(status, snap(generation=4, enforced=4), None, None, now=2000.0)
    assert again["conditions"][0]["lastTransitionTime"] == "1970-01-01T00:16:40Z"  # still True: the same time
    refused = ps.desired_status(again, snap(generation=5, enforced=4, problems=["limits.perContainer: bad"],
                                            refused=5), None, None, now=3000.0)
    condition = refused["conditions"][0]
    assert condition["status"] == "False" and condition["reason"] == "Invalid" and condition["observedGeneration"] == 5
    assert "limits.perContainer: bad" in condition["message"] and "generation 4" in condition["message"]
    assert condition["lastTransitionTime"] == "1970-01-01T00:50:00Z"
    assert refused["webhook"] == {"observedGeneration": 4}


def live_state(generation=3):
    return ps.NativeState(ps.LIVE, f"the native policies read generation {generation} live", generation)


def test_other_conditions_are_kept_and_an_unchanged_status_is_not_written():
    current = {"conditions": [{"type": "Ready", "status": "True"}]}
    desired = ps.desired_status(current, snap(), {"target": "t", "native": [], "webhook": []}, live_state(), now=10.0)
    assert [c["type"] for c in desired["conditions"]] == ["Accepted", "NativePolicies", "Ready"]
    assert ps.changed(current, desired)
    written = {k: v for k, v in desired.items() if v is not None}
    assert not ps.changed(written, ps.desired_status(written, snap(), desired["rules"], live_state(), now=99.0))
    none = ps.NativeState(ps.NOT_INSTALLED, "none", None)
    no_native = ps.desired_status(written, snap(), desired["rules"], none, now=99.0)
    assert no_native["native"] is None and ps.changed(written, no_native)  # merge patch: None removes it
    assert no_native["conditions"][1]["reason"] == ps.NOT_INSTALLED
    after = {k: v for k, v in no_native.items() if v is not None}
    assert not ps.changed(after, ps.desired_status(after, snap(), desired["rules"], none, now=100.0))
    # The bindings unreadable: what the status says of them stays.
    unknown = ps.desired_status(written, snap(), desired["rules"], None, now=99.0)
    assert "native" not in unknown and not ps.changed(written, unknown)
    assert [c["type"] for c in unknown["conditions"]] == ["Accepted", "NativePolicies", "Ready"]


def generated_bindings(policy):
    """The bindings ``admission-policies`` generates for ``policy`` (1.37)."""
    return [o for o in generate(policy, TARGET_137).objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]


def test_the_native_policies_condition_from_the_bindings():
    state = ps.native_state([], 7, DEFAULTS)
    assert (state.reason, state.status, state.observed, state.stale) == (ps.NOT_INSTALLED, "False", None, False)

    live = parse_policy("accelerator:\n  allowed: [nvidia-l4]\n", "values")
    bindings = generated_bindings(live)
    assert bindings and all(generate_mod.COMPILED_ANNOTATION in b["metadata"]["annotations"] for b in bindings)
    # The object's live values changed: the policies read them, nothing to generate.
    edited = parse_policy("accelerator:\n  allowed: [nvidia-h100]\nlimits:\n  perPod: 4\n", "object")
    state = ps.native_state(bindings, 7, edited)
    assert (state.reason, state.status, state.observed, state.stale) == (ps.LIVE, "True", 7, False)
    assert "generation 7" in state.message

    # A compiled key changed: the policies hold its old value.
    compiled = parse_policy("accelerator:\n  allowed: [nvidia-l4]\nexcludeNamespaces: [batch]\n", "object")
    state = ps.native_state(bindings, 8, compiled)
    assert (state.reason, state.status, state.observed, state.stale) == (ps.COMPILED_KEYS_CHANGED, "False", 8, True)
    assert "excludeNamespaces" in state.message and "helm upgrade" in state.message
    assert "admission-policies --apply" in state.message

    # Inline: the values were written in; the generation they came from when the bindings say it.
    inline = parse_policy("nativePolicies:\n  params: inline\n", "values")
    state = ps.native_state(generated_bindings(inline), 9, inline)
    assert (state.reason, state.status, state.observed, state.stale) == (ps.INLINE, "False", None, False)
    assert "helm upgrade" in state.message
    annotated = [{"metadata": {"annotations": {ps.POLICY_GENERATION_ANNOTATION: "5"}}},
                 {"metadata": {"annotations": {ps.POLICY_GENERATION_ANNOTATION: "6"}}}]
    state = ps.native_state(annotated, 9, inline)
    assert (state.reason, state.observed) == (ps.INLINE, 5) and "generation 5" in state.message

    # Live bindings from a generator that did not record the compiled keys: live, unchecked.
    state = ps.native_state([{"spec": {"paramRef": {"name": "default"}}}], 7, DEFAULTS)
    assert (state.reason, state.observed) == (ps.LIVE, 7) and "not checked" in state.message


def test_the_chart_values_and_the_object_made_from_them_agree():
    """GPUPolicy/default is made from the same values the policies are generated from: Live, not stale."""
    values = parse_policy("platform: gke\naccelerator:\n  allowed: [nvidia-l4]\nexcludeNamespaces: [batch]\n"
                          "namespaces:\n  dev:\n    enforcement: warn\n", "values")
    made = generate(values, TARGET_137).policy_object
    assert made is not None
    from_object = parse_policy(spec_text(made), "GPUPolicy/default generation 1")
    assert ps.native_state(generated_bindings(values), 1, from_object).reason == ps.LIVE


def test_the_rules_say_which_engine_carries_which():
    rules = ps.rules_status(DEFAULTS, DEFAULT)
    assert rules["target"] == DEFAULT.describe()
    left = {item["name"] for item in rules["webhook"]}
    assert set(rules["native"]) == {r.id for r in native_rules()} - left
    assert rules["native"] and all(item["reason"] for item in rules["webhook"])


class FakeLease:
    namespace, name, identity = "ns", "gpu-webhook-status", "me"

    def __init__(self, free=True):
        self.free = free
        self.renewals = 0
        self.released = False

    def acquire(self, now):
        return self.free

    def renew(self, now):
        self.renewals += 1
        return self.free

    def release(self, now, finished):
        self.released = True


class FakeKube:
    def __init__(self):
        self.patches = []
        self.fail = None
        self.bindings = [{"spec": {"paramRef": {"name": "default"}}}]

    def get(self, path, query=None):
        if path == "/version":
            return {"major": "1", "minor": "37"}
        if path.endswith("validatingadmissionpolicybindings"):
            assert query == {"labelSelector": "app.kubernetes.io/component=admission-policies"}
            return {"items": self.bindings}
        return {"resources": [{"name": "validatingadmissionpolicies", "kind": "ValidatingAdmissionPolicy"},
                              {"name": "mutatingadmissionpolicies", "kind": "MutatingAdmissionPolicy"}]}

    def request(self, method, path, query, body, content_type):
        if self.fail:
            raise self.fail
        self.patches.append((method, path, body, content_type))
        return {}


def writer_with(checks, lease, obj_spec=None):
    obj = make(checks)
    obj.replace([gpupolicy(2, obj_spec or {"accelerator": {"allowed": ["nvidia-l4"]}}, rv="7")])
    kube = FakeKube()
    writer = ps.StatusWriter(kube, StatusSettings(interval=2.0, lease_seconds=15), obj, lease)  # type: ignore[arg-type]
    return writer, kube, obj


def test_only_the_holder_writes(checks):
    writer, kube, _ = writer_with(checks, FakeLease(free=False))
    assert writer.step(100.0) == 5.0
    assert kube.patches == [] and not writer.holding


def test_the_holder_writes_once_when_it_changes_at_most_every_interval(checks):
    writer, kube, obj = writer_with(checks, FakeLease())
    writer.step(100.0)
    assert len(kube.patches) == 1
    method, path, body, content_type = kube.patches[0]
    assert (method, path, content_type) == ("PATCH", "/apis/gpu-webhook.io/v1alpha1/gpupolicies/default/status",
                                            ps.MERGE_PATCH)
    assert body["metadata"] == {"resourceVersion": "7"}
    status = body["status"]
    assert status["webhook"] == {"observedGeneration": 2} and status["native"] == {"observedGeneration": 2}
    assert "Kubernetes 1.37" in status["rules"]["target"]
    native = [c for c in status["conditions"] if c["type"] == "NativePolicies"]
    assert [(c["status"], c["reason"], c["observedGeneration"]) for c in native] == [("True", ps.LIVE, 2)]

    # The watch brings the status back: nothing to write.
    obj.apply("MODIFIED", gpupolicy(2, {"accelerator": {"allowed": ["nvidia-l4"]}}, status=status, rv="8"))
    writer.step(100.5)
    assert len(kube.patches) == 1

    # A new generation within the interval waits for it, then is written.
    obj.apply("MODIFIED", gpupolicy(3, {"accelerator": {"allowed": ["a"]}}, status=status, rv="9"))
    assert writer.step(101.0) == pytest.approx(1.0)
    assert len(kube.patches) == 1
    writer.step(102.0)
    assert len(kube.patches) == 2 and kube.patches[1][2]["status"]["webhook"] == {"observedGeneration": 3}


def test_a_lost_lease_stops_the_writes_and_a_conflict_waits_for_the_watch(checks):
    lease = FakeLease()
    writer, kube, obj = writer_with(checks, lease)
    kube.fail = ApiError(409, "Conflict", "modified")
    writer.step(100.0)
    assert writer.holding and kube.patches == []
    lease.free = False
    writer.step(110.0)
    assert not writer.holding and lease.renewals == 1


def stale_gauge():
    return metrics.REGISTRY.get_sample_value("gpu_webhook_native_policies_stale")


def test_compiled_keys_changed_is_written_and_counted_by_the_holder_alone(checks):
    lease = FakeLease()
    writer, kube, obj = writer_with(checks, lease)
    kube.bindings = generated_bindings(parse_policy("accelerator:\n  allowed: [nvidia-l4]\n", "values"))
    writer.step(100.0)
    status = kube.patches[-1][2]["status"]
    assert status["conditions"][1]["reason"] == ps.LIVE and stale_gauge() == 0

    # A compiled key edited in the object: the bindings are read again for the new generation.
    obj.apply("MODIFIED", gpupolicy(3, {"accelerator": {"allowed": ["nvidia-l4"]}, "platform": "gke"},
                                    status=status, rv="9"))
    writer.step(103.0)
    condition = kube.patches[-1][2]["status"]["conditions"][1]
    assert (condition["status"], condition["reason"], condition["observedGeneration"]) == (
        "False", ps.COMPILED_KEYS_CHANGED, 3)
    assert "platform" in condition["message"] and stale_gauge() == 1
    assert metrics.REGISTRY.get_sample_value("gpu_webhook_native_policy_generation") == 3

    lease.free = False  # another replica holds the Lease now and says it
    writer.step(120.0)
    assert not writer.holding and stale_gauge() == 0
    assert metrics.REGISTRY.get_sample_value("gpu_webhook_native_policy_generation") == 0


def test_the_spec_check_refuses_what_the_schema_refuses():
    with pytest.raises(PolicyError):
        Checks()('{"limits": {"perContainer": "lots"}}', "GPUPolicy/default generation 1")


def test_the_status_settings_round_trip():
    settings = StatusSettings(name="default", lease_namespace="ns", lease_name="l", kubeconfig=None)
    command = settings.command()
    assert command[1:3] == ["-m", "webhook.serving.policystatus"]
    assert StatusSettings.from_json(command[3]) == settings


# -- the worker: readiness, and cluster checks decided by the policy in force after the first list --------------


@pytest.fixture
def worker(tmp_path, monkeypatch):
    from tests.test_kube_client import kubeconfig
    from webhook.serving import certs, server

    paths = certs.write(certs.generate(["localhost"], days=1), str(tmp_path / "tls"))

    def make(wait=60.0):
        config = server.ServeConfig(cert_file=str(paths["cert"]), key_file=str(paths["key"]), policy_object="default",
                                    kubeconfig=str(kubeconfig(tmp_path / "kubeconfig", "https://nowhere:6443")),
                                    policy_object_wait=wait)
        state = server._WorkerState(config)
        assert state.live is not None
        state.live._check = Checks()  # in-process: no child
        return state

    return make


def test_a_worker_is_not_ready_before_its_first_list_and_then_serves_the_object(worker):
    state = worker()
    assert state.readiness() == "waiting for the first list of GPUPolicy/default"
    assert state.served_policy() is state.policy.value  # the fallback, until the list answers
    state.live.replace([gpupolicy(1, {"accelerator": {"allowed": ["nvidia-l4"]}})])
    assert state.readiness() is None and state.cluster is None
    assert list(state.served_policy().default.allowed) == ["nvidia-l4"]


def test_the_first_list_decides_cluster_checks_and_a_later_edit_switches_them_live(worker, capsys):
    """helm upgrade --set policy.cluster.enabled=true restarts the pods before its post-upgrade hook writes the new
    spec: the new pods list the old one (off), then see the edit. The view follows the edit, on and off."""
    state = worker()
    state.live.replace([gpupolicy(1, {"cluster": {"enabled": True}})])
    assert state.cluster is not None and len(state.informers) == 6
    assert state.readiness().startswith("waiting for the first list of nodes")  # decided at start: it gates
    first = state.informers
    state.live.apply("MODIFIED", gpupolicy(2, {"cluster": {"enabled": False}}))
    assert state.cluster is None and state.informers == [] and state.cluster_view() is None
    assert all(informer._stop.is_set() for informer in first)
    assert state.readiness() is None
    state.live.apply("MODIFIED", gpupolicy(3, {"cluster": {"enabled": True}}))
    assert state.cluster is not None and len(state.informers) == 6 and state.informers[0] is not first[0]
    assert state.readiness() is None  # switched on by an edit: no replica leaves the Service for it
    assert state.cluster_view() is None  # the checks wait for the first lists
    logged = capsys.readouterr().err
    assert logged.count('"event":"policy_cluster_toggled"') == 2 and "policy_cluster_toggle\"" not in logged


@pytest.mark.process
def test_with_a_policy_file_switching_cluster_checks_takes_a_restart(tmp_path, capsys):
    from webhook.serving import certs, server

    paths = certs.write(certs.generate(["localhost"], days=1), str(tmp_path / "tls"))
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster: {enabled: false}\n")
    state = server._WorkerState(server.ServeConfig(cert_file=str(paths["cert"]), key_file=str(paths["key"]),
                                                   policy_file=str(policy)))
    assert state.cluster is None
    state._check_cluster_toggle(parse_policy("cluster: {enabled: true}\n"))
    assert state.cluster is None
    assert '"event":"policy_cluster_toggle"' in capsys.readouterr().err


def test_the_wait_for_the_first_list_is_bounded(worker):
    state = worker(wait=0.0)
    assert state.readiness() is None
    state._policy_wait_over()
    assert state._cluster_decided and state.cluster is None  # by the fallback: the built-in defaults


def test_the_rejected_gauge_follows_the_last_policy_reload():
    def rejected():
        return metrics.REGISTRY.get_sample_value("gpu_webhook_policy_rejected")

    metrics.record_reload("policy", False)
    assert rejected() == 1
    metrics.record_reload("certificate", True)
    assert rejected() == 1
    metrics.record_reload("policy", True)
    assert rejected() == 0
