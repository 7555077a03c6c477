"""Upgrade from the previous release, on the node bed (issue 34's "done means"): a release installed with the chart
and image of PREVIOUS_COMMIT (the last release before GPUPolicy: the policy in a ConfigMap, the native policies
generated from it with literals) in hybrid mode (``admissionPolicies.enabled=true``) and a non-default policy, then
``helm upgrade --reset-then-reuse-values`` to this tree's chart and image (docs/upgrade.md: the new chart's defaults,
then the values the release had set), where GPUPolicy/default is read live by the webhook and by the native
policies' params. (``--reuse-values`` would keep the old chart's defaults, policyObject.enabled among them: unset,
so the webhook would keep reading the ConfigMap and nothing would write GPUPolicy/default's status.)

A bounded load of dry-run GPU pod creations (tests/e2e/load.py, RATE a second) runs from a few seconds before the
upgrade until 10 s after ``helm upgrade --wait`` returned: a fixed mix (MIX) of pods the policy refuses and pods it
admits, each judged by ``webhook.rules.admission.decide`` on the same policy. Asserted: no pod the policy refuses
is admitted at any moment, no admission fails (no error status, no webhook call error, no refusal of a pod the
policy admits, no webhook call the apiserver let through on failurePolicy Ignore), GPUPolicy/default after the
upgrade is the ConfigMap's policy before it (as parsed policies), and its status says Accepted True in bounded
time. The figures, by second since the upgrade started, and a timeline of what changed (webhook pods, admission
policies, GPUPolicy/default) are printed (``-s``).

Images: PREVIOUS_COMMIT's archive is built by ``tests/prepare image-previous`` (tests/image/build-previous-image.sh:
that commit's own build-image.sh in a temporary git worktree; its archive sits under its own key, beside this
tree's). Both archives may name their image ``localhost/gpu-webhook:<version>`` with the same version, so the
previous one is imported and retagged PREVIOUS_TAG, and this tree's name pointed back at this tree's image.

The module installs its own release (namespace NAMESPACE) and, at the end, uninstalls it, deletes the GPUPolicy
CRD (tests/e2e/bed.py forget_policy_crd), whatever admission policies a failed run left, the namespaces and the
previous image's tag, so the other node modules find the bed as before.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.bed import forget_policy_crd
from tests.e2e.gpupolicy import chart_of
from tests.e2e.load import AdmissionLoad, LoadReport, Result
from tests.e2e.node import NodeBed, until
from tests.e2e.test_node_release import _dry_run, _secret
from tests.manifests import container, pod
from tests.tools import ROOT, unavailable
from webhook.core import gpupolicy
from webhook.core.policy import PolicySet
from webhook.core.policyfile import parse_policy
from webhook.rules.admission import decide
from webhook.serving import certs

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

PREVIOUS_COMMIT = "828c426"  # the last release with the policy in a ConfigMap only (build-previous-image.sh reads it)
PREVIOUS_TAG = f"previous-{PREVIOUS_COMMIT}"
RELEASE, NAMESPACE = "gpu-webhook", "gw-upgrade"
RESEARCH = "gw-upgrade-research"  # the namespace override's namespace
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
RATE = 8.0  # dry-run pod creations a second
AFTER = 10.0  # seconds of load after helm upgrade returned
GPU = "nvidia.com/gpu"
POLICY = {
    "accelerator": {"allowed": ["nvidia-tesla-k80", "nvidia-l4", "nvidia-a100"], "default": "nvidia-tesla-k80"},
    "limits": {"perContainer": 4, "perPod": 6},
    "checks": {"privilegedGpu": "warn"},
    "namespaces": {RESEARCH: {"accelerator": {"allowed": ["nvidia-h100"], "default": "nvidia-h100"},
                              "limits": {"perContainer": 8, "perPod": 8}}},
}
POLICY_KINDS = ("validatingadmissionpolicies", "validatingadmissionpolicybindings", "mutatingadmissionpolicies",
                "mutatingadmissionpolicybindings")
FIGURES: dict[str, object] = {}


def _gpu_pod(what: str, accelerator: str, *gpus: int, privileged: bool = False) -> dict:
    extra = {"securityContext": {"privileged": True}} if privileged else {}
    return pod(*(container(f"c{i}", limits={GPU: str(n)}, **extra) for i, n in enumerate(gpus)), name=what,
               nodeSelector={"accelerator": accelerator})


# (namespace, pod): every request sends MIX[index % len(MIX)] (named after the index); which the policy admits is
# decided by webhook.rules.admission.decide, not written here.
MIX = (
    ("default", _gpu_pod("k80-one", "nvidia-tesla-k80", 1)),
    ("default", _gpu_pod("h100-not-allowed", "nvidia-h100", 1)),
    ("default", _gpu_pod("seven-over-per-pod", "nvidia-l4", 4, 3)),
    ("default", _gpu_pod("privileged-warn", "nvidia-l4", 2, privileged=True)),
    (RESEARCH, _gpu_pod("research-h100-eight", "nvidia-h100", 8)),
    (RESEARCH, _gpu_pod("research-k80-not-allowed", "nvidia-tesla-k80", 1)),
    ("default", _gpu_pod("five-over-per-container", "nvidia-a100", 5)),
    (RESEARCH, _gpu_pod("research-nine-over-per-pod", "nvidia-h100", 4, 4, 1)),
)


def _mix(index: int) -> tuple[str, dict]:
    namespace, document = MIX[index % len(MIX)]
    return namespace, {**document, "metadata": {"name": f"{document['metadata']['name']}-{index}"}}


def _expected(policies: PolicySet) -> list[bool]:
    """Whether the policy admits each pod of MIX (its own decision function, on the same policy)."""
    return [decide(document, "", "Pod", namespace, policies).allowed for namespace, document in MIX]


# --- the two images ----------------------------------------------------------------------------------------------

def _archive(script: str) -> Path:
    done = subprocess.run(["bash", str(ROOT / "tests" / "image" / script), "--print-archive"], capture_output=True,
                          text=True, timeout=120, check=False)
    path = Path(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None
    if path is None or not path.is_file():
        unavailable(f"the image of {PREVIOUS_COMMIT}", f"no OCI archive ({done.stderr.strip()[-300:]}, {path})",
                    "image-previous")
    return path


def _digests(bed: NodeBed) -> dict[str, str]:
    """Image name -> digest in the node's containerd."""
    lines = bed.ctr("images", "ls").stdout.splitlines()[1:]
    return {fields[0]: fields[2] for fields in (line.split() for line in lines) if len(fields) > 2}


