"""Issue 34 item 3: nothing unsafe when GPUPolicy/default is missing, stale or wrong.

On the 1.30 and 1.37 beds of the matrix: the generated live policies of the default policy
(``generate(parse_policy(""), target)``, for what discovery finds), the generated GPUPolicy CRD
(``webhook.core.policycrd.crd()``) and ``generate(...).policy_object``, then an edit of the object that a
param-read rule enforces (``limits.perPod: 1``), and a webhook started with ``--policy-object default``. Each case is
made, observed through the apiserver (server-side dry run, so nothing is stored) and asserted:

- (a) the object deleted;
- (b) the policies applied before the CRD exists (a bad install order), then the CRD and the object;
- (c) the apiserver restarted: a cold param informer, pods created from the moment ``/readyz`` says 200;
- (d) an invalid policy: refused by the CRD at write time; one the CRD stores but the webhook refuses at load;
- (e) two apiservers on one etcd seeing an edit at different moments.

What must hold wherever the bed shows it: the hard rules (the seed policies, no params) never depend on the
object; no policy refuses anything in kube-system because of a param; a missing object is reported.

No pod without a GPU is refused because a param cannot be resolved: the policies that read params ignore their
failures (failurePolicy Ignore), since the apiserver resolves params before matchConditions. With Fail they refused
every Pod of a matched namespace in (b), and for about 30 s after each restart in (c), with "failed to find resource
referenced by paramKind". One thing does not hold, and (c) asserts its measured shape (docs/native-policies.md,
"When GPUPolicy/default is missing, stale or wrong", has the figures): after a restart the admission-policy plugin
refuses every request, in kube-system too, with "not yet ready to handle request" until it has compiled the
policies; the control test makes the same restart without them. Run with ``-s`` for the figures.
"""

from __future__ import annotations

import json
import ssl
import statistics
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import gpupolicy as gp
from tests.e2e.cluster import ADMIN_TOKEN, ControlPlane
from tests.e2e.conftest import MATRIX_BEDS
from tests.e2e.gpupolicy import eventually
from tests.e2e.native_bed import surviving_upstream_crash
from tests.manifests import admission_review, container, pod
from tests.server import WebhookProcess, make_certs, start_webhook
from webhook.cli.policies import discover
from webhook.core import policycrd
from webhook.core.policyfile import parse_policy
from webhook.kube.client import ApiError, Kube
from webhook.native.generate import Generated, generate, to_yaml

BEDS = [bed for bed in MATRIX_BEDS if bed.id in ("1.30", "1.37")]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.parametrize("matrix_cluster", BEDS, ids=[b.id for b in BEDS], indirect=True)]

CRDS = Path(__file__).resolve().parent / "native-crds.yaml"
GPU = "nvidia.com/gpu"
TENANT = "tenant"
SYSTEM = "kube-system"
LEASE = "default/gpu-webhook-status-failures"
# The edit that makes a param-read rule bite: per-pod-limit, in gpu-webhook-live-deny, reads limits.perPod live.
SPEC = {"limits": {"perPod": 1}}
# How long a wait for the apiserver or the webhook to catch up may take: the 1.30 bed, loaded by a full run on 2
# cores, has taken over 60 s to compile the live policies. A wait returns as soon as it is met.
WAIT = 180
SEED = "gpu-webhook-custom-seed-deny"  # invalid-quantity of custom kinds: compiled, no params
LIVE = "gpu-webhook-live-deny"  # per-pod-limit: reads GPUPolicy/default
CPU_POD = pod(container(requests={"cpu": "100m"}), name="cpu")
GPU_POD = pod(container(limits={GPU: 1}), name="gpu1")
TWO_GPUS = pod(container(limits={GPU: 2}), name="gpu2")  # over limits.perPod 1: a param-read violation
# A hard-rule violation: a fractional GPU in a custom kind (a Pod's own validation refuses it before admission).
FRACTIONAL = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "frac"},
              "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [
                  {"name": "c", "image": "busybox", "resources": {"limits": {GPU: "0.5"}}}]}}}}}}

