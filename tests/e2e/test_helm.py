"""``helm install`` of the chart into the e2e control plane, with the real helm built from the Go module proxy.

What is real: helm (built by build-control-plane.sh, ``cluster.binary("helm")``), the kube-apiserver, the chart
installed the way a user installs it (``certs.mode=helm``, webhooks that call the chart's Service, no test-only
values), the CA and serving certificate helm generates, and the webhook server started with the Deployment's own
arguments. What is missing: a kubelet and a controller-manager, so the Deployment never gets a pod (hence no
``--wait``), and no kube-proxy.

How the rendered Service reaches a process on loopback
------------------------------------------------------
The bed's apiserver runs with ``--service-cluster-ip-range=127.0.100.0/24``, so the chart's ClusterIP Service
gets a loopback address (127.0.100.x). The apiserver resolves a webhook's ``clientConfig.service`` by itself, to
``https://<clusterIP>:<service port>``, with TLS server name ``<svc>.<ns>.svc``; no kube-proxy is involved. The
test installs with ``service.port`` and ``server.port`` set to one free port (and ``metrics.port``, the plain-HTTP
port of /metrics and the probes, to another), then does the kubelet's job: it
writes the Deployment's Secret and ConfigMap volumes to a directory and runs the container's ``args`` (paths
mapped to that directory) listening on the ClusterIP. So the apiserver checks the chart's certificate against the
chart's caBundle under the chart's Service name, which is what happens on a real cluster minus the pod network.

Other ways to do it:

- Endpoints or an EndpointSlice at 127.0.0.1: the apiserver refuses them (tried on v1.36.3 with kubectl)::

    The Endpoints "wh" is invalid: subsets[0].addresses[0].ip: Invalid value: "127.0.0.1": may not be in the
    loopback range (127.0.0.0/8, ::1/128)
    EndpointSlice.discovery.k8s.io "wh-1" is invalid: endpoints[0].addresses[0]: Invalid value: "127.0.0.1":
    may not be in the loopback range (127.0.0.0/8, ::1/128)

- ``webhook.url``, the chart's test-bed switch (``clientConfig.url``): works, but skips the Service and the
  certificate's DNS names and needs an IP SAN. The first test below uses it, together with ``certs.mode=secret``,
  so that cert mode gets a live install too. cert-manager mode needs cert-manager's controllers:
  test_node_cert_manager.py installs it on the node bed.

The releases are called ``gw-url`` and ``gw-helm``, not ``gpu-webhook``. tests/e2e/bed.py deletes configurations
by ``app.kubernetes.io/instance=gpu-webhook``, and its module fixture has already unregistered its own webhooks
before this module runs, so only this module's webhooks are called here. Each release is uninstalled, even when a
test fails. The ``gpu-system`` namespace is left in place: no namespace controller runs here, so deleting it would
leave it Terminating forever.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import shlex
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.cluster import NO_PROXY_ENV, ControlPlane
from tests.manifests import container, pod, seed_pod
from tests.server import GPU_WEBHOOK, WebhookProcess, free_port, make_certs, metric_sum, start_webhook, wait_ready

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
NAMESPACE = "gpu-system"
RELEASE = "gw-helm"
FULLNAME = f"{RELEASE}-gpu-webhook"  # the chart's "<release>-gpu-webhook"
KINDS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
PATHS = {"mutatingwebhookconfiguration": "/mutate", "validatingwebhookconfiguration": "/validate"}
OUR_DENIAL = 'admission webhook "validate.gpu-webhook.io" denied the request: '
# A GPU pod only our webhook refuses: its annotation and its nodeSelector ask for different accelerators
# (the pod of the chart's NOTES).
CONFLICT = pod(container(limits={GPU: 1}), name="gpu-test", annotations={"gpu-webhook/accelerator": "model-a"},
               nodeSelector={"accelerator": "model-b"})
CONFLICT_MESSAGE = (OUR_DENIAL + "1 GPU violation: metadata.annotations[gpu-webhook/accelerator]: annotation "
                    "gpu-webhook/accelerator=model-a conflicts with nodeSelector accelerator=model-b")


class Helm:
    """The real helm against the bed, with its config, cache and data kept in a temporary home."""

    def __init__(self, cluster: ControlPlane, home: Path):
        self.cluster = cluster
        self.env = {k: v for k, v in NO_PROXY_ENV.items() if not k.startswith(("HELM_", "KUBE"))}
        self.env.update(HOME=str(home), HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
                        HELM_DATA_HOME=str(home / "data"))

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([self.cluster.binary("helm"), f"--kubeconfig={self.cluster.kubeconfig}", *args],
                                capture_output=True, text=True, timeout=120, env=self.env, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {shlex.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result


@pytest.fixture(scope="module")
def helm(cluster, tmp_path_factory) -> Helm:
    return Helm(cluster, tmp_path_factory.mktemp("helm-home"))


def get(cluster: ControlPlane, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json", check=True).stdout)


def webhook_configurations(cluster: ControlPlane, name: str) -> dict[str, dict]:
    """kind -> the first webhook of that configuration (mutate.gpu-webhook.io, validate.gpu-webhook.io); the
    validating configuration also holds validate-dra.gpu-webhook.io and validate-custom.gpu-webhook.io (every
    custom kind the webhook knows), with the same client configuration."""
    found = {}
    for kind in KINDS:
        webhooks = get(cluster, kind, name)["webhooks"]
        assert [w["name"] for w in webhooks] in (["mutate.gpu-webhook.io"],
                                                 ["validate.gpu-webhook.io", "validate-dra.gpu-webhook.io",
                                                  "validate-custom.gpu-webhook.io"])
        assert all(w["clientConfig"].get("caBundle") == webhooks[0]["clientConfig"].get("caBundle") for w in webhooks)
        found[kind] = webhooks[0]
    return found


def secret_data(cluster: ControlPlane, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in get(cluster, "secret", "-n", NAMESPACE, name)["data"].items()}


def dry_run_until(cluster: ControlPlane, obj: dict, accept: Callable[[subprocess.CompletedProcess], bool],
                  timeout: float = 30) -> subprocess.CompletedProcess:
    """Dry-run-create ``obj`` (admission runs, nothing is stored) until ``accept`` holds: the apiserver picks up
    new, changed and deleted webhook configurations asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        result = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(obj))
        if accept(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not accepted within {timeout}s: rc={result.returncode} {result.stderr}")
        time.sleep(0.2)


def refused_by_us(result: subprocess.CompletedProcess) -> bool:
    return result.returncode != 0 and OUR_DENIAL in result.stderr


def gone(cluster: ControlPlane, kind: str, name: str) -> bool:
    result = cluster.kubectl("get", kind, name)
    return result.returncode != 0 and "NotFound" in result.stderr


def remove_release(helm: Helm, cluster: ControlPlane, name: str) -> None:
    """Cleanup that never raises: uninstall, and delete the configurations should helm have failed to."""
    helm("uninstall", name, "-n", NAMESPACE, "--ignore-not-found", check=False)
    for kind in KINDS:
        cluster.kubectl("delete", kind, "-l", f"app.kubernetes.io/instance={name}", "--ignore-not-found")
    forget_policy_crd(cluster.kubectl)


# --- certs.mode=secret through webhook.url --------------------------------------------------------------------
# Defined first so it runs before (and never alongside) the gw-helm release of the tests below.


def test_secret_mode_through_webhook_url_admits_and_refuses_and_uninstalls(cluster, helm, tmp_path):
    name = "gw-url"
    tls = make_certs(tmp_path / "tls", "127.0.0.1")  # `gpu-webhook certs --host 127.0.0.1`: the URL's IP SAN
    cluster.kubectl("create", "namespace", NAMESPACE)  # may exist already
    cluster.kubectl("-n", NAMESPACE, "create", "secret", "tls", f"{name}-tls", f"--cert={tls['cert']}",
                    f"--key={tls['key']}", check=True)
    server = start_webhook(tmp_path, certs=tls)
    try:
        installed = helm("install", name, str(CHART), "-n", NAMESPACE, "--set", "certs.mode=secret",
                         "--set", "image.repository=localhost/gpu-webhook",
                         "--set", f"certs.secret.name={name}-tls",
                         "--set", f"certs.secret.caBundle={base64.b64encode(tls['ca'].read_bytes()).decode()}",
                         "--set", f"webhook.url={server.address}")
        assert f"WARNING: webhook.url is set: the apiserver calls {server.address} instead of the Service." \
               in installed.stdout
        for kind, webhook in webhook_configurations(cluster, f"{name}-gpu-webhook").items():
            assert webhook["clientConfig"] == {"url": server.address + PATHS[kind],
                                               "caBundle": base64.b64encode(tls["ca"].read_bytes()).decode()}
        refused = dry_run_until(cluster, CONFLICT, refused_by_us)
        # What kubectl prints; it names the file (stdin) the object came from.
        printed = 'Error from server (Forbidden): error when creating "STDIN": ' + CONFLICT_MESSAGE
        assert refused.stderr.strip() == printed

        helm("uninstall", name, "-n", NAMESPACE)
        assert all(gone(cluster, kind, f"{name}-gpu-webhook") for kind in KINDS)
        forget_policy_crd(cluster.kubectl)  # kept by helm; the next release has another name
        dry_run_until(cluster, CONFLICT, lambda r: r.returncode == 0)
    finally:
        server.stop()
        remove_release(helm, cluster, name)
        cluster.kubectl("-n", NAMESPACE, "delete", "secret", f"{name}-tls", "--ignore-not-found")


# --- certs.mode=helm through the chart's Service ------------------------------------------------------------------


@dataclass
class PodOnHost(WebhookProcess):
    """The Deployment's container run on this machine (there is no kubelet), listening on the Service's ClusterIP."""

    host: str = ""
    metrics_port: int = 0  # the container port named "metrics" (plain HTTP: /metrics, /healthz, /readyz)

    def operations(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` on the metrics port, over plain HTTP as the kubelet and Prometheus do."""
        conn = http.client.HTTPConnection(self.host, self.metrics_port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def metric(self, name: str, **labels: str) -> float:
        """As WebhookProcess.metric, from the metrics port: the chart's --metrics-port takes /metrics off HTTPS."""
        status, body = self.operations("/metrics")
        assert status == 200, body
        return metric_sum(body.decode(), name, **labels)

    def connection(self, context: ssl.SSLContext | None = None, timeout: float = 10) -> http.client.HTTPSConnection:
        if context is None:  # trust only the chart's CA; the name is checked in the caBundle test
            context = ssl.create_default_context(cafile=str(self.ca))
            context.check_hostname = False
        return http.client.HTTPSConnection(self.host, self.port, context=context, timeout=timeout)


def mount_volumes(cluster: ControlPlane, pod_spec: dict, root: Path) -> dict[str, Path]:
    """Write the pod's Secret and ConfigMap volumes under ``root``, as the kubelet does; returns mountPath -> dir.
    Run again, it is the kubelet's sync: changed keys are replaced atomically, and the server reloads them."""
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    mounts = {}
    for mount in pod_spec["containers"][0]["volumeMounts"]:
        volume, directory = volumes[mount["name"]], root / mount["name"]
        directory.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {}
        if "secret" in volume:
            files = secret_data(cluster, volume["secret"]["secretName"])
        elif "configMap" in volume:
            data = get(cluster, "configmap", "-n", NAMESPACE, volume["configMap"]["name"])["data"]
            files = {k: v.encode() for k, v in data.items()}
        for key, content in files.items():
            staged = directory / f".{key}.new"
            staged.write_bytes(content)
            staged.chmod(0o600)
            staged.replace(directory / key)
        mounts[mount["mountPath"]] = directory
    return mounts


def on_host(arg: str, mounts: dict[str, Path]) -> str:
    """``--cert-file=/tls/tls.crt`` -> ``--cert-file=<root>/volumes/tls/tls.crt``: a container path in an argument,
    mapped to where mount_volumes wrote that volume."""
    flag, sep, value = arg.partition("=") if "=" in arg else ("", "", arg)
    for mount_path, directory in mounts.items():
        prefix = mount_path.rstrip("/") + "/"
        if value.startswith(prefix):
            return f"{flag}{sep}{directory}/{value[len(prefix):]}"
    return arg


def run_pod_on_host(cluster: ControlPlane, root: Path) -> PodOnHost:
    deployment = get(cluster, "deployment", "-n", NAMESPACE, FULLNAME)
    service = get(cluster, "service", "-n", NAMESPACE, FULLNAME)["spec"]
    cluster_ip = service["clusterIP"]
    # Never let the apiserver (or us) dial a real network: the bed's service range must be loopback.
    assert ipaddress.ip_address(cluster_ip).is_loopback, cluster_ip
    spec = deployment["spec"]["template"]["spec"]
    [main] = spec["containers"]
    assert "command" not in main  # the image's ENTRYPOINT, gpu-webhook, runs the args
    assert service["ports"][0]["port"] == main["ports"][0]["containerPort"]  # both set to one free port
    container_ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert {p["name"]: p["port"] for p in service["ports"]}["metrics"] == container_ports["metrics"]
    mounts = mount_volumes(cluster, spec, root / "volumes")
    args = [on_host(arg, mounts) for arg in main["args"]]
    log = root / "webhook.log"
    with log.open("wb") as out:
        # The pod's credentials (the chart gives it a token: it reads GPUPolicy/default), as the bed's kubeconfig.
        proc = subprocess.Popen([*GPU_WEBHOOK, *args, "--host", cluster_ip], stdout=out, stderr=subprocess.STDOUT,
                                env={**NO_PROXY_ENV, "TMPDIR": str(mounts["/tmp"]),
                                     "KUBECONFIG": str(cluster.kubeconfig)})
    server = PodOnHost(service["ports"][0]["port"], mounts["/tls"] / "ca.crt", mounts["/tls"] / "tls.crt",
                       mounts["/tls"] / "tls.key", log, proc, args, host=cluster_ip,
                       metrics_port=container_ports["metrics"])
    wait_ready(server)
    return server


@dataclass
class Release:
    install: subprocess.CompletedProcess
    server: PodOnHost
    port: int
    root: Path


@pytest.fixture(scope="module")
def release(cluster, helm, tmp_path_factory) -> Iterator[Release]:
    """``helm install`` in certs.mode=helm, then the Deployment's pod started on this machine; always removed."""
    root = tmp_path_factory.mktemp("gw-helm")
    port = free_port()
    metrics_port = free_port()
    server = None
    try:
        install = helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
                       "--set", "certs.mode=helm", "--set", f"service.port={port}", "--set", f"server.port={port}",
                       "--set", "image.repository=localhost/gpu-webhook",
                       "--set", f"metrics.port={metrics_port}",
                       "--set", "policy.accelerator.default=nvidia-tesla-k80")
        server = run_pod_on_host(cluster, root)
        dry_run_until(cluster, CONFLICT, refused_by_us)  # the apiserver has picked the configurations up
        yield Release(install, server, port, root)
    finally:
        if server is not None:
            server.stop()
        remove_release(helm, cluster, RELEASE)


def test_helm_install_creates_both_configurations_whose_ca_bundle_verifies_the_serving_certificate(cluster, release):
    assert "STATUS: deployed" in release.install.stdout
    tls = secret_data(cluster, f"{FULLNAME}-tls")
    assert sorted(tls) == ["ca.crt", "tls.crt", "tls.key"]
    serving = x509.load_pem_x509_certificate(tls["tls.crt"])
    server_name = f"{FULLNAME}.{NAMESPACE}.svc"  # what the apiserver checks for clientConfig.service
    for kind, webhook in webhook_configurations(cluster, FULLNAME).items():
        client = webhook["clientConfig"]
        assert client["service"] == {"name": FULLNAME, "namespace": NAMESPACE, "path": PATHS[kind],
                                     "port": release.port}
        bundle = base64.b64decode(client["caBundle"])
        assert bundle == tls["ca.crt"]
        serving.verify_directly_issued_by(x509.load_pem_x509_certificate(bundle))
        # The handshake the apiserver makes: this bundle as the only trust root, the Service's name, the ClusterIP.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(cadata=bundle.decode())
        with socket.create_connection((release.server.host, release.port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=server_name) as conn:
            assert conn.getpeercert(binary_form=True) == serving.public_bytes(Encoding.DER)


def test_the_deployments_probes_pass_over_plain_http_and_metrics_left_the_https_port(cluster, release):
    """The probes exactly as the kubelet runs them from the stored Deployment (scheme, named port, path), and
    /metrics only where the Service's ``metrics`` port (the ServiceMonitor's target) sends Prometheus."""
    [main] = get(cluster, "deployment", "-n", NAMESPACE, FULLNAME)["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in main["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        action = main[probe]["httpGet"]
        assert action["scheme"] == "HTTP" and named[action["port"]] == release.server.metrics_port
        status, body = release.server.operations(action["path"])
        assert status == 200, (probe, body)
    status, body = release.server.operations("/metrics")
    assert status == 200 and b"gpu_webhook_requests_total" in body
    assert release.server.request("GET", "/metrics").status == 404  # HTTPS: the apiserver's port only
    assert release.server.request("GET", "/readyz").status == 200  # still on both
    assert release.server.operations("/validate")[0] == 404  # no admissions over plain HTTP


def test_the_notes_one_liner_is_refused_by_the_webhook_with_the_message_the_notes_show(cluster, release):
    notes = [line.strip() for line in release.install.stdout.splitlines()]
    [command] = [line for line in notes if line.startswith("kubectl ") and " run gpu-test " in line]
    [promised] = [line for line in notes if line.startswith("Error from server (Forbidden): ")]
    before = release.server.metric("gpu_webhook_requests_total", endpoint="validate")
    result = cluster.kubectl(*shlex.split(command)[1:])
    assert result.returncode != 0
    assert result.stderr.strip() == promised == f"Error from server (Forbidden): {CONFLICT_MESSAGE}"
    # Answered by the process behind the Service, not by anything else.
    assert release.server.metric("gpu_webhook_requests_total", endpoint="validate") == before + 1


def test_the_seed_pod_is_admitted_with_the_accelerator_selector_from_the_charts_policy(cluster, release):
    seed = seed_pod()
    seed["metadata"]["name"] = "helm-seed"
    del seed["spec"]["nodeSelector"]
    created = cluster.kubectl("create", "-o", "json", "-f", "-", stdin=json.dumps(seed), check=True)
    try:
        stored = json.loads(created.stdout)["spec"]
        assert stored["nodeSelector"] == {"accelerator": "nvidia-tesla-k80"}  # --set policy.accelerator.default
        assert stored["containers"][0]["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    finally:
        cluster.kubectl("delete", "pod", "helm-seed", "--wait=false", "--ignore-not-found")


def test_helm_upgrade_keeps_the_ca_and_serving_certificate(cluster, helm, release):
    before_tls = secret_data(cluster, f"{FULLNAME}-tls")
    before = webhook_configurations(cluster, FULLNAME)
    upgraded = helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
                    "--set", "webhook.timeoutSeconds=7", "--set", "policy.accelerator.default=nvidia-l4")
    assert "STATUS: deployed" in upgraded.stdout and "REVISION: 2" in upgraded.stdout
    assert secret_data(cluster, f"{FULLNAME}-tls") == before_tls  # ca.crt, tls.crt and tls.key, byte for byte
    after = webhook_configurations(cluster, FULLNAME)
    for kind in KINDS:
        assert after[kind]["timeoutSeconds"] == 7  # the upgrade did rewrite both configurations...
        assert after[kind]["clientConfig"]["caBundle"] == before[kind]["clientConfig"]["caBundle"]  # ...not the CA
        assert base64.b64decode(after[kind]["clientConfig"]["caBundle"]) == before_tls["ca.crt"]
    # The changed policy ConfigMap reaches the running pod (the kubelet's sync); the server reloads it and the
    # apiserver still trusts it: the seed pod now gets the new default.
    mount_volumes(cluster, get(cluster, "deployment", "-n", NAMESPACE, FULLNAME)["spec"]["template"]["spec"],
                  release.root / "volumes")
    seed = seed_pod()
    del seed["spec"]["nodeSelector"]
    dry_run_until(cluster, seed, lambda r: r.returncode == 0
                  and json.loads(r.stdout)["spec"].get("nodeSelector") == {"accelerator": "nvidia-l4"})


def test_helm_uninstall_removes_the_webhooks_so_gpu_pods_are_not_blocked(cluster, helm, release):
    uninstalled = helm("uninstall", RELEASE, "-n", NAMESPACE)
    assert f'release "{RELEASE}" uninstalled' in uninstalled.stdout
    assert all(gone(cluster, kind, FULLNAME) for kind in KINDS)
    left = cluster.kubectl("get", "all,secret,configmap,serviceaccount,poddisruptionbudget", "-n", NAMESPACE,
                           "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name", check=True)
    assert left.stdout == ""
    assert cluster.kubectl("get", "secret", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}", "-o", "name",
                           check=True).stdout == ""  # no release history kept
    release.server.stop()  # the Deployment's pods go with the release
    # Nothing is left to call, or to fail closed: the conflicting GPU pod passes the built-in validation.
    admitted = dry_run_until(cluster, CONFLICT, lambda r: r.returncode == 0)
    assert json.loads(admitted.stdout)["spec"]["nodeSelector"] == {"accelerator": "model-b"}  # and unmutated
