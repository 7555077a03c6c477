"""The end-of-run timing report (tests/timings.py): a table of modules and one ``[ci] tiers:`` line, each test's
time counted toward its heaviest tier. The figures are made up here, or only their presence is checked: no test
depends on how fast this machine is."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests.tiers import TIERS
from tests.timings import TIER_LINE_PREFIX, Timings
from tests.tools import ROOT

MARKERS = "\n".join(f"    {tier}: the {tier} tier" for tier in TIERS if tier != "fast")
INI = f"[pytest]\nmarkers =\n{MARKERS}\n"

MODULE_A = """
import pytest

@pytest.mark.e2e
@pytest.mark.node
def test_on_the_node_bed():
    pass

@pytest.mark.slow
@pytest.mark.process
def test_slow_process():
    pass

def test_pure():
    pass

@pytest.mark.skip(reason="skipped tests count too")
def test_skipped():
    pass
"""

MODULE_B = """
import pytest

pytestmark = pytest.mark.chart

def test_chart():
    pass
"""


@pytest.fixture(autouse=True)
def bare(monkeypatch):
    """Inner sessions without the installed plugins (hypothesis alone takes seconds to import), so that these stay
    fast tests: only pytest's own and the one under test, given with ``-p``."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]) -> pytest.RunResult:
    """The inner session with the timing plugin: in this process, or with xdist's workers as a process of its own
    (its workers import tests.timings from the repository)."""
    if not workers:
        return pytester.runpytest("-p", "tests.timings")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return pytester.runpytest_subprocess("-p", "tests.timings", *workers)


def tier_counts(line: str) -> dict[str, int]:
    return {tier: int(count) for tier, count in re.findall(r"(\w+) \d+\.\d+s \((\d+)\)", line)}


def table_rows(lines: list[str]) -> dict[str, list[str]]:
    """The module table's rows, by module: the figures after the name."""
    start = next(i for i, line in enumerate(lines) if "time per module" in line) + 1
    assert lines[start].split()[:2] == ["module", "tests"], lines[start]
    rows = {}
    for line in lines[start + 1:]:
        name, *figures = line.split()
        rows[name] = figures
        if name == "total":
            return rows
    raise AssertionError(f"no total row in {lines[start:]}")


# The inner session alone, and on two pytest-xdist workers (as the suite runs), where the controller prints the
# report from what the workers' reports carry.
XDIST = pytest.mark.parametrize("workers", [
    pytest.param((), id="serial"),
    pytest.param(("-p", "xdist.plugin", "-n", "2"), id="xdist", marks=pytest.mark.process),  # the workers
])


@XDIST
def test_a_run_ends_with_the_modules_table_and_one_tier_line(pytester: pytest.Pytester, monkeypatch, workers):
    pytester.makeini(INI)
    pytester.makepyfile(test_a=MODULE_A, test_b=MODULE_B)
    result = run(pytester, monkeypatch, workers)
    assert result.ret == pytest.ExitCode.OK, result.outlines  # 4 passed and 1 skipped: the table counts them
    lines = result.outlines
    rows = table_rows(lines)
    assert {name: figures[0] for name, figures in rows.items()} == {"test_a.py": "4", "test_b.py": "1", "total": "5"}
    assert all(len(figures) == 8 for figures in rows.values()), rows
    tier_lines = [line for line in lines if line.startswith(TIER_LINE_PREFIX)]
    assert len(tier_lines) == 1, lines
    # Every tier, in order, zeros too; e2e+node counts toward node, slow+process toward slow, a skipped test toward
    # its tier (fast here).
    assert tier_counts(tier_lines[0]) == {"node": 1, "e2e": 0, "hardening": 0, "image": 0, "bench": 0, "chart": 1,
                                          "slow": 1, "process": 0, "fast": 2}
    assert list(tier_counts(tier_lines[0])) == list(TIERS)
    assert re.search(r"; collection \d+\.\d+s$", tier_lines[0]), tier_lines[0]
    assert lines.index(tier_lines[0]) > lines.index(next(line for line in lines if line.startswith("total")))


def test_collect_only_prints_no_report(pytester: pytest.Pytester):
    pytester.makeini(INI)
    pytester.makepyfile(test_a=MODULE_A)
    result = pytester.runpytest("-p", "tests.timings", "--collect-only", "-q")
    assert not [line for line in result.outlines if line.startswith(TIER_LINE_PREFIX) or "time per module" in line]


