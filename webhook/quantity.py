"""GPU counts from Kubernetes quantities.

``kubernetes.utils.parse_quantity`` is the one parser; it is lenient about inputs the
apiserver refuses (``NaN``, ``1_000``, surrounding spaces), so strings are first held to
the apimachinery grammar. Custom resources reach us without server-side parsing, so the
guard matters there.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path


def _kubernetes_parse_quantity() -> Callable[[object], Decimal]:
    """``kubernetes.utils.quantity.parse_quantity``, loaded from its file.

    ``import kubernetes.utils`` runs the package's ``__init__``, which imports the whole API
    client: about 17 MB in every worker for a dozen lines that import only ``decimal``.
    """
    loaded = sys.modules.get("kubernetes.utils.quantity")
    if loaded is not None:
        return loaded.parse_quantity
    package = importlib.util.find_spec("kubernetes")
    if package is None or not package.submodule_search_locations:
        raise ImportError("the kubernetes package is not installed")
    path = Path(package.submodule_search_locations[0]) / "utils" / "quantity.py"
    spec = importlib.util.spec_from_file_location("gpu_webhook._kubernetes_quantity", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_quantity


parse_quantity = _kubernetes_parse_quantity()

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_QUANTITY = re.compile(rf"[+-]?{_NUMBER}(?:[KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")


def quoted(value: object) -> str:
    """A value as a user wrote it, double-quoted like kubectl's messages."""
    return json.dumps(value) if isinstance(value, str) else str(value)


class QuantityError(ValueError):
    """A value that is not a whole, non-negative GPU count; the message says which way."""


def parse(value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"{quoted(value)} is not a quantity")
    if isinstance(value, str) and not _QUANTITY.fullmatch(value):
        raise QuantityError(f"{quoted(value)} is not a quantity")
    try:
        number = parse_quantity(value)
    except (ValueError, ArithmeticError):
        raise QuantityError(f"{quoted(value)} is not a quantity") from None
    if not number.is_finite():
        raise QuantityError(f"{quoted(value)} is not a quantity")
    return number


def gpu_count(value: object) -> int:
    """The whole number of devices a quantity asks for; GPUs are not shared, so no fractions."""
    number = parse(value)
    if number < 0:
        raise QuantityError(f"{quoted(value)} is negative (GPU counts are zero or more)")
    if number != number.to_integral_value():
        raise QuantityError(f"{quoted(value)} is not a whole number (GPUs cannot be shared)")
    return int(number)