FIGURES: dict[str, dict[str, Any]] = {}
# After a restart, the live policies may skip their param-read rules until the apiserver resolves their paramKind:
# every over-limit pod that gets in is sent before this many seconds from /readyz (the docs state this bound).
RESTART_WINDOW = 35.0


# --- talking to an apiserver --------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    message: str
    seconds: float = 0.0

    @property
    def admitted(self) -> bool:
        return self.status < 300

    def by(self, policy: str) -> bool:
        """Refused by ``policy``'s own validation (not a configuration error of it)."""
        return not self.admitted and f"ValidatingAdmissionPolicy '{policy}' with binding" in self.message

    @property
    def param_error(self) -> bool:
        """Refused because a policy could not be configured or its param read (kind unknown or not synced)."""
        return not self.admitted and ("paramKind" in self.message or "failed to configure" in self.message)

    def short(self) -> str:
        return f"{self.status} {self.message[:300]}"


class Api:
    """Dry-run creates against one apiserver (the main one, or a peer), as admin."""

    def __init__(self, url: str, ca: Path):
        self.url = url
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),
            urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(ca))))

    def create(self, obj: dict, namespace: str) -> Answer:
        api = obj["apiVersion"]
        base = "/api/v1" if api == "v1" else f"/apis/{api}"
        plural = {"Pod": "pods", "PyTorchJob": "pytorchjobs"}[obj["kind"]]
        request = urllib.request.Request(
            f"{self.url}{base}/namespaces/{namespace}/{plural}?dryRun=All", data=json.dumps(obj).encode(),
            method="POST", headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
        started = time.monotonic()
        try:
            with self.opener.open(request, timeout=30) as response:
                response.read()
                return Answer(response.status, "", time.monotonic() - started)
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            exc.close()
            return Answer(exc.code, str(body.get("message", "")), time.monotonic() - started)
        except OSError as exc:  # the apiserver going or not yet listening
            return Answer(0, f"connection: {exc}", time.monotonic() - started)


# --- the bed ------------------------------------------------------------------------------------------------------


@dataclass
class LiveBed:
    cluster: ControlPlane
    api: Api
    generated: Generated
    kube: Kube
    webhook: WebhookProcess
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        assert self.cluster.bed is not None
        return self.cluster.bed.id

    def policies(self) -> list[dict]:
        return [o for o in self.generated.objects if o["kind"] != gp.gpupolicy.KIND]

    def apply_policies(self) -> None:
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             stdin=to_yaml(self.policies()), check=True)

    def delete_policies(self) -> None:
        self.cluster.kubectl("delete", "--ignore-not-found", "--wait", "-f", "-", stdin=to_yaml(self.policies()),
                             check=True)

    def install_crd(self) -> None:
        gp.install_crd(self.cluster, policycrd.crd())

    def create_object(self, spec: dict | None = None) -> dict:
        obj = dict(self.generated.policy_object or {})
        self.cluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(obj), check=True)
        return gp.put_spec(self.kube, spec if spec is not None else SPEC)

    def enforced(self, api: Api | None = None) -> bool:
        """The seed refuses a fractional GPU, the live policy a pod over limits.perPod, a CPU pod is admitted."""
        api = api or self.api
        return (api.create(FRACTIONAL, TENANT).by(SEED) and api.create(TWO_GPUS, TENANT).by(LIVE)
                and api.create(CPU_POD, TENANT).admitted)

    def wait_enforced(self) -> float:
        """Until :meth:`enforced` (conftest's restart after an apiserver crash calls it)."""
        return eventually("the live policies enforced", self.enforced, timeout=240, every=0.2)

    def system_admitted(self, api: Api | None = None) -> bool:
        """kube-system is never matched: a CPU pod and a pod over every rule there are admitted."""
        api = api or self.api
        return all(api.create(obj, SYSTEM).admitted for obj in (CPU_POD, TWO_GPUS))

    def webhook_allows(self, obj: dict, namespace: str = TENANT) -> bool:
        review = admission_review({**obj, "metadata": {**obj["metadata"], "namespace": namespace}},
                                  namespace=namespace)
        answer = self.webhook.post("/validate", review)
        assert answer.status == 200, answer.body
        return bool(answer.json()["response"]["allowed"])


