"""The chart's alerts and dashboard as the tests read them, without helm.

``rule_groups`` replaces the placeholders of charts/gpu-webhook/monitoring/rules.yaml the way
templates/prometheusrule.yaml does (tests/chart/test_monitoring_chart.py holds the two renders equal), so
promtool checks and unit-tests the alerts whenever it is built, helm or not. ``metric_names`` and the two name
sets let a test refuse a query that reads a metric nothing exports.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

from webhook.audit.loop import parse_duration
from webhook.telemetry import metrics

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-webhook"
RULES = CHART / "monitoring" / "rules.yaml"
DASHBOARD = CHART / "dashboards" / "gpu-webhook.json"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"

# The release the promtool unit tests (tests/promtool/alerts_test.yaml) assume: its series carry these labels.
FULLNAME = "gpu-webhook"
NAMESPACE = "gpu-system"

# Groups dropped while their feature is off, as the template drops them.
FEATURE_GROUPS = {"gpu-webhook.audit": ("audit", "enabled"), "gpu-webhook.native": ("admissionPolicies", "enabled"),
                  "gpu-webhook.policy": ("policyObject", "enabled")}

# The apiserver's metrics the alerts and the dashboard read, as k8s.io/apiserver v0.30.14 and v0.37.2 register them
# (pkg/admission/metrics/metrics.go; pkg/admission/plugin/policy/validating/metrics/metrics.go and, from 1.32,
# .../mutating/metrics/metrics.go). Both versions use the same names; the policy checks' labels differ: 1.30 has
# {policy, policy_binding, enforcement_action, state}, 1.31 and later {policy, policy_binding, error_type,
# enforcement_action} (the mutating ones no enforcement_action). Counters made with component-base keep their
# names as written (no _total is added): apiserver_admission_webhook_rejection_count is the exported name.
APISERVER_METRICS = frozenset(
    {
        "apiserver_admission_webhook_rejection_count",
        "apiserver_admission_webhook_fail_open_count",
        "apiserver_admission_webhook_request_total",
        *(f"apiserver_admission_webhook_admission_duration_seconds{s}" for s in ("_bucket", "_sum", "_count")),
        "apiserver_validating_admission_policy_check_total",
        *(f"apiserver_validating_admission_policy_check_duration_seconds{s}" for s in ("_bucket", "_sum", "_count")),
        "apiserver_mutating_admission_policy_check_total",
        *(f"apiserver_mutating_admission_policy_check_duration_seconds{s}" for s in ("_bucket", "_sum", "_count")),
    }
)
# Series every Prometheus makes itself for each target.
SCRAPE_METRICS = frozenset({"up"})

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def webhook_metrics() -> frozenset[str]:
    """The sample names the webhook exports: each metric of webhook.telemetry.metrics with its type's suffixes."""
    names: set[str] = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            [family] = value.describe()
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return frozenset(names)


def chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))


def duration_seconds(text: str) -> int:
    """Whole seconds, rounded up, as the chart's gpu-webhook.durationSeconds computes them."""
    return math.ceil(parse_duration(text))


def rules_text(values: dict[str, Any], fullname: str = FULLNAME, namespace: str = NAMESPACE) -> str:
    """rules.yaml with its placeholders replaced (every group kept)."""
    rule = values["metrics"]["prometheusRule"]
    selector = rule.get("selector") or f'job="{fullname}", namespace="{namespace}"'
    text = RULES.read_text(encoding="utf-8")
    if rule.get("runbookURL"):
        text = text.replace("__RUNBOOK__", rule["runbookURL"])
    else:
        text = re.sub(r"(?m)^[ ]*runbook_url: __RUNBOOK__.*\n", "", text)
    overdue = duration_seconds(values["audit"]["interval"]) + 900
    for placeholder, value in (
        ("__WEBHOOK__", selector),
        ("__TIMEOUT__", str(values["webhook"]["timeoutSeconds"])),
        ("__AUDIT_OVERDUE__", str(overdue)),
    ):
        text = text.replace(placeholder, value)
    return text


def rule_groups(
    values: dict[str, Any] | None = None,
    fullname: str = FULLNAME,
    namespace: str = NAMESPACE,
    every_group: bool = False,
) -> list[dict[str, Any]]:
    """The groups the chart renders for ``values`` (the chart's defaults when None); ``every_group`` keeps the
    groups of features that are off."""
    values = values or chart_values()
    groups = yaml.safe_load(rules_text(values, fullname, namespace))["groups"]
    if every_group:
        return groups
    return [g for g in groups if g["name"] not in FEATURE_GROUPS or _on(values, FEATURE_GROUPS[g["name"]])]


