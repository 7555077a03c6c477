"""How the generated CEL is laid out for a reviewer (``webhook.native.celtext.layout``): long expressions on short
lines, cut only between tokens, so each evaluates as the builders wrote it; YAML literal blocks that read back as the
same objects. What the CEL says is ``tests/test_native.py``'s; that the laid-out text compiles and decides as before,
``tests/test_native_eval.py``'s."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from webhook.core.policy import PolicySet
from webhook.core.policyfile import load_policy, parse_policy
from webhook.native import generate as generator
from webhook.native.celtext import WIDTH, layout, one_line
from webhook.native.generate import CEL_FIELDS, generate, to_yaml
from webhook.native.target import DEFAULT, for_version

# Every line of a generated expression is at most MAX_LINE characters, but for a line that is a string literal too
# long for the room left: CEL cannot cut one, so it stands alone, after its indentation (at most MAX_INDENT) and with
# at most LITERAL_REST characters of brackets and operators. Measured on the default policy and NAMESPACED for every
# target: lines up to 120 (the layout aims at WIDTH, 100; what follows a closing bracket may run over), literals up
# to 614 characters (the registry's names as one regular expression), 8 characters besides, indentation up to 45.
MAX_LINE = 120
MAX_INDENT = 60
LITERAL_REST = 12

NAMESPACED = """\
accelerator: {allowed: [nvidia-l4, nvidia-a100], default: nvidia-l4}
limits: {perContainer: 4, perPod: 8}
tolerations: true
isolation: {hideGpus: void, runtimeClass: nvidia, trusted: {namespaces: [gpu-operator]}}
dra: {allowedDeviceClasses: [gpu.nvidia.com]}
nativePolicies:
  customKinds:
  - {group: example.com, resource: grids, templates: ['spec.rows[*].cells[*].template']}
namespaces:
  lab: {enforcement: warn}
  research: {limits: {perPod: 16}, checks: {privilegedGpu: "off"}}
"""
_LITERAL = re.compile(r"""[rRbB]{0,2}(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def cel(value: Any) -> list[str]:
    """Every CEL field of the objects, in order."""
    if isinstance(value, list):
        return [e for v in value for e in cel(v)]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in ([v] if k in CEL_FIELDS else cel(v))]
    return []


def both(policies: PolicySet, target: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict], list[dict]]:
    """(the objects as generated, the same with each expression as the builders wrote it)."""
    laid_out = generate(policies, target).objects
    with monkeypatch.context() as m:
        m.setattr(generator, "layout", lambda text: text)
        written = generate(policies, target).objects
    return laid_out, written


# The targets whose CEL differs most: 1.30 (no two-variable comprehension, no lists library, no claims, no mutation),
# 1.34 with MutatingAdmissionPolicy v1beta1 (claims, two-variable comprehensions), the newest.
TARGETS = [for_version("1.30"), for_version("1.34", ["admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"]),
           DEFAULT]
CASES = [("default", t) for t in TARGETS] + [("namespaced", t) for t in (TARGETS[0], DEFAULT)]


@pytest.fixture(scope="module")
def policies() -> dict[str, PolicySet]:
    return {"default": load_policy(None), "namespaced": parse_policy(NAMESPACED)}


@pytest.mark.parametrize(("name", "target"), CASES, ids=[f"{n}-{t.version}-{t.mutating}" for n, t in CASES])
def test_every_expression_is_the_builders_text_on_short_lines(name, target, policies, monkeypatch):
    laid_out, written = both(policies[name], target, monkeypatch)
    # The same objects but for the white space of their CEL: the same tokens in the same order.
    assert [one_line(e) for e in cel(laid_out)] == [one_line(e) for e in cel(written)]
    for expression in cel(laid_out):
        for line in expression.split("\n"):
            if len(line) <= MAX_LINE:
                continue
            literal = max(_LITERAL.findall(line), key=len, default="")
            indent = len(line) - len(line.lstrip())
            assert indent <= MAX_INDENT and len(line.strip()) - len(literal) <= LITERAL_REST, line


