"""The benchmark's smoke run (``python -m bench --smoke``): every endpoint and scenario for a few
seconds against a real server. Nothing about timing is asserted: only that every request got a 200
with a correct AdmissionReview and that the JSON result and the PNG plot were written.

vegeta is built by ``tests/prepare vegeta``; in CI (``CI=true``) a missing load tool fails this test, locally it skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import unavailable

REPO = Path(__file__).resolve().parent.parent


def _missing() -> str | None:
    from bench import loadgen

    try:
        loadgen.find_vegeta()
    except loadgen.LoadToolMissing as exc:
        return str(exc)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is missing: pip install -e '.[bench]'"
    return None


@pytest.mark.slow
def test_the_benchmark_smoke_run_answers_every_request(tmp_path):
    missing = _missing()
    if missing:
        unavailable("the benchmark's load tool", missing, "vegeta")
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert summary["all_ok"] and summary["requests"] > 0
    assert {r["endpoint"] for r in summary["runs"]} == {"noop", "validate", "mutate"}
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
