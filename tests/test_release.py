"""Releases: one version (webhook.__version__) everywhere it shows, a Keep a Changelog file with a section for it,
tags that match both, and the pip recipes of docs/cli.md installing `check` from a release's tag into a user's
pipeline (docs/release.md says how a release is cut).

The slow tests run the recipes as the page shows them: from a throw-away tag in a scratch copy of this
package (never a tag of this repository), in a fresh virtualenv with an empty HOME, in a scratch repository of
manifests; pip fetches the dependencies from the package registry.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

import webhook
from tests import recipes
from tests.recipes import git, pins
from tests.tools import ROOT
from webhook.cli.main import main

VERSION = webhook.__version__
TAG = f"v{VERSION}"
CHANGELOG = ROOT / "CHANGELOG.md"


# --------------------------------------------------------------------------------------------- one version


def test_the_chart_has_the_package_version():
    chart = yaml.safe_load((ROOT / "charts" / "gpu-webhook" / "Chart.yaml").read_text(encoding="utf-8"))
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)


def test_the_package_metadata_reads_the_version_from_webhook():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "webhook.__version__"}
    assert str(Version(VERSION)) == VERSION and not Version(VERSION).is_prerelease


def test_version_flag_prints_the_one_version(capsys):
    # In-process; the installed `gpu-webhook --version` is run by the pip recipe's test and in the image.
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert (exited.value.code, *capsys.readouterr()) == (0, f"gpu-webhook {VERSION}\n", "")


# Where a page shows the version a user pins or sees: image tags, the tag to clone, pre-commit's rev, pip's
# @tag, the release page's VERSION=, `gpu-webhook X` as --version and the chart's notes print it, the packaged
# chart's file name, helm's --version.
PINNED = re.compile(r"(?:gpu-webhook[: -]|--branch v|rev: v|@v|VERSION=|--version )(\d+\.\d+\.\d+)\b")


@pytest.mark.parametrize("name", [
    "docs/cli.md", "docs/install.md", "docs/release.md", ".pre-commit-hooks.yaml",
    "README.md", "docs/index.md",
])
def test_pages_show_the_version_a_user_pins(name):
    shown = PINNED.findall((ROOT / name).read_text(encoding="utf-8"))
    assert shown, f"{name} shows no version: the pattern no longer finds them"
    assert {v for v in shown if v != VERSION} == set(), f"{name} names other versions than {VERSION}"


def test_the_version_pattern_finds_what_it_should_and_nothing_else():
    text = ("docker build -t <registry>/gpu-webhook:1.2.3 .\ngit clone --branch v1.2.3 URL\nrev: v1.2.3\n"
            'pip install "git+URL@v1.2.3"\nVERSION=1.2.3\n# gpu-webhook 1.2.3\ndist/gpu-webhook-1.2.3.tgz\n'
            "helm install x --version 1.2.3\n"
            "helm 4.3.2, cert-manager v1.11.5, actions/checkout@v4, buildah 1.28, python:3.11.15-slim\n")
    assert PINNED.findall(text) == ["1.2.3"] * 8


# ----------------------------------------------------------------------------------------------- changelog

KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")  # Keep a Changelog's
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")


def changelog_versions(text: str) -> list[str]:
    """The released versions of a changelog, newest first."""
    return [m.group("name") for line in text.splitlines() if (m := HEADING.match(line)) and m.group("date")]


def changelog_problems(text: str, version: str) -> list[str]:
    """What makes ``text`` no Keep a Changelog file with a section for ``version``."""
    lines = text.splitlines()
    problems = [] if lines[:1] == ["# Changelog"] else ["the first line is not '# Changelog'"]
    sections = [line for line in lines if line.startswith("## ")]
    if not sections or sections[0] != "## [Unreleased]":
        problems.append("the first section is not '## [Unreleased]'")
    released: list[tuple[Version, str]] = []
    for line in sections[1:]:
        match = HEADING.match(line)
        if not match or not match.group("date"):
            problems.append(f"{line!r} is not '## [X.Y.Z] - YYYY-MM-DD'")
            continue
        try:
            released.append((Version(match.group("name")), match.group("date")))
        except InvalidVersion:
            problems.append(f"{line!r}: {match.group('name')!r} is not a version")
    if released != sorted(released, reverse=True) or len({v for v, _ in released}) != len(released):
        problems.append("the released sections are not newest first, each once")
    kinds = {line[4:] for line in lines if line.startswith("### ")}
    problems += [f"'### {kind}' is none of {', '.join(KINDS)}" for kind in sorted(kinds - set(KINDS))]
    body = text.split(f"## [{version}] - ", 1)[1].split("\n## ", 1)[0] if f"## [{version}] - " in text else ""
    if not body:
        problems.append(f"no section '## [{version}] - YYYY-MM-DD'")
    elif not re.search(r"^- ", body, re.MULTILINE):
        problems.append(f"the {version} section lists nothing")
    return problems


def test_the_changelog_has_a_section_for_this_version():
    assert changelog_problems(CHANGELOG.read_text(encoding="utf-8"), VERSION) == []


GOOD_LOG = "# Changelog\n\n## [Unreleased]\n\n## [0.10.0] - 2027-01-02\n\n### Fixed\n\n- b\n\n" \
           "## [0.9.0] - 2026-12-04\n\n### Added\n\n- a\n"


@pytest.mark.parametrize(("text", "version", "problems"), [
    (GOOD_LOG, "0.10.0", []),
    (GOOD_LOG, "0.9.0", []),
    (GOOD_LOG, "0.11.0", ["no section '## [0.11.0] - YYYY-MM-DD'"]),
    (GOOD_LOG.replace("## [Unreleased]\n\n", ""), "0.9.0", ["the first section is not '## [Unreleased]'"]),
    (GOOD_LOG.replace("# Changelog", "# Changes"), "0.9.0", ["the first line is not '# Changelog'"]),
    (GOOD_LOG.replace("0.10.0", "0.8.0"), "0.9.0", ["the released sections are not newest first, each once"]),
    (GOOD_LOG.replace(" - 2026-12-04", ""), "0.10.0", ["'## [0.9.0]' is not '## [X.Y.Z] - YYYY-MM-DD'"]),
    (GOOD_LOG.replace("### Fixed", "### Improvements"), "0.9.0",
     ["'### Improvements' is none of Added, Changed, Deprecated, Removed, Fixed, Security"]),
    (GOOD_LOG.replace("- a\n", ""), "0.9.0", ["the 0.9.0 section lists nothing"]),
])
def test_changelog_problems(text, version, problems):
    assert changelog_problems(text, version) == problems


def test_changelog_versions_are_the_released_sections_newest_first():
    assert changelog_versions(GOOD_LOG) == ["0.10.0", "0.9.0"]


# ---------------------------------------------------------------------------------------------------- tags


def newest_tag(repo: Path) -> str | None:
    """The highest ``v*`` version tag reachable from HEAD, or None."""
    listed = git(repo, "tag", "--merged", "HEAD", "--list", "v*", "--sort=-v:refname").split()
    return listed[0] if listed else None


def tag_problems(repo: Path, tag: str, changelog: str) -> list[str]:
    """What is wrong with release tag ``tag`` of ``repo`` against the changelog ``changelog``."""
    problems = []
    if git(repo, "cat-file", "-t", tag).strip() != "tag":
        problems.append(f"{tag} is a lightweight tag; releases are annotated (git tag -a)")
    tagged = re.search(r'^__version__ = "([^"]+)"$', git(repo, "show", f"{tag}:webhook/__init__.py"), re.MULTILINE)
    version = tagged.group(1) if tagged else None
    if f"v{version}" != tag:
        problems.append(f"{tag} tags a commit whose __version__ is {version}")
    if tag.removeprefix("v") not in changelog_versions(changelog):
        problems.append(f"CHANGELOG.md has no section for {tag}")
    return problems


@pytest.mark.process
def test_the_newest_tag_matches_the_changelog_and_the_version_it_tags():
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    if inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")
    tag = newest_tag(ROOT)
    if tag is None:
        pytest.skip("no v* tag reachable from HEAD")
    assert tag_problems(ROOT, tag, CHANGELOG.read_text(encoding="utf-8")) == []


def _release(repo: Path, version: str, tag: str | None = None, annotated: bool = True) -> None:
    (repo / "webhook").mkdir(exist_ok=True)
    (repo / "webhook" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", f"release {version}")
    if tag:
        git(repo, "tag", *(["-a", "-m", tag] if annotated else []), tag)


@pytest.mark.process
@pytest.mark.parametrize(("steps", "newest", "problems"), [
    ([("0.9.0", "v0.9.0", True), ("0.10.0", "v0.10.0", True)], "v0.10.0", []),
    ([("0.9.0", "v0.9.0", True), ("0.10.0", None, True)], "v0.9.0", []),
    ([("0.9.0", "v0.9.0", False)], "v0.9.0", ["v0.9.0 is a lightweight tag; releases are annotated (git tag -a)"]),
    ([("0.9.0", "v0.10.0", True)], "v0.10.0", ["v0.10.0 tags a commit whose __version__ is 0.9.0"]),
    ([("0.11.0", "v0.11.0", True)], "v0.11.0", ["CHANGELOG.md has no section for v0.11.0"]),
    ([("0.8.0", None, True)], None, None),
])
def test_tag_problems(tmp_path, steps, newest, problems):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for version, tag, annotated in steps:
        _release(repo, version, tag, annotated)
    # A newer tag on a branch HEAD does not contain is not this checkout's release.
    git(repo, "checkout", "-q", "-b", "side")
    _release(repo, "9.0.0", "v9.0.0")
    git(repo, "checkout", "-q", "-")
    assert newest_tag(repo) == newest
    if newest:
        assert tag_problems(repo, newest, GOOD_LOG) == problems


# ---------------------------------------------------------------------------- the pip recipes, as written


def _pip_recipes() -> tuple[str, str, str]:
    """The install commands (GitHub's step), and the GitHub and GitLab check commands, after checking that the
    page's three copies of the install (its sh block, GitHub's step, GitLab's lines) are one."""
    table = recipes.recipes()
    github, gitlab = table["github", "pip"].commands, table["gitlab", "pip"].commands
    assert len(github) == 2 and len(gitlab) == 3, (github, gitlab)
    install = github[0]
    on_gitlab = "\n".join(gitlab[:2]) + "\n"
    [block, *_] = recipes.blocks("sh")
    assert shlex.split(install.replace('"$RUNNER_TEMP/gpu-webhook', '"/tmp/gpu-webhook')) == shlex.split(on_gitlab) \
        == shlex.split(block)
    assert f"--branch {TAG} {recipes.REPO_URL} " in install
    return install, github[1], gitlab[2]


def _fresh_env(venv: Path, runner_temp: Path) -> dict[str, str]:
    """A CI job's environment: the venv's Python first on PATH, an empty HOME, nothing of this checkout's venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(HOME=tempfile.mkdtemp(dir=runner_temp.parent), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
               RUNNER_TEMP=str(runner_temp))
    return env


def _sh(command: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """One CI step: bash -e, as GitHub runs `run` and GitLab's runner a script line."""
    return subprocess.run(["bash", "-e", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the install resolves, downloads and builds about 55 packages
def test_the_pip_recipes_install_check_from_the_tag_and_it_fails_a_bad_manifest(tmp_path):
    install, github_check, gitlab_check = _pip_recipes()
    upstream = recipes.package_repo(tmp_path / "gpu-webhook", tag=TAG)
    recipes.commit_after_the_tag(upstream)
    user = recipes.user_repo(tmp_path / "user")
    venv, runner_temp = tmp_path / "venv", tmp_path / "runner-temp"
    runner_temp.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = _fresh_env(venv, runner_temp)

    done = _sh(install.replace(recipes.REPO_URL, f"file://{upstream}"), user, env, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (runner_temp / "gpu-webhook" / "requirements" / "constraints.txt").is_file()
    version = _sh("gpu-webhook --version", user, env)
    assert version.stdout == f"gpu-webhook {VERSION}\n", version.stderr
    assert shutil.which("gpu-webhook", path=env["PATH"]) == str(venv / "bin" / "gpu-webhook")
    listed = json.loads(_sh("python -m pip list --format=json", user, env).stdout)
    installed = {canonicalize_name(p["name"]): p["version"] for p in listed}
    assert installed.pop("gpu-webhook") == VERSION
    lock = pins(ROOT / "requirements" / "constraints.txt")
    for tool in ("pip", "setuptools"):  # the venv's own, not the recipe's
        installed.pop(tool, None)
    assert installed == {name: lock.get(name) for name in installed}, "not every package at the constraints' pin"

    for command, report in ((github_check, "gpu-webhook.sarif"), (gitlab_check, "gpu-webhook.xml")):
        good = _sh(command, user, env)
        assert (good.returncode, good.stderr) == (0, f"{len(recipes.GOOD)} objects checked, 0 denied, 0 warned\n")
        assert (user / report).stat().st_size > 0, f"{command} wrote no {report}"
    assert json.loads((user / "gpu-webhook.sarif").read_text())["runs"][0]["results"] == []

    bad_name = recipes.add_bad_manifest(user)
    for command in (github_check, gitlab_check):
        bad = _sh(command, user, env)
        assert (bad.returncode, bad.stderr) == (1, f"{len(recipes.GOOD) + 1} objects checked, 1 denied, 0 warned\n")
    [result] = json.loads((user / "gpu-webhook.sarif").read_text())["runs"][0]["results"]
    assert result["ruleId"] == recipes.BAD_RULE
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == bad_name
    junit = (user / "gpu-webhook.xml").read_text()
    assert junit.count("<failure ") == 1 and f'type="{recipes.BAD_RULE}"' in junit and f'file="{bad_name}"' in junit


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pip_installs_straight_from_the_tag_with_constraints_from_a_url(tmp_path):
    """The page's one-command form: `pip install -c <URL> "git+<repository URL>@vX.Y.Z"` resolves the tagged
    package at its version and every dependency at the constraints' pin (a dry run)."""
    text = " ".join(recipes.install_section().split())
    assert f'`pip install "git+{recipes.REPO_URL}@{TAG}"`, and `-c` also takes a URL' in text
    upstream = recipes.package_repo(tmp_path / "gpu-webhook", tag=TAG)
    recipes.commit_after_the_tag(upstream)
    report = tmp_path / "report.json"
    constraints = f"file://{upstream}/requirements/constraints.txt"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "-c", constraints, f"git+file://{upstream}@{TAG}"],
        capture_output=True, text=True, timeout=540, cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    install = {canonicalize_name(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}
    ours = install.pop("gpu-webhook")
    assert ours["metadata"]["version"] == VERSION
    assert ours["download_info"]["vcs_info"]["requested_revision"] == TAG
    assert ours["download_info"]["vcs_info"]["commit_id"] == git(upstream, "rev-list", "-n1", TAG).strip()
    lock = pins(ROOT / "requirements" / "constraints.txt")
    assert {name: i["metadata"]["version"] for name, i in install.items()} == {name: lock[name] for name in install}


@pytest.mark.slow
@pytest.mark.timeout(900)  # pre-commit builds a virtualenv and pip installs the package and its dependencies
def test_the_pre_commit_snippet_runs_the_hook_of_the_tag(tmp_path):
    snippet = recipes.pre_commit_snippet()
    [repo] = snippet["repos"]
    assert (repo["repo"], repo["rev"]) == (recipes.REPO_URL, TAG)
    upstream = recipes.package_repo(tmp_path / "gpu-webhook", tag=TAG)
    recipes.commit_after_the_tag(upstream)
    user = recipes.user_repo(tmp_path / "user")
    repo["repo"] = f"file://{upstream}"
    (user / ".pre-commit-config.yaml").write_text(yaml.safe_dump(snippet, sort_keys=False))
    git(user, "add", ".pre-commit-config.yaml")
    bad_name = recipes.add_bad_manifest(user)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "PRE_COMMIT_COLOR": "never",
           "HOME": str(tmp_path)}
    run = [sys.executable, "-m", "pre_commit", "run", "--files"]

    bad = subprocess.run([*run, bad_name, *recipes.GOOD], cwd=user, env=env, capture_output=True, text=True,
                         timeout=840)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-3000:]
    # check names the file, the line and column of the field, then the object (FILE:LINE:COLUMN: Kind ns/name: ...).
    assert "Failed" in bad.stdout, bad.stdout[-3000:]
    assert re.search(rf"{re.escape(bad_name)}:\d+:\d+: Job default/big: spec\.template\.spec\.containers\[0\]",
                     bad.stdout), bad.stdout[-3000:]
    good = subprocess.run([*run, *recipes.GOOD], cwd=user, env=env, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0 and "Passed" in good.stdout, good.stdout[-3000:] + good.stderr[-3000:]
    # YAML that is no manifest (the policy, the config itself) passes: the hook skips what is not a Kubernetes object.
    other = subprocess.run([*run, "policy.yaml", ".pre-commit-config.yaml"], cwd=user, env=env, capture_output=True,
                           text=True, timeout=300)
    assert other.returncode == 0 and "Passed" in other.stdout, other.stdout + other.stderr
