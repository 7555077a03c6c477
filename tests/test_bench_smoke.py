"""The benchmark's smoke run (``python -m bench --smoke``): every endpoint and scenario for a few
seconds against a real server. Nothing about timing is asserted: only that every request got a 200
with a correct AdmissionReview and that the JSON result and the PNG plot were written.

vegeta is built by ``tests/prepare vegeta``; in CI (``CI=true``) a missing load tool fails this test, locally it skips.
The same holds for the Go peer of ``python -m bench.peer --smoke`` (``tests/prepare bench-peer``), which only the
second test needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import unavailable

pytestmark = pytest.mark.bench

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


@pytest.mark.slow
def test_the_peer_smoke_run_agrees_with_ours_and_answers_every_request(tmp_path):
    """Ours and the Go controller-runtime peer, one short round each (~15 s): both answer every request right,
    and give the same decisions (and /mutate patches of the same effect) on the rule cases."""
    missing = _missing()
    if missing:
        unavailable("the benchmark's load tool", missing, "vegeta")
    from bench import peer

    try:
        peer.find_peer()
    except peer.PeerMissing as exc:
        unavailable("the benchmark's Go peer", str(exc), "bench-peer")
    out = tmp_path / "peer.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.peer", "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert summary["all_ok"] and summary["parity_ok"] and summary["requests"] > 0
    for side in ("ours", "peer"):
        assert {r["endpoint"] for r in summary["runs"][side]} == {"validate", "mutate"}
    known = {r["case"] for r in summary["parity"] if not r["agree"]}
    assert known <= {r["case"] for r in summary["parity"] if not r["must_agree"]}
