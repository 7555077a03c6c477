"""The end-of-run timing report (tests/README.md, "Where the time goes"): a pytest plugin, loaded by
tests/conftest.py, that prints after every run

- a table of the test modules, slowest first: tests run, the wall time of their setup, call and teardown phases
  (pytest's own durations, as ``--durations`` shows them), the CPU time pytest and its children spent meanwhile,
  and what is left of the wall time: waiting;
- one line, ``[ci] tiers: ...``, with each tier's wall time and test count in the fixed order of
  ``tests.tiers.TIERS`` (a test counts toward its heaviest tier, ``tests.tiers.tier_of``), and the collection's.

It reports; it asserts nothing. What the figures mean:

- a phase's time is the module's whose test ran it: a session fixture started in a test's setup counts toward that
  test's module, and so does its teardown after the session's last test;
- CPU is ``getrusage``: the pytest process's own (every thread), and that of its children that ended and were
  waited for during the phase (``subprocess.run``, a server stopped in a teardown), with their descendants that
  they waited for. A child still running counts when it is waited for (a session bed's daemons: in the teardown
  that stops them); a process that nobody in its parent chain waits for (a container, its shim reparented to
  init) is never counted: its CPU shows as waiting;
- waiting is wall minus both CPU times, at least 0: sleeps, polls, network and disk, programs that are not counted,
  and the run queue of a busy machine. Children run beside pytest, so this is a lower bound.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Generator
from dataclasses import dataclass, field

import pytest

from tests.tiers import TIERS, tier_of

PHASES = ("setup", "call", "teardown")
TIER_LINE_PREFIX = "[ci] tiers:"
CPU_ATTRIBUTE, TIER_ATTRIBUTE = "gpu_webhook_cpu", "gpu_webhook_tier"  # on each phase's report (xdist sends them)


def cpu_times() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its children that ended and were waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@dataclass
class Times:
    """What a module or a tier spent."""

    tests: int = 0
    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    cpu_own: float = 0.0
    cpu_children: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.wall.values())

    @property
    def waiting(self) -> float:
        return max(0.0, self.total - self.cpu_own - self.cpu_children)


@dataclass
class Timings:
    """The run's times per module and per tier, fed one test phase at a time."""

    modules: dict[str, Times] = field(default_factory=dict)
    tiers: dict[str, Times] = field(default_factory=lambda: {tier: Times() for tier in TIERS})
    collection: float = 0.0

    def add(self, nodeid: str, tier: str, when: str, wall: float, cpu_own: float, cpu_children: float) -> None:
        """One phase (``when``: setup, call or teardown) of the test ``nodeid``, which counts toward ``tier``."""
        module = nodeid.split("::", 1)[0]
        for times in (self.modules.setdefault(module, Times()), self.tiers[tier]):
            if when == "setup":  # every test that runs has a setup phase, skipped ones too
                times.tests += 1
            times.wall[when] += wall
            times.cpu_own += cpu_own
            times.cpu_children += cpu_children

    def module_lines(self) -> list[str]:
        """The table of modules, slowest first, with a total row."""
        width = max([len("module"), *(len(m) for m in self.modules)])
        header = (f"{'module':<{width}} {'tests':>5} {'setup':>8} {'call':>8} {'teardown':>8} {'wall':>8}"
                  f" {'cpu':>8} {'cpu kids':>8} {'waiting':>8}")

        def row(name: str, t: Times) -> str:
            figures = (*(t.wall[p] for p in PHASES), t.total, t.cpu_own, t.cpu_children, t.waiting)
            return f"{name:<{width}} {t.tests:>5} " + " ".join(f"{f:>8.1f}" for f in figures)

        ranked = sorted(self.modules.items(), key=lambda item: (-item[1].total, item[0]))
        total = Times()
        for _, t in ranked:
            total.tests += t.tests
            for p in PHASES:
                total.wall[p] += t.wall[p]
            total.cpu_own += t.cpu_own
            total.cpu_children += t.cpu_children
        return [header, *(row(name, t) for name, t in ranked), row("total", total)]

    def tier_line(self) -> str:
        """``[ci] tiers: node 1.0s (2), e2e ...; collection 3.0s``: every tier, in TIERS order, zeros included, so
        that two runs' lines compare column by column."""
        tiers = ", ".join(f"{tier} {t.total:.1f}s ({t.tests})" for tier, t in self.tiers.items())
        return f"{TIER_LINE_PREFIX} {tiers}; collection {self.collection:.1f}s"


class TimingReport:
    """The plugin: measures each phase's CPU around pytest's setup, call and teardown hooks (outermost, so that the
    other plugins' wrappers count), takes the wall time from the phase's report, prints at the end."""

    def __init__(self) -> None:
        self.timings = Timings()
        self._tier: dict[str, str] = {}
        self._cpu: dict[tuple[str, str], tuple[float, float]] = {}

    def _measure(self, item: pytest.Item, when: str) -> Generator[None, object, object]:
        if when == "setup":
            self._tier[item.nodeid] = tier_of(mark.name for mark in item.iter_markers())
        own, children = cpu_times()
        try:
            return (yield)
        finally:
            own_after, children_after = cpu_times()
            self._cpu[(item.nodeid, when)] = (own_after - own, children_after - children)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, object, object]:
        return (yield from self._measure(item, "setup"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        return (yield from self._measure(item, "call"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, object, object]:
        return (yield from self._measure(item, "teardown"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Generator[
            None, pytest.TestReport, pytest.TestReport]:
        """The phase's CPU and the test's tier travel on its report: with pytest-xdist, the report is what reaches the
        controller, which prints the tables (a worker's own are never shown)."""
        report = yield
        own, children = self._cpu.pop((item.nodeid, call.when), (0.0, 0.0))
        setattr(report, CPU_ATTRIBUTE, [own, children])
        setattr(report, TIER_ATTRIBUTE, self._tier.get(item.nodeid, "fast"))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when not in PHASES:
            return
        own, children = getattr(report, CPU_ATTRIBUTE, (0.0, 0.0))
        self.timings.add(report.nodeid, getattr(report, TIER_ATTRIBUTE, "fast"), report.when, report.duration,
                         own, children)

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Generator[None, object, object]:
        start = time.perf_counter()
        try:
            return (yield)
        finally:
            self.timings.collection = time.perf_counter() - start

    @pytest.hookimpl(trylast=True)  # after --durations' table (-ra's short summary comes after this)
    def pytest_terminal_summary(self, terminalreporter, config: pytest.Config) -> None:
        if config.option.collectonly:
            return
        write = terminalreporter.write_line
        if self.timings.modules:
            terminalreporter.write_sep("=", "time per module (s; cpu: pytest's, cpu kids: its waited-for children)")
            for line in self.timings.module_lines():
                write(line)
        write(self.timings.tier_line())


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimingReport(), "gpu-webhook-timings")
