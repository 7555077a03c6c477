"""One way to find credentials for every subcommand (serve's informers, the audit, the Lease), and one error
per HTTP status."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from webhook.kube import client
from webhook.kube.client import ApiError, ConfigError, Gone, NotServed, configuration, error_for
from webhook.kube.informer import KubeSource


def kubeconfig(path: Path, server: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return path


@pytest.fixture
def place(tmp_path, monkeypatch):
    """An empty HOME, no $KUBECONFIG, not in a cluster; the in-cluster loader replaced by one that says so."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def in_cluster(client_configuration):
        client_configuration.host = "https://in-cluster:443"

    monkeypatch.setattr("kubernetes.config.load_incluster_config", in_cluster)
    return tmp_path


@pytest.mark.parametrize(
    ("flag", "env", "in_cluster", "home", "expected"),
    [
        # the order controller-runtime uses: --kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config
        (True, True, True, True, "https://flag:6443"),
        (False, True, True, True, "https://env:6443"),
        (False, False, True, True, "https://in-cluster:443"),
        (False, False, False, True, "https://home:6443"),
    ],
)
def test_credentials_are_found_in_one_order(place, monkeypatch, flag, env, in_cluster, home, expected):
    flag_file = kubeconfig(place / "flag.yaml", "https://flag:6443")
    if env:
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig(place / "env.yaml", "https://env:6443")))
    if in_cluster:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    if home:
        kubeconfig(place / "home" / ".kube" / "config", "https://home:6443")
    settings = configuration(str(flag_file) if flag else None)
    assert settings.host == expected


def test_the_informers_connect_through_the_same_loader(place, monkeypatch):
    kubeconfig(place / "home" / ".kube" / "config", "https://home:6443")
    seen = []
    monkeypatch.setattr(client.Kube, "stream", lambda self, path, query, timeout: seen.append(self.host) or 1)
    assert KubeSource(None)._get("/api/v1/nodes", {}, 1.0) == 1
    assert seen == ["https://home:6443"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("nothing", "no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster"),
        ("missing-flag", "kubeconfig {tmp}/absent.yaml: no such file"),
        ("missing-env", "kubeconfig {tmp}/absent.yaml: no such file"),
        ("broken", "cannot load {tmp}/broken.yaml: "),
    ],
)
def test_no_usable_credentials_is_one_line(place, monkeypatch, setup, message):
    flag = None
    if setup == "missing-flag":
        flag = str(place / "absent.yaml")
    elif setup == "missing-env":
        monkeypatch.setenv("KUBECONFIG", str(place / "absent.yaml"))
    elif setup == "broken":
        (place / "broken.yaml").write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
        flag = str(place / "broken.yaml")
    with pytest.raises(ConfigError) as caught:
        configuration(flag)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(message.format(tmp=place))


def test_each_status_has_its_error():
    assert isinstance(error_for(404, "NotFound", "x"), NotServed)
    assert isinstance(error_for(410, "Expired", "x"), Gone)
    other = error_for(403, "Forbidden", "no")
    assert type(other) is ApiError and other.status == 403 and str(other) == "Forbidden: no"
    assert str(error_for(500, "", "boom")) == "HTTP 500: boom"
    assert issubclass(NotServed, ApiError) and issubclass(Gone, ApiError)
