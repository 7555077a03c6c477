"""Properties of the decision functions over generated pods, objects and AdmissionReviews, in process:
no request makes a handler raise, mutation is idempotent and never gives validation something new to
refuse, and ``gpu-webhook check`` decides exactly as ``/validate`` does."""

from __future__ import annotations

import base64
import json
import os

import jsonpatch
from hypothesis import HealthCheck, example, given, settings

from tests.hardening.strategies import ANNOTATION, POLICIES, namespaces, objects, pods, policy_names, requests
from tests.manifests import admission_request, container
from tests.manifests import pod as make_pod
from webhook import admission, review
from webhook.check import check_objects
from webhook.mutate import mutated_pod, pod_patch

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
    name = obj["metadata"]["name"]
    prefix = f"f.yaml: {obj['kind']}/{name}: "
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
