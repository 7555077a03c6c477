"""Which rules the native policies carry: exactly the rules ``webhook.core.catalog`` marks ``native``, each
with one builder of findings (for pod templates, for claims, or both), what its CEL needs beyond the oldest
target, and the reasons the others stay with the webhook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from webhook.core.catalog import RULES, Rule
from webhook.core.policy import CLUSTER_RULES, Policy
from webhook.native import claims, pods
from webhook.native.findings import Finding
from webhook.native.snippets import Ctx

FindingsBuilder = Callable[[Ctx], list[Finding]]


@dataclass(frozen=True)
class Builder:
    """The findings of one rule: its violations in pod templates, in a claim's device requests, or both."""

    rule: str
    pods: FindingsBuilder | None = None
    claims: FindingsBuilder | None = None
    custom_only: bool = False  # the apiserver enforces it on Pods and built-in templates itself
    needs: tuple[str, ...] = ()  # CEL libraries beyond the oldest target (webhook.native.target.LIBRARIES)


def _builders() -> dict[str, Builder]:
    ids = list(dict.fromkeys([*pods.BUILDERS, *claims.BUILDERS]))
    return {
        rule: Builder(rule, pods.BUILDERS.get(rule), claims.BUILDERS.get(rule), rule in pods.CUSTOM_ONLY,
                      pods.NEEDS.get(rule, ()))
        for rule in ids
    }


# One builder per rule id; tests/test_native.py holds its keys to the catalog's native rules.
BUILDERS: dict[str, Builder] = _builders()


def native_rules() -> list[Rule]:
    """The catalog's native rules, in its order."""
    return [rule for rule in RULES.values() if rule.engine == "native"]


def webhook_rules() -> list[Rule]:
    return [rule for rule in RULES.values() if rule.engine == "webhook"]


def setting(policy: Policy, rule: str) -> str:
    """deny, warn or off for ``rule`` in this namespace, before ``enforcement`` (which the bindings carry)."""
    value = policy.settings.get(rule, "deny")
    if value == "off" or (rule in CLUSTER_RULES and not policy.cluster_enabled):
        return "off"
    return value
