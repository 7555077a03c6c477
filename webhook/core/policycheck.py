"""A GPUPolicy object judged as the apiserver and the webhook judge it, each problem with the path of its field.

``gpu-webhook check`` reads GPUPolicy objects among the manifests it checks; what it says of one is what applying
it would meet:

- the apiserver: the API version the CRD serves, a name, and the CRD's schema (``webhook.core.policycrd``): the
  bounds of lists, strings and maps, and settings written as strings (a bare ``off`` is read as false, which the
  CRD refuses);
- the webhook's loader (``webhook.core.policyfile``), which GPUPolicy/default's spec meets when the webhook reads
  it: every key, type and value, and the checks after the schema (namespace names, resource patterns, the default
  accelerator in the allowed list), named ``spec.*``.

A problem both would name is named once, in the loader's words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core import gpupolicy
from webhook.core.policycrd import spec_schema
from webhook.core.policyfile import KeyPath, named_within, problems_at
from webhook.core.policyschema import SCHEMA


@dataclass(frozen=True)
class Problem:
    """One problem of a GPUPolicy object: ``at``, the path of the field in the object (an unknown key's own
    place), and the message naming it (``spec.limits.perContainer: -2 is less than the minimum of 0``)."""

    at: tuple[str, ...]
    message: str


def is_gpupolicy(obj: Mapping[str, Any]) -> bool:
    """Whether an object is a GPUPolicy of any version of the API group (``gpu-webhook.io/*``)."""
    api_version = obj.get("apiVersion")
    return (obj.get("kind") == gpupolicy.KIND and isinstance(api_version, str)
            and api_version.partition("/")[0] == gpupolicy.GROUP and "/" in api_version)


def name_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) and name else "(unnamed)"


def problems(obj: Mapping[str, Any]) -> list[Problem]:
    """Every problem of a GPUPolicy object (:func:`is_gpupolicy`): its version, its name, its spec. None: the
    apiserver would take it and the webhook would enforce its spec."""
    found: list[Problem] = []
    if obj.get("apiVersion") != gpupolicy.API_VERSION:
        found.append(Problem(("apiVersion",), f"apiVersion: {obj.get('apiVersion')}: the CRD serves "
                                              f"{gpupolicy.API_VERSION} only"))
        return found
    if name_of(obj) == "(unnamed)":
        found.append(Problem(("metadata",), f"metadata.name: missing (the one named {gpupolicy.NAME!r} is "
                                            "enforced)"))
    if "spec" not in obj:
        found.append(Problem((), "spec: missing: the spec is the policy (spec: {} for the defaults)"))
        return found
    spec = obj["spec"]
    if spec is None:  # `spec:` with nothing: kubectl drops a null field, and the loader reads it as the defaults
        return found
    loader = problems_at(spec)
    named = {tuple(map(str, path)) for path, _ in loader}
    found += [Problem(("spec", *_pointed(spec, path)), named_within(message, "spec")) for path, message in loader]
    found += [problem for problem in _crd_problems(spec) if problem.at[1:] not in named]
    return found


def _pointed(spec: object, path: KeyPath) -> tuple[str, ...]:
    """Where a problem at ``path`` is written: an unknown key's own place rather than the mapping that holds it."""
    at = tuple(map(str, path))
    value: Any = spec
    schema: Mapping[str, Any] = SCHEMA
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):  # a list's item
            value = value[part] if isinstance(value, list) and part < len(value) else None
            schema = schema.get("items", {})
            continue
        value = value.get(part) if isinstance(value, Mapping) else None
        extra = schema.get("additionalProperties")
        schema = schema.get("properties", {}).get(part) or (extra if isinstance(extra, Mapping) else {})
    if isinstance(value, Mapping) and schema.get("additionalProperties") is False:
        unknown = [key for key in value if key not in schema.get("properties", {})]
        if unknown:
            return (*at, str(unknown[0]))
    return at


def _crd_problems(spec: object) -> list[Problem]:
    """What the CRD's schema refuses in a spec (the CEL rules aside: the loader says the same)."""
    import jsonschema

    by_place: dict[tuple[str, ...], Any] = {}
    for error in jsonschema.Draft4Validator(spec_schema()).iter_errors(spec):
        at = tuple(map(str, error.absolute_path))
        # One problem a value: a setting's enum rather than its type (a bare off fails both).
        if at not in by_place or by_place[at].validator == "type":
            by_place[at] = error
    found = []
    for at, error in by_place.items():
        where = "spec" + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in at)
        found.append(Problem(("spec", *at), f"{where}: {_crd_words(error)}"))
    return found


def _crd_words(error: Any) -> str:
    """The CRD's refusal of one value, said plainly (jsonschema would print a whole list that is too long)."""
    value, bound = error.instance, error.validator_value
    if error.validator == "maxItems":
        return f"{len(value)} items, more than the {bound} the CRD allows"
    if error.validator == "maxLength":
        return f"{len(value)} characters, more than the {bound} the CRD allows"
    if error.validator == "maxProperties":
        return f"{len(value)} keys, more than the {bound} the CRD allows"
    if error.validator == "enum" and value is False:
        return "false is not a setting: write \"off\", quoted (a bare off is read as false, which the CRD refuses)"
    if error.validator == "enum":
        return f"{value!r} is not one of {', '.join(map(str, bound))}"
    return str(error.message)

