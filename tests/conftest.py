import pytest

from tests.server import start_webhook


@pytest.fixture(scope="module")
def webhook(tmp_path_factory):
    """One server for a test module, with the default policy plus a per-pod cap of 4 and a namespace in warn mode."""
    tmp = tmp_path_factory.mktemp("webhook")
    policy = tmp / "policy.yaml"
    policy.write_text("limits: {perPod: 4}\nnamespaces: {research: {enforcement: warn}}\n")
    server = start_webhook(tmp, "--policy", str(policy))
    yield server
    server.stop()
