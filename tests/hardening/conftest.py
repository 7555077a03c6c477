"""Figures measured by the hardening tests, printed at the end of the run (and written as JSON lines
to ``$GPU_WEBHOOK_FIGURES`` when that is set), whether a test passed or failed."""

from __future__ import annotations

import json
import os

import pytest

FIGURES = pytest.StashKey[list]()


@pytest.fixture
def figures(request):
    """A dict a test fills with what it measured: requests sent, failures, RSS, examples run, seconds."""
    found: dict = {}
    yield found
    request.config.stash.setdefault(FIGURES, []).append((request.node.nodeid, found))
    path = os.environ.get("GPU_WEBHOOK_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"test": request.node.nodeid, **found}) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config.stash.get(FIGURES, [])
    if not rows:
        return
    terminalreporter.section("hardening figures")
    for nodeid, found in rows:
        terminalreporter.write_line(f"{nodeid.split('::', 1)[-1]}: {json.dumps(found)}")
