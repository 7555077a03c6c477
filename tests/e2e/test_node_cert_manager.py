"""``certs.mode=cert-manager`` on a real node (tests/e2e/node.py) with a real cert-manager: its controller and
cainjector (tests/e2e/build-cert-manager.sh, CERT_MANAGER_VERSION in versions.env) run beside the bed's control
plane with its admin credentials, its CRDs applied; the chart is installed as the README's cluster quick start
does, with ``--set certs.mode=cert-manager`` and two replicas.

- install: cert-manager issues the chart's CA and serving certificate, the cainjector fills both webhook
  configurations' caBundle with that CA, the pods serve the issued certificate, the apiserver calls them
  through the Service (a GPU pod mutated, a pod over the cap refused);
- renewal under load: a re-issue triggered as ``cmctl renew`` does (the Certificate's ``Issuing`` condition),
  cert-manager writes a new certificate with a new key (the chart's ``rotationPolicy: Always``) into the Secret,
  the running pods reload it, while dry-run GPU pod creations go on: zero failed admissions.

Figures are printed at the end of the module (``-s`` shows them) and quoted in tests/e2e/README.md.
"""

from __future__ import annotations

import base64
import datetime
import json
import time
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.e2e.bed import CHART, forget_policy_crd
from tests.e2e.node import NodeBed, until
from tests.e2e.test_node_release import (
    NAMESPACE,
    POLICY,
    RELEASE,
    _assert_no_failures,
    _dry_run,
    _fingerprint,
    _load,
    _pods,
    _reloads,
    _served_certificates,
    _settle,
)
from tests.manifests import container, pod, seed_pod
from tests.tools import cache_root, unavailable, versions

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

CERTIFICATE = f"{RELEASE}-tls"  # the serving Certificate and its Secret
CA_SECRET = f"{RELEASE}-ca"
CONFIGURATIONS = (("validatingwebhookconfiguration", RELEASE), ("mutatingwebhookconfiguration", RELEASE))
LABEL = {"app.kubernetes.io/part-of": "gw-e2e-cert-manager"}

FIGURES: dict[str, object] = {}


def bin_dir() -> Path:
    return cache_root() / "cert-manager" / versions()["CERT_MANAGER_VERSION"] / "bin"