@pytest.fixture(scope="module")
def images(node_bed: NodeBed, webhook_image: str) -> Iterator[dict[str, str]]:
    """{"previous": <ref>, "current": <ref>}: PREVIOUS_COMMIT's image imported and retagged, this tree's as the
    webhook_image fixture imported it (its name is pointed back at it if the import took it over)."""
    bed = node_bed
    archive = _archive("build-previous-image.sh")
    repository = webhook_image.rsplit(":", 1)[0]
    previous, keep = f"{repository}:{PREVIOUS_TAG}", f"{repository}:keep-current-{PREVIOUS_COMMIT}"
    current_digest = _digests(bed)[webhook_image]
    bed.ctr("images", "tag", "--force", webhook_image, keep)
    start = time.monotonic()
    names = [n for n in bed.import_image(archive) if "gpu-webhook" in n]
    FIGURES["previous image import (s)"] = round(time.monotonic() - start, 1)
    assert names, f"no gpu-webhook image in {archive}"
    bed.ctr("images", "tag", "--force", names[0], previous)
    bed.ctr("images", "tag", "--force", keep, webhook_image)
    bed.ctr("images", "rm", keep)
    digests = _digests(bed)
    assert digests[webhook_image] == current_digest, digests
    assert digests[previous] != current_digest, f"{archive} holds this tree's image: {digests}"
    FIGURES["images"] = {"previous": f"{previous} {digests[previous]}", "current": f"{webhook_image} {current_digest}"}
    try:
        yield {"previous": previous, "current": webhook_image}
    finally:
        bed.ctr("images", "rm", previous)


# --- the release --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory) -> Path:
    return chart_of(PREVIOUS_COMMIT, tmp_path_factory.mktemp("previous-chart"), ROOT)