@pytest.fixture(scope="module")
def bed(matrix_cluster: ControlPlane, tmp_path_factory) -> Iterator[LiveBed]:
    cluster = matrix_cluster
    cluster.kubectl("apply", "-f", str(CRDS), check=True)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS), check=True)
    cluster.kubectl("create", "namespace", TENANT, check=True)
    kube = Kube.connect(str(cluster.kubeconfig))
    target = discover(kube)
    out = generate(parse_policy(""), target)
    assert out.policy_object is not None, "the default policy is live"
    live = LiveBed(cluster, Api(cluster.url, cluster.ca_file), out, kube, None)  # type: ignore[arg-type]
    live.install_crd()
    live.create_object()
    started = time.monotonic()
    live.apply_policies()
    took = surviving_upstream_crash(cluster, live.wait_enforced)
    print(f"\n{live.id}: {target.describe()}: {len(live.policies())} objects enforced {took:.1f} s after apply "
          f"({time.monotonic() - started:.1f} s with the apply)")
    tmp = tmp_path_factory.mktemp(f"live-failures-{live.id}")
    live.webhook = start_webhook(tmp, "--policy-object", "default", "--kubeconfig", str(cluster.kubeconfig),
                                 "--status-lease", LEASE, certs=make_certs(tmp / "tls", "127.0.0.1"))
    try:
        eventually("the webhook reads the object", lambda: live.webhook.metric(
            "gpu_webhook_policy_object_present") == 1 and not live.webhook_allows(TWO_GPUS))
        yield live
    finally:
        live.webhook.stop()
        kube.close()
        FIGURES[live.id] = live.figures
        print(f"\nfigures {live.id}: {json.dumps(live.figures, indent=1, default=str)}")


# --- the cases ----------------------------------------------------------------------------------------------------


def test_with_the_object_everything_is_enforced(bed):
    assert bed.enforced()
    assert bed.api.create(GPU_POD, TENANT).admitted
    assert bed.system_admitted()
    assert not bed.webhook_allows(TWO_GPUS) and bed.webhook_allows(GPU_POD)


def test_d_an_invalid_policy_is_refused_at_write_time_naming_the_field(bed):
    generation = gp.get(bed.kube)["metadata"]["generation"]
    bad_enum = {**bed.generated.policy_object, "spec": {**SPEC, "enforcement": "block"}}
    result = bed.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(bad_enum))
    assert result.returncode != 0
    assert "spec.enforcement" in result.stderr and "Unsupported value" in result.stderr, result.stderr
    bad_key = {**bed.generated.policy_object, "spec": {**SPEC, "namespaces": {"Team_A": {"enforcement": "warn"}}}}
    result_key = bed.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                                     stdin=json.dumps(bad_key))
    assert result_key.returncode != 0
    assert "spec.namespaces" in result_key.stderr and "not a namespace name" in result_key.stderr, result_key.stderr
    assert gp.get(bed.kube)["metadata"]["generation"] == generation  # nothing was stored
    bed.figures["d: refused at write time"] = [result.stderr.strip(), result_key.stderr.strip()]
    assert bed.enforced() and bed.system_admitted()


