"""The documentation site: generated blocks current, the strict build green, and a broken link failing it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from docs import gen
from tests.test_readme import sessions

ROOT = Path(__file__).resolve().parent.parent


def _policy_module():
    """The module with the policy's DEFAULTS and CHECK_SETTINGS, wherever the package keeps it."""
    for name in ("webhook.core.policyschema", "webhook.core.policy", "webhook.policy"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    raise AssertionError("no policy module with DEFAULTS (webhook.core.policyschema, core.policy or webhook.policy)")


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


@pytest.mark.process
def test_the_refused_policy_of_the_reference_prints_what_it_shows(tmp_path):
    page = (gen.DOCS / "rules.md").read_text(encoding="utf-8")
    part = page.split("\n### A policy that cannot be used\n", 1)[1].split("\n### ", 1)[0]
    [policy] = re.findall(r'```yaml title="policy.yaml"\n(.*?)```', part, re.DOTALL)
    [(command, shown)] = sessions(part)
    (tmp_path / "policy.yaml").write_text(policy)
    (tmp_path / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n")
    assert command.startswith("gpu-webhook ")
    done = subprocess.run([sys.executable, "-m", "webhook", *shlex.split(command)[1:]], cwd=tmp_path, text=True,
                          capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (2, "", shown)
    assert len(shown) == 1 and shown[0].count("; ") == 3  # the four mistakes the text says it has


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


def _zensical() -> list[str]:
    if importlib.util.find_spec("zensical") is None:
        message = "zensical is not installed; install it with `.venv/bin/pip install -e '.[docs]'`"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return [sys.executable, "-m", "zensical"]


def _site_copy(tmp_path: Path) -> Path:
    """The pages and mkdocs.yml in a folder of their own: zensical writes the site (site_dir) and its cache there."""
    copy = tmp_path / "copy"
    shutil.copytree(gen.DOCS, copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    return copy


def _build(project: Path) -> subprocess.CompletedProcess[str]:
    """``zensical build --strict`` of ``project``, its output without the terminal colours it always writes."""
    built = subprocess.run(
        [*_zensical(), "build", "--strict", "--config-file", str(project / "mkdocs.yml")],
        capture_output=True, text=True, timeout=120, cwd=project,
    )
    plain = re.compile(r"\x1b\[[0-9;]*m")
    return subprocess.CompletedProcess(built.args, built.returncode, plain.sub("", built.stdout),
                                       plain.sub("", built.stderr))


@pytest.mark.process
def test_the_site_builds_strictly_and_without_warnings(tmp_path):
    project = _site_copy(tmp_path)
    built = _build(project)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Warning" not in built.stdout + built.stderr, built.stdout + built.stderr
    site = project / yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["site_dir"]
    assert (site / "cli" / "index.html").is_file()
    assert (site / "troubleshooting" / "index.html").is_file()


@pytest.mark.process
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path):
    project = _site_copy(tmp_path)
    page = project / "docs" / "audit.md"
    lines = len(page.read_text(encoding="utf-8").splitlines())
    with page.open("a", encoding="utf-8") as out:
        out.write("\nSee [a page](no-such-page.md).\n\nSee [a heading](rules.md#no-such-heading).\n")
    built = _build(project)
    output = built.stdout + built.stderr
    assert built.returncode != 0, output
    assert f"audit.md:{lines + 2}:" in output and "page does not exist" in output, output
    assert f"audit.md:{lines + 4}:" in output and "anchor does not exist" in output, output


def _nav_pages(nav: object) -> list[str]:
    """The page files of a nav, depth first: ``- Title: page.md`` entries, sections holding more of them."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    raise AssertionError(f"not a nav entry: {nav!r}")


def nav_problems(config: dict, docs: Path) -> list[str]:
    """Pages left out of the nav, and nav entries with no page: the strict build does not look for either."""
    listed = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md") if "gen" not in p.relative_to(docs).parts)
    return ([f"{page}: not in the nav" for page in pages if page not in listed]
            + [f"{page}: in the nav, no such page" for page in listed if page not in pages]
            + [f"{page}: twice in the nav" for page in sorted(set(listed)) if listed.count(page) > 1])


@pytest.mark.parametrize("change, problems", [
    (None, []),
    ("orphan", ["orphan.md: not in the nav"]),
    ("ghost", ["ghost.md: in the nav, no such page"]),
    ("twice", ["cli.md: twice in the nav"]),
])
def test_every_page_is_in_the_nav_once_and_every_nav_entry_is_a_page(tmp_path, change, problems):
    docs = tmp_path / "docs"
    shutil.copytree(gen.DOCS, docs, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    if change == "orphan":
        (docs / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    elif change == "ghost":
        config["nav"].append({"Ghost": "ghost.md"})
    elif change == "twice":
        config["nav"].append({"Again": "cli.md"})
    assert nav_problems(config, docs) == problems


def test_the_rule_tables_are_the_rule_catalog():
    """Every rule with a setting is a row of the rules page's table; every rule, of the engines table."""
    from webhook.core import catalog

    rules_page = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    for rule in catalog.RULES.values():
        assert f"| `{rule.id}` |" in rules_page, rule.id
        if rule.setting:
            assert f"| `{rule.setting}` | `{rule.id}` | {rule.default} |" in rules_page, rule.id


# --- no history in user docs --------------------------------------------------------------------------------

# What a reader of the docs is told is how things are. Sentences about how they were (a key "now" read by every
# engine, the "old name" of an option, figures of a "previous generation") belong in CHANGELOG.md, which is history
# by nature and not checked. Word boundaries: "known" or "snow" are no match; "no longer fits" would be, and is
# written another way.
HISTORY = re.compile(
    r"\b(?:now|no longer|used to|formerly|old name|previously|today(?:'s)?|any ?more|in the past"
    r"|(?:upgrading|upgrade) to this release|earlier (?:runs|releases|versions)"
    r"|previous (?:generation|release|version|live)|before the generator was written)\b",
    re.IGNORECASE,
)


def user_docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "charts" / "gpu-webhook" / "README.md", *gen.pages()]


def history_in(path: Path, text: str) -> list[str]:
    """``file:line: "the words"`` for every history phrase of ``text`` outside code blocks."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        found += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r}" for m in HISTORY.finditer(prose)]
    return found


def test_user_docs_tell_how_things_are_not_how_they_were():
    found = [hit for path in user_docs() for hit in history_in(path, path.read_text(encoding="utf-8"))]
    assert not found, "history in user docs (say how it is, or move it to CHANGELOG.md):\n" + "\n".join(found)


@pytest.mark.parametrize("sentence, hit", [
    ("`excludeNamespaces` is now a key every engine reads.", "'now'"),
    ("The generated policies are no longer sent every pod.", "'no longer'"),
    ("`--nodes` is its old name.", "'old name'"),
    ("Upgrading to this release: set it to `[]`.", "'Upgrading to this release'"),
    ("It used to replace the default.", "'used to'"),
    ("A known issue; `now` in a code span; snow.", None),
])
def test_the_history_check_finds_each_phrase_and_nothing_else(sentence, hit):
    page = ROOT / "docs" / "example.md"
    found = history_in(page, f"# Title\n\n{sentence}\n\n```sh\necho now\n```\n")
    assert found == ([f"docs/example.md:3: {hit}"] if hit else [])


def test_what_it_writes_shows_the_rules_and_failure_policies_the_generator_writes():
    """docs/native-policies.md "What it writes": its policy, generated inline, gives the objects it shows, each
    with the rules (``gpu-webhook.io/rules``) and failurePolicy shown."""
    from webhook.core.policyfile import parse_policy
    from webhook.native.generate import generate

    page = (gen.DOCS / "native-policies.md").read_text(encoding="utf-8")
    part = page.split("\n## What it writes\n", 1)[1].split("\n## ", 1)[0]
    policy, shown = re.findall(r"```yaml\n(.*?)```", part, re.DOTALL)[:2]
    assert "and `nativePolicies: {params: inline}`" in part
    objects = generate(parse_policy(policy + "nativePolicies: {params: inline}\n")).objects
    written = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    stated = re.findall(r"^kind: (\w+)\nmetadata:\n  name: (\S+)\n(?:.*\n)*?    gpu-webhook\.io/rules: (\S+)\n"
                        r"spec:\n  failurePolicy: (\w+)", shown, re.MULTILINE)
    assert len(stated) >= 2, shown[:300]
    for kind, name, rules, failure in stated:
        obj = written[(kind, name)]
        assert (obj["metadata"]["annotations"]["gpu-webhook.io/rules"], obj["spec"]["failurePolicy"]) == (
            rules, failure), name
