"""certs.mode=helm: the generated CA and serving certificate, and what `helm upgrade` does with them.

An upgrade finds the earlier release's Secrets with `lookup`, which `helm template` cannot reach (no cluster:
it returns nothing). So the upgrades are rendered from a copy of the chart whose one `lookup` call (in
gpu-webhook.existingSecret) reads the Secrets from files instead; everything else is the chart as shipped.
The Secrets fed to it are the ones a first render made, with their dates moved where a case needs them.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.chart import test_chart
from tests.chart.test_chart import (
    CHART,
    FULLNAME,
    IMAGE,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    Helm,
    one,
    webhooks,
)

# test_chart's session fixtures, found here by name.
helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

TLS = f"{FULLNAME}-tls"
HELM_CA = f"{FULLNAME}-helm-ca"
NOT_AFTER = "gpu-webhook.io/not-after"
NAMES = "gpu-webhook.io/names"
DAY = dt.timedelta(days=1)

LOOKUP = '{{- toJson (lookup "v1" "Secret" .root.Release.Namespace .name | default dict) }}'
FROM_FILES = '{{- toJson (.root.Files.Get (printf "existing/%s.json" .name) | default "{}" | fromJson) }}'


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(helm: Helm, chart: Path, *args: str) -> list[dict[str, Any]]:
    done = helm.run("template", RELEASE, str(chart), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                    *IMAGE, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def upgrade(helm: Helm, tmp_path: Path, existing: list[dict[str, Any]], *args: str) -> list[dict[str, Any]]:
    """Render as `helm upgrade` would with ``existing`` Secrets in the cluster."""
    chart = tmp_path / "gpu-webhook"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text(encoding="utf-8")
    assert text.count(LOOKUP) == 1, "the chart's lookup of its Secrets moved: update LOOKUP"
    helpers.write_text(text.replace(LOOKUP, FROM_FILES), encoding="utf-8")
    (chart / "existing").mkdir()
    for secret in existing:
        (chart / "existing" / f"{secret['metadata']['name']}.json").write_text(json.dumps(secret), encoding="utf-8")
    return render(helm, chart, *args)


class Certs:
    """What one render holds in helm mode, decoded."""

    def __init__(self, docs: list[dict[str, Any]]):
        self.tls = one(docs, "Secret", TLS)
        self.ca_secret = one(docs, "Secret", HELM_CA)
        data = {k: base64.b64decode(v) for k, v in self.tls["data"].items()}
        self.bundle = x509.load_pem_x509_certificates(data["ca.crt"])
        self.cert = x509.load_pem_x509_certificate(data["tls.crt"])
        self.key = serialization.load_pem_private_key(data["tls.key"], password=None)
        self.ca = x509.load_pem_x509_certificate(base64.b64decode(self.ca_secret["data"]["tls.crt"]))
        self.ca_key = serialization.load_pem_private_key(base64.b64decode(self.ca_secret["data"]["tls.key"]), None)
        self.not_after = dt.datetime.fromisoformat(self.tls["metadata"]["annotations"][NOT_AFTER])
        self.ca_not_after = dt.datetime.fromisoformat(self.ca_secret["metadata"]["annotations"][NOT_AFTER])
        for hook in webhooks(docs).values():
            assert hook["clientConfig"]["caBundle"] == self.tls["data"]["ca.crt"], "the webhooks trust ca.crt"

    def check(self, tls_dates: bool = True, ca_dates: bool = True) -> None:
        """Invariants of every render: the pair matches, the CA signed it, the bundle leads with that CA, the
        annotations are the certificates' real dates (unless a test moved them and they were kept), and no
        serving certificate outlives its CA."""
        assert _public(self.key.public_key()) == _public(self.cert.public_key())
        assert _public(self.ca_key.public_key()) == _public(self.ca.public_key())
        self.cert.verify_directly_issued_by(self.ca)
        assert self.bundle[0] == self.ca
        assert self.ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
        if tls_dates:
            assert abs(self.not_after - self.cert.not_valid_after_utc) < dt.timedelta(minutes=1)
        if ca_dates:
            assert abs(self.ca_not_after - self.ca.not_valid_after_utc) < dt.timedelta(minutes=1)
        assert self.cert.not_valid_after_utc <= self.ca.not_valid_after_utc


def _public(key: Any) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def secrets(docs: list[dict[str, Any]], **annotations: dt.datetime) -> list[dict[str, Any]]:
    """The rendered Secrets as a cluster would return them, with NOT_AFTER moved: tls=..., ca=..."""
    out = []
    for name, key in ((TLS, "tls"), (HELM_CA, "ca")):
        secret = copy.deepcopy(one(docs, "Secret", name))
        if key in annotations:
            secret["metadata"]["annotations"][NOT_AFTER] = rfc3339(annotations[key])
        out.append(secret)
    return out


@pytest.fixture(scope="module")
def first(helm: Helm) -> list[dict[str, Any]]:
    """A first install's render (no Secrets to find)."""
    return helm.template()


