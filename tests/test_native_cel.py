"""The pieces of CEL text the native policies are built from, checked against the webhook's own definitions.

RE2 (the apiserver's regular expressions) and Python's ``re`` read the expressions the generator writes alike
(no look-around, no back-references), so each regular expression is run here with ``re`` and held to the
Python function it stands for: fnmatch for globs, the vendor registry's first match for names, the quantity
guard for strings.
"""

from __future__ import annotations

import fnmatch
import re

import pytest

from webhook.core import quantity
from webhook.core.policy import resolve
from webhook.core.resources import REGISTRY, Kind, lookup
from webhook.native import celtext, snippets
from webhook.native.celtext import glob_to_regex, globs_regex


def full(pattern: str, text: str) -> bool:
    return re.search(pattern, text) is not None


NAMES = ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/gpumem", "nvidia.com/mig-1g.5gb",
         "nvidia.com/mig-1g.5gb.shared", "nvidia.com/mig-2c.3g.20gb.me", "gpu.intel.com/i915", "gpu.intel.com/xe",
         "gpu.intel.com/monitoring", "gpu.intel.com/i915_monitoring", "gpu.intel.com/millicores", "amd.com/gpu",
         "amd.com/cpx_nps4", "example.com/gpu", "cpu", "memory", "a", "", "[x]", "x.y", "volcano.sh/vgpu-number",
         "volcano.sh/vgpu-memory", "management.nvidia.com/gpu", "nvidia.com/priority", "nvidia.com/gpucores",
         "deviceclass.resource.kubernetes.io/gpu.nvidia.com", "ns-1", "team-a", "kube-system", "abc", "a]b", "a-b"]
GLOBS = ["nvidia.com/gpu", "nvidia.com/*", "gpu.intel.com/*", "nvidia.com/mig-*", "*", "?", "a*b", "[ab]*", "[!a]*",
         "x.y", "*.com/gpu", "team-?", "[a-c]bc", "[]]", "a]b", "[", "kube-*", "*gpu*"]


@pytest.mark.parametrize("glob", GLOBS)
def test_a_glob_becomes_a_regular_expression_that_matches_what_fnmatch_matches(glob):
    pattern = "^(?:" + glob_to_regex(glob) + ")$"
    for name in NAMES:
        assert full(pattern, name) == fnmatch.fnmatchcase(name, glob), (glob, name)


def test_a_list_of_globs_matches_any_and_an_empty_list_matches_nothing():
    pattern = globs_regex(["nvidia.com/gpu", "amd.com/*"])
    assert full(pattern, "amd.com/gpu") and full(pattern, "nvidia.com/gpu")
    assert not full(pattern, "nvidia.com/gpu.shared") and not full(pattern, "xnvidia.com/gpu")
    assert not any(full(globs_regex([]), name) for name in NAMES)


def _first(name: str) -> Kind | None:
    entry = lookup(name)
    return entry.kind if entry else None


def test_the_registry_expressions_classify_every_name_as_the_registry_first_match_does():
    names = NAMES + [entry.example for entry in REGISTRY]
    for name in names:
        kind = _first(name)
        entry = lookup(name)
        assert full(snippets.REGISTERED, name) == (kind is not None), name
        assert full(snippets.COUNTING_REGISTERED, name) == (kind is not None and kind.counts), name
        assert full(snippets.PRIORITY, name) == (kind is Kind.PRIORITY), name
        assert full(snippets.SHARED, name) == (kind is Kind.SHARED), name
        assert full(snippets.MONITORING, name) == (kind is Kind.MONITORING), name
        assert full(snippets.SCHEDULER, name) == bool(entry and entry.scheduler and kind is not Kind.PRIORITY), name
        assert full(snippets.PERCENT, name) == bool(entry and entry.percent), name


