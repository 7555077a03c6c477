"""The test tiers of tests/README.md: every test carries the markers that pick its tier, the fast tier starts no
process, and the default run still selects every test."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import tiers
from tests.tiers import NODE_BED_MODULES, NODE_BED_SCOPE, no_processes, tier_markers, tier_of, xdist_scope

ROOT = Path(__file__).resolve().parent.parent

# (case, file under tests/, fixtures the test needs, markers it already has, markers added)
TIERS = [
    ("top-level pure test", ("test_rules.py",), ["tmp_path"], [], ["fast"]),
    ("top-level test that starts a process", ("test_http.py",), ["webhook"], ["process"], []),
    ("top-level slow test", ("test_cli_ci.py",), [], ["slow"], []),
    ("benchmark", ("test_bench_smoke.py",), [], ["bench", "slow"], []),
    ("chart directory", ("chart", "test_chart.py"), [], [], ["chart"]),
    ("hardening directory", ("hardening", "test_hostile.py"), ["figures"], ["slow"], ["hardening"]),
    ("image directory", ("image", "test_image.py"), [], [], ["image"]),
    ("e2e directory, control plane", ("e2e", "test_cli_recipes.py"), ["cluster", "bin_dir"], [], ["e2e"]),
    ("e2e module that marks itself", ("e2e", "test_admission.py"), ["cluster"], ["e2e"], []),
    ("e2e directory, node bed through a fixture", ("e2e", "test_node_hybrid.py"), ["release", "node_bed"],
     ["e2e", "slow"], ["node"]),
    ("a directory without a tier", ("schemas", "test_x.py"), [], [], ["fast"]),
]


@pytest.mark.parametrize(("parts", "fixtures", "markers", "added"), [c[1:] for c in TIERS], ids=[c[0] for c in TIERS])
def test_each_test_gets_the_markers_of_its_tier(parts, fixtures, markers, added):
    assert tier_markers(parts, fixtures, markers) == added


# (markers a test carries, the tier its time counts toward in the end-of-run report)
COUNTED_TOWARD = [
    (["e2e", "slow", "node"], "node"),
    (["e2e", "bench"], "e2e"),
    (["hardening", "slow"], "hardening"),
    (["bench", "slow"], "bench"),
    (["chart", "process"], "chart"),
    (["slow", "process"], "slow"),
    (["process", "parametrize"], "process"),
    (["fast"], "fast"),
    ([], "fast"),
]


@pytest.mark.parametrize(("markers", "tier"), COUNTED_TOWARD, ids=[" ".join(m) or "none" for m, _ in COUNTED_TOWARD])
def test_a_tests_time_counts_toward_its_heaviest_tier(markers, tier):
    assert tier_of(markers) == tier


def test_the_report_knows_every_tier_marker():
    assert set(tiers.TIERS) == {*tiers.NOT_FAST, "fast"}


def test_a_fast_test_that_starts_a_process_fails_and_says_to_mark_it():
    with no_processes("tests/test_x.py::test_y"), pytest.raises(pytest.fail.Exception) as failed:
        try:
            subprocess.run(["true"], check=True)
        except Exception:  # code under test that swallows errors does not hide it
            pass
    assert "tests/test_x.py::test_y is in the fast tier but started a process (true)" in str(failed.value)
    assert "@pytest.mark.process" in str(failed.value)


def test_a_fast_test_may_start_only_celeval_the_apiservers_cel(tmp_path):
    fake = tmp_path / "celeval"
    fake.write_text("#!/bin/sh\necho evaluated\n")
    fake.chmod(0o755)
    with no_processes("tests/test_x.py::test_y"):
        assert subprocess.run([str(fake)], capture_output=True, text=True, check=True).stdout == "evaluated\n"
        with pytest.raises(pytest.fail.Exception):
            subprocess.run([str(tmp_path / "celeval-not")], check=False)


def test_the_default_run_selects_every_test():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    assert not [o for o in shlex.split(options["addopts"]) if o.startswith("-m") or o.startswith("-k")]


def collected(*args: str) -> list[str]:
    """The test ids ``pytest --collect-only`` selects with these arguments (none: pytest exits 5)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode in (0, 5), result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def module_of(test_id: str) -> str:
    return test_id.split("::")[0].rsplit("/", 1)[-1]


@pytest.mark.process
def test_every_test_under_e2e_is_marked_e2e():
    assert collected("-m", "not e2e", "tests/e2e") == []


@pytest.mark.process
def test_the_node_marker_picks_exactly_the_tests_on_the_node_bed():
    assert {module_of(test) for test in collected("-m", "node", "tests/e2e")} == NODE_BED_MODULES
    assert [test for test in collected("-m", "not node", "tests/e2e") if module_of(test) in NODE_BED_MODULES] == []


def test_the_node_beds_modules_are_one_xdist_scope_and_every_other_module_its_own():
    assert xdist_scope("tests/e2e/test_node_release.py::test_x[a::b]") == NODE_BED_SCOPE
    assert xdist_scope("tests/e2e/test_node_alerts.py::test_y") == NODE_BED_SCOPE
    assert xdist_scope("tests/e2e/test_node_build.py::test_z") == "tests/e2e/test_node_build.py"  # no bed
    assert xdist_scope("tests/e2e/test_helm.py::Test::test_w") == "tests/e2e/test_helm.py"
    assert xdist_scope("tests/test_node.py::test_v") == "tests/test_node.py"
