"""Reading a policy: YAML with keys as written, every bad key named in one PolicyError, a GPUPolicy's spec unwrapped.

Loading and validation live here and nowhere else; the server, the CLI and the tests all
call :func:`load_policy` or :func:`parse_policy`. A policy is refused as a whole, in one
:class:`PolicyError` naming every bad key (the schema's problems and every check after it, in the order the schema
lists the keys), so a typo never half-applies and a second one never waits for the first to be fixed.

Mapping keys are read as written: YAML 1.1 would turn a namespace ``2024:`` into a number and
``on:`` into ``True``, which no namespace name ever equals.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# jsonschema, PyYAML and difflib are imported where they are used: a serving process builds its policy without
# them (webhook.serving.policies checks the schema in a child process), and what it imports stays in every worker.
from webhook.core import gpupolicy
from webhook.core.policy import PolicySet, resolve
from webhook.core.policyschema import SCHEMA

# Native resources: never GPUs, and a pattern matching one would make cpu and memory count as GPUs.
_CORE_RESOURCES = {
    "cpu": "cpu", "memory": "memory", "ephemeral-storage": "ephemeral-storage", "storage": "storage",
    "pods": "pods", "hugepages-2Mi": "hugepages-*", "hugepages-1Gi": "hugepages-*",
}
# A namespace name is a DNS-1123 label; a key that is not one can never match a namespace.
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)


@functools.cache
def _loader() -> type[Any]:
    """The YAML loader of policy files, made when the first file is read."""
    import yaml
    from yaml.constructor import ConstructorError

    class _Loader(yaml.SafeLoader):
        """YAML with every scalar mapping key kept as the text written, and duplicate keys refused.

        Keys a merge (``<<: *anchor``) brings in may be overridden, as YAML allows; keys written twice may not.
        """

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            written = {id(key_node) for key_node, _ in node.value}
            self.flatten_mapping(node)  # merge keys (<<) first, as SafeLoader does
            mapping: dict[Any, Any] = {}
            seen: set[Any] = set()
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else self.construct_object(key_node, deep)
                try:
                    duplicate = key in seen
                except TypeError:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark
                    ) from None
                if id(key_node) in written:
                    seen.add(key)
                if duplicate:
                    raise ConstructorError(
                        "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                mapping[key] = self.construct_object(value_node, deep)
            return mapping

    return _Loader


class PolicyError(ValueError):
    """A policy that cannot be used; ``problems`` names each bad key."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid policy: " + "; ".join(problems))


def _written(value: object) -> str:
    """A value as it reads in YAML: ``true`` rather than Python's ``True``."""
    if isinstance(value, bool) or value is None:
        import yaml

        return yaml.safe_dump(value).removesuffix("\n...\n")
    if isinstance(value, str) and value and value == value.strip():
        return value
    return repr(value)


KeyPath = tuple[object, ...]  # a key's place in the policy: ("namespaces", "team-a", "limits", "perPod")


