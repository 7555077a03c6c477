"""The defaults docs/day-one.md states about the chart, held to what the chart renders: the webhooks' failure
policies in each mode, and for each setting the roles bound to the webhook's ServiceAccount, its token and the
NetworkPolicy's egress. Each row of the page's tables is rendered with the arguments it names and read back, so a
change of the chart that the page does not follow (or a row the chart does not render) fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from tests.chart import test_chart
from tests.chart.test_chart import FULLNAME, Helm

helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

PAGE = Path(__file__).resolve().parents[2] / "docs" / "day-one.md"


def table(heading: str, text: str | None = None) -> list[list[str]]:
    """The body rows of the first table under ``### heading``, as cells (code spans kept, outer ``|`` gone)."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    part = text.split(f"\n### {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def code(cell: str) -> str:
    spans = re.findall(r"`([^`]*)`", cell)
    return " ".join(spans)


def failure_policies(docs: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    found: dict[str, set[str]] = {"MutatingWebhookConfiguration": set(), "ValidatingWebhookConfiguration": set()}
    for doc in docs:
        if doc["kind"] in found:
            found[doc["kind"]] |= {hook["failurePolicy"] for hook in doc["webhooks"]}
    return found["MutatingWebhookConfiguration"], found["ValidatingWebhookConfiguration"]


def test_the_failure_policies_by_mode_are_what_the_chart_renders(helm: Helm) -> None:
    rows = table("Failure policies by mode")
    assert len(rows) == 3, rows
    for mode, render, mutating, validating in rows:
        docs = helm.template(*shlex.split(code(render)))
        assert failure_policies(docs) == ({mutating}, {validating}), mode


def grants(docs: list[dict[str, Any]]) -> list[str]:
    """The roles bound to the webhook's ServiceAccount, as the page writes them (``ClusterRole `name```)."""
    out = []
    for doc in docs:
        if doc["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if any(s.get("kind") == "ServiceAccount" and s.get("name") == FULLNAME for s in doc.get("subjects", [])):
            ref = doc["roleRef"]
            out.append(f"{ref['kind']} `{ref['name']}`")
    return sorted(out)


def token(docs: list[dict[str, Any]]) -> str:
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    volumes = deployment["spec"]["template"]["spec"].get("volumes", [])
    projected = [s for v in volumes for s in v.get("projected", {}).get("sources", []) if "serviceAccountToken" in s]
    return "yes" if projected else "no"


def egress(docs: list[dict[str, Any]]) -> str:
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rules = policy["spec"].get("egress", [])
    if not rules:
        return "none"
    ports = {p.get("port") for rule in rules for p in rule.get("ports", [])}
    peers = [peer for rule in rules for peer in rule.get("to", [])]
    assert 53 in ports and {"ipBlock": {"cidr": "10.0.0.10/32"}} in peers, rules
    return "the apiserver and DNS"


EGRESS = ["--set", "networkPolicy.enabled=true", "--set", "networkPolicy.egress.enabled=true",
          "--set-json", 'networkPolicy.egress.apiserver=[{"ipBlock":{"cidr":"10.0.0.10/32"}}]']


def test_what_each_setting_grants_is_what_the_chart_renders(helm: Helm) -> None:
    rows = table("What the chart grants and where the webhook connects")
    assert [row[0] for row in rows][0] == "the defaults" and len(rows) >= 4, rows
    for values, roles, has_token, connects in rows:
        args = shlex.split(code(values)) if values != "the defaults" else []
        docs = helm.template(*args, *EGRESS)
        stated = sorted(r.strip().replace("<fullname>", FULLNAME) for r in roles.split(",")) if roles != "none" \
            else []
        assert (grants(docs), token(docs), egress(docs)) == (stated, has_token, connects), values


def test_the_tables_are_read_as_a_reader_reads_them() -> None:
    """No helm needed: the rows parse into the arguments and values the tests above compare, and an edited cell
    changes what they expect (so a page edited out of step with the chart fails them)."""
    text = PAGE.read_text(encoding="utf-8")
    rows = table("Failure policies by mode", text)
    assert rows[0][1:] == ["`--kube-version 1.36.0`", "Fail", "Fail"]
    assert shlex.split(code(rows[1][1])) == ["--kube-version", "1.36.0", "--set", "admissionPolicies.enabled=true"]
    edited = table("Failure policies by mode", text.replace("| `--kube-version 1.36.0` | Fail | Fail |",
                                                            "| `--kube-version 1.36.0` | Ignore | Fail |", 1))
    assert edited[0][2:] == ["Ignore", "Fail"]
    granted = table("What the chart grants and where the webhook connects", text)
    assert granted[0][:1] == ["the defaults"] and code(granted[1][0]) == "--set policyObject.enabled=false"
