"""Edits of GPUPolicy/default alone reach the native engine (issue 34: both engines change together on every edit),
on the real apiservers of the matrix (the beds of tests/e2e/test_native_policies.py: 1.30, 1.34 with
MutatingAdmissionPolicy v1beta1, 1.36, 1.37), with no webhook registered.

The bed (tests/e2e/native_bed.py) holds the policies generated in live mode (``nativePolicies.params: live``, the
default) and GPUPolicy/default. Each test then replaces the object's spec by the corpus' policy with one change
(``kubectl apply --server-side`` of the object; the generated policies are never applied again):

(a) the allowed accelerators, (b) a cap (``limits.perContainer``), (c) a namespace override that loosens (the
namespace's caps above the global ones), (d) one that tightens (its caps and accelerators below), (e) a rule moved
from deny to warn (``checks.privilegedGpu: warn``), (f) a rule turned off (``checks.cdiAnnotation: off``).

After each edit the test waits until the apiserver answers, for every object of the corpus whose verdict the edit
changes, as ``webhook.rules.admission.decide`` does on the edited policy (the edit → enforcement time is printed),
then runs the whole corpus differential (tests/native_corpus.py ``compare``) on the edited policy: 0 differences.

Last, the edit → enforcement latency of the native engine: 24 merge patches of the allowed accelerators, alternately
adding and removing the one a probe Pod selects, each followed by server-side dry-run creates of the probe every
~20 ms until its verdict flips; p50 and p99 are printed beside the issue's 2 s goal, and p99 must be within 5 s.

Run time: the differential costs 20-28 s a time here (454 objects), so all six edits and the latency take about
5.5 min a bed on this shared 2-core machine (measured on 1.37, tests/e2e/README.md), and 1.30 answers each request
several times slower (its differential took 100-160 s). So the six edits run on the newest bed (``FULL``); the
oldest runs one edit (``ONE``: a namespace override that loosens, what the live mode adds), checked on the verdicts
it changes without the whole differential after it, and the latency test.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.cluster import ControlPlane
from tests.e2e.native_bed import (
    BEDS,
    NativeBed,
    action_of,
    ask_all,
    differential,
    family,
    foreign_sources,
    labelled_raw,
    native_bed,
    parsed,
    policies_named,
    seen,
    split_denials,
    wait_until_enforced,
    written,
)
from tests.native_corpus import BUILTIN, NS, POLICY, Case, as_pod, compare, corpus, gpu, spec
from webhook.core.podspecs import group_of
from webhook.core.policy import PolicySet
from webhook.native.rules import CUSTOM_ONLY
from webhook.rules import admission

# The oldest and the newest bed: the differential after an edit is the same CEL on the others
# (tests/e2e/test_native_policies.py runs the corpus on all four), and each bed costs its start and policies (CI time).
EDIT_BEDS = [bed for bed in BEDS if bed.id in ("1.30", "1.37")]
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.parametrize("matrix_cluster", EDIT_BEDS, ids=[b.id for b in EDIT_BEDS], indirect=True)]

BASE = written(POLICY)
PROBE_ACCELERATOR = "nvidia-h100"
LATENCY_EDITS = 24
POLL = 0.02
GOAL, BOUND = 2.0, 5.0
FULL = ("1.37",)
ONE = "namespace-loosens"


def _allowed(document: dict[str, Any]) -> None:
    document["accelerator"]["allowed"] = ["nvidia-tesla-k80", "nvidia-l4", PROBE_ACCELERATOR]


def _cap(document: dict[str, Any]) -> None:
    document["limits"]["perContainer"] = 2


def _loosen(document: dict[str, Any]) -> None:
    document["namespaces"][NS] = {"limits": {"perContainer": 8, "perPod": 10}}


def _tighten(document: dict[str, Any]) -> None:
    document["namespaces"][NS] = {"limits": {"perContainer": 2, "perPod": 3},
                                  "accelerator": {"allowed": ["nvidia-l4"], "default": "nvidia-l4"}}


def _warn(document: dict[str, Any]) -> None:
    document.setdefault("checks", {})["privilegedGpu"] = "warn"


def _off(document: dict[str, Any]) -> None:
    # Not gpuDeviceMount: off, it admits Pods whose hostPath holds '..', which the apiserver's own validation
    # refuses before admission (the corpus holds that the webhook refuses what the apiserver does).
    document.setdefault("checks", {})["cdiAnnotation"] = "off"


EDITS: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("allowed-accelerators", _allowed), ("cap", _cap), ("namespace-loosens", _loosen),
    ("namespace-tightens", _tighten), ("deny-to-warn", _warn), ("rule-off", _off)]


def edited(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    document = copy.deepcopy(BASE)
    change(document)
    return document


@dataclass
class Live:
    bed: NativeBed
    current: PolicySet  # what GPUPolicy/default holds now
    split: dict[str, list[str]] = field(default_factory=dict)  # by edit: denials missing another policy's words

    def wait_enforced(self) -> float:
        """The bed's policies act on what GPUPolicy/default holds now (conftest's restart after a crash)."""
        return wait_until_enforced(self.bed, policies=self.current)


@pytest.fixture(scope="module")
def live(matrix_cluster: ControlPlane) -> Iterator[Live]:
    for bed in native_bed(matrix_cluster, POLICY):
        yield Live(bed, bed.policies)


def expectation(policies: PolicySet, case: Case, native: set[str]) -> tuple[bool, tuple[str, ...], tuple[str, ...]]:
    """What the native engine must say of ``case``: admitted, and the native rules it denies and warns."""
    verdict = admission.decide(case.obj, group_of(case.obj["apiVersion"]), case.kind, case.namespace, policies)
    carried = [(v.rule, a) for v, a in zip(verdict.violations, verdict.actions, strict=True)
               if v.rule in native and not (case.kind in BUILTIN and v.rule in CUSTOM_ONLY)]
    denied = tuple(sorted(r for r, a in carried if a == "deny"))
    return not denied, denied, tuple(sorted(r for r, a in carried if a == "warn"))


def until_enforced(live: Live, new: PolicySet, timeout: float = 60) -> tuple[float, int]:
    """Wait until the apiserver answers as ``new`` says for every case of the corpus whose expectation differs
    from the current policy's; the seconds it took from now and the number of such cases."""
    bed = live.bed
    native = set(bed.generated.native)
    claims = bed.target.minor >= 34
    changed = [c for c in corpus() if (claims or family(c.kind) != "claims")
               and expectation(live.current, c, native) != expectation(new, c, native)]
    assert changed, "the edit changes no verdict of the corpus"
    start = time.monotonic()
    while True:
        answers = ask_all(bed.api, changed)
        found = compare(new, bed.generated, changed, [seen(c, a) for c, a in zip(changed, answers, strict=True)])
        split_denials(bed, new, changed, answers, found)
        if not found:
            return time.monotonic() - start, len(changed)
        assert time.monotonic() - start < timeout, \
            f"{bed.target.describe()}: the edit was not enforced within {timeout} s:\n{found.details(10)}"
        time.sleep(0.1)