def _keys_of(schema: Mapping[str, Any], prefix: KeyPath = ()) -> tuple[KeyPath, ...]:
    """Every key the schema's objects name, each as its path: through nested objects, not into lists or maps of
    free names (a namespace's settings are a scope of their own)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    return tuple(
        path for name, sub in properties.items() for path in (((*prefix, name),) + _keys_of(sub, (*prefix, name)))
    )


_OVERLAY = SCHEMA["properties"]["namespaces"]["additionalProperties"]
# The two scopes a key may be written in: the policy, and one namespace's overrides.
_TOP_KEYS = _keys_of(SCHEMA)
_OVERLAY_KEYS = _keys_of(_OVERLAY)


def _dotted(path: KeyPath) -> str:
    return ".".join(map(str, path))


def _unknown_key(key: object, at: KeyPath, known: list[str]) -> str:
    """An unknown key with where it lives when the schema has it elsewhere in the same scope (``'perContainer'
    (a setting of limits.*: write it as limits.perContainer)``), that it is no namespace's when only the top
    level has it, else the nearest spelling at this level or elsewhere (``'cpuPodOnGPUNodes' (did you mean
    'cpuPodOnGpuNodes'?)``)."""
    import difflib

    in_namespace = len(at) >= 2 and at[0] == "namespaces"
    scope: KeyPath = at[:2] if in_namespace else ()
    keys = _OVERLAY_KEYS if in_namespace else _TOP_KEYS
    here = at[len(scope):]
    elsewhere = [(*scope, *path) for path in keys if path[-1] == key and path[:-1] != here]
    if elsewhere:
        sections = " or ".join(f"{_dotted(p[:-1])}.*" if len(p) > 1 else "the top level" for p in elsewhere)
        return f"{key!r} (a setting of {sections}: write it as {' or '.join(map(_dotted, elsewhere))})"
    top_only = [path for path in _TOP_KEYS if path[-1] == key] if in_namespace else []
    if top_only:
        return f"{key!r} (not per namespace: {' or '.join(map(_dotted, top_only))} is set at the top level)"
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(str(key).lower(), list(by_lower), n=1)
    if close:
        return f"{key!r} (did you mean {by_lower[close[0]]!r}?)"
    by_lower_elsewhere = {str(path[-1]).lower(): path for path in reversed(keys)}  # the first of a name wins
    close = difflib.get_close_matches(str(key).lower(), list(by_lower_elsewhere), n=1)
    return f"{key!r} (did you mean {_dotted((*scope, *by_lower_elsewhere[close[0]]))}?)" if close else repr(key)


def _choices(options: list[object]) -> str:
    names = [o for o in options if isinstance(o, str)]  # False stands in for a bare off
    return ", ".join(names[:-1]) + f" or {names[-1]}"


def _schema_problems(document: object) -> list[tuple[KeyPath, str]]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = []
    for error in validator.iter_errors(document):
        at = tuple(error.absolute_path)
        where = _dotted(at) or "(top level)"
        if error.validator == "additionalProperties":
            known = sorted(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - set(known), key=str)
            problem = f"{where}: unknown key(s) {', '.join(_unknown_key(k, at, known) for k in unknown)}"
        elif error.validator == "anyOf":  # a custom kind's: the one anyOf of the schema
            problem = f"{where}: give templates (pod templates), or resources (resource blocks) with kind"
        elif error.validator == "enum":
            problem = f"{where}: {_written(error.instance)} is not a setting (use {_choices(error.validator_value)})"
        else:
            problem = f"{where}: {error.message}"
        problems.append((at, problem))
    return problems


def _key_problems(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """Namespace keys that can never match a namespace (read as a number or boolean, or no DNS label)."""
    namespaces = document.get("namespaces")
    problems: list[tuple[KeyPath, str]] = []
    for key in namespaces if isinstance(namespaces, Mapping) else ():
        if isinstance(key, bool):
            spelled = "'on'/'yes'/'true'" if key else "'off'/'no'/'false'"
            problem = f"namespaces: key {key} (YAML read {spelled} as a boolean): quote it"
        elif not isinstance(key, str):
            kind = "a number" if isinstance(key, (int, float)) else f"a {type(key).__name__}"
            problem = f"namespaces: key {key!r} is {kind}, not a name: quote it"
        elif not _NAMESPACE.fullmatch(key):
            problem = f"namespaces: {key!r} is not a namespace name (lowercase letters, digits and '-', at most 63)"
        else:
            continue
        problems.append((("namespaces", key), problem))
    return problems


def _resource_problems(patterns: object) -> list[tuple[KeyPath, str]]:
    """GPU resource patterns that would take native resources for GPUs, or could name no extended resource."""
    problems: list[tuple[KeyPath, str]] = []
    for i, pattern in enumerate(patterns if isinstance(patterns, list) else []):
        if not isinstance(pattern, str):
            continue  # the schema has said so
        core = sorted({label for name, label in _CORE_RESOURCES.items() if fnmatch.fnmatchcase(name, pattern)})
        if core:
            problem = f"resources[{i}]: {pattern!r} matches {', '.join(core)}, which are not GPUs"
            problems.append((("resources", i), problem))
        elif "/" not in pattern:
            problem = f"resources[{i}]: {pattern!r} has no domain (GPUs are extended resources such as nvidia.com/gpu)"
            problems.append((("resources", i), problem))
    return problems


def _accelerator_written(section: object) -> tuple[Mapping[str, Any], list[str] | None, str | None]:
    """An ``accelerator`` mapping as written, its allowed list and its default (the defaults where not written;
    None where the schema refuses the value)."""
    written = section if isinstance(section, Mapping) else {}
    allowed, default = written.get("allowed", []), written.get("default", "")
    usable = isinstance(allowed, list) and all(isinstance(a, str) for a in allowed)
    return written, allowed if usable else None, default if isinstance(default, str) else None


def _accelerator_problems(document: Mapping[str, Any]) -> list[tuple[KeyPath, str]]:
    """A default accelerator outside the allowed list, of the policy and of each namespace that writes either
    (one that writes neither has the policy's, named once).

    Read from the document as written, so it runs beside the schema's check; a value the schema refuses is
    not checked again (the schema names it)."""
    _, allowed, default = _accelerator_written(document.get("accelerator"))
    problems: list[tuple[KeyPath, str]] = []
    if allowed and default and default not in allowed:
        problem = f"accelerator.default: {default!r} is not in the allowed list {allowed}"
        problems.append((("accelerator", "default"), problem))
    namespaces = document.get("namespaces")
    for name, overlay in namespaces.items() if isinstance(namespaces, Mapping) else ():
        overlay_accelerator = overlay.get("accelerator") if isinstance(overlay, Mapping) else None
        written, own_allowed, own_default = _accelerator_written(overlay_accelerator)
        ns_allowed = own_allowed if "allowed" in written else allowed
        ns_default = own_default if "default" in written else default
        if not written or not ns_allowed or not ns_default or ns_default in ns_allowed:
            continue
        where = f"namespaces.{name}.accelerator"
        if "default" in written:
            inherited = "" if "allowed" in written else " (accelerator.allowed)"
            problem = f"{where}.default: {ns_default!r} is not in the allowed list {ns_allowed}{inherited}"
            problems.append((("namespaces", name, "accelerator", "default"), problem))
        else:
            problem = f"{where}.allowed: {ns_allowed} leaves out the default {ns_default!r} (accelerator.default)"
            problems.append((("namespaces", name, "accelerator", "allowed"), problem))
    return problems


def _place(path: KeyPath) -> tuple[tuple[int, int, str], ...]:
    """Where a problem at ``path`` goes in the list: keys in the order the schema (and the reference) lists
    them, then keys it does not know by name; namespace names by name; list items by index."""
    schema: Mapping[str, Any] = SCHEMA
    place = []
    for part in path:
        properties: Mapping[str, Any] = schema.get("properties", {})
        if isinstance(part, int) and not isinstance(part, bool) and "items" in schema:
            place.append((0, part, ""))
            schema = schema["items"]
        elif isinstance(part, str) and part in properties:
            place.append((0, list(properties).index(part), ""))
            schema = properties[part]
        else:
            place.append((1, 0, str(part)))
            extra = schema.get("additionalProperties")
            schema = extra if isinstance(extra, Mapping) else {}
    return tuple(place)


def problems_at(document: object, *, schema_checked: bool = False) -> list[tuple[KeyPath, str]]:
    """Every problem of a decoded policy document with the path of its key (an unknown key's: the mapping that
    holds it), in the order of their keys: the schema's (unless ``schema_checked``) and every check after it, on
    the policy and on each namespace."""
    problems = [] if schema_checked else _schema_problems(document)
    if isinstance(document, Mapping):
        problems += _key_problems(document)
        problems += _resource_problems(document.get("resources"))
        problems += _accelerator_problems(document)
    return sorted(problems, key=lambda found: _place(found[0]))


def _all_problems(document: object, *, schema_checked: bool = False) -> list[str]:
    """Every problem of a decoded policy document, each naming its key, in the order of their keys."""
    return [problem for _, problem in problems_at(document, schema_checked=schema_checked)]


def build_policy(document: object, source: str = "policy", *, schema_checked: bool = False,
                 within: str = "") -> PolicySet:
    """Validate a decoded policy document (``None`` means all defaults) and resolve it. ``schema_checked``: the
    JSON schema has passed it already, in another process (every other check runs all the same). ``within``:
    where the policy lives in what was read (``spec`` of a GPUPolicy), named before each bad key."""
    if document is None:
        document = {}
    problems = _all_problems(document, schema_checked=schema_checked)
    if problems:
        raise PolicyError(source, [named_within(problem, within) for problem in problems])
    assert isinstance(document, Mapping)
    return resolve(document)


def named_within(problem: str, prefix: str) -> str:
    """A problem naming its key under ``prefix``: ``limits.perPod: ...`` as ``spec.limits.perPod: ...``."""
    if not prefix:
        return problem
    top = "(top level): "
    return f"{prefix}: {problem[len(top):]}" if problem.startswith(top) else f"{prefix}.{problem}"


def _at(mark: Any, first_line: int) -> str:
    return f"line {mark.line + first_line + 1}, column {mark.column + 1}"


def yaml_error_line(exc: Exception, first_line: int = 0) -> str:
    """A YAML parser error as one line, ``(line N, column M)`` after each part instead of PyYAML's
    multi-line ``in "<unicode string>", line N, column M``; lines are counted after ``first_line``."""
    import yaml

    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    parts = []
    if exc.context:
        parts.append(exc.context + (f" ({_at(exc.context_mark, first_line)})" if exc.context_mark else ""))
    if exc.problem:
        parts.append(exc.problem + (f" ({_at(exc.problem_mark, first_line)})" if exc.problem_mark else ""))
    return " ".join(": ".join(parts).split())


def unwrap(document: object, source: str = "policy") -> tuple[object, str]:
    """A decoded document's policy and the prefix of its keys: a GPUPolicy's ``spec`` (keys named ``spec.*``,
    as the apiserver names them), else the document itself (no prefix). A document with ``apiVersion`` or
    ``kind`` (neither is a policy key) must be a whole GPUPolicy of this API version."""
    if not isinstance(document, Mapping) or ("apiVersion" not in document and "kind" not in document):
        return document, ""
    wanted = f"apiVersion {gpupolicy.API_VERSION} and kind {gpupolicy.KIND}"
    written = f"apiVersion {_written(document.get('apiVersion'))} and kind {_written(document.get('kind'))}"
    if document.get("apiVersion") != gpupolicy.API_VERSION or document.get("kind") != gpupolicy.KIND:
        raise PolicyError(source, [f"{written}: not a policy (a policy file, or a GPUPolicy with {wanted})"])
    if "spec" not in document:
        raise PolicyError(source, [f"a {gpupolicy.KIND} without spec: its spec is the policy (spec: {{}} for the "
                                   "defaults)"])
    return document["spec"], "spec"


def parse_policy(text: str, source: str = "policy", *, schema_checked: bool = False) -> PolicySet:
    """The policy in ``text``: a policy file, or a GPUPolicy (``gpu-webhook.io/v1alpha1``) whose spec is one;
    its problems name keys as written there (``spec.limits.perPod`` in a GPUPolicy)."""
    import yaml

    try:
        documents = [d for d in yaml.load_all(text, Loader=_loader()) if d is not None]  # keys as written
    except yaml.YAMLError as exc:
        raise PolicyError(source, [f"not valid YAML: {yaml_error_line(exc)}"]) from None
    if len(documents) > 1:
        raise PolicyError(source, [f"{len(documents)} YAML documents: give one policy (a policy file, or one "
                                   f"{gpupolicy.KIND})"])
    document, within = unwrap(documents[0] if documents else None, source)
    return build_policy(document, source, schema_checked=schema_checked, within=within)


def load_policy(path: str | Path | None) -> PolicySet:
    """The policy in ``path``, or the defaults when no file is given."""
    if path is None:
        return build_policy(None, "default policy")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(str(path), [f"cannot read: {exc}"]) from None
    return parse_policy(text, str(path))
