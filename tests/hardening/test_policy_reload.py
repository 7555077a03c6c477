"""Policy reload under load, the policy mounted as the kubelet mounts a ConfigMap: every broken version is
refused and the last good policy stays in force, a good one takes over, and no request fails meanwhile."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.hardening.harness import (
    GPU,
    AtomicVolume,
    Call,
    LoadClient,
    Tally,
    _review,
    get,
    start_server,
    wait_for,
)
from tests.manifests import container, pod
from tests.server import client_context

GOOD_BEFORE = b"limits: {perContainer: 1}\n"  # two GPUs in one container: denied
GOOD_AFTER = b"limits: {perContainer: 2}\n"  # two GPUs in one container: admitted
BROKEN = {
    "yaml syntax": b"limits: {perContainer: 2\n",
    "unknown key": b"limitz: {perContainer: 2}\n",
    "bad value": b"limits: {perContainer: lots}\n",
    "default not allowed": b"accelerator: {allowed: [nvidia-l4], default: nvidia-t4}\n",
    "not utf-8": b"limits: {perContainer: \xff\xfe}\n",
    "key removed": None,  # the ConfigMap lost the key: the file is gone
}
HOLD = 1.6  # each version stays longer than the server's 1 s poll


@pytest.mark.slow
def test_broken_policies_under_load_keep_the_last_good_one_and_fail_no_request(tmp_path, figures):
    volume = AtomicVolume(tmp_path / "policy")
    volume.publish({"policy.yaml": GOOD_BEFORE})
    server = start_server(tmp_path, "--policy", str(volume.path("policy.yaml")))
    context = client_context(server.ca)
    expect: dict[str, bool | None] = {"allowed": False}

    def two_gpus() -> Call:
        uid = str(uuid.uuid4())
        return Call("/validate", _review(pod(container(limits={GPU: 2})), uid), uid, expect["allowed"])

    tally, stop = Tally(), threading.Event()
    deadline = time.monotonic() + 60
    clients = [
        LoadClient("keepalive-0", server.port, context, [two_gpus], tally, stop, deadline, rate=20),
        LoadClient("keepalive-1", server.port, context, [two_gpus], tally, stop, deadline, rate=20),
        LoadClient("fresh", server.port, context, [two_gpus], tally, stop, deadline, rate=8, keep_alive=False),
    ]
    readiness: list[int] = []
    took_over = None
    started = time.monotonic()
    try:
        for client in clients:
            client.start()
        time.sleep(HOLD)
        for text in BROKEN.values():
            volume.publish({"policy.yaml": text} if text is not None else {"other.yaml": b"x: 1\n"})
            until = time.monotonic() + HOLD
            while time.monotonic() < until:
                readiness.append(get(server.port, context, "/readyz")[0])
                time.sleep(0.2)
        expect["allowed"] = None  # set before the swap: answers in flight may come from either policy
        swapped = time.monotonic()
        volume.publish({"policy.yaml": GOOD_AFTER})
        probe = two_gpus()
        assert wait_for(lambda: b'"allowed":true' in server.post("/validate", probe.body).body, timeout=5)
        took_over = time.monotonic() - swapped
        time.sleep(0.5)
        expect["allowed"] = True
        time.sleep(HOLD)
    finally:
        stop.set()
        for client in clients:
            client.join(15)
        try:
            failures = server.metric("gpu_webhook_reloads_total", what="policy", result="failure")
            successes = server.metric("gpu_webhook_reloads_total", what="policy", result="success")
        finally:
            server.stop()

    log = server.log.read_text()
    summary = tally.summary()
    figures.update(broken_versions=len(BROKEN), reload_failures=failures, reload_successes=successes,
                   reload_failed_log_lines=log.count('"reload_failed"'),
                   new_policy_in_force_after_s=round(took_over, 2) if took_over else None,
                   readyz_polls=len(readiness), readyz_not_200=sum(s != 200 for s in readiness),
                   seconds=round(time.monotonic() - started, 1), **summary)
    assert summary["failed"] == 0, summary
    assert summary["sent"] > 200, summary
    assert set(readiness) == {200}, "a broken policy must not make the server unready"
    assert failures == len(BROKEN), "every broken version is noticed and refused"
    assert successes >= 1
    assert log.count('"reload_failed"') == len(BROKEN)
