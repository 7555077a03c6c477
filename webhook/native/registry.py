"""The one registry of native rules: each rule's builders of findings, what can make it fire, what its CEL needs.

A builder declares itself with :func:`native`, beside its code: ``@native("accelerator-conflict", fires=(ANNOTATED,))``
for its findings in pod templates, ``@native("admin-access", claims=True)`` for those in a claim's device requests.
A rule with both (``per-container-limit``) has one record holding both builders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from webhook.native.findings import Finding
from webhook.native.snippets import Ctx

Builder = Callable[[Ctx], list[Finding]]


@dataclass(frozen=True)
class Trigger:
    """A cheap test that is true whenever a rule could find a violation in a Pod or built-in template: on the
    template ``pod``, on a container ``container`` of list ``field``, or on a resource name ``name`` with a domain
    (value ``value``) of a container's limits or requests. Tests of one level are evaluated in one pass
    (``rules.matters``).

    A trigger with a ``key`` may be named by several rules and is written once, in the order of the keys; one without
    is its rule's own, written after them."""

    level: str  # "template", "container" or "name"
    test: str | Callable[[Ctx], str]  # the CEL, or how the policies write it
    key: str = ""

    def text(self, ctx: Ctx) -> str:
        return self.test if isinstance(self.test, str) else self.test(ctx)


# What the apiserver refuses on Pods and built-in templates before admission: no template there can make it fire.
NEVER = Trigger("never", "false", "never")


@dataclass(frozen=True)
class NativeRule:
    """A native rule: its findings in pod templates, in a claim's device requests, or both, and what the generator
    must know of it."""

    rule: str
    pods: Builder | None = None
    claims: Builder | None = None
    # What can make it fire on a Pod or built-in template (NEVER: the apiserver refuses it there first). A template
    # none of a policy's rules can fire on skips the policy.
    fires: tuple[Trigger, ...] = ()
    needs: tuple[str, ...] = ()  # CEL libraries beyond the 1.30 floor (target.LIBRARIES); else left to the webhook
    custom_only: bool = False  # the apiserver enforces it on Pods and built-in templates (validateResourceRequirements)
    # reads the cluster's facts (GPUPolicy/default's status.cluster): native only where the policies read it live
    reads_facts: bool = False


# Every native rule, in the order the builders declared themselves (``webhook.native.rules`` imports them all).
REGISTRY: dict[str, NativeRule] = {}


def native(rule: str, *, fires: tuple[Trigger, ...] = (), claims: bool = False, needs: tuple[str, ...] = (),
           custom_only: bool = False, reads_facts: bool = False) -> Callable[[Builder], Builder]:
    """Declare one of ``rule``'s builders, the catalog row's CEL half: on pod templates, with what can make it fire
    (required: a rule that named no trigger would be skipped on every pod it could fire on), or on claims."""
    if claims and (fires or custom_only):
        raise ValueError(f"{rule}: the claims policies have no matchConditions and no built-in templates")
    if not claims and not fires:
        raise ValueError(f"{rule}: say what can make it fire (fires)")

    def register(build: Builder) -> Builder:
        entry = REGISTRY.get(rule, NativeRule(rule))
        if (entry.claims if claims else entry.pods) is not None:
            raise ValueError(f"{rule}: two builders")
        needed = tuple(dict.fromkeys(entry.needs + needs))
        if claims:
            REGISTRY[rule] = replace(entry, claims=build, needs=needed, reads_facts=entry.reads_facts or reads_facts)
        else:
            REGISTRY[rule] = replace(entry, pods=build, fires=fires, needs=needed, custom_only=custom_only,
                                     reads_facts=entry.reads_facts or reads_facts)
        return build
    return register