def _crds(directory: Path) -> list[dict]:
    """cert-manager's CRDs as its module ships them, their Helm-templated labels replaced by ours."""
    documents = []
    for path in sorted(directory.glob("crd-*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                document["metadata"]["labels"] = dict(LABEL)
                documents.append(document)
    return documents


def _secret_pem(bed: NodeBed, name: str, key: str) -> bytes:
    secret = bed.kubectl_json("get", "secret", name, "-n", NAMESPACE)
    return base64.b64decode(secret["data"][key])


def _ready(bed: NodeBed, certificate: str) -> dict | None:
    """The Certificate when cert-manager reports it Ready, else None."""
    got = bed.kubectl("get", "certificate", certificate, "-n", NAMESPACE, "-o", "json")
    if got.returncode:
        return None
    document = json.loads(got.stdout)
    conditions = document.get("status", {}).get("conditions", [])
    return document if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None


def _ca_bundles(bed: NodeBed) -> set[bytes]:
    """Every caBundle of the chart's two webhook configurations (empty bytes where none is set)."""
    bundles = set()
    for kind, name in CONFIGURATIONS:
        for webhook in bed.kubectl_json("get", kind, name)["webhooks"]:
            bundles.add(base64.b64decode(webhook["clientConfig"].get("caBundle", "")))
    return bundles


def _renew(bed: NodeBed, certificate: str) -> None:
    """What ``cmctl renew`` does: the Issuing condition, True, set on the Certificate's status."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered", "lastTransitionTime": now,
                 "message": "Certificate re-issuance manually triggered"}
    patch = [{"op": "add", "path": "/status/conditions/-", "value": condition}]
    bed.kubectl("patch", "certificate", certificate, "-n", NAMESPACE, "--subresource=status", "--type=json",
                "-p", json.dumps(patch), check=True)


@pytest.fixture(scope="module")
def cert_manager(node_bed: NodeBed):
    """cert-manager's CRDs applied and its controller and cainjector running against the bed's apiserver."""
    bed = node_bed
    directory = bin_dir()
    absent = [n for n in ("cert-manager-controller", "cert-manager-cainjector") if not (directory / n).is_file()]
    if absent or not list((directory / "crds").glob("crd-*.yaml")):
        unavailable("cert-manager", f"{', '.join(absent) or 'CRDs'} not built in {directory}", "cert-manager")
    crds = _crds(directory / "crds")
    processes = []
    try:
        bed.kubectl("apply", "--server-side", "-f", "-", stdin="\n---\n".join(json.dumps(c) for c in crds),
                    check=True)
        bed.kubectl("wait", "--for=condition=Established", "crd", "-l", "app.kubernetes.io/part-of="
                    + LABEL["app.kubernetes.io/part-of"], "--timeout=60s", check=True)
        start = time.monotonic()
        kubeconfig = f"--kubeconfig={bed.kubeconfig}"
        processes.append(bed.spawn("cert-manager-controller", [
            str(directory / "cert-manager-controller"), kubeconfig, "--leader-elect=false",
            "--cluster-resource-namespace=cert-manager", "--metrics-listen-address=127.0.0.1:9402", "--v=2"]))
        processes.append(bed.spawn("cert-manager-cainjector", [
            str(directory / "cert-manager-cainjector"), kubeconfig, "--leader-elect=false", "--v=2"]))
        time.sleep(1)
        for process in processes:
            assert process.proc.poll() is None, f"{process.name} exited:\n{process.log.read_text()[-3000:]}"
        FIGURES["cert-manager version"] = versions()["CERT_MANAGER_VERSION"]
        yield {"started": start, "processes": processes}
    finally:
        for process in processes:
            process.stop()
        deleted = bed.kubectl("delete", "crd", "-l", "app.kubernetes.io/part-of=" + LABEL["app.kubernetes.io/part-of"],
                              "--ignore-not-found", "--wait=true", "--timeout=90s", timeout=120)
        print(f"node cert-manager figures: {json.dumps(FIGURES, indent=1)}")
        assert deleted.returncode == 0, f"deleting cert-manager's CRDs: {deleted.stderr}"


@pytest.fixture(scope="module")
def release(node_bed: NodeBed, cert_manager, webhook_image: str, tmp_path_factory):
    """The README's cluster quick start with certs.mode=cert-manager, two replicas."""
    bed = node_bed
    tmp = tmp_path_factory.mktemp("cert-manager-release")
    installed = False
    try:
        bed.kubectl("create", "namespace", NAMESPACE, check=True)
        repository, tag = webhook_image.rsplit(":", 1)
        values = {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}, "replicaCount": 2,
                  "certs": {"mode": "cert-manager"}, "policy": POLICY}
        (tmp / "values.yaml").write_text(yaml.safe_dump(values))
        start = time.monotonic()
        result = bed.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                          "--values", str(tmp / "values.yaml"), "--wait", "--timeout=240s", timeout=300)
        installed = True
        FIGURES["helm install --wait, 2 replicas (s)"] = round(time.monotonic() - start, 1)
        if result.returncode:
            described = [bed.kubectl("describe", kind, "-n", NAMESPACE).stdout for kind in ("pods", "certificates")]
            pytest.fail(f"helm install failed: {result.stderr}\n" + "\n".join(described), pytrace=False)
        until("the apiserver reaching the webhook through the Service with the injected CA",
              lambda: _dry_run(bed, seed_pod()).returncode == 0, 90, interval=0.3,
              diagnose=lambda: _dry_run(bed, seed_pod()).stderr)
        FIGURES["install to the first admission (s)"] = round(time.monotonic() - start, 1)
        yield
    finally:
        problems = []
        if installed:
            uninstall = bed.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=90s")
            forget_policy_crd(bed.kubectl)
            if uninstall.returncode:
                problems.append(f"helm uninstall: {uninstall.stderr}")
        try:
            until("the release's pods gone", lambda: not _pods(bed), 90, interval=0.5)
        except TimeoutError as exc:
            problems.append(str(exc))
        deleted = bed.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
                              "--timeout=90s", timeout=120)
        if deleted.returncode:
            problems.append(f"kubectl delete namespace: {deleted.stderr}")
        assert not problems, problems


