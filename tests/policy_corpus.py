"""Policies for the GPUPolicy CRD's tests: every valid policy we have (the defaults, each platform, the e2e and
native corpora's, the chart's custom one, the documentation's examples) and invalid ones the CRD refuses with the
field it names. Shared by tests/test_policycrd.py (the schema, in process) and tests/e2e/test_gpupolicy_crd.py
(the real apiserver)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from webhook.core.policyfile import PolicyError, parse_policy
from webhook.core.policyschema import DEFAULTS, PLATFORMS

ROOT = Path(__file__).resolve().parent.parent
_FENCED = re.compile(r"^```ya?ml\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def _loads(text: str) -> Any:
    from webhook.core.policyfile import _loader

    return yaml.load(text, Loader=_loader())


def _documented() -> dict[str, Any]:
    """The YAML examples of the docs that are whole, valid policies (manifests and fragments are not)."""
    found = {}
    for page in sorted((ROOT / "docs").glob("*.md")):
        for i, match in enumerate(_FENCED.finditer(page.read_text(encoding="utf-8"))):
            body = match["body"]
            try:
                document = _loads(body)
                parse_policy(body)
            except (yaml.YAMLError, PolicyError):
                continue
            if isinstance(document, dict) and document and "apiVersion" not in document:
                found[f"{page.stem}-{i}"] = document
    return found


def valid() -> dict[str, Any]:
    """name -> a valid policy document, as a policy file decodes (a bare off may be false)."""
    from tests.e2e.conftest import E2E_POLICY
    from tests.native_corpus import POLICY as NATIVE_POLICY

    policies: dict[str, Any] = {"empty": {}, "defaults": DEFAULTS}
    policies.update({f"platform-{name}": {"platform": name} for name in PLATFORMS})
    policies["e2e"] = _loads(E2E_POLICY)
    policies["native-corpus"] = _loads(NATIVE_POLICY)
    policies["bare-off"] = _loads("checks: {mixedGpuAndMig: off}\nisolation: {hideGpus: off}\n"
                                  "namespaces: {a: {checks: {zeroGpuLimit: off}, isolation: {hideGpus: off}}}\n")
    policies["namespace-accelerators"] = _loads(
        "accelerator: {allowed: [a, b], default: a}\n"
        "namespaces: {x: {accelerator: {default: b}}, y: {accelerator: {allowed: [c], default: c}}, z: {}}\n")
    policies["custom-kinds"] = _loads(
        "nativePolicies:\n  customKinds:\n"
        "  - {group: example.com, resource: trainers, templates: [spec.template]}\n"
        "  - {group: example.com, version: v1, resource: servers, kind: Server, resources: [spec.resources]}\n")
    policies.update(_documented())
    for name, document in policies.items():
        parse_policy(yaml.safe_dump(document), name)  # each one valid for the webhook
    return policies


# name -> (spec, the field the apiserver names, words of its message): each refused by the CRD.
INVALID: dict[str, tuple[dict[str, Any], str, str]] = {
    "typo": ({"checks": {"cpuPodOnGPUNodes": "warn"}}, "spec.checks.cpuPodOnGPUNodes", "unknown field"),
    "bad-enum": ({"enforcement": "block"}, "spec.enforcement", 'Unsupported value: "block"'),
    "bare-off-in-kubectl": ({"checks": {"mixedGpuAndMig": False}}, "spec.checks.mixedGpuAndMig",
                            "must be of type string"),
    "namespace-not-a-label": ({"namespaces": {"Research": {}}}, "spec.namespaces", "is not a namespace name"),
    "namespace-too-long": ({"namespaces": {"a" * 64: {}}}, "spec.namespaces", "is not a namespace name"),
    "too-many-items": ({"excludeNamespaces": [f"ns-{i}" for i in range(257)]}, "spec.excludeNamespaces",
                       "must have at most 256 items"),
    "too-many-namespaces": ({"namespaces": {f"ns-{i}": {} for i in range(1001)}}, "spec.namespaces",
                            "must have at most 1000 items"),
    "default-not-allowed": ({"accelerator": {"allowed": ["a"], "default": "b"}}, "spec.accelerator.default",
                            "'b' is not in the allowed list ['a']"),
    "namespace-default-not-allowed": ({"accelerator": {"allowed": ["a"]}, "namespaces": {"x": {"accelerator": {
        "default": "b"}}}}, "spec.namespaces", "accelerator.default is not in the allowed list"),
    "no-domain": ({"resources": ["nvidia.com/gpu", "gpu"]}, "spec.resources[1]",
                  "'gpu' has no domain (GPUs are extended resources such as nvidia.com/gpu)"),
    # gpu-webhook refuses it because it matches cpu; stored, the generated policies would read it while the webhook
    # kept its last good policy
    "domain-in-brackets": ({"resources": ["nvidia.com/gpu", "cp[u/]"]}, "spec.resources[1]",
                           "'cp[u/]' has its domain's '/' only inside [...]"),
    "custom-kind-without-templates": ({"nativePolicies": {"customKinds": [{"group": "a.io", "resource": "bs"}]}},
                                      "spec.nativePolicies.customKinds[0]", "give templates (pod templates)"),
    "pattern": ({"excludeNamespaces": ["Not_A_Name"]}, "spec.excludeNamespaces[0]", "should match"),
    "negative": ({"limits": {"perPod": -1}}, "spec.limits.perPod", "should be greater than or equal to 0"),
    "long-accelerator": ({"accelerator": {"default": "a" * 64}}, "spec.accelerator.default", "Too long"),
}
