"""Field paths and violations, shaped like apimachinery's ``field.Path`` and ``field.Error``.

Every check returns a list of :class:`Violation` so that one response can name every
problem at once, each at the path a user would look for in their manifest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldPath:
    """A rendered path such as ``spec.containers[0].resources.limits[nvidia.com/gpu]``."""

    text: str = ""

    def child(self, name: str) -> FieldPath:
        return FieldPath(f"{self.text}.{name}" if self.text else name)

    def index(self, i: int) -> FieldPath:
        return FieldPath(f"{self.text}[{i}]")

    def key(self, k: str) -> FieldPath:
        # Map keys such as "nvidia.com/gpu" contain dots, so they are bracketed, as kubectl prints them.
        return FieldPath(f"{self.text}[{k}]")

    def __str__(self) -> str:
        return self.text


ROOT = FieldPath()


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem: where it is, which rule found it (policy settings are keyed by rule), and why."""

    path: FieldPath
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"