def test_d_a_glob_whose_domain_is_only_inside_brackets_is_refused_at_write_time(bed):
    """``resources: ['cp[u/]']`` contains a '/', but as a glob it matches ``cpu``, and the webhook refuses it. Stored,
    the native engine (which has no last good policy) would read its other values while the webhook kept the last
    good policy, and the engines would disagree: the CRD refuses it, naming the field, and nothing changes."""
    good = gp.get(bed.kube)["metadata"]["generation"]
    with pytest.raises(ApiError) as refused:
        gp.put_spec(bed.kube, {"limits": {"perPod": 3}, "resources": [GPU, "cp[u/]"]})
    assert "spec.resources[1]" in str(refused.value) and "only inside [...]" in str(refused.value)
    assert gp.get(bed.kube)["metadata"]["generation"] == good
    assert bed.enforced() and bed.system_admitted()


def test_a_the_object_deleted(bed):
    assert bed.enforced()
    gp.delete(bed.kube)
    deleted = time.monotonic()
    # parameterNotFoundAction Allow: the live policies are skipped, so the param-read rule no longer refuses.
    took = eventually("the live policy skipped", lambda: bed.api.create(TWO_GPUS, TENANT).admitted, timeout=WAIT,
                      every=0.05)
    bed.figures["a: delete -> param-read rule skipped (s)"] = round(took, 2)
    cpu = [bed.api.create(CPU_POD, TENANT) for _ in range(20)]
    assert all(a.admitted for a in cpu), [a.short() for a in cpu if not a.admitted]
    assert bed.api.create(FRACTIONAL, TENANT).by(SEED)  # the hard rule holds without the object
    assert bed.api.create(GPU_POD, TENANT).admitted
    assert bed.system_admitted()
    # The webhook keeps its last good policy and says the object is missing.
    eventually("present 0", lambda: bed.webhook.metric("gpu_webhook_policy_object_present") == 0, timeout=WAIT)
    assert not bed.webhook_allows(TWO_GPUS) and bed.webhook_allows(GPU_POD)
    assert any("policy_object_missing" in line for line in bed.webhook.log_lines())
    bed.figures["a: webhook present gauge after delete"] = bed.webhook.metric("gpu_webhook_policy_object_present")
    bed.figures["a: seconds deleted"] = round(time.monotonic() - deleted, 1)
    bed.create_object()
    took = eventually("enforced again", bed.enforced, timeout=WAIT, every=0.05)
    bed.figures["a: object recreated -> enforced (s)"] = round(took, 2)
    eventually("present 1", lambda: bed.webhook.metric("gpu_webhook_policy_object_present") == 1, timeout=WAIT)


def sample(bed: LiveBed, seconds: float, api: Api | None = None) -> dict[str, list[Answer]]:
    """Every kind of request, round after round, for ``seconds``."""
    api = api or bed.api
    cases = {"cpu tenant": (CPU_POD, TENANT), "gpu tenant": (GPU_POD, TENANT), "2 gpus tenant": (TWO_GPUS, TENANT),
             "fractional tenant": (FRACTIONAL, TENANT), "cpu kube-system": (CPU_POD, SYSTEM),
             "2 gpus kube-system": (TWO_GPUS, SYSTEM)}
    seen: dict[str, list[Answer]] = {name: [] for name in cases}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, (obj, namespace) in cases.items():
            seen[name].append(api.create(obj, namespace))
    return seen


def tally(seen: dict[str, list[Answer]]) -> dict[str, str]:
    out = {}
    for name, answers in seen.items():
        refused = [a for a in answers if not a.admitted]
        reasons = Counter(reason(a) for a in refused)
        out[name] = f"{len(refused)}/{len(answers)} refused" + (f" {dict(reasons)}" if reasons else "")
    return out


def reason(answer: Answer) -> str:
    if answer.status == 0:
        return "no connection"
    for marker in ("not yet synced", "failed to find resource referenced by paramKind", "not known",
                   "not yet ready"):
        if marker in answer.message:
            return marker
    if answer.by(SEED):
        return "seed rule"
    if answer.by(LIVE):
        return "live rule"
    return answer.message[:120]