@pytest.mark.parametrize("edit", EDITS, ids=[name for name, _ in EDITS])
def test_an_edit_of_the_policy_object_alone_reaches_the_native_engine(live, edit):
    name, change = edit
    bed = live.bed
    assert bed.cluster.bed is not None
    if bed.cluster.bed.id not in FULL and name != ONE:
        pytest.skip(f"the six edits run on {', '.join(FULL)}; {bed.cluster.bed.id} runs {ONE} (run time)")
    document = edited(change)
    new = parsed(document)
    before = {o["metadata"]["name"]: o["metadata"].get("resourceVersion") for o in bed.generated.objects}
    started = time.monotonic()
    bed.edit(document)
    applied = time.monotonic() - started
    took, changed = until_enforced(live, new)
    live.current = new
    if bed.cluster.bed.id not in FULL:
        # The verdicts the edit changes are enforced (until_enforced); the whole corpus on this bed's live policies
        # is tests/e2e/test_native_policies.py's, and here would cost 100-160 s more on 1.30.
        print(f"{bed.target.describe()}: {name}: kubectl apply {applied:.2f} s, {changed} verdicts changed, "
              f"enforced {took:.2f} s after it")
        return
    result = differential(bed, new, f" after {name}", excuse_split=True)
    live.split[name] = result.split
    print(f"{bed.target.describe()}: {name}: kubectl apply {applied:.2f} s, {changed} verdicts changed, enforced "
          f"{took:.2f} s after it; {result.summary}")
    assert not result.found, result.summary + "\n" + result.found.details()
    assert len(result.cases) - result.found.skipped >= 200, result.summary
    assert result.found.admitted >= 100 and result.found.refused >= 100, result.summary
    sources = foreign_sources(result)
    assert not sources, "refused or warned by another family's policy:\n" + "\n".join(sources)
    assert before == {o["metadata"]["name"]: o["metadata"].get("resourceVersion") for o in bed.generated.objects}