def _pods(bed: NodeBed) -> list[dict]:
    return bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", SELECTOR)["items"]


def _native_refuses(bed: NodeBed) -> bool:
    refused = _dry_run(bed, _gpu_pod("probe", "nvidia-tesla-k80", 5))
    return refused.returncode != 0 and "ValidatingAdmissionPolicy" in refused.stderr


@pytest.fixture(scope="module")
def release(node_bed: NodeBed, images: dict[str, str], previous_chart: Path, tmp_path_factory):
    """The previous chart and image, installed as test_node_release.py installs this one (certs.mode=secret, two
    replicas) in hybrid mode with POLICY; removed at the end with everything it left."""
    bed = node_bed
    tmp = tmp_path_factory.mktemp("upgrade-release")
    installed = False
    try:
        for namespace in (NAMESPACE, RESEARCH):
            bed.kubectl("create", "namespace", namespace, check=True)
        bundle = certs.generate(certs.service_names(RELEASE, NAMESPACE))
        secret = _secret(bundle)
        secret["metadata"]["namespace"] = NAMESPACE
        bed.kubectl("create", "-f", "-", stdin=json.dumps(secret), check=True)
        repository, tag = images["previous"].rsplit(":", 1)
        values = {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "replicaCount": 2,
            "certs": {"mode": "secret", "secret": {"name": f"{RELEASE}-tls",
                                                   "caBundle": base64.b64encode(bundle.ca_pem).decode()}},
            "admissionPolicies": {"enabled": True},
            "policy": POLICY,
        }
        (tmp / "values.yaml").write_text(yaml.safe_dump(values))
        start = time.monotonic()
        result = bed.helm("install", RELEASE, str(previous_chart), "--namespace", NAMESPACE,
                          "--values", str(tmp / "values.yaml"), "--wait", "--timeout=180s", timeout=240)
        installed = True
        FIGURES["previous chart: helm install --wait (s)"] = round(time.monotonic() - start, 1)
        if result.returncode:
            pytest.fail(f"helm install of {PREVIOUS_COMMIT}'s chart failed: {result.stderr}\n"
                        f"{bed.kubectl('describe', 'pods', '-n', NAMESPACE).stdout[-4000:]}", pytrace=False)
        until("the previous release's native policies enforcing", lambda: _native_refuses(bed), 60, interval=0.5)
        until("the previous release's webhook answering through its Service",
              lambda: _dry_run(bed, _gpu_pod("probe", "nvidia-tesla-k80", 1)).returncode == 0, 60, interval=0.3)
        yield bed
    finally:
        problems = []
        start = time.monotonic()
        if installed:
            uninstall = bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=120s",
                                 timeout=180)
            if uninstall.returncode:
                problems.append(f"helm uninstall: {uninstall.stderr}")
        forget_policy_crd(bed.kubectl)
        # A release that failed half-way may leave its hook Job's policies (the pre-delete Job removes them).
        bed.kubectl("delete", ",".join(POLICY_KINDS), "-l", "app.kubernetes.io/component=admission-policies",
                    "--ignore-not-found")
        try:
            until("the release's pods gone", lambda: not _pods(bed), 90, interval=0.5)
        except TimeoutError as exc:
            problems.append(str(exc))
        for namespace in (NAMESPACE, RESEARCH):
            deleted = bed.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true",
                                  "--timeout=90s", timeout=120)
            if deleted.returncode:
                problems.append(f"kubectl delete namespace {namespace}: {deleted.stderr}")
        FIGURES["teardown (s)"] = round(time.monotonic() - start, 1)
        print(f"node upgrade figures: {json.dumps(FIGURES, indent=1)}")
        assert not problems, problems


# --- what changes during the upgrade -----------------------------------------------------------------------------

