"""Field paths and violations, shaped like apimachinery's ``field.Path`` and ``field.Error``.

Every check returns a list of :class:`Violation` so that one response can name every
problem at once, each at the path a user would look for in their manifest.

A violation also knows what it is about: its path with list items known by name
(``spec.containers[name=main]…``, unchanged when an update inserts a container before it)
and the offending value. An UPDATE is held to the violations whose :attr:`Violation.subject`
the old object did not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FieldPath:
    """A rendered path such as ``spec.containers[0].resources.limits[nvidia.com/gpu]``."""

    text: str = ""
    # The path with named list items by name; None while it is the same as ``text``.
    named: str | None = field(default=None, compare=False, repr=False)

    @property
    def stable(self) -> str:
        """The path as it stays across updates: ``spec.containers[name=main]`` for ``spec.containers[0]``."""
        return self.text if self.named is None else self.named

    def child(self, name: str) -> FieldPath:
        return FieldPath(_dot(self.text, name), None if self.named is None else _dot(self.named, name))

    def index(self, i: int) -> FieldPath:
        return FieldPath(f"{self.text}[{i}]", None if self.named is None else f"{self.named}[{i}]")

    def item(self, i: int, by: str, name: object) -> FieldPath:
        """Item ``i`` of a list whose items have a name in field ``by``; by index when it has none."""
        if not isinstance(name, str) or not name:
            return self.index(i)
        return FieldPath(f"{self.text}[{i}]", f"{self.stable}[{by}={name}]")

    def key(self, k: str) -> FieldPath:
        # Map keys such as "nvidia.com/gpu" contain dots, so they are bracketed, as kubectl prints them.
        return FieldPath(f"{self.text}[{k}]", None if self.named is None else f"{self.named}[{k}]")

    def __str__(self) -> str:
        return self.text


def _dot(text: str, name: str) -> str:
    return f"{text}.{name}" if text else name


ROOT = FieldPath()


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem: where it is, which rule found it (policy settings are keyed by rule), and why."""

    path: FieldPath
    rule: str
    message: str
    # What the problem is about (the quantity, count or accelerator found); empty where path and rule say it all.
    value: str = ""
    # Found on a pod spec that asks for no GPU: a tenant rule's denial of it holds in a tenant namespace only.
    no_gpu: bool = False

    @property
    def subject(self) -> tuple[str, str, str]:
        """The same problem in the object before and after an UPDATE: same rule, same named path, same value."""
        return (self.rule, self.path.stable, self.value)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"
