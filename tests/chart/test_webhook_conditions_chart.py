"""The chart renders exactly the matchConditions tests/test_webhook_conditions.py holds to the rules: for each of its
policies and modes, ``helm template`` gives every webhook the texts ``webhook.native.webhooks`` and
``webhook.native.hybrid`` build. The chart's own GPU patterns, glob conversion and hideGpus lists are checked on
policies of their own (globs of every shape, hideGpus on and off by namespace, a platform's label and taints)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import test_webhook_conditions as conditions
from tests.chart import test_chart
from tests.chart.test_chart import Helm, values_args, webhooks
from webhook.core.policyfile import parse_policy
from webhook.native import webhooks as generated

helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

MAP_API = ("--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
# The helm flags of each mode of the property test (its targets: 1.36 with MutatingAdmissionPolicy v1, 1.35 without).
FLAGS = {
    "webhook-only": ("--kube-version", "1.36.0", *MAP_API),
    "hybrid": ("--kube-version", "1.36.0", *MAP_API),
    "hybrid-no-map": ("--kube-version", "1.35.0"),
    "hybrid-cluster": ("--kube-version", "1.36.0", *MAP_API),
    "webhook-only-cluster": ("--kube-version", "1.36.0", *MAP_API),
    "hybrid-cluster-inline": ("--kube-version", "1.36.0", *MAP_API),
    "hybrid-cluster-no-map": ("--kube-version", "1.35.0"),
}
HOOKS = {"validate": "validate.gpu-webhook.io", "mutate": "mutate.gpu-webhook.io", "dra": "validate-dra.gpu-webhook.io",
         "custom": "validate-custom.gpu-webhook.io"}
OTHER_POLICIES: dict[str, dict[str, Any]] = {
    "globs": {"resources": ["acme.io/gpu-?", "x.io/[!a]b*", "x.io/[a-c]", "x.io/[]x]", "v.io/a*b*", "x.io/[",
                            "q.io/it's", "n.io/a.b+c"],
              "platform": "aks", "checks": {"cpuPodOnGpuNodes": "off"}, "isolation": {"hideGpus": "void"},
              "namespaces": {"a": {"isolation": {"hideGpus": False}}, "b": {"isolation": {"hideGpus": "off"}}},
              "dra": {"gpuClasses": ["gpu.example.com"]}},
    "taints": {"platform": "gke", "gpuTaints": [{"key": "z.io/t"}, {"key": "a"}, {"key": "a", "value": "x"}],
               "checks": {"cpuPodOnGpuNodes": False}, "namespaces": {"b": {"checks": {"cpuPodOnGpuNodes": "warn"}},
                                                                      "c": {"isolation": {"hideGpus": "none"}}},
               "accelerator": {"nodeLabel": "example.com/gpu-model"}},
    "no-classes": {"dra": {"gpuClasses": []}, "isolation": {"hideGpus": "none"}},
}


def rendered(docs: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {name: [c["expression"] for c in hook.get("matchConditions", [])] for name, hook in webhooks(docs).items()}


@pytest.mark.parametrize("policy", list(conditions.POLICIES))
def test_the_chart_renders_the_conditions_the_property_test_holds_to_the_rules(helm: Helm, policy: str) -> None:
    document = conditions.POLICIES[policy]
    for mode in conditions.modes(document):
        values: dict[str, Any] = {"policy": document}
        if not mode.name.startswith("webhook-only"):
            values["admissionPolicies"] = {"enabled": True}
        if "-cluster" in mode.name:
            values["policy"] = {**document, "cluster": {"enabled": True}}
        if mode.name.endswith("-inline"):
            values["policy"]["nativePolicies"] = {"params": "inline"}
        got = rendered(helm.template(*FLAGS[mode.name], *values_args(values)))
        want = {HOOKS[hook]: list(texts or ()) for hook, texts in mode.conditions.items()}
        assert got == want, (policy, mode.name)


@pytest.mark.parametrize("policy", list(OTHER_POLICIES))
def test_the_chart_fills_in_the_policy_as_the_code_does(helm: Helm, policy: str) -> None:
    document = OTHER_POLICIES[policy]
    got = rendered(helm.template(*values_args({"policy": document})))
    want = generated.expressions(parse_policy(json.dumps(document)))
    assert got[HOOKS["validate"]] == [want["validate"]]
    assert got[HOOKS["mutate"]] == [want["mutate"]]
    assert got[HOOKS["dra"]] == [want["dra"]]
