from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.server import start_webhook
from tests.tiers import no_processes, run_order, tier_markers, xdist_scope

TESTS = Path(__file__).resolve().parent

# pytester: tests/test_timings.py runs small sessions of its own. tests.timings: the end-of-run report of where the
# time went, per module and per tier (tests/README.md).
pytest_plugins = ["pytester", "tests.timings"]


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items):
    """The tiers of tests/README.md: each test gets its directory's marker, ``node`` when it needs the node
    bed, and ``fast`` when nothing takes it out of the pure tier (tests/tiers.py)."""
    for item in items:
        path = Path(item.path)
        if not path.is_relative_to(TESTS):
            continue
        have = [mark.name for mark in item.iter_markers()]
        for name in tier_markers(path.relative_to(TESTS).parts, getattr(item, "fixturenames", ()), have):
            item.add_marker(name)
    items.sort(key=lambda item: run_order(mark.name for mark in item.iter_markers()))


class BedScheduling(LoadScopeScheduling):
    """xdist's ``--dist loadscope`` with the scopes of ``tests.tiers.xdist_scope``: the node bed's modules are one
    scope, every other module its own. (``loadgroup``'s markers do not group here: xdist 3.8 writes the group into
    ``Item._nodeid``, which pytest 9 no longer reads.)"""

    def _split_scope(self, nodeid: str) -> str:
        return xdist_scope(nodeid)


def pytest_xdist_make_scheduler(config, log):
    """The suite's scheduler on workers (``-n``, ``--dist loadscope``: pyproject.toml's addopts)."""
    if config.getvalue("dist") == "loadscope":
        return BedScheduling(config, log)
    return None


def _in_process(item):
    """A fast test runs in-process: starting a process from it (or from a fixture it sets up) fails it. Its
    teardown is not held to that: when the fast test is the session's last, pytest tears the session's fixtures
    down there too (the node bed's, which starts nsenter)."""
    if item.get_closest_marker("fast") is None:
        return (yield)
    with no_processes(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _in_process(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _in_process(item))


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    """One server for a test module, with the default policy plus a per-pod cap of 4 and a namespace in warn mode."""
    tmp = tmp_path_factory.mktemp("webhook")
    policy = tmp / "policy.yaml"
    policy.write_text("limits: {perPod: 4}\nnamespaces: {research: {enforcement: warn}}\n")
    server = start_webhook(tmp, "--policy", str(policy))
    yield server
    server.stop()


def pytest_configure(config):
    # The tests that start a program (git, the CLI) as a process carry this marker, so a tier that runs only
    # in-process tests can leave them out.
    config.addinivalue_line("markers", "process: starts a server, the CLI or another program as a process")
