"""The policy of a serving process, its JSON schema checked in a child process.

A gunicorn worker carries every module its master imported, and checking a policy against its JSON schema takes
jsonschema, which brings referencing, rpds, attrs and the draft meta-schemas: 3 MB of every worker's RSS, for a
check made once per policy file. So neither the master nor its workers import it. A policy file's text goes to a
short-lived child (``python -m webhook.serving.policies SOURCE``, the text on stdin) that loads it as
``gpu-webhook check`` would and answers with its problems as a JSON list; only when there are none does the serving
process build the policy from the same text, every other check included (``parse_policy(...,
schema_checked=True)``). The problems are the ones ``load_policy`` names, word for word. The built-in defaults
need no child: they are the schema's own (``tests/test_policy.py`` holds them to it).

A policy file is loaded when the server starts and when its bytes change (``webhook.serving.watch``), so a child
runs then and only then.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from webhook.core.policy import PolicySet
from webhook.core.policyfile import PolicyError, build_policy, parse_policy

# Starting Python and importing the policy module takes well under a second; a child this late is stuck.
CHECK_SECONDS = 60.0


def load(path: str | Path | None) -> PolicySet:
    """The policy in ``path``, or the defaults when no file is given; :class:`PolicyError` as ``load_policy``."""
    if path is None:
        return build_policy(None, "default policy", schema_checked=True)
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(source, [f"cannot read: {exc}"]) from None
    problems = problems_in_child(text, source)
    if problems:
        raise PolicyError(source, problems)
    return parse_policy(text, source, schema_checked=True)


def problems_in_child(text: str, source: str) -> list[str]:
    """Every problem ``parse_policy`` finds in ``text``, found by a child process: the schema check's imports
    stay there."""
    # The child imports this very package, wherever it was imported from here.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "webhook.serving.policies", source], input=text.encode("utf-8"),
            capture_output=True, env=env, timeout=CHECK_SECONDS, check=False,
        )
    except subprocess.TimeoutExpired:
        return [f"its check did not finish within {CHECK_SECONDS:.0f} s"]
    except OSError as exc:
        return [f"its check could not start: {exc}"]
    try:
        problems = orjson.loads(done.stdout) if done.returncode == 0 else None
    except orjson.JSONDecodeError:
        problems = None
    if not isinstance(problems, list) or not all(isinstance(p, str) for p in problems):
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return [f"its check failed (exit {done.returncode}): {lines[-1] if lines else 'no message'}"]
    return problems


def _check(source: str) -> int:
    """The child: the policy text on stdin, its problems as a JSON list on stdout."""
    text = sys.stdin.buffer.read().decode("utf-8")
    try:
        parse_policy(text, source)
        problems: list[str] = []
    except PolicyError as exc:
        problems = exc.problems
    sys.stdout.buffer.write(orjson.dumps(problems))
    return 0


if __name__ == "__main__":
    sys.exit(_check(sys.argv[1] if len(sys.argv) > 1 else "policy"))
