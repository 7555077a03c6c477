"""GPU counts from Kubernetes quantities.

``kubernetes.utils.parse_quantity`` is the one parser; it is lenient about inputs the
apiserver refuses (``NaN``, ``1_000``, surrounding spaces), so strings are first held to
the apimachinery grammar. Custom resources reach us without server-side parsing, so the
guard matters there.

Cost is bounded before any conversion: a string longer than :data:`MAX_LENGTH` or with an
exponent beyond :data:`MAX_EXPONENT` is refused as it stands (``int(Decimal("1e600000"))``
alone held a worker for 20 s), and a count above :data:`CEILING` is refused before it is
turned into an ``int``. Both say the same thing: not a sensible GPU count.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable
from decimal import Decimal, localcontext
from pathlib import Path


def _kubernetes_parse_quantity() -> Callable[[object], Decimal]:
    """``kubernetes.utils.quantity.parse_quantity``, loaded from its file.

    ``import kubernetes.utils`` runs the package's ``__init__``, which imports the whole API
    client: about 17 MB in every worker for a dozen lines that import only ``decimal``. The file's place
    is no promise of the package: pyproject pins kubernetes below its next major version, and
    tests/test_dependencies.py fails, saying so, if the file moves or parses differently.
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
_QUANTITY = re.compile(rf"[+-]?{_NUMBER}(?:[KMGTPE]i|[numkMGTPE]|[eE](?P<exponent>[+-]?\d+))?", re.ASCII)
# A template's placeholder left in the manifest: envsubst's ${GPUS} (${GPUS:-1} too) and $GPUS, Helm's {{ ... }}.
# RE2 reads it alike (webhook.native.snippets.PLACEHOLDER).
PLACEHOLDER = r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\{\{.*\}\}"
_PLACEHOLDER = re.compile(PLACEHOLDER, re.ASCII)

# No cluster has a million devices of one kind on one pod; above this a count is a typo or an attack.
CEILING = 10**6
# Bounds that keep parsing constant-cost; a real GPU count needs a few characters and no exponent.
MAX_LENGTH = 64
MAX_EXPONENT = 64
# Digits kept exactly while a suffix is applied (64 digits times 1024**6 stays within this).
_PRECISION = 100


def quoted(value: object) -> str:
    """A value as a user wrote it: strings double-quoted like kubectl's messages, ``true``, ``false`` and
    ``null`` as YAML and JSON spell them (not Python's ``True``), numbers as they are."""
    if isinstance(value, (str, bool)) or value is None:
        return json.dumps(value)
    return str(value)


def shown(value: object) -> str:
    """``quoted``, cut short for values too long to echo back whole in a message."""
    if isinstance(value, str) and len(value) > MAX_LENGTH:
        return f"{json.dumps(value[:16])[:-1]}…\" ({len(value)} characters)"
    if isinstance(value, int) and value.bit_length() > 4 * MAX_LENGTH:  # str() of it may even raise
        return f"an integer of {value.bit_length()} bits"
    text = quoted(value)
    return text if len(text) <= MAX_LENGTH else f"{text[:16]}… ({len(text)} characters)"


class QuantityError(ValueError):
    """A value that is not a whole, non-negative GPU count; the message says which way."""


def _not_sensible(value: object) -> QuantityError:
    return QuantityError(f"{shown(value)} is not a sensible GPU count (at most {CEILING})")


def parse(value: object) -> Decimal:
    """The exact number a quantity stands for; refuses, without converting, what would cost too much."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise QuantityError(f"{shown(value)} is not a quantity")
    if isinstance(value, str):
        if len(value) > MAX_LENGTH:
            raise _not_sensible(value)
        match = _QUANTITY.fullmatch(value)
        if not match and _PLACEHOLDER.fullmatch(value):
            raise QuantityError(f"{quoted(value)} is a placeholder that was never substituted; "
                                "render the manifest first")
        if not match:
            raise QuantityError(f"{quoted(value)} is not a quantity")
        exponent = match.group("exponent")
        if exponent is not None and abs(int(exponent)) > MAX_EXPONENT:
            raise _not_sensible(value)
    elif isinstance(value, int) and abs(value) > CEILING:
        raise _not_sensible(value)  # before Decimal(value): a JSON integer may have thousands of digits
    try:
        with localcontext(prec=_PRECISION):  # the suffix multiplication must not round 1.000…1 to 1
            number = parse_quantity(value)
    except (ValueError, ArithmeticError):
        raise QuantityError(f"{quoted(value)} is not a quantity") from None
    if not number.is_finite():
        raise QuantityError(f"{quoted(value)} is not a quantity")
    return number


def gpu_count(value: object) -> int:
    """The whole number of devices a quantity asks for; GPUs are not shared, so no fractions."""
    # The usual values (1, "2"), exactly as the parser reads them, without the parser: every rule counts GPUs.
    if type(value) is int and 0 <= value <= CEILING:
        return value
    if type(value) is str and 0 < len(value) <= 6 and value.isascii() and value.isdigit():
        return int(value)
    number = parse(value)
    if number < 0:
        raise QuantityError(f"{quoted(value)} is negative (GPU counts are zero or more)")
    if number > CEILING:
        raise _not_sensible(value)  # before int(number), which would build every digit
    if number != number.to_integral_value():
        raise QuantityError(f"{quoted(value)} is not a whole number (GPUs cannot be shared)")
    return int(number)