def test_every_denial_lists_every_violation_as_the_webhook_does(live):
    """After the edits above: each refusal names every violation the webhook names. The apiserver answers with the
    first denying policy's message alone, so this holds where one deny policy holds every rule an object breaks:
    Pods and built-in workloads have one; the custom kinds' rules are cut in two (tests/test_native_eval.py holds
    an object that two of them refuse, as a strict xfail). Counted apart by the edit tests."""
    assert live.bed.cluster.bed is not None
    if live.bed.cluster.bed.id not in FULL:
        pytest.skip(f"the six edits run on {', '.join(FULL)}")
    assert len(live.split) == len(EDITS), "run with the edit tests"
    split = [f"{edit}: {line}" for edit, lines in live.split.items() for line in lines]
    print(f"{live.bed.target.describe()}: {len(split)} denials list only the first denying policy's violations "
          f"({', '.join(f'{edit} {len(lines)}' for edit, lines in live.split.items())})")
    assert not split, "\n".join(split[:20])


def test_edit_to_enforcement_latency_of_the_native_engine(live):
    bed = live.bed
    probe = labelled_raw(as_pod("latency", spec(gpu(1), nodeSelector={"accelerator": PROBE_ACCELERATOR}), {}))
    base = BASE["accelerator"]["allowed"]
    # From the corpus' policy (the allowed list without the probe's accelerator): refused.
    bed.edit(BASE)
    until_enforced(live, parsed(BASE))
    live.current = parsed(BASE)
    deadline = time.monotonic() + 60
    while (first := bed.api.create(probe, NS)).admitted:
        assert time.monotonic() < deadline, "the probe was never refused"
        time.sleep(POLL)
    assert any(action_of(n) == "deny" for n in policies_named(first.message)), first.message
    times, polls = [], 0
    for i in range(LATENCY_EDITS):
        admit = i % 2 == 0
        allowed = [*base, PROBE_ACCELERATOR] if admit else base
        started = time.monotonic()
        patched = bed.api.patch_policy({"spec": {"accelerator": {"allowed": allowed}}})
        assert patched.admitted, patched.message
        while True:
            polled = time.monotonic()
            polls += 1
            answer = bed.api.create(probe, NS)
            if answer.admitted == admit:
                times.append(time.monotonic() - started)
                break
            assert polled - started < 30, f"edit {i} ({'add' if admit else 'remove'}) not enforced within 30 s"
            time.sleep(max(0.0, POLL - (time.monotonic() - polled)))
        if not admit:
            assert PROBE_ACCELERATOR in answer.message, answer.message
    document = copy.deepcopy(BASE)
    document["accelerator"]["allowed"] = base
    live.current = parsed(document)
    ordered = sorted(times)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"{bed.target.describe()}: edit -> enforcement over {len(times)} edits ({polls} dry-run creates): "
          f"p50 {p50:.3f} s, p99 {p99:.3f} s, max {ordered[-1]:.3f} s, min {ordered[0]:.3f} s; goal {GOAL:.0f} s: "
          f"{'met' if p99 <= GOAL else 'missed'} (p99 {'<=' if p99 <= GOAL else '>'} {GOAL:.0f} s)")
    assert len(times) >= 20
    assert p99 <= BOUND, f"p99 {p99:.3f} s over {BOUND} s: {[round(t, 3) for t in times]}"