# --- a first install ----------------------------------------------------------------------------


def test_first_install_makes_a_short_lived_certificate_and_a_ca_the_pods_never_see(first) -> None:
    certs = Certs(first)
    certs.check()
    assert certs.bundle == [certs.ca]
    validity = certs.cert.not_valid_after_utc - certs.cert.not_valid_before_utc
    ca_validity = certs.ca.not_valid_after_utc - certs.ca.not_valid_before_utc
    assert validity == 365 * DAY and ca_validity == 3650 * DAY
    assert certs.tls["type"] == certs.ca_secret["type"] == "kubernetes.io/tls"
    pod = one(first, "Deployment")["spec"]["template"]["spec"]
    mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert mounted == {TLS}, "the CA's key stays out of the pods"


def test_validity_follows_the_values(helm: Helm) -> None:
    certs = Certs(helm.template(*["--set", "certs.helm.validityDays=30", "--set", "certs.helm.renewBeforeDays=10",
                                  "--set", "certs.helm.caValidityDays=400"]))
    certs.check()
    assert certs.cert.not_valid_after_utc - certs.cert.not_valid_before_utc == 30 * DAY
    assert certs.ca.not_valid_after_utc - certs.ca.not_valid_before_utc == 400 * DAY


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "certs.helm.renewBeforeDays=365"],
         "certs.helm.renewBeforeDays (365) must be less than certs.helm.validityDays (365)"),
        (["--set", "certs.helm.caValidityDays=365"],
         "certs.helm.caValidityDays (365) must be greater than certs.helm.validityDays (365)"),
    ],
)
def test_inconsistent_durations_are_refused(helm: Helm, args: list[str], message: str) -> None:
    assert message in helm.template_error(*args)


def test_other_modes_ignore_the_helm_durations(helm: Helm) -> None:
    docs = helm.template("--set", "certs.mode=cert-manager", "--set", "certs.helm.renewBeforeDays=400")
    assert not [d for d in docs if d["kind"] == "Secret"]


# --- upgrades -------------------------------------------------------------------------------------


def test_upgrade_keeps_what_is_far_from_expiry(helm: Helm, tmp_path: Path, first) -> None:
    """Byte for byte: the pods see no change and the caBundle stays."""
    docs = upgrade(helm, tmp_path, secrets(first))
    for name in (TLS, HELM_CA):
        assert one(docs, "Secret", name)["data"] == one(first, "Secret", name)["data"]
        assert one(docs, "Secret", name)["metadata"]["annotations"] == one(first, "Secret", name)["metadata"][
            "annotations"]
    Certs(docs).check()


@pytest.mark.parametrize(("left", "renewed"), [(91, False), (89, True), (1, True), (-10, True)])
def test_upgrade_renews_the_serving_certificate_near_expiry_with_the_same_ca(
    helm: Helm, tmp_path: Path, first, left: int, renewed: bool
) -> None:
    """Within renewBeforeDays (90) of its end, a new serving certificate from the same CA: the caBundle does not
    change, so there is no moment when the apiserver and a pod disagree."""
    before = Certs(first)
    docs = upgrade(helm, tmp_path, secrets(first, tls=now() + left * DAY))
    after = Certs(docs)
    after.check(tls_dates=renewed)
    assert (after.cert != before.cert) is renewed
    assert after.ca == before.ca and after.tls["data"]["ca.crt"] == before.tls["data"]["ca.crt"]
    assert one(docs, "Secret", HELM_CA)["data"] == one(first, "Secret", HELM_CA)["data"]
    if renewed:
        assert after.cert.not_valid_after_utc - now() > 364 * DAY