def test_the_yaml_reads_back_as_the_same_objects_and_every_long_expression_is_a_literal_block(policies):
    objects = generate(policies["namespaced"]).objects
    text = to_yaml(objects)
    assert list(yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))) == objects
    assert "&id" not in text and "*id" not in text
    multi_line = [e for e in cel(objects) if "\n" in e]
    assert multi_line and all(len(e) > WIDTH for e in multi_line)
    # Each one is written as a `|-` block, never as a quoted string with \n escapes.
    assert text.count("expression: |-\n") + text.count("messageExpression: |-\n") == len(multi_line)
    assert "\\n" not in "".join(line for line in text.splitlines() if "expression: \"" in line)


SAMPLES = [
    "a && b",
    "variables.templates.exists(t, t.uses && t.spec.containers.exists(c, c.name == 'a && b, c ? d : e'))",
    "x.?y.orValue({})[?'k'].orValue('') != '' ? {'a': dyn(x ? 1 : 2), 'b': dyn([1, 2, 3])} : null",
    "[r'^(?:a|b)$', \"it's \\\"quoted\\\", (with) [brackets]\"].exists(p, 'k'.matches(p)) || size(q) > 0u",
]


@pytest.mark.parametrize("expression", SAMPLES)
@pytest.mark.parametrize("width", [10, 30, 100])
def test_a_layout_changes_only_white_space_between_tokens_never_a_literal(expression, width, monkeypatch):
    monkeypatch.setattr("webhook.native.celtext.WIDTH", width)
    laid_out = layout(expression)
    assert one_line(laid_out) == one_line(expression)
    for literal in _LITERAL.findall(expression):
        assert literal in laid_out
    assert layout(laid_out) == laid_out
    if len(expression) <= width:
        assert laid_out == expression


def test_a_long_condition_is_cut_between_its_operands_and_a_call_after_its_variable(monkeypatch):
    monkeypatch.setattr("webhook.native.celtext.WIDTH", 40)
    assert layout("variables.pods.exists(p, p.uses && p.holds && p.trusted) || variables.update") == (
        "variables.pods.exists(p,\n"
        "  p.uses && p.holds && p.trusted)\n"
        "|| variables.update")
    assert layout("(request.namespace == 'research' ? false : true) && (a || b)") == (
        "(request.namespace == 'research'\n"
        " ? false\n"
        " : true)\n"
        "&& (a || b)")


def test_a_long_sum_reads_as_text_several_operands_to_a_line(monkeypatch):
    monkeypatch.setattr("webhook.native.celtext.WIDTH", 40)
    assert layout("'container ' + c.name + ' asks for ' + string(n) + ' ' + k + ', over the limit'") == (
        "'container ' + c.name + ' asks for '\n"
        "+ string(n) + ' ' + k\n"
        "+ ', over the limit'")
    # An operand that fits on no line is laid out on its own lines, the sum going on after it.
    assert layout("'a' + [1, 2].map(x, x * 100000000 + 200000000 + 300000000).join(',') + 'b' + 'c'") == (
        "'a'\n"
        "+ [1, 2].map(x,\n"
        "    x * 100000000 + 200000000\n"
        "    + 300000000).join(',')\n"
        "+ 'b' + 'c'")


# What a comprehension binds is named for what it holds (``pod``, ``container``, ``toleration``...): a reviewer reads
# the policies without a legend. Indices keep the usual i and j.
_BOUND = re.compile(r"\.(?:all|exists|exists_one|map|filter|transformList|transformMap|sortBy)\((\w+),(?: (\w+),)?")
INDICES = {"i", "j"}


@pytest.mark.parametrize("target", TARGETS, ids=[f"{t.version}-{t.mutating}" for t in TARGETS])
def test_every_bound_variable_of_the_generated_cel_is_named_for_what_it_holds(target, policies):
    names: set[str] = set()
    for name in ("default", "namespaced"):
        for expression in cel(generate(policies[name], target).objects):
            names.update(n for m in _BOUND.finditer(expression) for n in m.groups() if n)
    assert names and not {n for n in names if len(n) < 2 and n not in INDICES}, sorted(names)
    assert {"pod", "container", "name", "field"} <= names


@pytest.mark.parametrize("text", ["a + '''triple'''", "a # comment", "(a", "a)", "[a)"])
def test_what_it_cannot_read_is_refused_not_guessed(text):
    with pytest.raises(ValueError):
        layout(text + " && " + "x" * 120)
