"""The rule table is the one definition of every rule: each id a check reports is in it, each row is
reported by some check, and the policy's settings, defaults and hints come from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from webhook.core import catalog
from webhook.core.policyfile import PolicyError, parse_policy
from webhook.core.policyschema import CHECK_SETTINGS, DEFAULTS

PACKAGE = Path(__file__).resolve().parent.parent / "webhook"


def _literals(node: ast.expr) -> list[str] | None:
    """The rule ids an argument can take: a string, or either branch of ``a if c else b``; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = _literals(node.body), _literals(node.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def reported_ids(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every rule id passed to ``Violation(path, rule, ...)`` in the package, with where."""
    found: dict[str, set[str]] = {}
    for source in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Violation"):
                continue
            argument = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "rule"), None)
            where = f"{source.relative_to(package.parent)}:{node.lineno}"
            ids = _literals(argument) if argument is not None else None
            assert ids is not None, f"{where}: a Violation's rule must be written as a literal id of the rule table"
            for rule_id in ids:
                found.setdefault(rule_id, set()).add(where)
    return found


def test_every_id_a_check_reports_is_in_the_table():
    unknown = {rule_id: sorted(where) for rule_id, where in reported_ids().items() if rule_id not in catalog.RULES}
    assert unknown == {}


def test_every_rule_in_the_table_is_reported_by_some_check():
    assert set(catalog.RULES) - set(reported_ids()) == set()


def test_the_scan_finds_a_misspelt_id_and_a_computed_one(tmp_path):
    """The checks above can fail: a typo in a check is an id the table lacks, and an id that is not a literal
    cannot be checked at all."""
    package = tmp_path / "webhook"
    package.mkdir()
    (package / "x.py").write_text('Violation(path, "privileged-gpus", "message")\n')
    assert set(reported_ids(package)) == {"privileged-gpus"} and "privileged-gpus" not in catalog.RULES
    (package / "x.py").write_text('Violation(path, "privileged-" + kind, "message")\n')
    with pytest.raises(AssertionError, match="x.py:1: a Violation's rule must be written as a literal"):
        reported_ids(package)


def test_the_policy_settings_and_defaults_are_the_tables():
    with_setting = [rule for rule in catalog.RULES.values() if rule.section]
    assert CHECK_SETTINGS == {rule.id: (rule.section, rule.key) for rule in with_setting}
    for rule in with_setting:
        assert DEFAULTS[rule.section][rule.key] == rule.default, rule.id
    settings = {key for section in catalog.SECTIONS for key in DEFAULTS[section]}
    lists = {"enabled", "gpuClasses", "allowedDeviceClasses", "adminAccessNamespaces"}
    assert settings - lists == {rule.key for rule in with_setting}


@pytest.mark.parametrize(
    ("document", "hint"),
    [
        ("checks: {allocationModeAll: warn}", "checks: unknown key(s) 'allocationModeAll' (a setting of dra.*: "
                                              "write it as dra.allocationModeAll)"),
        ("cluster: {privilegedGpu: off}", "'privilegedGpu' (a setting of checks.*: write it as checks.privilegedGpu)"),
        ("dra: {unknownDeviceClass: warn}", "(a setting of cluster.*: write it as cluster.unknownDeviceClass)"),
        ("namespaces: {team-a: {checks: {unknownAccelerator: off}}}",
         "namespaces.team-a.checks: unknown key(s) 'unknownAccelerator' (a setting of namespaces.team-a.cluster.*: "
         "write it as namespaces.team-a.cluster.unknownAccelerator)"),
        # dra.adminAccess is no namespace's to set: the hint does not send it to namespaces.team-a.dra
        ("namespaces: {team-a: {checks: {adminAccess: off}}}",
         "namespaces.team-a.checks: unknown key(s) 'adminAccess' (not per namespace: dra.adminAccess is set at the "
         "top level)"),
        # a near miss in the right section still gets the spelling hint
        ("checks: {privilegedGPU: off}", "'privilegedGPU' (did you mean 'privilegedGpu'?)"),
    ],
)
def test_a_setting_in_the_wrong_section_says_where_it_lives(document, hint):
    with pytest.raises(PolicyError) as caught:
        parse_policy(document)
    assert hint in str(caught.value)


def test_every_webhook_only_rule_says_why_and_native_rules_say_nothing():
    for rule in catalog.RULES.values():
        assert rule.engine in ("native", "webhook")
        assert bool(rule.why) == (rule.engine == "webhook"), rule.id


def test_the_cluster_rules_the_facts_carry_are_native_and_the_rest_stay_with_the_webhook():
    """CEL sees the object, its namespace and the params: the cluster's facts in GPUPolicy/default's status carry
    which models the nodes have, the most GPUs of each on one node, which RuntimeClasses exist and their node
    selectors, which DeviceClasses exist and the most devices of each class on one node; the rest need more than a
    summary holds."""
    assert {r.id for r in catalog.in_section("cluster") if r.engine == "native"} == {
        "unknown-accelerator", "unknown-runtime-class", "runtime-class-conflict", "exceeds-node-capacity",
        "unadvertised-resource", "unknown-device-class", "exceeds-device-capacity"}