def _on(values: dict[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = values
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return bool(node)


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


# Grafana's variables, as a dashboard query holds them, and what stands for each when the query is parsed alone.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$namespace": ".+", "$job": ".+"}


def dashboard_queries(board: dict[str, Any] | None = None) -> dict[str, str]:
    """Each panel target's PromQL with Grafana's variables replaced, keyed by panel title and refId; the template
    variables' label_values() queries are Grafana's, not PromQL, and their inner selectors are returned instead."""
    board = board or dashboard()
    queries = {}
    for panel in board["panels"]:
        for target in panel["targets"]:
            queries[f"{panel['title']} / {target['refId']}"] = target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), *[a-z_]+\)", variable["definition"])
            assert match, f"variable {variable['name']}: not a label_values(selector, label) query"
            queries[f"variable {variable['name']}"] = match.group(1)
    for key, query in queries.items():
        for variable, stand_in in GRAFANA_VARIABLES.items():
            query = query.replace(variable, stand_in)
        queries[key] = query
    return queries


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_LISTS = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_BRACES = re.compile(r"\{[^}]*\}")
# PromQL's keywords, aggregations and functions that the queries here use (a name not in this set is a metric).
PROMQL_WORDS = frozenset(
    """
    sum min max avg count stddev stdvar topk bottomk quantile count_values group by without on ignoring group_left
    group_right and or unless offset bool rate irate increase delta idelta deriv histogram_quantile time timestamp
    vector scalar abs absent absent_over_time label_replace label_join max_over_time min_over_time avg_over_time
    sum_over_time count_over_time last_over_time changes resets clamp_min clamp_max ceil floor round sort sort_desc
    inf nan
    """.split()
)


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query reads: identifiers outside strings, label matchers, label lists and
    ranges that are not PromQL's own words or durations."""
    text = _STRING.sub('""', query)
    text = _RANGE.sub("", text)
    text = _BRACES.sub("", text)
    text = _LABEL_LISTS.sub(r"\1", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        before = text[match.start() - 1] if match.start() else " "
        if word.lower() in PROMQL_WORDS or before.isdigit() or before == ".":
            continue
        names.add(word)
    return names


# --- time-scaled rules (tests/e2e/test_node_alerts.py) ----------------------------------------------------------------
# A test on a real Prometheus cannot wait the alerts' production durations (a for: of 15 minutes, windows of an hour
# or a day). time_scaled divides every duration of the rules by one factor and leaves the rest of each expression as
# the chart wrote it.

_PROMQL_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PROMQL_DURATION = r"(?:[0-9]+(?:ms|s|m|h|d|w|y))+"


def promql_seconds(text: str) -> float:
    """A Prometheus duration (``5m``, ``1h30m``, ``915s``, ``1500ms``) in seconds."""
    if not re.fullmatch(_PROMQL_DURATION, text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _PROMQL_UNITS[unit] for n, unit in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", text))


def scaled_duration(text: str, factor: int) -> str:
    """The Prometheus duration ``text`` divided by ``factor``, in whole milliseconds (at least 1 ms)."""
    return f"{max(1, round(1000 * promql_seconds(text) / factor))}ms"


_RANGE_SELECTOR = re.compile(rf"\[({_PROMQL_DURATION})(:({_PROMQL_DURATION})?)?\]")
_OFFSET = re.compile(rf"\boffset\s+({_PROMQL_DURATION})")


def time_scaled(groups: list[dict[str, Any]], factor: int) -> list[dict[str, Any]]:
    """``groups`` with every ``for:``, range selector (``[5m]``; a subquery's ``[1h:1m]``) and ``offset`` divided by
    ``factor``. Nothing else changes: a number that stands for seconds in an expression (the audit's overdue
    threshold) is not a duration and keeps its value, and strings (label values) are never touched."""
    def scale_expr(expr: str) -> str:
        parts = _STRING.split(expr)
        strings = _STRING.findall(expr)

        def scale_range(m: re.Match[str]) -> str:
            step = "" if m.group(2) is None else ":" + (scaled_duration(m.group(3), factor) if m.group(3) else "")
            return f"[{scaled_duration(m.group(1), factor)}{step}]"

        scaled = [_OFFSET.sub(lambda m: f"offset {scaled_duration(m.group(1), factor)}",
                              _RANGE_SELECTOR.sub(scale_range, part)) for part in parts]
        return "".join(p + s for p, s in zip(scaled, [*strings, ""], strict=True))

    out = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            rule = dict(rule, expr=scale_expr(rule["expr"]))
            if "for" in rule:
                rule["for"] = scaled_duration(rule["for"], factor)
            rules.append(rule)
        out.append(dict(group, rules=rules))
    return out