def test_b_policies_applied_before_the_crd_exists(bed):
    bed.delete_policies()
    bed.cluster.kubectl("delete", "crd", gp.CRD_NAME, "--wait", check=True)
    eventually("the policies gone", lambda: bed.api.create(FRACTIONAL, TENANT).admitted, timeout=WAIT)
    time.sleep(2)
    bed.apply_policies()  # the bad install order: the policies before their CRD
    applied = time.monotonic()
    eventually("the seed policy loaded", lambda: bed.api.create(FRACTIONAL, TENANT).by(SEED), timeout=WAIT)
    loaded = time.monotonic() - applied
    seen = sample(bed, 4.0)
    bed.figures["b: CRD missing, 4 s after the seed loaded"] = tally(seen)
    bed.figures["b: example CPU refusal"] = next((a.message for a in seen["cpu tenant"] if not a.admitted), None)
    bed.figures["b: seed loaded after apply (s)"] = round(loaded, 2)
    # What holds: kube-system is never matched; the hard rule holds.
    assert all(a.admitted for name in ("cpu kube-system", "2 gpus kube-system") for a in seen[name])
    assert all(a.by(SEED) or a.param_error for a in seen["fractional tenant"])
    cpu_refused = [a for a in seen["cpu tenant"] if not a.admitted]
    bed.figures["b: CPU pods refused while the CRD is missing"] = f"{len(cpu_refused)}/{len(seen['cpu tenant'])}"
    assert cpu_refused == [], [a.short() for a in cpu_refused]

    crd_at = time.monotonic()
    bed.install_crd()
    crd_took = time.monotonic() - crd_at
    bed.create_object()
    object_at = time.monotonic()
    cpu_ok = eventually("CPU pods admitted", lambda: bed.api.create(CPU_POD, TENANT).admitted, timeout=WAIT,
                        every=0.05)
    enforced = eventually("enforcement starts", bed.enforced, timeout=WAIT, every=0.05)
    bed.figures["b: CRD apply -> Established and served (s)"] = round(crd_took, 2)
    bed.figures["b: object created -> CPU pods admitted (s)"] = round(cpu_ok, 2)
    bed.figures["b: object created -> enforced (s)"] = round(cpu_ok + enforced, 2)
    bed.figures["b: object created -> enforced, wall (s)"] = round(time.monotonic() - object_at, 2)
    assert bed.system_admitted()
    eventually("the webhook sees the object again", lambda: bed.webhook.metric(
        "gpu_webhook_policy_object_present") == 1, timeout=WAIT)


@dataclass
class Timed:
    case: str
    sent: float  # seconds after /readyz
    answer: Answer


CASES = {"cpu tenant": (CPU_POD, TENANT), "2 gpus tenant": (TWO_GPUS, TENANT),
         "fractional tenant": (FRACTIONAL, TENANT), "cpu kube-system": (CPU_POD, SYSTEM)}


def load(api: Api, since: float, seconds: float, workers: int = 4) -> list[Timed]:
    """``workers`` threads, each creating every case of CASES in turn, for ``seconds`` from ``since``: a request
    held by the apiserver (its admission plugins wait up to 10 s to be ready) does not stop the others."""
    import threading

    out: list[Timed] = []
    lock = threading.Lock()
    end = since + seconds

    def work(offset: int) -> None:
        names = list(CASES)
        i = offset
        while time.monotonic() < end:
            name = names[i % len(names)]
            sent = time.monotonic() - since
            answer = api.create(*CASES[name])
            with lock:
                out.append(Timed(name, sent, answer))
            i += 1

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sorted(out, key=lambda t: t.sent)


def timeline(seen: list[Timed]) -> dict[str, str]:
    """Per case: refused/sent, the reasons, and when (seconds after /readyz) the refused ones were sent."""
    out = {}
    for name in CASES:
        mine = [t for t in seen if t.case == name]
        refused = [t for t in mine if not t.answer.admitted]
        reasons = Counter(reason(t.answer) for t in refused)
        when = f" sent {refused[0].sent:.2f}-{refused[-1].sent:.2f} s" if refused else ""
        out[name] = f"{len(refused)}/{len(mine)} refused" + (f" {dict(reasons)}{when}" if reasons else "")
    return out


