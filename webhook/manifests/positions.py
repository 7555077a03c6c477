"""Where a field is in its document: field paths cut into steps, and positions from a YAML document's nodes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import yaml

_STEP = re.compile(r"\[([^\]]*)\]|([^.\[\]]+)")


def steps(path: str) -> tuple[str, ...]:
    """The keys and indexes of a field path: ``spec.containers[0].resources.limits[nvidia.com/gpu]`` ->
    ``spec``, ``containers``, ``0``, ``resources``, ``limits``, ``nvidia.com/gpu``."""
    return tuple(m[1] if m[1] is not None else m[2] for m in _STEP.finditer(path))


class Locator(Protocol):
    def at(self, path: Sequence[str]) -> tuple[int, int]:
        """(line, column), 1-based, of the field at ``path``, or of its closest ancestor that exists."""
        ...


@dataclass(frozen=True)
class YamlLocator:
    """Positions in a YAML document, from its composed nodes (``first_line``: the file's lines before them)."""

    root: yaml.Node
    first_line: int = 0

    def at(self, path: Sequence[str]) -> tuple[int, int]:
        node, mark = self.root, self.root.start_mark
        for step in path:
            if isinstance(node, yaml.MappingNode):
                found = next((pair for pair in node.value
                              if isinstance(pair[0], yaml.ScalarNode) and pair[0].value == step), None)
                if found is None:
                    break
                mark, node = found[0].start_mark, found[1]
            elif isinstance(node, yaml.SequenceNode) and step.isdigit() and int(step) < len(node.value):
                node = node.value[int(step)]
                mark = node.start_mark
            else:
                break
        return mark.line + self.first_line + 1, mark.column + 1

