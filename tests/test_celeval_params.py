"""celeval's params (tests/celeval/main.go): a policy's paramKind, its binding's paramRef and the param objects among
the input's objects, collected as k8s.io/apiserver's dispatchers do (generic.CollectParams) and seen by CEL as
``params``, in validations and in mutations; the failure paths (no param with Deny, the param kind not synced or
not known) through the policy's failurePolicy with the apiserver's messages."""

from __future__ import annotations

from typing import Any

import pytest

from tests.celeval import Request, evaluate

NS = "team-a"
RULES = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["pods"]}]}
LIMITS = {"apiVersion": "example.com/v1", "kind": "Limits"}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap"}
DENY, ALLOW = "Deny", "Allow"
NOT_FOUND = "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"


def limits(name: str, most: int, namespace: str = NS, **labels: str) -> dict[str, Any]:
    return {**LIMITS, "metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": {"max": most}}


def pod(containers: int, namespace: str = NS) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": namespace, "labels": {"app": "x"}},
            "spec": {"containers": [{"name": f"c{i}", "image": "busybox"} for i in range(containers)]}}


def policy(kind: str, name: str, failure: str, param_kind: dict | None, **spec: Any) -> dict[str, Any]:
    spec = {"failurePolicy": failure, "matchConstraints": RULES, **spec}
    if param_kind:
        spec["paramKind"] = param_kind
    api = "v1beta1" if kind.startswith("Mutating") else "v1"
    return {"apiVersion": f"admissionregistration.k8s.io/{api}", "kind": kind, "metadata": {"name": name},
            "spec": spec}


def binding(kind: str, name: str, param_ref: dict | None, **spec: Any) -> dict[str, Any]:
    spec = {"policyName": name, **spec}
    if param_ref is not None:
        spec["paramRef"] = param_ref
    api = "v1beta1" if kind.startswith("Mutating") else "v1"
    return {"apiVersion": f"admissionregistration.k8s.io/{api}", "kind": f"{kind}Binding",
            "metadata": {"name": name}, "spec": spec}


def validating(param_ref: dict | None, failure: str = "Fail", param_kind: dict | None = LIMITS,
               expression: str = "params.spec.max >= size(object.spec.containers)") -> list[dict[str, Any]]:
    kind = "ValidatingAdmissionPolicy"
    return [policy(kind, "limits", failure, param_kind, validations=[{"expression": expression}]),
            binding(kind, "limits", param_ref, validationActions=["Deny"])]


def by_name(name: str, action: str = DENY, **more: str) -> dict[str, Any]:
    return {"name": name, "parameterNotFoundAction": action, **more}


def by_selector(action: str = DENY, **labels: str) -> dict[str, Any]:
    return {"selector": {"matchLabels": labels}, "parameterNotFoundAction": action}


REFUSED = "ValidatingAdmissionPolicy 'limits' with binding 'limits' denied request: "
TWO = [limits("small", 2, tier="gpu"), limits("large", 5, tier="gpu"), limits("other", 0, tier="cpu")]

