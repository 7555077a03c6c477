"""The default policy's generated admission policies, kept in the repository (tests/golden/) so that a change to the
generator shows in review as a change to what a cluster admin would apply: one file for the newest target and one for
the oldest (1.30), where the version differences show. Rewrite them after a deliberate change with

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_native_golden.py

and review the diff."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from webhook.core.policyfile import load_policy, parse_policy
from webhook.native.generate import generate, to_yaml
from webhook.native.target import DEFAULT, OLDEST, for_version

GOLDEN = Path(__file__).resolve().parent / "golden"
TARGETS = {"admission-policies-default.yaml": DEFAULT,
           f"admission-policies-1.{OLDEST}.yaml": for_version(f"1.{OLDEST}"),
           "admission-policies-inline.yaml": DEFAULT}
# The policies that write the default policy's values in (nativePolicies.params: inline) rather than read them live.
INLINE = "nativePolicies: {params: inline}\n"


def golden_text(name: str) -> str:
    """What ``gpu-webhook admission-policies --kube-version <target>`` writes on stdout with no policy file (with
    the inline one's policy for the inline file)."""
    policies = parse_policy(INLINE) if "inline" in name else load_policy(None)
    return to_yaml(generate(policies, TARGETS[name]).objects)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_default_policy_generates_what_the_golden_file_holds(name):
    path = GOLDEN / name
    text = golden_text(name)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    kept = path.read_text(encoding="utf-8") if path.exists() else ""
    if text != kept:
        diff = "".join(list(difflib.unified_diff(kept.splitlines(True), text.splitlines(True), f"{path} (kept)",
                                                 "generated", n=2))[:60])
        pytest.fail(f"the generated admission policies differ from {path.relative_to(GOLDEN.parent.parent)}; "
                    f"if the change is meant, rewrite it with `UPDATE_GOLDEN=1 .venv/bin/pytest "
                    f"tests/test_native_golden.py` and review the diff. First lines of the diff:\n{diff}",
                    pytrace=False)
