"""`gpu-webhook check` as a newcomer meets it (issue 33): each refusal says what to do, in one line."""

from __future__ import annotations

from tests.test_cli import (
    GOOD,
    NOTHING,
    cli,  # noqa: F401  (the fixture: gpu-webhook in this process)
)

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
