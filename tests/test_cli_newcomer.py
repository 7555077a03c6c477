"""`gpu-webhook check` as a newcomer meets it (issue 33): each refusal says what to do, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.recipes import pins
from tests.test_cli import (
    GOOD,
    NOTHING,
    cli,  # noqa: F401  (the fixture: gpu-webhook in this process)
)

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------- a directory without -R


def test_a_directory_whose_manifests_are_in_subdirectories_suggests_recursive(cli, tmp_path):  # noqa: F811
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "pod.yaml").write_text(GOOD)
    (tmp_path / "README.md").write_text("# k8s")
    assert cli("check", str(tmp_path)) == (2, "", [
        f"{tmp_path}: no *.yaml, *.yml, *.json files; its subdirectories hold some: add -R to read them", NOTHING])
    assert cli("check", "-R", str(tmp_path))[0] == 0


def test_a_directory_with_no_manifests_anywhere_gets_no_hint(cli, tmp_path):  # noqa: F811
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text("# notes")
    assert cli("check", str(tmp_path)) == (2, "", [f"{tmp_path}: no *.yaml, *.yml, *.json files", NOTHING])


# ------------------------------------------------------------------------------ the pre-commit hook


def test_the_pre_commit_hook_runs_once_and_installs_the_constraints_pins():
    """pre-commit runs a hook in several processes at once unless it is serial (the summary printed once per
    process), and installs the hook without the constraints file: the pins ride in ``additional_dependencies``."""
    [hook] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook.get("require_serial") is True
    pinned = [Requirement(d) for d in hook.get("additional_dependencies", [])]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pinned), pinned
    hook_pins = {canonicalize_name(r.name): next(iter(r.specifier)).version for r in pinned}
    assert hook_pins == pins(REPO / "requirements" / "constraints.txt"), (
        "the hook's additional_dependencies are not requirements/constraints.txt's pins")


# ------------------------------------------------------------------------------------ exit codes in --help


@pytest.mark.parametrize("command", [[], ["check"]], ids=["gpu-webhook", "check"])
def test_help_says_what_the_exit_codes_mean(cli, command):  # noqa: F811
    code, out, _ = cli(*command, "--help")
    assert code == 0
    said = out.split("exit codes:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in said[:3]] == ["0", "1", "2"], out
    assert "denied" in said[1] and "could not be used" in said[2]


def test_the_cli_reference_says_what_checks_exit_codes_mean():
    text = (REPO / "docs" / "cli.md").read_text()
    check = text.split("### `gpu-webhook check`", 1)[1].split("\n### ", 1)[0]
    assert "Exit codes:\n\n- `0`: nothing would be denied" in check and "- `1`: something would be denied" in check
    assert "- `2`: an input or the policy could not be used" in check