def test_cert_manager_issues_the_certificate_and_the_cainjector_fills_the_ca_bundles(node_bed, release):
    bed = node_bed
    serving = _ready(bed, CERTIFICATE)
    assert serving is not None, bed.kubectl("describe", "certificate", CERTIFICATE, "-n", NAMESPACE).stdout
    assert _ready(bed, CA_SECRET) is not None, "the chart's CA Certificate is not Ready"
    ca = _secret_pem(bed, CA_SECRET, "tls.crt")
    assert _secret_pem(bed, CERTIFICATE, "ca.crt") == ca
    assert _ca_bundles(bed) == {ca}, "the cainjector did not put the chart's CA into every webhook"
    leaf = x509.load_pem_x509_certificate(_secret_pem(bed, CERTIFICATE, "tls.crt"))
    assert leaf.issuer == x509.load_pem_x509_certificate(ca).subject
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert f"{RELEASE}.{NAMESPACE}.svc" in names
    pods = _settle(bed)
    served = _served_certificates(bed, [p["status"]["podIP"] for p in pods])
    assert set(served.values()) == {_fingerprint(_secret_pem(bed, CERTIFICATE, "tls.crt"))}, served


def test_the_apiserver_calls_the_pods_with_the_injected_ca(node_bed, release):
    admitted = _dry_run(node_bed, seed_pod())
    assert admitted.returncode == 0, admitted.stderr
    assert json.loads(admitted.stdout)["spec"].get("nodeSelector"), "the mutating webhook did not answer"
    refused = _dry_run(node_bed, pod(container("cuda", limits={"nvidia.com/gpu": "5"}), name="too-many"))
    assert refused.returncode != 0
    assert 'admission webhook "validate.gpu-webhook.io" denied the request' in refused.stderr, refused.stderr
    assert "spec.containers[0].resources.limits[nvidia.com/gpu]" in refused.stderr, refused.stderr


def test_a_renewal_under_load_fails_no_admission(node_bed, release):
    """A re-issue as ``cmctl renew`` triggers it: new key and certificate in the Secret, reloaded by the running
    pods, the same CA in the caBundle, while GPU pod creations go on."""
    bed = node_bed
    pods = _settle(bed)
    uids = {p["metadata"]["uid"] for p in pods}
    ips = [p["status"]["podIP"] for p in pods]
    old_pem, old_key = _secret_pem(bed, CERTIFICATE, "tls.crt"), _secret_pem(bed, CERTIFICATE, "tls.key")
    old = _fingerprint(old_pem)
    assert set(_served_certificates(bed, ips).values()) == {old}
    bundles = _ca_bundles(bed)
    with _load(bed) as load:
        time.sleep(2)
        start, wall = time.monotonic(), time.time()
        _renew(bed, CERTIFICATE)
        new = until("cert-manager writing a new certificate into the Secret",
                    lambda: (f := _fingerprint(_secret_pem(bed, CERTIFICATE, "tls.crt"))) != old and f, 60,
                    interval=0.3, diagnose=lambda: bed.kubectl("describe", "certificate", CERTIFICATE, "-n",
                                                               NAMESPACE).stdout)
        issued = time.monotonic() - start
        until("the new certificate served by every pod",
              lambda: (s := _served_certificates(bed, ips)) and set(s.values()) == {new} and s, 90,
              interval=0.5, diagnose=lambda: str(_served_certificates(bed, ips)))
        served = time.monotonic() - start
        time.sleep(3)  # admissions on the new certificate
    report = load.stop()
    _assert_no_failures(report, "cert-manager renewal")
    assert _secret_pem(bed, CERTIFICATE, "tls.key") != old_key, "the private key was not rotated"
    assert _ca_bundles(bed) == bundles, "the caBundle changed on a renewal with the same CA"
    assert {p["metadata"]["uid"] for p in _pods(bed)} == uids, "the pods were replaced"
    FIGURES["renewal (cmctl renew's trigger)"] = {
        "new certificate in the Secret (s)": round(issued, 1),
        "new certificate served by both pods (s)": round(served, 1),
        "each pod's workers reloaded (s)": sorted(round(max(_reloads(bed, p, "certificate", wall)) - wall, 1)
                                                  for p in _pods(bed)),
        "requests sent": report.sent, "failed": len(report.failed)}