def test_upgrade_reissues_the_certificate_for_new_names(helm: Helm, tmp_path: Path, first) -> None:
    """certs.extraDNSNames and extraIPAddresses reach the certificate on the next upgrade, same CA."""
    before = Certs(first)
    docs = upgrade(helm, tmp_path, secrets(first), "--set-json", 'certs.extraDNSNames=["gpu-webhook.internal"]',
                   "--set-json", 'certs.extraIPAddresses=["10.0.0.7"]')
    after = Certs(docs)
    after.check()
    sans = after.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-webhook.internal" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert after.ca == before.ca and after.tls["data"]["ca.crt"] == before.tls["data"]["ca.crt"]
    assert after.tls["metadata"]["annotations"][NAMES] != before.tls["metadata"]["annotations"][NAMES]


@pytest.mark.parametrize(("left", "renewed"), [(366, False), (364, True), (-1, True)])
def test_upgrade_replaces_a_ca_with_less_than_a_certificates_lifetime_left(
    helm: Helm, tmp_path: Path, first, left: int, renewed: bool
) -> None:
    """A new CA and certificate; the caBundle holds the new CA and the old one, so pods still serving the old
    certificate (until the kubelet syncs the Secret into them) stay trusted."""
    before = Certs(first)
    docs = upgrade(helm, tmp_path, secrets(first, ca=now() + left * DAY))
    after = Certs(docs)
    after.check(ca_dates=renewed)
    assert (after.ca != before.ca) is renewed
    if renewed:
        assert after.bundle == [after.ca, before.ca]
        assert after.cert != before.cert
        before.cert.verify_directly_issued_by(after.bundle[1])
    else:
        assert after.bundle == [before.ca] and after.cert == before.cert


def test_the_previous_ca_stays_in_the_bundle_until_the_next_ca(helm: Helm, tmp_path: Path, first) -> None:
    rotated = upgrade(helm, tmp_path / "1", secrets(first, ca=now() + 10 * DAY))
    then = upgrade(helm, tmp_path / "2", secrets(rotated))
    assert one(then, "Secret", TLS)["data"] == one(rotated, "Secret", TLS)["data"]
    assert len(Certs(then).bundle) == 2
    # The CA after that one replaces the oldest: never more than two.
    again = upgrade(helm, tmp_path / "3", secrets(rotated, ca=now() + 10 * DAY))
    assert Certs(again).bundle == [Certs(again).ca, Certs(rotated).ca]


def test_upgrade_from_a_secret_without_dates_or_ca_key(helm: Helm, tmp_path: Path, first) -> None:
    """A Secret made by an earlier chart (ten-year pair, no annotations, the CA's key thrown away): a new CA and
    certificate, and the old CA kept in the bundle for the pods that still serve the old pair."""
    old = copy.deepcopy(one(first, "Secret", TLS))
    del old["metadata"]["annotations"]
    docs = upgrade(helm, tmp_path, [old])
    after = Certs(docs)
    after.check()
    old_ca = x509.load_pem_x509_certificate(base64.b64decode(old["data"]["ca.crt"]))
    assert after.ca != old_ca and after.bundle == [after.ca, old_ca]


def test_a_missing_serving_secret_is_remade_from_the_kept_ca(helm: Helm, tmp_path: Path, first) -> None:
    ca_only = [s for s in secrets(first) if s["metadata"]["name"] == HELM_CA]
    after = Certs(upgrade(helm, tmp_path, ca_only))
    after.check()
    assert after.ca == Certs(first).ca and after.bundle == [after.ca]


def test_notes_say_until_when_the_certificate_is_valid(helm: Helm) -> None:
    text = test_chart.notes(helm)
    assert "is valid until 20" in text and "upgrade at least every 275 days" in text
    assert "valid until" not in test_chart.notes(helm, "--set", "certs.mode=cert-manager")
