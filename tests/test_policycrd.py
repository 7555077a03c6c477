"""The GPUPolicy CRD (webhook.core.policycrd) and the GPUPolicy form of a policy file (core.policyfile.parse_policy).

The schema is checked here in process: structural (what the apiserver demands of a CRD's schema), bounded, and
accepting every valid policy we have. tests/e2e/test_gpupolicy_crd.py sends the same corpus to a real apiserver,
CEL rules included."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import pytest
import yaml

from tests.policy_corpus import INVALID, valid
from webhook.core import catalog, gpupolicy, policykeys
from webhook.core.policycrd import (
    MAX_ITEMS,
    MAX_NAMESPACES,
    NAMESPACE_OFF_KEYS,
    OFF_KEYS,
    as_spec,
    chart_helper,
    crd,
    spec_schema,
)
from webhook.core.policyfile import PolicyError, load_policy, parse_policy
from webhook.core.policyschema import SCHEMA

VALID = valid()
# What a structural schema may not hold (apiextensions' structural schema rules) or the policy's JSON schema says
# in a way the apiserver does not take.
FORBIDDEN = {"uniqueItems", "anyOf", "oneOf", "allOf", "not", "$schema", "title", "const"}


def nodes(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from nodes(node["additionalProperties"], f"{path}[*]")
    if "items" in node:
        yield from nodes(node["items"], f"{path}[]")


def test_the_crd_names_the_resource_of_core_gpupolicy():
    definition = crd()
    spec = definition["spec"]
    assert definition["metadata"]["name"] == "gpupolicies.gpu-webhook.io"
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        gpupolicy.GROUP, "Cluster", gpupolicy.KIND, gpupolicy.PLURAL)
    assert spec["names"]["shortNames"] == ["gpupol"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == (gpupolicy.VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {"Accepted": '.status.conditions[?(@.type=="Accepted")].status',
                       "Webhook": ".status.webhook.observedGeneration",
                       "Native": ".status.native.observedGeneration",
                       "Native-Policies": '.status.conditions[?(@.type=="NativePolicies")].reason',
                       "Age": ".metadata.creationTimestamp"}


def test_the_spec_schema_is_structural_and_bounded():
    for path, node in nodes(spec_schema()):
        assert not FORBIDDEN & set(node), path
        assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        assert node.get("additionalProperties", {}) is not False, path
        if node["type"] == "array":
            assert 0 < node["maxItems"] <= MAX_ITEMS, path
        if node["type"] == "object" and "additionalProperties" in node:
            assert node["maxProperties"] == MAX_NAMESPACES, path
        if node["type"] == "string":
            assert "enum" in node or 0 < node["maxLength"] <= 1024, path
            assert all(isinstance(value, str) for value in node.get("enum", ())), path


def test_every_key_of_the_policy_schema_is_in_the_crd():
    def keys(node: Mapping[str, Any], path: str = "") -> set[str]:
        return {p for p, _ in nodes(node, path)}

    assert keys(spec_schema()) == keys(SCHEMA)


def test_settings_are_string_enums_with_off():
    schema = spec_schema()
    assert schema["properties"]["checks"]["properties"]["mixedGpuAndMig"]["enum"] == ["deny", "warn", "off"]
    assert schema["properties"]["isolation"]["properties"]["hideGpus"]["enum"] == ["void", "none", "off"]
    assert schema["properties"]["enforcement"]["enum"] == ["deny", "warn"]
    assert "hideGpus" in OFF_KEYS["isolation"] and "zeroGpuLimit" in NAMESPACE_OFF_KEYS["checks"]
    assert "enabled" not in OFF_KEYS["cluster"]


@pytest.mark.parametrize("name", sorted(VALID))
def test_the_crd_schema_accepts_every_valid_policy(name):
    """The OpenAPI schema, read as JSON schema (the x-kubernetes-* keys are ignored; e2e runs the CEL)."""
    spec = as_spec(VALID[name])
    jsonschema.Draft4Validator(spec_schema()).validate(spec)
    as_object, as_file = parse_policy(yaml.safe_dump(spec)), parse_policy(yaml.safe_dump(VALID[name]))
    assert (as_object.default, as_object.by_namespace) == (as_file.default, as_file.by_namespace)  # the same rules


# Refused by CEL rules or by strict field validation (unknown keys), not by the schema's keywords.
BEYOND_KEYWORDS = {"typo", "namespace-not-a-label", "namespace-too-long", "default-not-allowed",
                   "namespace-default-not-allowed", "no-domain", "domain-in-brackets", "custom-kind-without-templates"}


@pytest.mark.parametrize("name", sorted(set(INVALID) - BEYOND_KEYWORDS))
def test_the_crd_schema_refuses_what_it_can_say_without_cel(name):
    spec, _, _ = INVALID[name]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(spec_schema()).validate(spec)


def test_as_spec_quotes_a_bare_off_of_settings_only():
    document = {"checks": {"mixedGpuAndMig": False}, "cluster": {"enabled": False, "unknownAccelerator": False},
                "isolation": {"hideGpus": False}, "tolerations": False,
                "namespaces": {"a": {"checks": {"zeroGpuLimit": False}, "tolerations": False}}}
    assert as_spec(document) == {
        "checks": {"mixedGpuAndMig": "off"}, "cluster": {"enabled": False, "unknownAccelerator": "off"},
        "isolation": {"hideGpus": "off"}, "tolerations": False,
        "namespaces": {"a": {"checks": {"zeroGpuLimit": "off"}, "tolerations": False}}}
    assert document["checks"]["mixedGpuAndMig"] is False  # a copy


def test_the_chart_helper_names_every_setting_that_may_be_off():
    helper = chart_helper()
    for section, keys in {**OFF_KEYS, **NAMESPACE_OFF_KEYS}.items():
        assert f'get $spec "{section}"' in helper and all(f'"{key}"' in helper for key in keys)


# --- a GPUPolicy read as a policy file ----------------------------------------------------------------------------

GPUPOLICY = """\
apiVersion: gpu-webhook.io/v1alpha1
kind: GPUPolicy
metadata: {name: default}
spec:
"""


def test_a_gpupolicy_document_is_read_as_its_spec():
    text = GPUPOLICY + "  limits: {perPod: 3}\n  checks: {mixedGpuAndMig: 'off'}\n"
    plain = "limits: {perPod: 3}\nchecks: {mixedGpuAndMig: 'off'}\n"
    assert parse_policy(text).document == parse_policy(plain).document
    assert parse_policy(GPUPOLICY).document == parse_policy("").document  # spec: (null) is the defaults


def test_a_gpupolicy_with_status_is_read_as_its_spec():
    text = GPUPOLICY + "  enforcement: warn\nstatus: {conditions: [], webhook: {observedGeneration: 1}}\n"
    assert parse_policy(text).default.enforcement == "warn"


@pytest.mark.parametrize(("text", "problem"), [
    (GPUPOLICY + "  limits: {perPod: -1}\n", "spec.limits.perPod: -1 is less than the minimum of 0"),
    (GPUPOLICY + "  checks: {cpuPodOnGPUNodes: warn}\n",
     "spec.checks: unknown key(s) 'cpuPodOnGPUNodes' (did you mean 'cpuPodOnGpuNodes'?)"),
    (GPUPOLICY + "  namespaces: {Research: {}}\n", "spec.namespaces: 'Research' is not a namespace name"),
    (GPUPOLICY + "  accelerator: {allowed: [a], default: b}\n",
     "spec.accelerator.default: 'b' is not in the allowed list ['a']"),
    (GPUPOLICY + "  - a list\n", "spec: ['a list'] is not of type 'object'"),
    ("apiVersion: gpu-webhook.io/v1beta1\nkind: GPUPolicy\nspec: {}\n",
     "apiVersion gpu-webhook.io/v1beta1 and kind GPUPolicy: not a policy (a policy file, or a GPUPolicy with "
     "apiVersion gpu-webhook.io/v1alpha1 and kind GPUPolicy)"),
    ("apiVersion: v1\nkind: ConfigMap\ndata: {}\n", "apiVersion v1 and kind ConfigMap: not a policy"),
    ("kind: GPUPolicy\nspec: {}\n", "apiVersion null and kind GPUPolicy: not a policy"),
    ("apiVersion: gpu-webhook.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: default}\n",
     "a GPUPolicy without spec: its spec is the policy (spec: {} for the defaults)"),
    (GPUPOLICY + "  limits: {perPod: 1}\n---\n" + GPUPOLICY, "2 YAML documents: give one policy"),
    ("limits: {perPod: 1}\n---\nlimits: {perPod: 2}\n", "2 YAML documents: give one policy"),
])
def test_a_bad_gpupolicy_is_one_clear_problem(text, problem):
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_a_policy_file_keeps_its_own_key_names_and_one_document_with_separators_loads():
    with pytest.raises(PolicyError) as caught:
        parse_policy("limits: {perPod: -1}\n")
    assert caught.value.problems == ["limits.perPod: -1 is less than the minimum of 0"]
    assert parse_policy("---\nlimits: {perPod: 2}\n---\n").default.per_pod == 2


def test_load_policy_reads_a_gpupolicy_file(tmp_path):
    path = tmp_path / "gpupolicy.yaml"
    path.write_text(GPUPOLICY + "  limits: {perContainer: 2}\n")
    assert load_policy(path).default.per_container == 2


# --- descriptions: what kubectl explain prints ----------------------------------------------------------------


def _properties(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every property under ``node``, at every depth: through lists' items and maps' values."""
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _properties(sub, f"{path}.{name}")
    if isinstance(node.get("items"), Mapping):
        yield from _properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _properties(node["additionalProperties"], f"{path}[*]")


