"""GPU counts from Kubernetes quantities.

``kubernetes.utils.parse_quantity`` is the one parser; it is lenient about inputs the
apiserver refuses (``NaN``, ``1_000``, surrounding spaces), so strings are first held to
the apimachinery grammar. Custom resources reach us without server-side parsing, so the
guard matters there.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

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