class Timeline:
    """Polls what the upgrade changes (the webhook pods, the admission policies and their bindings, GPUPolicy/default)
    and keeps each change with its time (monotonic)."""

    def __init__(self, bed: NodeBed, interval: float = 0.5):
        self.bed, self.interval = bed, interval
        self.events: list[tuple[float, str, object]] = []
        self.last: dict[str, object] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="upgrade-timeline", daemon=True)

    def __enter__(self) -> Timeline:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)

    def _note(self, what: str, value: object) -> None:
        if self.last.get(what, "unseen") != value:
            self.last[what] = value
            self.events.append((time.monotonic(), what, value))

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self._poll()
            except Exception as exc:  # a poll that fails is noted, not fatal: the test asserts on the load
                self._note("poll error", repr(exc)[:200])

    def _poll(self) -> None:
        listed = self.bed.kubectl("get", ",".join(POLICY_KINDS) + ",pods", "-n", NAMESPACE, "-o", "json", timeout=20)
        if listed.returncode == 0:
            items = json.loads(listed.stdout)["items"]
            self._note("webhook pods", sorted(_pod_state(p) for p in items if p["kind"] == "Pod"))
            self._note("admission policies", sorted(_policy_state(i) for i in items if i["kind"] != "Pod"))
        found = self.bed.kubectl("get", gpupolicy.PLURAL, gpupolicy.NAME, "-o", "json", timeout=20)
        if found.returncode:
            self._note("GPUPolicy/default", "absent")
        else:
            obj = json.loads(found.stdout)
            accepted = [c["status"] for c in (obj.get("status") or {}).get("conditions") or []
                        if c.get("type") == "Accepted"]
            self._note("GPUPolicy/default", f"generation {obj['metadata'].get('generation')}, "
                                            f"Accepted {accepted[0] if accepted else 'unset'}")


SHORT_KINDS = {"ValidatingAdmissionPolicy": "VAP", "ValidatingAdmissionPolicyBinding": "VAPB",
               "MutatingAdmissionPolicy": "MAP", "MutatingAdmissionPolicyBinding": "MAPB"}


def _pod_state(p: dict) -> str:
    """``<name's suffix> <image tag> [ready] [terminating]``."""
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    return (f"{p['metadata']['name'].rsplit('-', 1)[-1]} {p['spec']['containers'][0]['image'].rsplit(':', 1)[-1]}"
            f"{' ready' if ready else ''}{' terminating' if p['metadata'].get('deletionTimestamp') else ''}")


def _policy_state(item: dict) -> str:
    """``<VAP|VAPB|MAP|MAPB> <name>``, `` params`` when it reads a parameter (paramKind, paramRef)."""
    params = item["spec"].get("paramKind") or item["spec"].get("paramRef")
    return f"{SHORT_KINDS[item['kind']]} {item['metadata']['name']}{' params' if params else ''}"


# --- judging the load ---------------------------------------------------------------------------------------------

def _refusal(result: Result) -> bool:
    """A policy's refusal (a webhook's or a ValidatingAdmissionPolicy's), not an error."""
    return (result.status in (400, 403, 422) and "failed calling webhook" not in result.error
            and ("denied the request" in result.error or "AdmissionPolicy" in result.error))


def _verdict(result: Result, expected: list[bool]) -> str:
    """admitted | refused | wrong (a pod the policy refuses, admitted) | failed (an error, or a pod the policy
    admits, refused)."""
    allowed = expected[result.index % len(MIX)]
    if result.ok:
        return "admitted" if allowed else "wrong"
    if _refusal(result):
        return "failed" if allowed else "refused"
    return "failed"


def _fail_open(bed: NodeBed) -> float:
    """Webhook calls the apiserver let through on failurePolicy Ignore so far (its metric, every webhook)."""
    return sum(float(line.rsplit(" ", 1)[1])
               for line in bed.kubectl("get", "--raw", "/metrics", check=True).stdout.splitlines()
               if line.startswith("apiserver_admission_webhook_fail_open_count{"))


