"""The CI recipes of docs/cli.md ("Installing `check` in a pipeline"), read from the page, and the throw-away
git repositories they are proven in: gpu-webhook's package at a tag, and a user's repository of manifests.

The tests run what the page shows, so the page cannot drift from what was run: the only substitutions are the
placeholders the page itself explains (the repository URL, the registry).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.utils import canonicalize_name

from tests.manifests import container, pod, workload
from tests.tools import ROOT

CLI_PAGE = ROOT / "docs" / "cli.md"
REPO_URL = "<gpu-webhook repository URL>"  # the page's placeholder for gpu-webhook's git URL
REGISTRY = "<registry>"  # and for the registry the release image is pulled from
GPU = "nvidia.com/gpu"

_FENCED = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def _section(page: str, heading: str) -> str:
    """The text of a page from ``heading`` to the next heading of the same or a higher level (a ``#`` line inside
    a fenced block is a comment, not a heading)."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = page.splitlines(keepends=True)
    start = lines.index(heading + "\n")
    fenced = False
    for number in range(start + 1, len(lines)):
        line = lines[number]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            return "".join(lines[start:number])
    return "".join(lines[start:])


def install_section() -> str:
    return _section(CLI_PAGE.read_text(encoding="utf-8"), "### Installing `check` in a pipeline")


def blocks(lang: str, text: str | None = None) -> list[str]:
    """The fenced blocks of ``lang`` in the install section (or in ``text``), in order."""
    found = _FENCED.finditer(install_section() if text is None else text)
    return [match.group("body") for match in found if match.group("lang") == lang]


@dataclass(frozen=True)
class Recipe:
    system: str  # "github" or "gitlab"
    way: str  # "pip" or "image"
    doc: dict[str, Any]  # the YAML as the CI system reads it

    @property
    def job(self) -> dict[str, Any]:
        if self.system == "github":
            [job] = self.doc["jobs"].values()
            return job
        [job] = self.doc.values()
        return job

    @property
    def commands(self) -> list[str]:
        """The shell commands the job runs, in order: each GitHub step's `run`, each GitLab `script` line."""
        if self.system == "github":
            return [step["run"] for step in self.job["steps"] if "run" in step]
        return list(self.job["script"])


def _recipe(doc: dict[str, Any]) -> Recipe:
    if "jobs" in doc:
        [job] = doc["jobs"].values()
        runs = " ".join(step.get("run", "") for step in job["steps"])
        return Recipe("github", "image" if runs.lstrip().startswith("docker run") else "pip", doc)
    [job] = doc.values()
    return Recipe("gitlab", "image" if isinstance(job.get("image"), dict) else "pip", doc)


def recipes() -> dict[tuple[str, str], Recipe]:
    """The page's four recipes by (system, way); the pre-commit snippet is left out."""
    found = [_recipe(doc) for doc in map(yaml.safe_load, blocks("yaml")) if "repos" not in doc]
    table = {(r.system, r.way): r for r in found}
    assert len(table) == len(found) == 4, f"expected one recipe per system and way, found {sorted(table)}"
    return table


def pre_commit_snippet() -> dict[str, Any]:
    [snippet] = [doc for doc in map(yaml.safe_load, blocks("yaml")) if "repos" in doc]
    return snippet


def image_ref(version: str) -> str:
    """The release image as the recipes name it."""
    return f"{REGISTRY}/gpu-webhook:{version}"


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file (hash continuation lines and comments skipped)."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if match:
            found[canonicalize_name(match.group(1))] = match.group(2)
    return found


# --- scratch repositories -----------------------------------------------------------------------------


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          check=True, capture_output=True, text=True, timeout=60)
    return done.stdout


# What installing the package from a clone reads, and the hook definition pre-commit reads.
PACKAGE_FILES = ("pyproject.toml", "README.md", ".pre-commit-hooks.yaml", "requirements/constraints.txt")


def package_repo(destination: Path, tag: str | None = None) -> Path:
    """This work tree's package, committed in a repository of its own (a clone would take HEAD only, never
    what is not committed yet), with an annotated ``tag`` on that commit when asked."""
    destination.mkdir()
    for name in PACKAGE_FILES:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination / name)
    shutil.copytree(ROOT / "webhook", destination / "webhook", ignore=shutil.ignore_patterns("__pycache__"))
    git(destination, "init", "-q")
    git(destination, "add", ".")
    git(destination, "commit", "-q", "-m", "snapshot")
    if tag:
        git(destination, "tag", "-a", tag, "-m", f"throw-away {tag}")
    return destination


def commit_after_the_tag(repo: Path) -> None:
    """A later commit on the package repository's branch, unlike the release in what the tests look at: another
    version, and a hook that fails on everything. Whatever installs the tag must not see it."""
    init = repo / "webhook" / "__init__.py"
    init.write_text(re.sub(r'(?m)^__version__ = .*$', '__version__ = "99.0.0"', init.read_text()))
    hooks = repo / ".pre-commit-hooks.yaml"
    text = hooks.read_text()
    assert "entry: gpu-webhook check" in text, "the hook's entry changed: change this test helper with it"
    hooks.write_text(text.replace("entry: gpu-webhook check", "entry: false"))
    git(repo, "commit", "-q", "-am", "after the release")


# A user's repository: a policy capping GPUs per container at 4, and manifests the recipes check.
POLICY = "limits: {perContainer: 4}\n"
GOOD = {
    "manifests/train.yaml": pod(container("train", limits={GPU: 2}), name="train"),
    "manifests/serving/infer.yaml": workload("Deployment", pod(container("infer", limits={GPU: 1})), name="infer"),
}
BAD = ("manifests/big.yaml", workload("Job", pod(container("big", limits={GPU: 8})), name="big"))
BAD_RULE = "per-container-limit"


def user_repo(destination: Path) -> Path:
    """A fresh git repository holding ``policy.yaml`` and the good manifests, committed."""
    destination.mkdir()
    git(destination, "init", "-q")
    (destination / "policy.yaml").write_text(POLICY)
    for name, obj in GOOD.items():
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        (destination / name).write_text(yaml.safe_dump(obj))
    git(destination, "add", ".")
    git(destination, "commit", "-q", "-m", "manifests")
    return destination


def add_bad_manifest(repo: Path) -> str:
    """Commit a manifest the policy denies; returns its path in the repository."""
    name, obj = BAD
    (repo / name).write_text(yaml.safe_dump(obj))
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", "too many GPUs")
    return name
