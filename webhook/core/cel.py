"""DeviceClass and request selectors (CEL) evaluated against ResourceSlice devices, with cel-python.

The apiserver compiles selectors; only the scheduler evaluates them. To count the devices a class
can hand out, the cluster view evaluates the class's selectors on every published device. The
device is shaped as the scheduler's CEL environment shapes it: ``device.driver``,
``device.attributes[<domain>][<id>]``, ``device.capacity[<domain>][<id>]``,
``device.allowMultipleAllocations``.

cel-python implements the CEL language but not Kubernetes' extension libraries (``semver``,
``quantity``, ``isSorted``, ...), and represents versions and quantities as plain strings. A selector
it cannot compile, or one that fails at run time for any reason but a missing attribute, is
:class:`Unevaluable`; the caller then counts the driver's devices instead and says so. A missing
attribute or domain is what the scheduler treats as "does not match", and so is it here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any


class Unevaluable(Exception):
    """This selector cannot be evaluated here; the message says why."""


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    import celpy  # lark's grammar costs ~30 ms and some memory: only when a selector is evaluated

    env = celpy.Environment()
    try:
        return env.program(env.compile(expression))
    except Exception as exc:  # celpy raises its own parse errors and lark's
        raise Unevaluable(f"cel-python cannot compile it: {str(exc).splitlines()[0][:160]}") from None


def _activation(device: Mapping[str, Any]) -> dict[str, Any]:
    import celpy

    return {"device": celpy.json_to_cel(dict(device))}


def matches(expressions: tuple[str, ...], device: Mapping[str, Any]) -> bool:
    """Whether ``device`` passes every selector; raises :class:`Unevaluable`."""
    if not expressions:
        return True
    import celpy

    activation = _activation(device)
    for expression in expressions:
        program = _program(expression)
        try:
            result = program.evaluate(activation)
        except celpy.CELEvalError as exc:
            if _missing_attribute(exc):
                return False
            raise Unevaluable(f"evaluation failed: {_short(exc)}") from None
        except Exception as exc:  # an unsupported function or type inside cel-python
            raise Unevaluable(f"evaluation failed: {type(exc).__name__}: {str(exc)[:160]}") from None
        if isinstance(result, celpy.CELEvalError):
            if _missing_attribute(result):
                return False
            raise Unevaluable(f"evaluation failed: {_short(result)}")
        if not isinstance(result, celpy.celtypes.BoolType):
            raise Unevaluable(f"the selector gives {type(result).__name__}, not a bool")
        if not bool(result):
            return False
    return True


def _missing_attribute(error: BaseException) -> bool:
    # cel-python reports a missing map key as KeyError, and so an unknown function ("undeclared
    # reference to 'isGreaterThan'"): only the first is the scheduler's "no match". Its errors carry no
    # code, so this reads their args and text, which tests/test_dependencies.py holds to this shape.
    args: tuple[Any, ...] = tuple(getattr(error, "args", ()))
    message = str(args[0]) if args else ""
    return len(args) > 1 and args[1] in (KeyError, IndexError) and not message.startswith("undeclared reference")


def _short(error: BaseException) -> str:
    text = str(error.args[0]) if error.args else str(error)
    return text.split(" (in activation", 1)[0][:160]