def _spec_of_the_crd() -> Mapping[str, Any]:
    [version] = crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_every_property_under_spec_of_the_rendered_crd_has_a_description():
    """The CRD as `admission-policies --crd` writes it: YAML, read back."""
    written = yaml.safe_load(yaml.safe_dump(crd(), sort_keys=False))
    [version] = written["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found = list(_properties(spec))
    assert len(found) >= 120  # every key of the policy, a namespace's overrides included
    assert [path for path, node in found if not str(node.get("description", "")).strip()] == []
    assert spec["description"]


def test_a_key_added_to_the_schema_without_words_is_named():
    """What a new key of policyschema.SCHEMA meets until it has its words in policykeys.WHAT."""
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["isolation"]["properties"]["madeUpNamespaces"] = {"type": "array", "items": {"type": "string"}}
    schema["properties"]["gpuTaints"]["items"]["properties"]["operator"] = {"type": "string"}
    assert policykeys.undescribed(schema) == ["gpuTaints[].operator", "isolation.madeUpNamespaces"]
    assert policykeys.undescribed() == []
    described = spec_schema(schema)["properties"]["isolation"]["properties"]
    assert "description" not in described["madeUpNamespaces"] and described["trusted"]["description"]


def test_every_entry_of_the_words_names_a_key_of_the_schema():
    assert policykeys.unused() == []
    assert set(policykeys.WHAT) <= set(policykeys.key_paths())


def test_a_setting_names_its_rule_what_it_refuses_and_its_default():
    schema = _spec_of_the_crd()
    for section in catalog.SECTIONS:
        for rule in catalog.in_section(section):
            words = schema["properties"][section]["properties"][rule.key]["description"]
            assert f"`{rule.id}`" in words and rule.refuses in words, rule.id
            assert words.endswith(f"Default: {rule.default}."), rule.id
            in_namespace = schema["properties"]["namespaces"]["additionalProperties"]["properties"]
            if section != "dra":
                words = in_namespace[section]["properties"][rule.key]["description"]
                assert f"`{rule.id}`" in words and words.endswith("Default: the policy's."), rule.id


def test_every_key_with_a_default_says_it():
    schema = _spec_of_the_crd()
    limits = schema["properties"]["limits"]["properties"]
    assert "(rule `per-container-limit`)" in limits["perContainer"]["description"]
    assert limits["perContainer"]["description"].endswith("0: no cap. Default: 0.")
    assert schema["properties"]["isolation"]["properties"]["trusted"]["properties"]["namespaces"][
        "description"].endswith("Default: [].")
    for path in policykeys.key_paths():
        value = policykeys.default(path)
        if value is not None:
            assert policykeys.description(path).endswith(f"Default: {policykeys.shown(value)}."), path


# The whole CRD as JSON: what a client-side apply stores in the last-applied-configuration annotation (all of an
# object's annotations: at most 262144 bytes) and what a Helm release secret carries (about 1 MiB, with every
# other object of the chart). 43870 bytes when the descriptions came in; a quarter of the annotations' limit is
# the bound.
CRD_BYTES = 65536


def test_the_crd_fits_a_client_side_apply_with_room_to_spare():
    size = len(json.dumps(crd(annotations={"helm.sh/resource-policy": "keep"}), separators=(",", ":")))
    assert 40_000 < size <= CRD_BYTES