BURN = "while time.process_time() < {start} + 0.3:\n    pass\n"
CHILD = "import time\n" + BURN.format(start="0")


@pytest.mark.process
@XDIST
def test_cpu_counts_toward_the_module_that_spent_it_in_pytest_or_in_a_child(pytester: pytest.Pytester, monkeypatch,
                                                                           workers):
    """Each inner test spends 0.3 s of CPU (process time, however long that takes on a busy machine): one in the
    pytest process, one in a child it waits for."""
    pytester.makeini(INI)
    pytester.makepyfile(test_own=f"""
import time

def test_spends_cpu_here():
    start = time.process_time()
{textwrap.indent(BURN.format(start="start"), "    ")}
""", test_child=f"""
import subprocess, sys

def test_spends_cpu_in_a_child():
    subprocess.run([sys.executable, "-c", {CHILD!r}], check=True)
""")
    result = run(pytester, monkeypatch, workers)
    assert result.ret == pytest.ExitCode.OK, result.outlines
    rows = table_rows(result.outlines)
    cpu, kids = 5, 6  # the columns after the name: tests, setup, call, teardown, wall, cpu, cpu kids, waiting
    assert float(rows["test_own.py"][cpu]) >= 0.3 and float(rows["test_own.py"][kids]) == 0, rows
    assert float(rows["test_child.py"][kids]) >= 0.3, rows


def filled() -> Timings:
    timings = Timings()
    phases = [
        # nodeid, tier, phase, wall, cpu, cpu kids
        ("tests/e2e/test_bed.py::test_one", "node", "setup", 30.0, 1.0, 4.0),
        ("tests/e2e/test_bed.py::test_one", "node", "call", 5.0, 0.5, 0.5),
        ("tests/e2e/test_bed.py::test_one", "node", "teardown", 0.0, 0.0, 0.0),
        ("tests/e2e/test_bed.py::test_two", "node", "setup", 0.0, 0.0, 0.0),
        ("tests/e2e/test_bed.py::test_two", "node", "call", 2.0, 0.2, 0.0),
        ("tests/e2e/test_bed.py::test_two", "node", "teardown", 10.0, 0.3, 6.0),
        ("tests/test_rules.py::test_pure[a]", "fast", "setup", 0.0, 0.0, 0.0),
        ("tests/test_rules.py::test_pure[a]", "fast", "call", 0.5, 0.5, 0.0),
        ("tests/test_rules.py::test_pure[a]", "fast", "teardown", 0.0, 0.0, 0.0),
        ("tests/test_http.py::test_cpu_bound", "process", "setup", 1.0, 0.4, 0.0),
        ("tests/test_http.py::test_cpu_bound", "process", "call", 1.0, 1.5, 0.9),  # children beside pytest
        ("tests/test_http.py::test_cpu_bound", "process", "teardown", 0.0, 0.0, 0.0),
    ]
    for phase in phases:
        timings.add(*phase)
    timings.collection = 8.3
    return timings


def test_the_table_sums_the_phases_per_module_slowest_first():
    assert [line.split() for line in filled().module_lines()] == [
        ["module", "tests", "setup", "call", "teardown", "wall", "cpu", "cpu", "kids", "waiting"],
        ["tests/e2e/test_bed.py", "2", "30.0", "7.0", "10.0", "47.0", "2.0", "10.5", "34.5"],
        ["tests/test_http.py", "1", "1.0", "1.0", "0.0", "2.0", "1.9", "0.9", "0.0"],  # waiting is never below 0
        ["tests/test_rules.py", "1", "0.0", "0.5", "0.0", "0.5", "0.5", "0.0", "0.0"],
        ["total", "4", "31.0", "8.5", "10.0", "49.5", "4.4", "11.4", "33.7"],
    ]


def test_the_tier_line_names_every_tier_in_order_with_its_wall_time_and_tests():
    assert filled().tier_line() == (
        "[ci] tiers: node 47.0s (2), e2e 0.0s (0), hardening 0.0s (0), image 0.0s (0), bench 0.0s (0), "
        "chart 0.0s (0), slow 0.0s (0), process 2.0s (1), fast 0.5s (1); collection 8.3s")
