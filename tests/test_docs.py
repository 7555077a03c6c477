"""The documentation site: generated blocks current, the strict build green, and a broken link failing it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docs import gen

ROOT = Path(__file__).resolve().parent.parent


def _policy_module():
    """The module with the policy's DEFAULTS and CHECK_SETTINGS, wherever the package keeps it."""
    for name in ("webhook.core.policy", "webhook.policy"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise AssertionError("no policy module with DEFAULTS (webhook.core.policy or webhook.policy)")


# --- generated blocks -----------------------------------------------------------------------------------------


def test_every_generated_block_is_current():
    stale = gen.stale()
    assert not stale, (
        f"generated docs blocks are stale in {', '.join(stale)}: regenerate them with "
        f"`.venv/bin/{gen.REGENERATE}` and commit the pages"
    )


def test_every_marked_block_has_a_generator_or_is_pending():
    names = {block.name for page in gen.pages() for block in gen.blocks_of(page.read_text(encoding="utf-8"))}
    assert names - set(gen.BLOCKS) - set(gen.PENDING) == set()
    assert set(gen.BLOCKS) <= names, "a registered block is on no page"


def test_regenerate_replaces_the_block_between_its_markers_and_nothing_else(monkeypatch):
    monkeypatch.setitem(gen.BLOCKS, "demo", lambda: "new\n")
    monkeypatch.setitem(gen.PENDING, "handmade", "written by hand")
    page = (
        "before\n<!-- BEGIN GENERATED: demo -->\nold\n<!-- END GENERATED: demo -->\nbetween\n"
        "<!-- BEGIN GENERATED: handmade -->\nby hand\n<!-- END GENERATED: handmade -->\nafter\n"
    )
    assert gen.regenerate(page) == page.replace("old", "new")
    with pytest.raises(KeyError, match="no generator for block 'nosuch'"):
        gen.regenerate("<!-- BEGIN GENERATED: nosuch -->\n<!-- END GENERATED: nosuch -->\n")
    with pytest.raises(ValueError, match="has no"):
        gen.regenerate("<!-- BEGIN GENERATED: demo -->\nold\n")


def test_links_of_copied_files_point_into_the_site_or_become_paths():
    text = (
        "[values.yaml](values.yaml) and [certs/README.md](../../certs/README.md#rotation); "
        "[the rules](../../docs/rules.md), [here](#audit), [cel](https://example.org/x), "
        "`[not](a-link.md)`\n```\n[not](in-a-fence.md)\n```\n"
    )
    assert gen._retarget("charts/gpu-webhook/README.md", "chart.md", text) == (
        "`charts/gpu-webhook/values.yaml` and [certs/README.md](certificates.md#rotation); "
        "[the rules](rules.md), [here](#audit), [cel](https://example.org/x), "
        "`[not](a-link.md)`\n```\n[not](in-a-fence.md)\n```\n"
    )


def test_the_cli_block_lists_every_option_of_every_command():
    page = (gen.DOCS / "cli.md").read_text(encoding="utf-8")
    parser = gen.find_parser()
    for name, _, sub in gen._subcommands(parser):
        assert f"### `{parser.prog} {name}`" in page
        for action in gen._visible(sub):
            for flag in action.option_strings:
                assert f"`{flag}`" in page, (name, flag)


def test_the_chart_values_table_describes_every_key_with_a_description():
    values = gen.chart_values_of((ROOT / gen.VALUES).read_text(encoding="utf-8"))
    paths = [value.path for value in values]
    assert "image.repository" in paths and "policy" in paths
    assert all(value.description for value in values)


# --- what the hand-written pages say about the code ---------------------------------------------------------


def test_the_policy_reference_shows_the_built_in_defaults():
    page = (gen.DOCS / "rules.md").read_text(encoding="utf-8")
    block = re.search(r'```yaml title="the defaults"\n(.*?)```', page, re.DOTALL)
    assert block is not None
    assert yaml.safe_load(block.group(1)) == _policy_module().DEFAULTS


def test_the_rules_table_gives_each_setting_its_key_rule_and_default():
    policy = _policy_module()
    page = (gen.DOCS / "rules.md").read_text(encoding="utf-8")
    [block] = [b for b in gen.blocks_of(page) if b.name == "rules"]
    rows = {}
    for line in page[block.start : block.end].splitlines():
        if line.startswith("| `"):
            cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
            rows[cells[1]] = (cells[0], cells[2])
    expected = {
        rule: (f"{section}.{key}", policy.DEFAULTS[section][key])
        for rule, (section, key) in policy.CHECK_SETTINGS.items()
    }
    assert rows == expected


# --- the site -------------------------------------------------------------------------------------------------


def _mkdocs() -> list[str]:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        message = "mkdocs or mkdocs-material is not installed; install them with `.venv/bin/pip install -e '.[docs]'`"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return [sys.executable, "-m", "mkdocs"]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_mkdocs(), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.mark.process
def test_the_site_builds_strictly(tmp_path):
    built = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


@pytest.mark.process
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(gen.DOCS, copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "audit.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [a page](no-such-page.md) and [a heading](rules.md#no-such-heading).\n")
    built = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr and "no-such-heading" in built.stderr, built.stderr


def test_the_rule_tables_are_the_rule_catalog():
    """Every rule with a setting is a row of the rules page's table; every rule, of the engines table."""
    from webhook.core import catalog

    rules_page = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    for rule in catalog.RULES.values():
        assert f"| `{rule.id}` |" in rules_page, rule.id
        if rule.setting:
            assert f"| `{rule.setting}` | `{rule.id}` | {rule.default} |" in rules_page, rule.id
