"""metrics.prometheusRule and metrics.dashboard as helm renders them.

- The PrometheusRule's groups are exactly tests/monitoring.py's render of monitoring/rules.yaml for the same values
  (so promtool, in tests/test_monitoring.py, tests what helm installs), and the object passes the Prometheus
  Operator's own schema for it (tests/schemas/prometheusrule-v1.yaml), with unknown fields refused as the apiserver
  would prune them.
- The dashboard ConfigMap carries the Grafana sidecar's label, is valid Kubernetes, and holds the dashboard file
  unchanged.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests import monitoring
from tests.chart import test_chart
from tests.chart.test_chart import CHART, IMAGE, KUBE_MINOR, KUBE_VERSION, NAMESPACE, RELEASE, Helm, one, values_args

helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "prometheusrule-v1.yaml"
FULLNAME = f"{RELEASE}-gpu-webhook"

RULE_VALUES: dict[str, dict[str, Any]] = {
    "defaults": {"metrics": {"prometheusRule": {"enabled": True}}},
    "everything-on": {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "labels": {"release": "kube-prometheus-stack"},
                "selector": 'job="gw", cluster="prod"',
                "runbookURL": "https://docs.example.org/troubleshooting/",
            }
        },
        "audit": {"enabled": True, "interval": "1h30m"},
        "admissionPolicies": {"enabled": True},
        "webhook": {"timeoutSeconds": 12},
    },
    "policy-object-off": {"metrics": {"prometheusRule": {"enabled": True}}, "policyObject": {"enabled": False}},
    "odd-interval": {"metrics": {"prometheusRule": {"enabled": True}}, "audit": {"enabled": True, "interval": "2.5m"}},
}


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's schema with unknown fields refused wherever it lists the fields (the apiserver would drop them)."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


def operator_validator() -> jsonschema.Draft7Validator:
    """A validator of the vendored schema, made strict. Not checked against JSON Schema's metaschema: the CRD's
    patterns are Go's RE2 (``^(?i)(abort|warn)?$``), which Python's re refuses; each is compiled only when a
    document has the field, and the chart's rules use none of those."""
    return jsonschema.Draft7Validator(strict(yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))))


def render(helm: Helm, values: dict[str, Any]) -> list[dict[str, Any]]:
    return helm.template(*values_args(values))


def with_defaults(values: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """values.yaml under ``values``, merged as helm merges them (maps key by key, anything else replaced)."""
    out = copy.deepcopy(monitoring.chart_values() if base is None else base)
    for key, value in values.items():
        out[key] = (
            with_defaults(value, out[key]) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


@pytest.mark.parametrize("name", list(RULE_VALUES))
def test_prometheus_rule_is_the_rendered_rule_file(helm: Helm, name: str) -> None:
    values = RULE_VALUES[name]
    rule = one(render(helm, values), "PrometheusRule")
    assert rule["metadata"]["name"] == FULLNAME and rule["metadata"]["namespace"] == NAMESPACE
    for key, value in values["metrics"]["prometheusRule"].get("labels", {}).items():
        assert rule["metadata"]["labels"][key] == value
    assert rule["spec"]["groups"] == monitoring.rule_groups(
        with_defaults(values), fullname=FULLNAME, namespace=NAMESPACE
    )


def test_audit_interval_reaches_the_overdue_alert(helm: Helm) -> None:
    """2.5m is 150 s: the alert fires 150 + 900 s after the last run; helm's arithmetic and Python's agree."""
    rule = one(render(helm, RULE_VALUES["odd-interval"]), "PrometheusRule")
    [audit] = [g for g in rule["spec"]["groups"] if g["name"] == "gpu-webhook.audit"]
    assert "> 1050" in audit["rules"][0]["expr"] and "[1050s]" in audit["rules"][0]["expr"]


@pytest.mark.parametrize("name", list(RULE_VALUES))
def test_prometheus_rule_passes_the_operators_schema(helm: Helm, name: str) -> None:
    rule = one(render(helm, RULE_VALUES[name]), "PrometheusRule")
    operator_validator().validate(rule)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"


def test_the_schema_check_refuses_a_misspelt_field(helm: Helm) -> None:
    validator = operator_validator()
    rule = one(render(helm, RULE_VALUES["defaults"]), "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["annotation"] = rule["spec"]["groups"][0]["rules"][0].pop("annotations")
    with pytest.raises(jsonschema.ValidationError, match="annotation"):
        validator.validate(rule)
    rule = one(render(helm, RULE_VALUES["defaults"]), "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(rule)


def test_nothing_renders_by_default(helm: Helm) -> None:
    docs = helm.template()
    assert not [d for d in docs if d["kind"] == "PrometheusRule"]
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]


def dashboard_configmap(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "ConfigMap", f"{FULLNAME}-dashboard")


def test_dashboard_configmap_for_the_grafana_sidecar(helm: Helm) -> None:
    config = dashboard_configmap(render(helm, {"metrics": {"dashboard": {"enabled": True}}}))
    assert config["metadata"]["namespace"] == NAMESPACE
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in config["metadata"]
    kubernetes_validate.validate(config, KUBE_MINOR, strict=True)
    assert json.loads(config["data"]["gpu-webhook.json"]) == monitoring.dashboard()


def test_dashboard_configmap_takes_its_labels_annotations_and_namespace(helm: Helm) -> None:
    values = {
        "metrics": {
            "dashboard": {
                "enabled": True,
                "labels": {"grafana_dashboard": "gpu"},
                "annotations": {"grafana_folder": "Admission"},
                "namespace": "monitoring",
            }
        }
    }
    config = dashboard_configmap(render(helm, values))
    assert config["metadata"]["namespace"] == "monitoring"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "gpu"
    assert config["metadata"]["annotations"] == {"grafana_folder": "Admission"}
    kubernetes_validate.validate(config, KUBE_MINOR, strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"metrics": {"prometheusRule": {"enabled": True, "severity": "page"}}}, "severity"),
        ({"metrics": {"dashboard": {"enabled": True, "namespace": "Not_A_Namespace"}}}, "namespace"),
        ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
    ],
)
def test_schema_refuses_wrong_monitoring_values(helm: Helm, values: dict[str, Any], message: str) -> None:
    error = helm.template_error(*values_args(values))
    assert "values don't meet the specifications of the schema" in error and message in error


def test_helm_lint_with_alerts_and_dashboard(helm: Helm) -> None:
    values = with_defaults({"metrics": {"dashboard": {"enabled": True}}}, RULE_VALUES["everything-on"])
    done = helm.run(
        "lint",
        str(CHART),
        "--strict",
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        *IMAGE,
        *values_args(values),
    )
    assert done.returncode == 0, done.stdout + done.stderr
