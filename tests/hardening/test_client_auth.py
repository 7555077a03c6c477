"""Optional client authentication: with ``--client-ca`` only clients presenting a certificate signed by that CA
(for client use) are served, and the CA file is reloaded like the serving certificate; without it any client is."""

from __future__ import annotations

import http.client
import ssl
import time

import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.hardening.harness import AtomicVolume, Authority, start_server, trusting, wait_for
from tests.manifests import admission_review, seed_pod
from tests.server import client_context

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def attempt(port: int, context: ssl.SSLContext, path: str = "/healthz") -> int | str:
    """The HTTP status, or how the connection was refused."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except ssl.SSLError as exc:
        return exc.reason or type(exc).__name__
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pki")
    apiserver_ca, other_ca, next_ca = Authority("apiserver-client-ca"), Authority("other-ca"), Authority("next-ca")
    identity = {
        "apiserver": apiserver_ca.issue("kube-apiserver").write(tmp, "apiserver"),
        "stranger": other_ca.issue("kube-apiserver").write(tmp, "stranger"),
        # Signed by the right CA, but for serving only: not an identity a client may present.
        "server-only": apiserver_ca.issue("gpu-webhook", ExtendedKeyUsageOID.SERVER_AUTH).write(tmp, "server-only"),
        "next": next_ca.issue("kube-apiserver").write(tmp, "next"),
    }
    return {"tmp": tmp, "cas": {"apiserver": apiserver_ca, "next": next_ca}, "identity": identity}


def context_for(server, pki, who: str | None, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    if who is None:
        context = client_context(server.ca)
    else:
        cert, key = pki["identity"][who]
        context = trusting(server.ca, cert=cert, key=key)
    if version:
        context.minimum_version = context.maximum_version = version
    return context


@pytest.mark.slow
def test_with_client_ca_only_clients_with_a_certificate_from_that_ca_are_served(tmp_path, pki, figures):
    volume = AtomicVolume(tmp_path / "client-ca")
    volume.publish({"ca.crt": pki["cas"]["apiserver"].pem})
    server = start_server(tmp_path, "--client-ca", str(volume.path("ca.crt")), wait=False)
    results: dict[str, int | str] = {}
    try:
        good = context_for(server, pki, "apiserver")
        assert wait_for(lambda: attempt(server.port, good) == 200, timeout=30), server.log.read_text()
        for who in (None, "stranger", "server-only", "apiserver"):
            for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
                results[f"{who or 'no certificate'} {version.name}"] = attempt(
                    server.port, context_for(server, pki, who, version))
        answer = server.post("/validate", admission_review(seed_pod()), context=good)
        assert answer.status == 200 and answer.json()["response"] == {"uid": UID, "allowed": True}

        # The client CA is reloaded like the serving certificate: an overlap bundle, then the new CA alone.
        volume.publish({"ca.crt": pki["cas"]["apiserver"].pem + pki["cas"]["next"].pem})
        rotated = context_for(server, pki, "next")
        assert wait_for(lambda: attempt(server.port, rotated) == 200, timeout=6)
        results["old during overlap"] = attempt(server.port, good)
        volume.publish({"ca.crt": pki["cas"]["next"].pem})
        assert wait_for(lambda: attempt(server.port, good) != 200, timeout=6)
        results["old after rotation"] = attempt(server.port, good)
        results["new after rotation"] = attempt(server.port, rotated)
        time.sleep(0.2)
        assert server.proc.poll() is None
    finally:
        figures.update(results)
        server.stop()
    for key, result in results.items():
        served = key.startswith("apiserver") or key in ("old during overlap", "new after rotation")
        assert (result == 200) is served, (key, result)


def test_without_client_ca_clients_need_no_certificate(tmp_path, pki, figures):
    server = start_server(tmp_path)
    try:
        plain = attempt(server.port, context_for(server, pki, None))
        with_certificate = attempt(server.port, context_for(server, pki, "apiserver"))
        answer = server.post("/validate", admission_review(seed_pod()))
    finally:
        server.stop()
    figures.update(no_certificate=plain, with_certificate=with_certificate)
    assert answer.status == 200 and answer.json()["response"]["allowed"] is True
    assert plain == 200 and with_certificate == 200
