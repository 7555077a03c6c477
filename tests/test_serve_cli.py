"""`gpu-webhook serve` refuses what it cannot serve in one line and exit 2, before any worker starts:
a busy port, files that are missing or are not what their option says, a key that is not the certificate's."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.server import GPU_WEBHOOK, free_port, make_certs

pytestmark = pytest.mark.process


def serve(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*GPU_WEBHOOK, "serve", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("other"))


def one_line_refusal(done: subprocess.CompletedProcess, says: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("gpu-webhook: cannot serve: ") and says in lines[0], lines[0]
    assert "Traceback" not in done.stderr and not done.stdout


def test_a_port_in_use_is_one_line_and_exit_2(pair):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        done = serve("--host", "127.0.0.1", "--port", str(port), "--cert-file", str(pair["cert"]),
                     "--key-file", str(pair["key"]))
    one_line_refusal(done, f"127.0.0.1:{port} is already in use")
    assert time.monotonic() - started < 10  # no retries against the other server


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (lambda p, o: (p["cert"].parent / "missing.crt", p["key"]), "--cert-file {cert}: no such file"),
        (lambda p, o: (p["cert"], p["key"].parent / "missing.key"), "--key-file {key}: no such file"),
        (lambda p, o: (p["key"], p["key"]), "--cert-file {cert} is not a PEM certificate (it holds a private key)"),
        (lambda p, o: (p["cert"], p["cert"]), "--key-file {key} is not an unencrypted PEM private key (it holds a "
                                              "certificate)"),
        (lambda p, o: (p["cert"], o["key"]), "--key-file {key} does not belong to the certificate in --cert-file "
                                             "{cert}"),
    ],
    ids=["missing certificate", "missing key", "key given as certificate", "certificate given as key",
         "key of another certificate"],
)
def test_tls_files_are_checked_and_named(pair, other, files, says):
    cert, key = files(pair, other)
    done = serve("--port", str(free_port()), "--cert-file", str(cert), "--key-file", str(key))
    one_line_refusal(done, says.format(cert=cert, key=key))


def test_a_client_ca_that_holds_no_certificate_is_named(pair):
    done = serve("--port", str(free_port()), "--cert-file", str(pair["cert"]), "--key-file", str(pair["key"]),
                 "--client-ca", str(pair["key"]))
    one_line_refusal(done, f"--client-ca {pair['key']} holds no PEM certificate (it holds a private key)")


def test_self_signed_listens_on_localhost_only(tmp_path):
    """--self-signed is for trying the webhook out: it must not expose a laptop on every interface."""
    port = free_port()
    proc = subprocess.Popen([*GPU_WEBHOOK, "serve", "--self-signed", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        bound = None
        while time.monotonic() < deadline and bound is None:
            for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if int(hex_port, 16) == port and state == "0A":  # LISTEN
                    bound = socket.inet_ntoa(bytes.fromhex(address)[::-1])
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert bound == "127.0.0.1"
