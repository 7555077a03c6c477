"""The test tiers: which markers a collected test gets from where it lives and what it needs, and the rule that
keeps the ``fast`` tier in-process. tests/README.md describes the tiers for contributors; tests/conftest.py
applies them.

A test gets the marker of its directory (``tests/chart`` -> ``chart``, ...), ``node`` when it needs the node
bed (the ``node_bed`` fixture, directly or through another fixture), and ``fast`` when it carries none of the
markers that take it out of the pure tier. Modules mark what no rule can see: ``process`` (the test starts a
server, the CLI or another program as a process), ``bench``, ``slow``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest

# tests/<directory>/... -> the marker every test collected there gets.
DIRECTORY_MARKERS = {"e2e": "e2e", "chart": "chart", "hardening": "hardening", "image": "image"}
# The fixture that starts the node bed (tests/e2e/conftest.py); needing it means needing the bed.
NODE_BED_FIXTURE = "node_bed"
# A test with any of these is not in the fast tier.
NOT_FAST = ("e2e", "node", "chart", "hardening", "image", "bench", "slow", "process")
# The tiers, heaviest first: what each needs to run (the node bed needs the control plane too; a directory's tier
# before the markers a module adds), then ``fast``. A test carries several markers; the end-of-run timing report
# (tests/timings.py) counts its time toward the first tier of this order it carries, so every test counts once.
TIERS = ("node", "e2e", "hardening", "image", "bench", "chart", "slow", "process", "fast")


def tier_markers(parts: tuple[str, ...], fixtures: Iterable[str], markers: Iterable[str]) -> list[str]:
    """The markers to add to a test whose file is ``tests/<parts...>``, which needs ``fixtures`` (the whole
    closure) and already carries ``markers``."""
    have = set(markers)
    add = []
    if len(parts) > 1 and parts[0] in DIRECTORY_MARKERS:
        add.append(DIRECTORY_MARKERS[parts[0]])
    if NODE_BED_FIXTURE in fixtures:
        add.append("node")
    add = [name for name in add if name not in have]
    if not have.union(add).intersection(NOT_FAST):
        add.append("fast")
    return add


# The modules whose tests run on the node bed (tests/e2e/node.py; the ``node_bed`` fixture): tests/test_tiers.py
# holds this list to the fixture, test by test.
NODE_BED_MODULES = frozenset({
    "test_node.py", "test_node_alerts.py", "test_node_cert_manager.py", "test_node_chart.py", "test_node_day_one.py",
    "test_node_day_one_page.py", "test_node_hybrid.py", "test_node_hybrid_nomap.py", "test_node_release.py",
    "test_node_upgrade.py",
})
NODE_BED_SCOPE = "tests/e2e/node-bed"


def xdist_scope(nodeid: str) -> str:
    """The tests pytest-xdist runs on one worker, one after another (tests/conftest.py's scheduler): the node bed's
    (one bed per run, its modules in file order), or else the test's module (its fixtures start once)."""
    module = nodeid.split("::", 1)[0]
    directory, _, name = module.rpartition("/")
    return NODE_BED_SCOPE if directory == "tests/e2e" and name in NODE_BED_MODULES else module


def run_order(markers: Iterable[str]) -> int:
    """Where a test's tier comes in the run: the heaviest first (:data:`TIERS`), so that with several workers the
    longest groups start at once and the short ones fill in around them. A stable sort keeps each module's order."""
    return TIERS.index(tier_of(markers))


def tier_of(markers: Iterable[str]) -> str:
    """The one tier a test with ``markers`` counts toward: the heaviest of :data:`TIERS` it carries, ``fast`` when
    it carries none (a session without tests/conftest.py's markers)."""
    have = set(markers)
    return next((tier for tier in TIERS if tier in have), "fast")


# Programs a fast test may start: celeval is the apiserver's CEL as a pure function (tests/celeval), the one way the
# fast tier can evaluate the generated admission policies.
ALLOWED_PROGRAMS = ("celeval",)


@contextmanager
def no_processes(nodeid: str) -> Iterator[None]:
    """While active, starting a process fails the test with what to do (a test in the fast tier runs
    in-process), but for :data:`ALLOWED_PROGRAMS`. ``pytest.fail`` is a BaseException, so code under test that
    catches Exception cannot hide it."""
    original = subprocess.Popen.__init__

    def refuse(self, args, *rest, **kwargs):
        first = args if isinstance(args, str) else str(list(args)[0]) if args else ""
        if first.rsplit("/", 1)[-1] in ALLOWED_PROGRAMS:
            return original(self, args, *rest, **kwargs)
        program = args if isinstance(args, str) else " ".join(str(arg) for arg in list(args)[:3])
        pytest.fail(f"{nodeid} is in the fast tier but started a process ({program}): "
                    "mark it @pytest.mark.process (see tests/README.md)", pytrace=False)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", refuse)
        yield
