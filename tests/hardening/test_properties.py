"""Properties of the decision functions over generated pods, objects and AdmissionReviews, in process:
no request makes a handler raise, mutation is idempotent and never gives validation something new to
refuse, and ``gpu-webhook check`` decides exactly as ``/validate`` does."""

from __future__ import annotations

import base64
import contextlib
import datetime
import io
import json
import os
import tempfile
from pathlib import Path

import jsonpatch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.hardening.strategies import ANNOTATION, POLICIES, namespaces, objects, pods, policy_names, requests
from tests.manifests import admission_request, container
from tests.manifests import pod as make_pod
from webhook.cli import check
from webhook.cli.check import check_objects
from webhook.core import review
from webhook.manifests import yamlstream
from webhook.rules import admission
from webhook.rules.mutate import mutated_pod, pod_patch

# Examples per property; GPU_WEBHOOK_FUZZ_EXAMPLES scales a longer run by hand.
EXAMPLES = int(os.environ.get("GPU_WEBHOOK_FUZZ_EXAMPLES", "400"))
GPU = "nvidia.com/gpu"


def bounded(examples: int = EXAMPLES):
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def found(obj: dict, policy_name: str, namespace: str) -> set[tuple[str, str]]:
    answer = admission.decide(obj, "", "Pod", namespace, POLICIES[policy_name])
    return {(str(v.path), v.rule) for v in answer.violations}


def test_no_request_makes_validate_or_mutate_raise_and_mutate_never_denies(figures):
    runs = {"examples": 0}

    @bounded()
    @given(requests, policy_names)
    def prop(request, policy_name):
        runs["examples"] += 1
        policies = POLICIES[policy_name]
        parsed = review.Review("admission.k8s.io/v1", request)
        verdict = admission.validate(request, policies)
        json.dumps(review.encode(parsed, verdict))
        assert verdict.code in (200, 403), verdict
        patched = admission.mutate(request, policies)
        assert patched.allowed, patched
        body = review.encode(parsed, patched)["response"]
        if "patch" in body:
            assert body["patchType"] == "JSONPatch"
            ops = json.loads(base64.b64decode(body["patch"]))
            assert request.get("operation") == "CREATE" and ops
            jsonpatch.apply_patch(request["object"], ops)

    try:
        prop()
    finally:
        figures.update(runs)


def test_mutation_is_idempotent_and_its_patch_yields_the_mutated_pod(figures):
    runs = {"examples": 0, "patched": 0}

    @bounded()
    @given(pods, policy_names, namespaces)
    def prop(pod, policy_name, namespace):
        runs["examples"] += 1
        policy = POLICIES[policy_name].for_namespace(namespace)
        ops = pod_patch(pod, policy)
        runs["patched"] += bool(ops)
        once = jsonpatch.apply_patch(pod, ops)
        assert once == mutated_pod(pod, policy)
        # The apiserver may call /mutate again on the patched pod (reinvocationPolicy: IfNeeded).
        assert pod_patch(once, policy) == []
        answer = admission.mutate(admission_request(once, namespace=namespace), POLICIES[policy_name])
        assert answer.patch == ()

    try:
        prop()
    finally:
        figures.update(runs)


def test_validation_after_mutation_never_finds_something_new(figures):
    """Mutation fills in what is absent; it must never create a violation (by path and rule) the pod did not have."""
    runs = {"examples": 0, "patched": 0}

    # Found by this property, kept so they are tried on every run:
    # an empty accelerator annotation is "none" to mutation (it injects the default) but a value to validation;
    @example(make_pod(container(limits={GPU: 1}), annotations={ANNOTATION: ""}), "namespaced", "default")
    # a GPU limit that is no whole number is copied into requests, and the GPU taint toleration and accelerator
    # selector it brings make validation call the pod one that uses no GPU.
    @example(make_pod(container(limits={GPU: "500m"})), "warn", "default")
    @bounded()
    @given(pods, policy_names, namespaces)
    def prop(pod, policy_name, namespace):
        runs["examples"] += 1
        policies = POLICIES[policy_name]
        mutated = mutated_pod(pod, policies.for_namespace(namespace))
        runs["patched"] += mutated != pod
        before, after = found(pod, policy_name, namespace), found(mutated, policy_name, namespace)
        assert after <= before, f"mutation introduced {sorted(after - before)}; mutated pod: {mutated}"
        if admission.validate(admission_request(pod, namespace=namespace), policies).allowed:
            assert admission.validate(admission_request(mutated, namespace=namespace), policies).allowed

    try:
        prop()
    finally:
        figures.update(runs)


def _check_says(obj: dict, policy_name: str, namespace: str) -> tuple[list[str], list[str]]:
    """(denials, warnings) as ``path: message`` strings, from the lines ``gpu-webhook check`` prints."""
    name, own = obj["metadata"]["name"], obj["metadata"].get("namespace")
    prefix = f"f.yaml: {obj['kind']} {own or namespace}/{name}: "
    denials, warnings = [], []
    for denied, line in check_objects([obj], "f.yaml", POLICIES[policy_name], namespace):
        assert line.startswith(prefix), line
        path, _, message = line[len(prefix):].partition(": ")
        if denied:
            denials.append(f"{path}: {message}")
        else:
            assert message.startswith("warning: "), line
            warnings.append(f"{path}: {message.removeprefix('warning: ')}")
    return denials, warnings


