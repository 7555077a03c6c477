"""The chart's alerts and Grafana dashboard (metrics.prometheusRule, metrics.dashboard), without helm.

In process: every alert has its runbook and its promtool unit tests, the placeholders are all replaced, and no
query (alert or dashboard panel) reads a metric that neither the webhook nor the apiserver exports. With promtool
(`tests/prepare prometheus`; these tests start it, so they are ``process``): the rendered rules pass
`promtool check rules`, the unit tests of tests/promtool/alerts_test.yaml pass (each alert fires on the series
that should raise it, after its `for`, and stays silent on healthy series), and every dashboard query parses.
tests/chart/test_monitoring_chart.py holds helm's render equal to the one here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import monitoring
from tests.tools import promtool

UNIT_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts_test.yaml"
KNOWN_METRICS = monitoring.webhook_metrics() | monitoring.APISERVER_METRICS | monitoring.SCRAPE_METRICS

EVERYTHING_ON: dict[str, Any] = {
    "audit": {"enabled": True, "interval": "1h30m"},
    "admissionPolicies": {"enabled": True},
    "webhook": {"timeoutSeconds": 12},
    "metrics": {
        "prometheusRule": {
            "enabled": True,
            "selector": 'job="gw", cluster="prod"',
            "runbookURL": "https://docs.example.org/troubleshooting/",
        }
    },
}


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def all_alerts() -> dict[str, dict[str, Any]]:
    return monitoring.alerts(monitoring.rule_groups(every_group=True))


# --- in process -------------------------------------------------------------------------------------------


def test_default_values_render_the_always_on_groups_only() -> None:
    names = [g["name"] for g in monitoring.rule_groups()]
    assert names == ["gpu-webhook.apiserver", "gpu-webhook.webhook", "gpu-webhook.policy"]
    on = [g["name"] for g in monitoring.rule_groups(merged(monitoring.chart_values(), EVERYTHING_ON))]
    assert on == ["gpu-webhook.apiserver", "gpu-webhook.webhook", "gpu-webhook.audit", "gpu-webhook.native",
                  "gpu-webhook.policy"]
    off = [g["name"] for g in monitoring.rule_groups(merged(monitoring.chart_values(),
                                                            {"policyObject": {"enabled": False}}))]
    assert off == ["gpu-webhook.apiserver", "gpu-webhook.webhook"]


def test_placeholders_are_replaced_from_the_values() -> None:
    default = yaml.safe_dump(monitoring.rule_groups(every_group=True))
    assert "__" not in default
    assert "runbook_url" not in default
    assert 'job="gpu-webhook", namespace="gpu-system"' in default
    alerts = all_alerts()
    assert alerts["GpuWebhookSlowAdmission"]["expr"].rstrip().endswith("> 0.8 * 5")
    assert "> 4500" in alerts["GpuWebhookAuditOverdue"]["expr"]  # 1h + 15 min

    custom = monitoring.rule_groups(merged(monitoring.chart_values(), EVERYTHING_ON))
    assert "__" not in yaml.safe_dump(custom)
    custom_alerts = monitoring.alerts(custom)
    assert (
        'gpu_webhook_requests_total{job="gw", cluster="prod", decision="error"}'
        in (custom_alerts["GpuWebhookInternalErrors"]["expr"])
    )
    assert custom_alerts["GpuWebhookSlowAdmission"]["expr"].rstrip().endswith("> 0.8 * 12")
    assert "> 6300" in custom_alerts["GpuWebhookAuditOverdue"]["expr"]  # 1h30m + 15 min
    for name, rule in custom_alerts.items():
        assert rule["annotations"]["runbook_url"] == f"https://docs.example.org/troubleshooting/#{name.lower()}"


@pytest.mark.parametrize(
    ("text", "seconds"), [("1h", 3600), ("30m", 1800), ("1h30m", 5400), ("1.5h", 5400), ("90s", 90), ("500ms", 1)]
)
def test_audit_interval_in_seconds(text: str, seconds: int) -> None:
    assert monitoring.duration_seconds(text) == seconds


def test_every_alert_has_a_runbook_section() -> None:
    """docs/troubleshooting.md has a heading named after each alert (the anchor runbook_url points to), which says
    what it means, what to look at and what to do; each alert's description names it."""
    page = monitoring.TROUBLESHOOTING.read_text(encoding="utf-8")
    sections = dict(re.findall(r"(?ms)^### (GpuWebhook\w+)\n(.*?)(?=^#{2,3} )", page + "\n## end"))
    for name, rule in all_alerts().items():
        assert name in sections, f"docs/troubleshooting.md has no section '### {name}'"
        for part in ("**What it means.**", "**Look at.**", "**Do.**"):
            assert part in sections[name], f"the runbook of {name} lacks {part}"
        assert f"Runbook: docs/troubleshooting.md, {name}." in rule["annotations"]["description"]
    assert set(sections) == set(all_alerts()), "a runbook section names no alert"


def unit_test_cases() -> list[dict[str, Any]]:
    return [
        case
        for test in yaml.safe_load(UNIT_TESTS.read_text(encoding="utf-8"))["tests"]
        for case in test["alert_rule_test"]
    ]


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    cases = unit_test_cases()
    for name in all_alerts():
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"no promtool test sees {name} fire"
        assert any(not c["exp_alerts"] for c in mine), f"no promtool test holds {name} silent"
    assert {c["alertname"] for c in cases} <= set(all_alerts())