def _by_second(report: LoadReport, expected: list[bool], origin: float) -> dict[int, Counter]:
    seconds: dict[int, Counter] = {}
    for r in report.results:
        second = int((r.sent - origin) // 1)
        counts = seconds.setdefault(second, Counter())
        counts["sent"] += 1
        counts[_verdict(r, expected)] += 1
    return dict(sorted(seconds.items()))


def _table(seconds: dict[int, Counter]) -> str:
    rows = ["  s   sent admitted refused wrong failed"]
    rows += [f"{s:>4} {c['sent']:>6} {c['admitted']:>8} {c['refused']:>7} {c['wrong']:>5} {c['failed']:>6}"
             for s, c in seconds.items()]
    return "\n".join(rows)


APPLY_JOB = f"{RELEASE}-policies-apply"


def _apply_job(bed: NodeBed) -> dict[str, object]:
    """The hook Job that applied the admission policies, if it is still there (a failed one stays): its conditions,
    and its pods' times and log lines (``kubectl logs --timestamps``)."""
    job = bed.kubectl("get", "job", APPLY_JOB, "-n", NAMESPACE, "-o", "json")
    if job.returncode:
        return {"job": "gone (it succeeded: hook-delete-policy hook-succeeded)"}
    status = json.loads(job.stdout).get("status") or {}
    pods = bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"job-name={APPLY_JOB}")["items"]
    logs = bed.kubectl("logs", "-n", NAMESPACE, "-l", f"job-name={APPLY_JOB}", "--timestamps", "--prefix",
                       "--tail=-1", "--all-containers")
    return {"conditions": [f"{c.get('type')} {c.get('status')} {c.get('reason')}: {c.get('message')}"
                           for c in status.get("conditions") or []],
            "startTime": status.get("startTime"), "failed": status.get("failed"),
            "pods": [(p["metadata"]["name"], p["status"].get("phase"),
                      [(t.get("state"), t.get("lastState")) for t in p["status"].get("containerStatuses") or []])
                     for p in pods],
            "log": logs.stdout.splitlines()[-80:] + logs.stderr.splitlines()[-5:]}


STATUS_EVENTS = ("policy_status", "policy_object", '"level":"error"', '"level":"warning"')


def _status_log(bed: NodeBed) -> list[str]:
    """What each webhook pod logged about GPUPolicy/default and its status (the status process's events), and any
    warning or error; a pod that logged none of these shows its last lines."""
    found = []
    for p in _pods(bed):
        name = p["metadata"]["name"]
        if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "admission-policies":
            continue
        logs = bed.kubectl("logs", "-n", NAMESPACE, name, "--tail=2000", timeout=60)
        lines = [f"{name}: {line[:400]}" for line in logs.stdout.splitlines() if any(e in line for e in STATUS_EVENTS)]
        found += lines[-30:] or [f"{name}: {line[:400]}" for line in logs.stdout.splitlines()[-10:]]
        found += [f"{name} (kubectl logs stderr): {logs.stderr.strip()[:300]}"] if logs.returncode else []
    return found


def _policy_of_configmap(bed: NodeBed) -> tuple[str, PolicySet]:
    configmap = bed.kubectl_json("get", "configmap", "-n", NAMESPACE, f"{RELEASE}-policy")
    text = configmap["data"]["policy.yaml"]
    return text, parse_policy(text, "the ConfigMap's policy.yaml")


def _policy_object(bed: NodeBed) -> dict:
    return bed.kubectl_json("get", gpupolicy.PLURAL, gpupolicy.NAME)