# id: (policy and binding, params, containers, request namespace, request's paramsUnavailable)
#  -> (allowed, the refusal's message, [(evaluation, param)] of the decisions)
VALIDATING = {
    "name found, within": (validating(by_name("small")), TWO, 2, NS, False, (True, "", [("admit", "team-a/small")])),
    "name found, over": (validating(by_name("small")), TWO, 3, NS, False,
                         (False, REFUSED + "failed expression: params.spec.max >= size(object.spec.containers)",
                          [("deny", "team-a/small")])),
    "ref namespace": (validating(by_name("small", namespace="shared")), [limits("small", 1, "shared")], 2, NS, False,
                      (False, REFUSED + "failed expression: params.spec.max >= size(object.spec.containers)",
                       [("deny", "shared/small")])),
    "other namespace unseen": (validating(by_name("small", ALLOW)), [limits("small", 1, "shared")], 2, NS, False,
                               (True, "", [("skipped", None)])),
    "not found, Allow": (validating(by_name("none", ALLOW)), TWO, 3, NS, False, (True, "", [("skipped", None)])),
    "not found, Deny, Fail": (validating(by_name("none")), TWO, 1, NS, False,
                              (False, REFUSED + NOT_FOUND, [("error", None)])),
    "not found, Deny, Ignore": (validating(by_name("none"), "Ignore"), TWO, 1, NS, False,
                                (True, "", [("error", None)])),
    "selector, both evaluated": (validating(by_selector(tier="gpu")), TWO, 3, NS, False,
                                 (False, REFUSED + "failed expression: params.spec.max >= size(object.spec.containers)",
                                  [("admit", "team-a/large"), ("deny", "team-a/small")])),
    "selector, none, Deny": (validating(by_selector(tier="tpu")), TWO, 1, NS, False,
                             (False, REFUSED + NOT_FOUND, [("error", None)])),
    "cluster-scoped request": (validating(by_name("small")), TWO, 1, "", False,
                               (False, REFUSED + "failed to configure binding: cannot use namespaced paramRef in "
                                "policy binding that matches cluster-scoped resources", [("error", None)])),
    "not synced, Fail": (validating(by_name("small")), TWO, 1, NS, True,
                         (False, REFUSED + "failed to configure binding: paramKind kind "
                          "`&ParamKind{APIVersion:example.com/v1,Kind:Limits,}` not yet synced to use for admission",
                          [("error", None)])),
    "not synced, Ignore": (validating(by_name("small"), "Ignore"), TWO, 1, NS, True, (True, "", [("error", None)])),
    "kind unknown, Fail": (validating(by_name("small")), TWO, 1, NS, "unknown",
                           (False, "ValidatingAdmissionPolicy 'limits' denied request: failed to configure policy: "
                            "failed to find resource referenced by paramKind: 'example.com/v1, Kind=Limits'",
                            [("error", None)])),
    "no paramKind: paramRef ignored": (validating(by_name("none"), param_kind=None, expression="true"), [], 1, NS,
                                       False, (True, "", [("admit", None)])),
    "no paramRef: params null": (validating(None, expression="params == null"), TWO, 1, NS, False,
                                 (True, "", [("admit", None)])),
    "built-in kind, typed": (validating(by_name("caps"), param_kind=CONFIGMAP,
                                        expression="params.kind == 'ConfigMap' && params.data.max == '1'"),
                             [{**CONFIGMAP, "metadata": {"name": "caps", "namespace": NS}, "data": {"max": "1"}}],
                             1, NS, False, (True, "", [("admit", "team-a/caps")])),
}


@pytest.mark.parametrize("case", VALIDATING.values(), ids=VALIDATING.keys())
def test_validating_params(case):
    objects, params, containers, namespace, unavailable, (allowed, message, decisions) = case
    request = Request(pod(containers, namespace), namespace, params_unavailable=unavailable)
    done = evaluate(objects + params, [request])
    assert done.compile_errors == []
    answer = done.answers[0]
    assert (answer.allowed, answer.message) == (allowed, message)
    assert [(d["evaluation"], d.get("param")) for d in answer.decisions] == decisions


def team(name: str, value: str, **labels: str) -> dict[str, Any]:
    return {**CONFIGMAP, "metadata": {"name": name, "namespace": NS, "labels": labels}, "data": {"team": value}}


def mutating(param_ref: dict | None, failure: str = "Fail") -> list[dict[str, Any]]:
    kind = "MutatingAdmissionPolicy"
    patch = '[JSONPatch{op: "add", path: "/metadata/labels/" + params.metadata.name, value: params.data.team}]'
    return [policy(kind, "label", failure, CONFIGMAP, reinvocationPolicy="Never",
                   mutations=[{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}]),
            binding(kind, "label", param_ref)]


MAP_REFUSED = "policy 'label' with binding 'label' denied request: "
TEAMS = [team("a", "ml", use="yes"), team("b", "infra", use="yes"), team("c", "ops")]

# id: (policy and binding, params) -> (allowed, message, the pod's labels after the mutations, or None if unchanged)
MUTATING = {
    "name found": (mutating(by_name("a")), TEAMS, (True, "", {"app": "x", "a": "ml"})),
    "selector, each applied": (mutating(by_selector(use="yes")), TEAMS,
                               (True, "", {"app": "x", "a": "ml", "b": "infra"})),
    "not found, Allow": (mutating(by_name("z", ALLOW)), TEAMS, (True, "", None)),
    "not found, Deny, Fail": (mutating(by_name("z")), TEAMS, (False, MAP_REFUSED + NOT_FOUND, None)),
    "not found, Deny, Ignore": (mutating(by_name("z"), "Ignore"), TEAMS, (True, "", None)),
}


@pytest.mark.parametrize("case", MUTATING.values(), ids=MUTATING.keys())
def test_mutating_params(case):
    objects, params, (allowed, message, labels) = case
    done = evaluate(objects + params, [Request(pod(1), NS)])
    assert done.compile_errors == []
    answer = done.answers[0]
    assert (answer.allowed, answer.message) == (allowed, message)
    assert (answer.mutated or {}).get("metadata", {}).get("labels") == labels