def first_admitted(seen: list[Timed], case: str) -> float | None:
    return next((t.sent for t in seen if t.case == case and t.answer.admitted), None)


@pytest.mark.parametrize("attempt", [1])
def test_c_the_apiserver_restarted_with_a_cold_param_informer(bed, attempt):
    stopping = time.monotonic()
    bed.cluster.stop_apiserver()
    starting = time.monotonic()
    bed.cluster.restart_apiserver()  # returns once /readyz says 200
    ready = time.monotonic()
    seen = load(bed.api, ready, 45.0)
    key = f"c{attempt}"
    bed.figures[f"{key}: stop / start to /readyz (s)"] = [round(starting - stopping, 2), round(ready - starting, 2)]
    bed.figures[f"{key}: 45 s from /readyz, 4 clients"] = timeline(seen)
    bed.figures[f"{key}: first admitted (s after /readyz): cpu tenant, cpu kube-system"] = [
        first_admitted(seen, "cpu tenant"), first_admitted(seen, "cpu kube-system")]
    for name in ("cpu tenant", "cpu kube-system"):
        example = next((t.answer.message for t in seen if t.case == name and not t.answer.admitted), None)
        if example:
            bed.figures[f"{key}: example refusal, {name}"] = example
    over = [t for t in seen if t.case == "2 gpus tenant" and t.answer.admitted]
    bed.figures[f"{key}: 2-GPU pods admitted (live rule skipped)"] = len(over)
    if over:
        bed.figures[f"{key}: 2-GPU pods admitted, sent (s after /readyz)"] = [round(over[0].sent, 2),
                                                                              round(over[-1].sent, 2)]
    # The restart window of the live policies, as docs/native-policies.md "After a kube-apiserver restart" states
    # it: none on 1.30; on 1.37 over-limit pods may get in while the paramKind cannot be resolved, for under
    # RESTART_WINDOW seconds from /readyz (measured: 28.6-29.6 s in 4 of 6 restarts, none in the other 2).
    if bed.id == "1.30":
        assert not over, timeline(seen)
    else:
        assert all(t.sent < RESTART_WINDOW for t in over), (RESTART_WINDOW, [round(t.sent, 2) for t in over])
    # The hard rule never admits: refused by the seed, or under failurePolicy Fail by an error.
    assert not any(t.answer.admitted for t in seen if t.case == "fractional tenant"), timeline(seen)
    # kube-system is never matched: what refuses there is the admission plugin's own readiness, not a param.
    system = [t.answer for t in seen if t.case == "cpu kube-system"]
    assert not any(a.param_error for a in system), timeline(seen)
    assert first_admitted(seen, "cpu kube-system") is not None, timeline(seen)
    cpu_refused = [t.answer for t in seen if t.case == "cpu tenant" and not t.answer.admitted]
    assert all("not yet ready" in a.message for a in cpu_refused), [a.short() for a in cpu_refused]
    eventually("enforced after the restart", bed.enforced, timeout=WAIT)
    bed.kube.close()
    bed.kube = Kube.connect(str(bed.cluster.kubeconfig))


