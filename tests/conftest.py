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


def pytest_configure(config):
    # The tests that start a program (git, the CLI) as a process carry this marker, so a tier that runs only
    # in-process tests can leave them out.
    config.addinivalue_line("markers", "process: starts a server, the CLI or another program as a process")
