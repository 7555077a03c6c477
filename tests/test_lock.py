"""The image installs from requirements/image.lock alone (``--no-deps``): every dependency pyproject.toml
declares must be pinned there, with hashes, at a version the declaration accepts. Regenerate with the command
in the lock's header after changing the dependencies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def locked() -> dict[str, str]:
    pins = {}
    for match in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:", (ROOT / "requirements" / "image.lock")
                             .read_text(), re.M):
        pins[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return pins


def test_every_runtime_dependency_is_pinned_with_hashes_at_an_accepted_version():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = locked()
    problems = []
    for text in declared:
        requirement = Requirement(text)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if name not in pins:
            problems.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{requirement.name}=={pins[name]} does not satisfy {requirement.specifier}")
    assert not problems, problems