@pytest.mark.parametrize("glob", GLOBS + ["gpu.intel.com/i915_*", "nvidia.com/gpumem*", "huawei.com/Ascend910*"])
def test_the_names_left_out_of_a_glob_are_the_registrys_that_count_nothing(glob):
    policies = resolve({"resources": [glob]})
    left_out = snippets.not_counting(snippets.Ctx(policies))
    names = NAMES + [entry.example for entry in REGISTRY]
    for name in filter(lambda n: fnmatch.fnmatchcase(n, glob), names):
        kind = _first(name)
        assert full(left_out, name) == (kind is not None and not kind.counts), (glob, name)


def test_the_default_gpu_names_leave_out_a_short_list():
    left_out = snippets.not_counting(snippets.Ctx(resolve({})))
    assert len(left_out) < 200 and "millicores" in left_out and "kunlunxin" not in left_out


SPELLINGS = ["1", "0", "+1", "-1", "1.", ".5", "0.5", "1000m", "1Ki", "1ki", "1E", "1e", "1e3", "1E3", "1e+3", "1e-3",
             "two", "", " 1", "1 ", "1_000", "NaN", "Inf", "0x10", "1.5.5", "1Mi", "5n", "1u", "--1", "+-1", "1e400",
             "١", "1e0000064", "1e065", "1e64", "1e-64", "1e-65"]


def test_the_quantity_grammar_is_the_webhooks():
    grammar = quantity._QUANTITY  # the guard webhook.core.quantity holds strings to
    for text in SPELLINGS:
        assert full(snippets.QUANTITY_GRAMMAR, text) == (grammar.fullmatch(text) is not None), text


PLACEHOLDERS = ["${GPUS}", "${GPUS:-1}", "${}", "$GPUS", "$_x1", "{{ .Values.gpus }}", "{{}}", "$1", "$", "${GPUS}x",
                "x${GPUS}", "$GPUS-1", "{{ a }", "{ a }}", "${a\n}", "{{a\n}}", "$$", "${a}}"]


def test_the_placeholder_pattern_is_the_webhooks():
    guard = quantity._PLACEHOLDER  # what webhook.core.quantity calls a placeholder never substituted
    for text in PLACEHOLDERS:
        assert full(snippets.PLACEHOLDER, text) == (guard.fullmatch(text) is not None), text


@pytest.mark.parametrize("exponent", [*range(0, 130), 999, 1000])
@pytest.mark.parametrize("sign", ["", "+", "-"])
def test_an_exponent_is_sensible_up_to_the_webhooks_bound_whatever_its_leading_zeros(exponent, sign):
    for zeros in ("", "0", "000"):
        text = f"1e{sign}{zeros}{exponent}"
        assert full(snippets.EXPONENT, text)
        assert full(snippets.SENSIBLE_EXPONENT, text) == (exponent <= quantity.MAX_EXPONENT), text


def test_literals_are_cel_strings_and_values_by_namespace_fall_back_to_the_global_one():
    assert celtext.lit("a b") == "'a b'"
    assert celtext.lit("it's") == '"it\'s"'
    assert celtext.lit('a "b"\n') == '"a \\"b\\"\\n"'
    from webhook.core.policyfile import parse_policy

    policies = parse_policy("limits: {perPod: 2}\nnamespaces: {a: {limits: {perPod: 4}}, b: {limits: {perPod: 4}}, "
                            "c: {limits: {perPod: 8}}, d: {enforcement: warn}}\n")
    text = celtext.by_namespace(policies, lambda p: str(p.per_pod))
    assert text == "(request.namespace in ['a', 'b'] ? 4 : (request.namespace == 'c' ? 8 : 2))"
    assert celtext.by_namespace(policies, lambda p: "x") == "x"


def test_a_regular_expression_is_a_raw_literal_argument_of_matches():
    assert celtext.matches("k", r"^a\.b$") == r"k.matches(r'^a\.b$')"
    assert celtext.matches("k", "it's") == 'k.matches("it\'s")'
