"""docs/day-one.md: every command of the page is run by a test (``tests.day_one_page.RUN_BY`` names it), and the
offline ones run here as written. The cluster ones run on the node bed, in the page's order
(tests/e2e/test_node_day_one_page.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.day_one_page import RUN_BY, command, commands, node_exporter, sections, tenant_deployment

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_of_the_page_has_a_test_that_runs_it():
    shown = commands()  # the delete by label is on the page twice (roll back, uninstall): the walk runs it in both
    assert sorted(set(shown) - set(RUN_BY)) == [], "on the page, run by no test: add it to RUN_BY and to its test"
    assert sorted(set(RUN_BY) - set(shown)) == [], "run by a test, not on the page (changed or removed?)"
    for test in set(RUN_BY.values()):
        path, _, name = test.partition("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), test


def test_the_sections_come_in_the_order_a_platform_engineer_meets_them():
    titles = list(sections())
    order = ["Before you install: what would be refused", "What may be refused after the install",
             "Exempt a namespace", "Turn on hybrid mode", "Roll back", "Uninstall"]
    assert [t for t in titles if t in order] == order, titles


def test_the_check_finds_a_command_missing_from_the_table():
    page = "## Roll back\n\n```sh\nhelm rollback gpu-webhook 2 -n gpu-system\n# a comment\n```\n"
    assert commands(page) == ["helm rollback gpu-webhook 2 -n gpu-system"]
    assert set(commands(page)) - set(RUN_BY) == {"helm rollback gpu-webhook 2 -n gpu-system"}


@pytest.mark.process
def test_check_on_manifests_reports_the_agent_and_refuses_the_tenant(tmp_path):
    """``gpu-webhook check -R manifests/`` as the page writes it, on a node agent's DaemonSet and a tenant's
    Deployment: the tenant's is refused (exit 1), the agent is reported (refused or warned, as the isolation
    rules decide for a namespace that is not a tenant's), and trusting the agent's namespace silences it."""
    line = command("Before you install: what would be refused", "gpu-webhook check -R")
    (tmp_path / "manifests" / "agents").mkdir(parents=True)
    (tmp_path / "manifests" / "agents" / "node-exporter.yaml").write_text(yaml.safe_dump(node_exporter()))
    (tmp_path / "manifests" / "trainer.yaml").write_text(yaml.safe_dump(tenant_deployment()))
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(shell: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", shell], cwd=tmp_path, env=env, text=True, capture_output=True,
                              timeout=60)

    done = run(line)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "Deployment team-a/trainer" in output and "conflicts with nodeSelector" in output, output
    assert "DaemonSet monitoring/node-exporter" in output, output  # -R: the subdirectory is read too
    (tmp_path / "policy.yaml").write_text("isolation: {trusted: {namespaces: [monitoring]}}\n")
    trusted = run(line.replace("check ", "check --policy policy.yaml ", 1))
    assert trusted.returncode == 1 and "node-exporter" not in trusted.stdout, trusted.stdout + trusted.stderr
