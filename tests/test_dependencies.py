"""Where the code reaches into a dependency by a route the dependency does not promise, because it offers no
public one: each test below fails, naming what moved, when a new version changes that shape, and pyproject.toml
pins each of these dependencies below its next major version.

- gunicorn: ``Arbiter.run`` calls ``manage_workers()`` on every turn of its loop and ``halt()`` calls
  ``stop(graceful)`` (``serving.server._Arbiter`` starts, restarts and stops the audit process there: no server
  hook runs per turn of the master's loop, or before the workers are stopped).
- kubernetes: ``kubernetes/utils/quantity.py`` as a file defining ``parse_quantity`` (``core.quantity``;
  ``kubernetes.utils.parse_quantity`` would import the whole API client, 17 MB, into every worker).
- PyYAML: a constructor's ``constructed_objects``, ``recursive_objects``, ``state_generators`` and
  ``deep_construct`` (``manifests.yamlstream._build`` resets them after a refused document: nothing public
  resets a loader whose stream must go on).
- orjson: the text of ``JSONDecodeError``, ``depth limit`` and ``infinity`` (``core.review.decode``; the error
  has no code).
- cel-python: ``CELEvalError.args``, ``(message, KeyError, ...)`` for a missing key and ``undeclared reference``
  for an unknown function (``core.cel._missing_attribute``; the error has no code).
"""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
REACHED_INTO = ("gunicorn", "kubernetes", "pyyaml", "orjson", "cel-python")


def test_each_dependency_reached_into_is_pinned_below_its_next_major_version():
    from importlib.metadata import version

    declared = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        declared[requirement.name.lower()] = requirement
    for name in REACHED_INTO:
        installed = Version(version(name))
        below = [s for s in declared[name].specifier if s.operator == "<"]
        assert below, f"pyproject.toml: {name} has no upper bound, and this code relies on its internals"
        assert installed in declared[name].specifier, f"{name} {installed} is outside {declared[name].specifier}"
        # At most the next major version (next minor for 0.x, whose minor versions break).
        limit = Version(below[0].version)
        ceiling = (installed.major + 1, 0) if installed.major else (0, installed.minor + 1)
        assert (limit.major, limit.minor) <= ceiling, f"pyproject.toml: {name} {below[0]} lets the next major in"


def test_gunicorn_master_loop_still_calls_manage_workers_and_stop():
    from gunicorn.arbiter import Arbiter

    assert "self.manage_workers()" in inspect.getsource(Arbiter.run), (
        "gunicorn's Arbiter.run no longer calls manage_workers() on each turn of its loop: "
        "webhook.serving.server._Arbiter starts and restarts the audit process there"
    )
    assert "self.stop(" in inspect.getsource(Arbiter.halt), (
        "gunicorn's Arbiter.halt no longer goes through stop(): webhook.serving.server._Arbiter stops the audit "
        "process there"
    )
    assert list(inspect.signature(Arbiter.stop).parameters) == ["self", "graceful"], (
        f"gunicorn's Arbiter.stop is now {inspect.signature(Arbiter.stop)}: webhook.serving.server._Arbiter "
        "overrides stop(self, graceful=True)"
    )
    assert list(inspect.signature(Arbiter.manage_workers).parameters) == ["self"]


@pytest.mark.process
def test_kubernetes_quantity_file_is_there_and_parses_as_the_package_does():
    package = importlib.util.find_spec("kubernetes")
    assert package is not None and package.submodule_search_locations
    path = Path(package.submodule_search_locations[0]) / "utils" / "quantity.py"
    assert path.is_file(), f"kubernetes has no {path} any more: webhook.core.quantity loads parse_quantity from it"
    # Loaded from the file, in a process that has not imported the client: the route the workers take.
    code = ("import sys; from webhook.core import quantity; assert 'kubernetes' not in sys.modules, 'client loaded'; "
            "print(quantity.parse_quantity('1.5Ki'), quantity.parse_quantity('500m'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1536.0", "0.500"]
    from kubernetes.utils.quantity import parse_quantity

    from webhook.core import quantity

    for value in ("1", "1Ki", "500m", "1e3", "1.5G", 2, "0.1"):
        assert quantity.parse_quantity(value) == parse_quantity(value) == quantity.parse(value), value


@pytest.mark.parametrize("loader", ["SafeLoader", "CSafeLoader"])
def test_pyyaml_constructor_keeps_the_state_check_resets(loader):
    import yaml

    cls = getattr(yaml, loader, None)
    if cls is None:
        pytest.skip(f"PyYAML built without libyaml: no {loader}")
    instance = cls("a: 1\n")
    try:
        for name, kind in (("constructed_objects", dict), ("recursive_objects", dict), ("state_generators", list),
                           ("deep_construct", bool)):
            assert isinstance(getattr(instance, name, None), kind), (
                f"PyYAML's {loader} has no {name} ({kind.__name__}) any more: webhook.manifests.yamlstream resets "
                "it after a document its constructor refused"
            )
    finally:
        instance.dispose()
    from webhook.manifests import yamlstream

    # What the reset is for: a refused document does not take the next one with it.
    documents = yamlstream.load("a: 2024-13-45\n---\nb: 1\n")
    assert documents[0].problem and documents[1].value == {"b": 1}


@pytest.mark.parametrize(("body", "words"), [
    (b"[" * 2000 + b"]" * 2000, "depth limit"),
    (b"1e400", "infinity"),
    (b"[" + b"9" * 400 + b"]", "infinity"),
])
def test_orjson_errors_still_say_what_review_tells_apart(body, words):
    import orjson

    with pytest.raises(orjson.JSONDecodeError) as refused:
        orjson.loads(body)
    assert words in str(refused.value), (
        f"orjson now says {str(refused.value)!r}: webhook.core.review.decode looks for {words!r} in it"
    )


def test_cel_python_errors_still_tell_a_missing_key_from_an_unknown_function():
    import celpy

    from webhook.core import cel

    env = celpy.Environment()
    device = {"driver": "d", "attributes": {}, "capacity": {}, "allowMultipleAllocations": False}
    activation = {"device": celpy.json_to_cel(device)}

    def error_of(expression: str) -> BaseException:
        try:
            result = env.program(env.compile(expression)).evaluate(activation)
        except celpy.CELEvalError as exc:
            return exc
        assert isinstance(result, celpy.CELEvalError), f"{expression} gave {result!r}, not an error"
        return result

    missing = error_of("device.attributes['gpu.example.com'].model == 'l4'")
    assert len(missing.args) > 1 and missing.args[1] is KeyError, (
        f"cel-python now reports a missing map key as {missing.args!r}: webhook.core.cel reads args[1] is KeyError"
    )
    unknown = error_of("isGreaterThan(1, 2)")
    assert str(unknown.args[0]).startswith("undeclared reference"), (
        f"cel-python now reports an unknown function as {str(unknown.args[0])[:80]!r}: webhook.core.cel tells it "
        "from a missing key by 'undeclared reference'"
    )
    assert cel.matches(("device.attributes['gpu.example.com'].model == 'l4'",), device) is False
    with pytest.raises(cel.Unevaluable):
        cel.matches(("isGreaterThan(1, 2)",), device)