def agree(obj: dict, policy_name: str, namespace: str, response: dict) -> None:
    """``response`` (an AdmissionReview response from /validate) says what ``check`` says about ``obj``."""
    denials, warnings = _check_says(obj, policy_name, namespace)
    assert response["allowed"] is (not denials), (denials, response)
    assert response.get("warnings", []) == warnings
    if denials:
        message = response["status"]["message"]
        assert message.startswith(f"{len(denials)} GPU violation"), (message, denials)
        assert all(d in message for d in denials), (message, denials)


def test_check_and_validate_agree_on_every_object(figures):
    runs = {"examples": 0, "denied": 0, "warned": 0}

    @bounded(EXAMPLES * 3 // 4)
    @given(objects, policy_names, namespaces)
    def prop(obj, policy_name, namespace):
        runs["examples"] += 1
        request = admission_request(obj, namespace=namespace)
        response = review.encode(review.Review("admission.k8s.io/v1", request),
                                 admission.validate(request, POLICIES[policy_name]))["response"]
        runs["denied"] += not response["allowed"]
        runs["warned"] += bool(response.get("warnings"))
        agree(obj, policy_name, namespace, response)

    try:
        prop()
    finally:
        figures.update(runs)


# ---------------------------------------------------------------------------- YAML aliases in `check`

ALIAS_LEAVES = (
    "lol",
    "[lol, lol]",
    "{x: 1, y: [1, 2]}",
    "{name: c, resources: {requests: {nvidia.com/gpu: 1}}}",
    "{containers: [{name: c, resources: {limits: {nvidia.com/gpu: 0.5}}}]}",
)


@st.composite
def alias_documents(draw) -> tuple[str, set[str]]:
    """A manifest whose spec holds levels of anchors, each made of aliases to the levels below (alias bombs
    among them), as sequences, mappings, merge keys or, rarely, aliases to themselves; and the shapes used."""
    levels = draw(st.integers(1, 12))
    lines = [f"  l0: &l0 {draw(st.sampled_from(ALIAS_LEAVES))}"]
    shapes = set()
    for i in range(1, levels + 1):
        fan = draw(st.integers(1, 12))
        refs = [f"*l{draw(st.integers(max(0, i - 3), i - 1))}" for _ in range(fan)]
        shape = draw(st.sampled_from(["sequence", "mapping", "merge", "block"] * 5 + ["itself"]))
        shapes.add(shape)
        if shape == "sequence":
            body = "[" + ", ".join(refs) + "]"
        elif shape == "mapping":
            body = "{" + ", ".join(f"k{j}: {ref}" for j, ref in enumerate(refs)) + "}"
        elif shape == "merge":
            body = "{<<: [" + ", ".join(refs) + f"], own{i}: 1}}"
        elif shape == "block":
            body = "".join(f"\n    - {ref}" for ref in refs)
        else:
            body = f"[*l{i}, " + ", ".join(refs) + "]"
        lines.append(f"  l{i}: &l{i} {body}")
    kind, used = draw(st.sampled_from([("Pod", "containers"), ("TrainingJob", "template"), ("Deployment", "x")]))
    lines.append(f"  {used}: *l{levels}")
    head = f"apiVersion: example.com/v1\nkind: {kind}\nmetadata: {{name: bomb}}\nspec:\n"
    return head + "\n".join(lines) + "\n", shapes


def expanded_at_least(value: object, floor: int) -> bool:
    """Whether ``value``, with shared parts counted each time, has more than ``floor`` nodes (stops there)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > floor:
            return True
        if isinstance(item, dict):
            count += len(item)  # the keys
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def test_check_ends_quickly_and_cleanly_on_nested_aliases(figures):
    """Alias bombs are refused with one line, anything else is checked as plain YAML would have it, and the
    output stays bounded; every example within the deadline (the unbounded loader ran for minutes)."""
    runs = {"examples": 0, "refused": 0, "checked": 0}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.yaml"

        @settings(max_examples=EXAMPLES // 2, deadline=datetime.timedelta(seconds=2), database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(alias_documents())
        def prop(drawn):
            text, shapes = drawn
            runs["examples"] += 1
            path.write_text(text)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stderr(err):
                code = check.run([str(path)], POLICIES["defaults"], out=out)
            problems = err.getvalue().splitlines()[:-1]
            assert len(out.getvalue().splitlines()) <= yamlstream.ALIAS_NODE_FLOOR
            if code == 2:
                runs["refused"] += 1
                assert len(problems) == 1, problems
                assert problems[0].startswith(f"{path}: document 1: "), problems
                assert any(s in problems[0] for s in ("too many YAML aliases", "refers to itself", "merg")), problems
                if "too many YAML aliases" in problems[0] and not shapes & {"merge", "itself"}:
                    assert expanded_at_least(yaml.load(text, yamlstream._SafeLoader), yamlstream.ALIAS_NODE_FLOOR)
            else:
                runs["checked"] += 1
                assert code in (0, 1) and not problems
                assert yamlstream.load(text)[0].value == yaml.load(text, yamlstream._SafeLoader)

        try:
            prop()
        finally:
            figures.update(runs)
