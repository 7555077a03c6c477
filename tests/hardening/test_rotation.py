"""Certificate rotation under load, with the files laid out and swapped as the kubelet updates a mounted Secret."""

from __future__ import annotations

import threading
import time

import pytest

from tests.hardening.harness import (
    AtomicVolume,
    LoadClient,
    Tally,
    der_of,
    served_certificate,
    standard_calls,
    start_server,
    trusting,
    wait_for,
)
from webhook.serving import certs

ROTATIONS = 4
HOLD_SECONDS = 1.5  # load keeps running this long on each certificate once it is served


@pytest.mark.slow
def test_rotating_the_certificate_under_load_fails_nothing_and_new_connections_get_the_new_one(tmp_path, figures):
    bundles = [certs.generate(["127.0.0.1", "localhost"], days=1, ca_name=f"ca-{i}") for i in range(ROTATIONS + 1)]
    ca_files = []
    for i, bundle in enumerate(bundles):
        ca_files.append(tmp_path / f"ca-{i}.crt")
        ca_files[-1].write_bytes(bundle.ca_pem)
    index_of = {der_of(b.cert_pem): i for i, b in enumerate(bundles)}
    every_ca = tmp_path / "ca-bundle.crt"
    every_ca.write_bytes(b"".join(b.ca_pem for b in bundles))

    volume = AtomicVolume(tmp_path / "tls")
    volume.publish({"tls.crt": bundles[0].cert_pem, "tls.key": bundles[0].key_pem})
    server = start_server(tmp_path, certs={"ca": ca_files[0], "cert": volume.path("tls.crt"),
                                            "key": volume.path("tls.key")})
    server.ca = every_ca  # as a caBundle holding old and new CAs during the overlap
    context = trusting(*ca_files)
    tally, stop = Tally(), threading.Event()
    connected: list[tuple[float, int]] = []  # (when it was started, index of the certificate a new connection got)

    def note_certificate(conn, started_at: float) -> None:
        connected.append((started_at, index_of.get(conn.sock.getpeercert(binary_form=True), -1)))

    deadline = time.monotonic() + 60
    clients = [
        LoadClient(f"keepalive-{i}", server.port, context, standard_calls(), tally, stop, deadline, rate=15)
        for i in range(2)
    ] + [
        LoadClient(f"fresh-{i}", server.port, context, standard_calls(), tally, stop, deadline, rate=8,
                   keep_alive=False, on_connect=note_certificate)
        for i in range(2)
    ]
    propagation: list[float] = []
    seen_at: list[float] = []
    started = time.monotonic()
    try:
        for client in clients:
            client.start()
        time.sleep(HOLD_SECONDS)
        for i in range(1, ROTATIONS + 1):
            swapped = time.monotonic()
            volume.publish({"tls.crt": bundles[i].cert_pem, "tls.key": bundles[i].key_pem})
            served = wait_for(lambda i=i: served_certificate(server.port, context) == der_of(bundles[i].cert_pem),
                              timeout=6)
            assert served, f"rotation {i}: the new certificate was not served within 6 s\n{server.log.read_text()}"
            seen_at.append(time.monotonic())
            propagation.append(round(seen_at[-1] - swapped, 2))
            time.sleep(HOLD_SECONDS)
    finally:
        stop.set()
        for client in clients:
            client.join(15)
        try:
            reloads = server.metric("gpu_webhook_reloads_total", what="certificate", result="success")
        finally:
            server.stop()

    summary = tally.summary()
    # Once a certificate is served, no connection started later may get an older one (one worker here).
    stale = [(round(at - started, 2), idx) for at, idx in connected
             for i, seen in enumerate(seen_at, 1) if at > seen and idx < i]
    figures.update(rotations=ROTATIONS, propagation_s=propagation, certificate_reloads=reloads,
                   new_connections_checked=len(connected), stale_certificates=len(stale),
                   seconds=round(time.monotonic() - started, 1), **summary)
    assert summary["failed"] == 0, summary
    assert summary["sent"] > 100, summary
    assert not stale, f"new connections served an old certificate after the new one: {stale[:5]}"
    assert {idx for _, idx in connected} >= set(range(ROTATIONS + 1)), "every certificate served new connections"
    assert -1 not in {idx for _, idx in connected}
    assert reloads >= ROTATIONS