def test_helm_upgrade_from_the_previous_release_under_load(release: NodeBed, images: dict[str, str]):
    bed = release
    text, before = _policy_of_configmap(bed)
    assert yaml.safe_load(text) == POLICY, text
    expected = _expected(before)
    assert True in expected and False in expected, expected
    FIGURES["mix (pod: the policy admits it)"] = {d["metadata"]["name"]: a for (_, d), a in zip(MIX, expected,
                                                                                                 strict=True)}
    assert bed.kubectl("get", "crd", f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}").returncode != 0, \
        "the previous chart has no GPUPolicy CRD: a CRD left by another module"
    fail_open = _fail_open(bed)

    load = AdmissionLoad(bed.url, bed.tokens["admin"], bed.ca_file, rate=RATE, pods=_mix)
    with Timeline(bed) as timeline, load:
        time.sleep(3)
        started = time.monotonic()
        upgrade = bed.helm("upgrade", RELEASE, str(ROOT / "charts" / "gpu-webhook"), "--namespace", NAMESPACE,
                           "--reset-then-reuse-values", "--set", f"image.tag={images['current'].rsplit(':', 1)[1]}",
                           "--wait", "--timeout=240s", timeout=300)
        returned = time.monotonic()
        time.sleep(AFTER)
    report = load.stop()
    fail_open = _fail_open(bed) - fail_open
    FIGURES["the policies' apply Job"] = _apply_job(bed)

    seconds = _by_second(report, expected, started)
    verdicts = Counter(_verdict(r, expected) for r in report.results)
    wrong = [r for r in report.results if _verdict(r, expected) == "wrong"]
    failed = [r for r in report.results if _verdict(r, expected) == "failed"]
    FIGURES["helm upgrade --wait (s)"] = round(returned - started, 1)
    FIGURES["load"] = (f"{report.sent} sent at {RATE}/s from {started - report.started:.1f} s before the upgrade "
                       f"until {report.stopped - returned:.1f} s after helm returned: {dict(verdicts)}; "
                       f"latency p50 {report.latency_ms(0.5)} ms, p99 {report.latency_ms(0.99)} ms, "
                       f"max {report.latency_ms(1.0)} ms")
    FIGURES["webhook calls let through on failurePolicy Ignore (apiserver fail_open_count)"] = fail_open
    FIGURES["warned (privileged-warn admitted with a Warning)"] = sum(
        1 for r in report.results if r.ok and r.warnings)
    FIGURES["timeline (s since helm upgrade started)"] = [
        f"{t - started:+.1f} {what}: {value}" for t, what, value in timeline.events]
    print(json.dumps({k: v for k, v in FIGURES.items() if k != "timeline (s since helm upgrade started)"}, indent=1))
    print("timeline (s since helm upgrade started):")
    print("\n".join(FIGURES["timeline (s since helm upgrade started)"]))  # type: ignore[arg-type]
    print(f"by second since helm upgrade started (helm returned at +{returned - started:.1f} s):")
    print(_table(seconds))
    for label, results in (("WRONG (refused by the policy, admitted)", wrong), ("FAILED", failed)):
        for r in results[:30]:
            print(f"{label}: #{r.index} {MIX[r.index % len(MIX)][1]['metadata']['name']} at "
                  f"+{r.sent - started:.2f}s: {r.status} {r.error[:300]}")

    assert upgrade.returncode == 0, f"helm upgrade failed: {upgrade.stderr}"
    assert report.sent >= RATE * (returned - started + AFTER) * 0.8, f"the load fell behind: {report.summary()}"

    # The policy moved whole: GPUPolicy/default is the ConfigMap's policy, and it is the one in force.
    obj = _policy_object(bed)
    after = parse_policy(json.dumps({k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}),
                         "GPUPolicy/default")
    assert after.document == before.document, (obj["spec"], text)
    _, still = _policy_of_configmap(bed)
    assert still.document == before.document

    def accepted() -> dict | None:
        current = _policy_object(bed)
        status = current.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ok = (conditions.get("Accepted", {}).get("status") == "True"
              and (status.get("webhook") or {}).get("observedGeneration") == current["metadata"]["generation"])
        return current if ok else None

    waited = time.monotonic()
    try:
        until("GPUPolicy/default Accepted True for its generation", accepted, 60, interval=0.5,
              diagnose=lambda: json.dumps(_policy_object(bed).get("status"), indent=1))
    finally:
        FIGURES["the webhook pods' log on GPUPolicy/default"] = _status_log(bed)
        print("\n".join(FIGURES["the webhook pods' log on GPUPolicy/default"]))  # type: ignore[arg-type]
    FIGURES["GPUPolicy/default Accepted True, after the load ended (s)"] = round(time.monotonic() - waited, 1)

    # The upgrade went where it should: live native policies (params from GPUPolicy/default), this tree's image.
    deny = bed.kubectl_json("get", "validatingadmissionpolicy", "gpu-webhook-live-deny")
    assert (deny["spec"].get("paramKind") or {}).get("kind") == gpupolicy.KIND, deny["spec"].get("paramKind")
    assert {p["spec"]["containers"][0]["image"] for p in _pods(bed)} == {images["current"]}

    assert not wrong, f"{len(wrong)} pods the policy refuses were admitted: {_table(seconds)}"
    assert not failed, f"{len(failed)} admissions failed: {_table(seconds)}"
    assert fail_open == 0, f"{fail_open} webhook calls failed open (failurePolicy Ignore)"