def test_e_two_apiservers_see_an_edit_at_different_moments(bed):
    peer = bed.cluster.start_peer_apiserver()
    try:
        other = Api(peer.url, bed.cluster.ca_file)
        seen = load(other, time.monotonic(), 10.0)  # the peer's cold start, as (c)
        bed.figures["e: peer's first 10 s after /readyz, 4 clients"] = timeline(seen)
        assert not any(t.answer.param_error for t in seen if t.case == "cpu kube-system"), timeline(seen)
        eventually("the peer enforces", lambda: bed.enforced(other), timeout=WAIT)
        windows, main_lag, peer_lag = [], [], []
        for i in range(10):
            limit = 2 if i % 2 == 0 else 1  # 2: two GPUs admitted; 1: refused
            want = limit == 2
            gp.put_spec(bed.kube, {"limits": {"perPod": limit}})
            edited = time.monotonic()
            seen_at: dict[str, float] = {}
            while len(seen_at) < 2:
                assert time.monotonic() - edited < 30, f"edit {i}: {seen_at}"
                for name, api in (("main", bed.api), ("peer", other)):
                    if name not in seen_at and api.create(TWO_GPUS, TENANT).admitted == want:
                        seen_at[name] = time.monotonic() - edited
            main_lag.append(seen_at["main"])
            peer_lag.append(seen_at["peer"])
            windows.append(abs(seen_at["main"] - seen_at["peer"]))
        bed.figures["e: edit -> main apiserver (s) p50/max"] = [round(statistics.median(main_lag), 3),
                                                                round(max(main_lag), 3)]
        bed.figures["e: edit -> peer apiserver (s) p50/max"] = [round(statistics.median(peer_lag), 3),
                                                                round(max(peer_lag), 3)]
        bed.figures["e: window between them (s) p50/max"] = [round(statistics.median(windows), 3),
                                                             round(max(windows), 3)]
        assert max(windows) < 5.0
    finally:
        peer.stop()
    gp.put_spec(bed.kube, SPEC)
    eventually("the spec again", bed.enforced, timeout=WAIT)


def test_c_control_the_same_restart_without_the_generated_policies(bed):
    """Attributes (c): the same restart and load with none of the generated policies applied."""
    bed.delete_policies()
    eventually("the policies gone", lambda: bed.api.create(FRACTIONAL, TENANT).admitted, timeout=WAIT)
    bed.cluster.stop_apiserver()
    bed.cluster.restart_apiserver()
    seen = load(bed.api, time.monotonic(), 15.0)
    bed.figures["c control: 15 s from /readyz without the policies"] = timeline(seen)
    assert all(t.answer.admitted for t in seen if t.case == "cpu kube-system"), timeline(seen)
    started = time.monotonic()
    bed.apply_policies()
    # Applying 40-odd policies took 20-75 s on the loaded 2-core bed.
    took = eventually("enforced again", bed.enforced, timeout=240)
    bed.figures["c control: policies applied again, enforced (s, with the apply)"] = round(
        time.monotonic() - started, 1)
    assert took < 240


def test_c_inline_policies_hold_every_rule_through_a_restart(bed):
    """The same restart and load with ``nativePolicies.params: inline``: no params to resolve, so no window; not one
    over-limit pod is admitted (measured: 0 over 5 restarts on 1.37)."""
    inline = generate(parse_policy("limits: {perPod: 1}\nnativePolicies: {params: inline}\n"), bed.generated.target)
    assert inline.policy_object is None
    objects = to_yaml([o for o in inline.objects if o["kind"] != gp.gpupolicy.KIND])
    bed.delete_policies()
    bed.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=objects, check=True)
    try:
        eventually("the inline policies enforced", lambda: bed.api.create(TWO_GPUS, TENANT).by("gpu-webhook-deny")
                   and bed.api.create(FRACTIONAL, TENANT).by("gpu-webhook-custom-deny"), timeout=WAIT)
        bed.cluster.stop_apiserver()
        bed.cluster.restart_apiserver()
        seen = load(bed.api, time.monotonic(), 45.0)
        bed.figures["c inline: 45 s from /readyz, 4 clients"] = timeline(seen)
        assert not any(t.answer.admitted for t in seen if t.case in ("2 gpus tenant", "fractional tenant")), \
            timeline(seen)
    finally:
        bed.cluster.kubectl("delete", "--ignore-not-found", "--wait", "-f", "-", stdin=objects, check=True)
        bed.apply_policies()
        eventually("the live policies enforced again", bed.enforced, timeout=240)
        bed.kube.close()
        bed.kube = Kube.connect(str(bed.cluster.kubeconfig))