def test_metric_names_finds_what_a_query_reads() -> None:
    query = (
        'sum by (le, name) (rate(made_up_total{job=~"a|b", x="rate(y)"}[5m] offset 1h)) / on (name) group_left '
        "max(other_metric) > 0.8 * 5 or vector(0) and absent_over_time(third:recorded[1h])"
    )
    assert monitoring.metric_names(query) == {"made_up_total", "other_metric", "third:recorded"}


def test_alerts_read_only_metrics_someone_exports() -> None:
    for name, rule in all_alerts().items():
        unknown = monitoring.metric_names(rule["expr"]) - KNOWN_METRICS
        assert not unknown, f"{name} reads {sorted(unknown)}, which nothing exports"


def test_dashboard_reads_only_metrics_someone_exports() -> None:
    queries = monitoring.dashboard_queries()
    assert len(queries) >= 10
    for where, query in queries.items():
        names = monitoring.metric_names(query)
        assert names, f"{where}: reads no metric"
        assert not names - KNOWN_METRICS, f"{where} reads {sorted(names - KNOWN_METRICS)}, which nothing exports"


def test_dashboard_shows_what_the_operators_need() -> None:
    board = monitoring.dashboard()
    queries = " ".join(monitoring.dashboard_queries(board).values())
    for needed in (
        "gpu_webhook_requests_total",  # decisions by verdict, webhook
        "apiserver_validating_admission_policy_check_total",  # decisions, native
        "apiserver_admission_webhook_admission_duration_seconds_bucket",  # latency as the apiserver sees it
        "gpu_webhook_violations_total",  # refusals by rule
        "gpu_webhook_informer_age_seconds",  # cluster view age
        "gpu_webhook_audit_violations",  # audit violations by namespace
        "gpu_webhook_policy_generation",  # the GPUPolicy generation each engine enforces
        "gpu_webhook_native_policy_generation",
    ):
        assert needed in queries
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"] and panel["targets"]


def test_time_scaled_divides_every_duration_and_nothing_else() -> None:
    groups = [{"name": "g", "rules": [
        {"alert": "A", "for": "15m", "expr": 'rate(x{a="5m", b=~"[1h]"}[5m]) > 0 and increase(y[1d] offset 1h) > 915'},
        {"alert": "B", "expr": "max_over_time(z[1h:1m]) > 0 and min_over_time(z[1h30m:]) > 0"}]}]
    (group,) = monitoring.time_scaled(groups, 60)
    assert group["rules"][0] == {
        "alert": "A", "for": "15000ms",
        "expr": 'rate(x{a="5m", b=~"[1h]"}[5000ms]) > 0 and increase(y[1440000ms] offset 60000ms) > 915'}
    assert group["rules"][1] == {"alert": "B", "expr": "max_over_time(z[60000ms:1000ms]) > 0 "
                                                     "and min_over_time(z[90000ms:]) > 0"}
    with pytest.raises(ValueError):
        monitoring.promql_seconds("5 minutes")


def test_time_scaled_leaves_no_unscaled_duration_in_the_charts_rules() -> None:
    """Every duration of every rule is rewritten (in ms): none of the chart's escapes the scaling."""
    scaled = monitoring.alerts(monitoring.time_scaled(monitoring.rule_groups(merged(monitoring.chart_values(),
                                                                                    EVERYTHING_ON)), 60))
    originals = all_alerts()
    for name, rule in scaled.items():
        text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', rule["expr"])
        assert not re.search(r"(\[|:|offset )[0-9]+(?!ms)[smhdwy]", text), (name, rule["expr"])
        if "for" in originals[name]:
            assert monitoring.promql_seconds(rule["for"]) * 60 == monitoring.promql_seconds(originals[name]["for"])


# --- promtool ---------------------------------------------------------------------------------------------


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def write_rules(directory: Path, groups: list[dict[str, Any]]) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000), encoding="utf-8")
    return path


@pytest.mark.process
@pytest.mark.parametrize("values", ["defaults", "everything-on"])
def test_promtool_checks_the_rendered_rules(tmp_path: Path, values: str) -> None:
    chart = monitoring.chart_values()
    groups = monitoring.rule_groups(chart if values == "defaults" else merged(chart, EVERYTHING_ON))
    write_rules(tmp_path, groups)
    done = run_promtool("check", "rules", "--lint=all", "--lint-fatal", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in groups)} rules found" in done.stdout


@pytest.mark.process
def test_promtool_checks_the_time_scaled_rules(tmp_path: Path) -> None:
    """The rules tests/e2e/test_node_alerts.py loads into a real Prometheus (durations divided by 60) still parse."""
    groups = monitoring.time_scaled(monitoring.rule_groups(merged(monitoring.chart_values(), EVERYTHING_ON)), 60)
    write_rules(tmp_path, groups)
    done = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.process
def test_promtool_unit_tests_of_every_alert_pass(tmp_path: Path) -> None:
    write_rules(tmp_path, monitoring.rule_groups(every_group=True))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = run_promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def recording_rules(queries: dict[str, str]) -> list[dict[str, Any]]:
    """The queries as recording rules, which `promtool check rules` parses with Prometheus' own parser."""
    rules = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries.values())]
    return [{"name": "dashboard", "rules": rules}]


@pytest.mark.process
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    queries = monitoring.dashboard_queries()
    write_rules(tmp_path, recording_rules(queries))
    done = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(queries)} rules found" in done.stdout


@pytest.mark.process
def test_promtool_refuses_a_query_that_does_not_parse(tmp_path: Path) -> None:
    """The check above would catch a broken panel: the same path refuses a query with an unclosed paren."""
    write_rules(tmp_path, recording_rules({"broken": "sum(rate(gpu_webhook_requests_total[5m])"}))
    done = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert done.returncode != 0
    assert "parse error" in done.stdout + done.stderr
