"""The cluster the policies are generated for: its Kubernetes minor version and the admission APIs it serves.

Which engine carries which half is decided here, once, from data, the way Kyverno and Gatekeeper decide by
discovery (``gpu-webhook admission-policies --apply``), by helm's flags offline (``--kube-version``,
``--api-versions``) or by the chart's ``.Capabilities``:

- validation is native where ``admissionregistration.k8s.io/v1`` ValidatingAdmissionPolicy is served (1.30+);
- mutation is native where MutatingAdmissionPolicy and its binding are served at ``v1`` (1.36+) or, turned on,
  at ``v1beta1`` (1.34, 1.35); otherwise it stays with the webhook.

What the CEL may use depends on the version too. An apiserver checks a new expression against the CEL
environment of its *compatibility version*, its own minor minus one (``k8s.io/apiserver``
``pkg/cel/environment/base.go``, ``DefaultCompatibilityVersion``), so a library that arrived in 1.N is usable
from 1.(N+1). :data:`LIBRARIES` is that table; a rule whose CEL needs a library the target lacks stays with the
webhook on that target, and the generator says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

# The oldest and newest minors this generator targets (ValidatingAdmissionPolicy v1 arrived in 1.30).
OLDEST, NEWEST = 30, 37

# CEL libraries by the minor that introduced them in k8s.io/apiserver's base environment, for the features the
# generator may need. Checked against base.go of k8s.io/apiserver v0.30.14 ... v0.37.2.
LIBRARIES: dict[str, tuple[int, str]] = {
    "two-variable comprehensions": (32, "transformList, transformMap, all(i, v, ...)"),
    "lists": (34, "flatten, slice, distinct, sort (cel-go ext.Lists v3)"),
}

GROUP = "admissionregistration.k8s.io"
VAP, MAP = "ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"
MUTATING_VERSIONS = ("v1", "v1beta1")  # in order of preference; v1alpha1 (1.32, 1.33) is not generated


class TargetError(ValueError):
    """A version or API list that cannot be read: one line for the user."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A Kubernetes minor version and the admission-policy APIs it serves."""

    minor: int
    validating: bool  # ValidatingAdmissionPolicy (and its binding) at v1
    mutating: str | None  # the version MutatingAdmissionPolicy and its binding are served at, or None

    @property
    def version(self) -> str:
        return f"1.{self.minor}"

    @property
    def compatibility(self) -> int:
        """The minor of the CEL environment a new expression is checked against."""
        return self.minor - 1

    def has(self, library: str) -> bool:
        return LIBRARIES[library][0] <= self.compatibility

    def lacks(self, needs: Iterable[str]) -> list[str]:
        return [n for n in needs if not self.has(n)]

    @property
    def engines(self) -> tuple[str, str]:
        """(validation, mutation): ``native`` or ``webhook``."""
        return ("native" if self.validating else "webhook", "native" if self.mutating else "webhook")

    def describe(self) -> str:
        validation, mutation = self.engines
        served = f"MutatingAdmissionPolicy {self.mutating}" if self.mutating else "no MutatingAdmissionPolicy"
        return (f"Kubernetes {self.version} ({served}): validation {validation}, mutation {mutation}")


def parse_minor(text: str) -> int:
    """``1.34``, ``v1.34.2``, ``1.34.0-gke.100`` -> 34; other majors and unreadable text are refused."""
    match = re.fullmatch(r"v?1\.(\d+)(?:\.\d+)?(?:[-+][0-9A-Za-z.+-]*)?", text.strip())
    if not match:
        raise TargetError(f"{text!r} is not a Kubernetes version (write it as 1.34 or v1.34.2)")
    return int(match.group(1))


def for_version(version: str, api_versions: Iterable[str] = ()) -> Target:
    """The target helm's flags describe: ``--kube-version`` and any ``--api-versions`` (``group/version`` or
    ``group/version/Kind``). Without API versions, what the version serves by default: ValidatingAdmissionPolicy
    from 1.30, MutatingAdmissionPolicy v1 from 1.36 (v1beta1 in 1.34 and 1.35 is off unless turned on, so it is
    used only when ``--api-versions`` names it)."""
    minor = parse_minor(version)
    if minor < OLDEST:
        raise TargetError(f"Kubernetes 1.{minor} serves no ValidatingAdmissionPolicy v1 (1.{OLDEST} or later needed); "
                          "keep the webhook alone there")
    named = set(api_versions)
    for item in named:
        if item.count("/") > 2 or not all(item.split("/")) or any(c.isspace() for c in item):
            raise TargetError(f"--api-versions {item!r} is not version, group/version or group/version/Kind")
    # Served: v1 by default from 1.36, and what the flags name (as the chart asks .Capabilities: the policy kind,
    # whose binding comes with it under one feature gate) where that version exists; v1 preferred.
    served = {"v1"} if minor >= 36 else set()
    served |= {v for v in MUTATING_VERSIONS if f"{GROUP}/{v}/{MAP}" in named and _could_serve(minor, v)}
    mutating = next((v for v in MUTATING_VERSIONS if v in served), None)
    return Target(minor, True, mutating)


def known(target: Target) -> tuple[Target, str]:
    """``target``, or for a minor newer than this generator knows the newest it knows (serving what the newer one
    said it serves), and a line saying so ("" when the minor is known)."""
    if target.minor <= NEWEST:
        return target, ""
    assumed = dataclasses.replace(target, minor=NEWEST)
    return assumed, (f"Kubernetes {target.version} is newer than this release knows: generating for "
                     f"{assumed.version}, the newest it knows")


def _could_serve(minor: int, version: str) -> bool:
    """Whether a MutatingAdmissionPolicy version exists at that minor at all (v1beta1 1.34+, v1 1.36+)."""
    return minor >= (36 if version == "v1" else 34)


def from_discovery(minor: int, served: dict[str, set[str]]) -> Target:
    """The target discovery describes: ``served`` maps each ``admissionregistration.k8s.io`` version the apiserver
    serves to its kinds. A kind counts only with its binding (Kyverno asks the same)."""
    def has(version: str, kind: str) -> bool:
        kinds = served.get(version, set())
        return kind in kinds and kind + "Binding" in kinds
    mutating = next((v for v in MUTATING_VERSIONS if has(v, MAP)), None)
    return Target(minor, has("v1", VAP), mutating)


def every_version() -> list[Target]:
    """One target per minor this generator knows, as a cluster of that version serves by default, and 1.34 and
    1.35 with MutatingAdmissionPolicy v1beta1 turned on: the rows of the documentation's table."""
    out = []
    for minor in range(OLDEST, NEWEST + 1):
        out.append(Target(minor, True, "v1" if minor >= 36 else None))
        if minor in (34, 35):
            out.append(Target(minor, True, "v1beta1"))
    return out


DEFAULT = Target(NEWEST, True, "v1")

__all__ = ["DEFAULT", "LIBRARIES", "Target", "TargetError", "every_version", "for_version", "from_discovery", "known",
           "parse_minor"]
