"""Graceful shutdown under load: SIGTERM fails /readyz first, in-flight and draining requests all succeed,
and the process exits by itself within its grace period.

The clients behave as the apiserver does while an endpoint goes away: new connections keep coming
until the endpoint removal has propagated (``ENDPOINT_LAG`` after /readyz turns 503), and kept-alive
connections are reused until the server closes them.
"""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import threading
import time
import uuid

import pytest

from tests.hardening.harness import Call, LoadClient, Tally, standard_calls, start_server
from tests.manifests import admission_review, seed_pod
from tests.server import client_context

DRAIN = 3.0
GRACE = DRAIN + 20  # gunicorn's graceful timeout in webhook/server.py
ENDPOINT_LAG = 1.0


class ReadinessPoller(threading.Thread):
    """GET /readyz on a fresh connection every 50 ms; records (when answered, status or the error). The time is
    the answer's: a poll sent just before SIGTERM may be answered 503 just after it."""

    def __init__(self, port: int, context: ssl.SSLContext, stop: threading.Event, deadline: float):
        super().__init__(daemon=True)
        self.port, self.context, self.stop, self.deadline = port, context, stop, deadline
        self.seen: list[tuple[float, int | str]] = []

    def run(self) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=1)
            try:
                conn.request("GET", "/readyz")
                result: int | str = conn.getresponse().status
            except Exception as exc:
                result = type(exc).__name__
            finally:
                conn.close()
            self.seen.append((time.monotonic(), result))
            self.stop.wait(0.05)


def slow_request(port: int, context: ssl.SSLContext, start_at: float, spread: float, out: dict) -> None:
    """One admission whose body trickles in over ``spread`` seconds: in flight when the worker stops."""
    uid = str(uuid.uuid4())
    body = json.dumps(admission_review(seed_pod(), uid=uid)).encode()
    call = Call("/validate", body, uid, True)
    time.sleep(max(0.0, start_at - time.monotonic()))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=15)
    out["started"] = time.monotonic()
    try:
        conn.putrequest("POST", "/validate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        pieces = 10
        step = len(body) // pieces + 1
        for i in range(pieces):
            conn.send(body[i * step:(i + 1) * step])
            time.sleep(spread / pieces)
        response = conn.getresponse()
        out["problem"] = call.judge(response.status, response.read())
    except Exception as exc:
        out["problem"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["ended"] = time.monotonic()
        conn.close()


@pytest.mark.slow
def test_sigterm_under_load_drains_without_a_failed_request_and_exits_in_time(tmp_path, figures):
    server = start_server(tmp_path, "--drain-seconds", str(DRAIN))
    context = client_context(server.ca)
    tally = Tally()
    stop_new, stop_all = threading.Event(), threading.Event()
    deadline = time.monotonic() + GRACE + 15
    kept = [LoadClient(f"keepalive-{i}", server.port, context, standard_calls(), tally, stop_all, deadline,
                       rate=25, stop_on_close=True) for i in range(2)]
    fresh = [LoadClient(f"fresh-{i}", server.port, context, standard_calls(), tally, stop_new, deadline,
                        rate=10, keep_alive=False) for i in range(2)]
    poller = ReadinessPoller(server.port, context, stop_all, deadline)
    slow: dict = {}
    exit_code = None
    try:
        for thread in (*kept, *fresh, poller):
            thread.start()
        time.sleep(1.5)
        sigterm = time.monotonic()
        # In flight across the moment the worker stops accepting (SIGTERM + DRAIN).
        slow_thread = threading.Thread(target=slow_request,
                                       args=(server.port, context, sigterm + DRAIN - 0.4, 1.2, slow), daemon=True)
        slow_thread.start()
        server.proc.send_signal(signal.SIGTERM)

        first_503 = None
        while time.monotonic() < sigterm + 5 and first_503 is None:
            first_503 = next((at for at, status in list(poller.seen) if at >= sigterm and status == 503), None)
            time.sleep(0.02)
        assert first_503 is not None, f"/readyz never answered 503 after SIGTERM: {poller.seen[-10:]}"
        # Endpoints take a moment to drop the pod; new connections stop coming after that.
        time.sleep(max(0.0, first_503 + ENDPOINT_LAG - time.monotonic()))
        stop_new.set()
        try:
            exit_code = server.proc.wait(timeout=GRACE + 5)
        except Exception:
            exit_code = None
        exited = time.monotonic()
        slow_thread.join(15)
    finally:
        stop_new.set()
        stop_all.set()
        for thread in (*kept, *fresh, poller):
            thread.join(15)
        server.stop()

    records = tally.snapshot()
    served_after_503 = [r for r in records if r.at > first_503 and not r.problem]
    readiness = poller.seen
    before = [s for at, s in readiness if at < sigterm]
    after_first_503 = [s for at, s in readiness if at > first_503]
    summary = tally.summary()
    figures.update(
        drain_s=DRAIN, readyz_503_after_s=round(first_503 - sigterm, 3), exit_after_s=round(exited - sigterm, 2),
        exit_code=exit_code, grace_s=GRACE, served_during_drain=len(served_after_503),
        last_success_after_sigterm_s=round(max(r.at for r in served_after_503) - sigterm, 2)
        if served_after_503 else None,
        slow_request=slow.get("problem") or "ok", keepalive_closed_by_server=[c.closed_by_server for c in kept],
        readiness_polls=len(readiness), **summary,
    )
    assert summary["failed"] == 0, summary
    assert set(before) == {200}, f"/readyz before SIGTERM: {before}"
    assert first_503 - sigterm < 1.0
    assert 200 not in after_first_503, "/readyz went back to 200 while draining"
    assert slow.get("problem") is None, f"the in-flight request failed: {slow}"
    assert served_after_503, "nothing was served during the drain"
    assert max(r.at for r in served_after_503) - sigterm >= DRAIN * 0.8, "admissions stopped before the drain ended"
    assert all(c.closed_by_server for c in kept), "kept-alive connections must be closed by the server, not broken"
    assert exit_code == 0, server.log.read_text()[-3000:]
    assert exited - sigterm < GRACE
