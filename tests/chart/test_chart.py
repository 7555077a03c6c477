"""The Helm chart in charts/gpu-webhook: lint, render, schema, Kubernetes validity, matchConditions.

Rendering needs a real ``helm``: ``$HELM``, else the one ``tests/prepare`` builds beside the e2e control
plane. Without it the module is skipped locally and fails in CI (``CI=true``). Every rendered document
is validated against the OpenAPI schemas of the e2e apiserver's Kubernetes version with
kubernetes-validate (offline, strict: unknown fields fail); cert-manager and Prometheus Operator
kinds are CRDs it has no schema for, and are skipped by name. The matchConditions expression is
evaluated with cel-python; the live apiserver in the e2e tests remains the final judge.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from tests.chart import sync_schema
from tests.tools import control_plane_bin, missing_binaries, unavailable, versions
from webhook.admission import decide
from webhook.policy import DEFAULTS, PolicyError, parse_policy

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-webhook"

RELEASE = "gw"
NAMESPACE = "gpu-system"
FULLNAME = "gw-gpu-webhook"

# CRD kinds: kubernetes-validate ships only the built-in API's schemas.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}

PEM_CA = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
CA_BUNDLE = base64.b64encode(PEM_CA.encode()).decode()
SECRET_MODE = [
    "--set",
    "certs.mode=secret",
    "--set",
    "certs.secret.name=my-tls",
    "--set",
    f"certs.secret.caBundle={CA_BUNDLE}",
]
CUSTOM_RESOURCES = [
    {"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "resources": ["pytorchjobs"]},
    {"apiGroups": ["ray.io"], "apiVersions": ["*"], "resources": ["rayclusters", "rayjobs"], "scope": "Namespaced"},
]
CUSTOM_POLICY = {
    "resources": ["nvidia.com/gpu", "example.com/*-gpu", "vendor.io/accel-*"],
    "accelerator": {"allowed": ["a100", "h100"], "default": "a100"},
    "limits": {"perContainer": 4, "perPod": 8},
    "tolerations": True,
    "enforcement": "warn",
    "namespaces": {"research": {"enforcement": "deny", "accelerator": {"allowed": ["h100"], "default": "h100"}}},
}


# --- tools ------------------------------------------------------------------------------------


VERSIONS = versions()
KUBE_VERSION = VERSIONS.get("KUBERNETES_VERSION", "v1.36.0").lstrip("v")  # e.g. 1.36.3
KUBE_MINOR = ".".join(KUBE_VERSION.split(".")[:2])  # e.g. 1.36


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """``$HELM``, else the helm that tests/prepare builds beside the e2e control plane."""
    if os.environ.get("HELM"):
        path = Path(os.environ["HELM"])
        if not os.access(path, os.X_OK):
            unavailable("helm", f"HELM={path} is not executable", "control-plane")
        return str(path)
    directory = control_plane_bin()
    if missing_binaries(directory, ("helm",)):
        unavailable("helm", f"{directory / 'helm'} is not built", "control-plane")
    return str(directory / "helm")


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment that keeps helm away from any real cluster and from the user's helm config."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
    env.update(
        HOME=str(home),
        KUBECONFIG=str(home / "no-kubeconfig"),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_DATA_HOME=str(home / "data"),
    )
    return env


class Helm:
    def __init__(self, binary: str, env: dict[str, str]):
        self.binary = binary
        self.env = env

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args], capture_output=True, text=True, env=self.env, timeout=60, check=False
        )

    @functools.cache  # noqa: B019 - one Helm per session; identical renders are reused
    def _template(self, args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return self.run(
            "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args
        )

    def template(self, *args: str) -> list[dict[str, Any]]:
        done = self._template(tuple(args))
        assert done.returncode == 0, f"helm template {shlex.join(args)} failed:\n{done.stderr}"
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]

    def template_error(self, *args: str) -> str:
        done = self._template(tuple(args))
        assert done.returncode != 0, f"helm template {shlex.join(args)} should have failed"
        return done.stderr


@pytest.fixture(scope="session")
def helm(helm_bin: str, helm_env: dict[str, str]) -> Helm:
    return Helm(helm_bin, helm_env)


def values_args(values: Mapping[str, Any]) -> list[str]:
    """--set-json arguments for each top-level key of ``values``."""
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def webhooks(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every webhook entry by name, from both configurations."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in one(docs, kind)["webhooks"]:
            assert hook["name"] not in out
            out[hook["name"]] = hook
    return out


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [c] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


# Renders used by several tests: (id, extra helm args).
RENDERS = {
    "helm-certs": [],
    "cert-manager": ["--set", "certs.mode=cert-manager"],
    "cert-manager-issuer": [
        "--set",
        "certs.mode=cert-manager",
        "--set-json",
        'certs.certManager.issuerRef={"name":"corp-ca","kind":"ClusterIssuer","group":"cert-manager.io"}',
    ],
    "secret": SECRET_MODE,
    "custom": [
        *SECRET_MODE,
        *values_args(
            {
                "webhook": {
                    "customResources": CUSTOM_RESOURCES,
                    "excludeNamespaces": ["batch-system", "kube-system"],
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 10,
                    "objectSelector": {"matchLabels": {"gpu-webhook.io/skip": "false"}},
                },
                "policy": CUSTOM_POLICY,
                "replicaCount": 3,
                "metrics": {"serviceMonitor": {"enabled": True}},
                "server": {"clientCA": {"configMapName": "apiserver-client-ca"}, "drainSeconds": 2.5},
            }
        ),
    ],
    "url": [*SECRET_MODE, "--set", "webhook.url=https://127.0.0.1:9443"],
    "single-replica": ["--set", "replicaCount=1"],
}


# --- lint and Kubernetes validity ----------------------------------------------------------------


@pytest.mark.parametrize("args", [[], ["--set", "certs.mode=cert-manager"], SECRET_MODE], ids=["helm", "cm", "secret"])
def test_helm_lint_passes(helm: Helm, args: list[str]) -> None:
    done = helm.run("lint", str(CHART), "--strict", "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("render", RENDERS, ids=list(RENDERS))
def test_every_rendered_document_is_valid_kubernetes(helm: Helm, render: str) -> None:
    docs = helm.template(*RENDERS[render])
    checked = []
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue  # a CRD: no schema offline (see CRD_KINDS)
        try:
            kubernetes_validate.validate(doc, KUBE_MINOR, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
        checked.append(doc["kind"])
    assert {"Deployment", "Service", "ConfigMap", "MutatingWebhookConfiguration"} <= set(checked)


def test_the_validator_rejects_unknown_fields(helm: Helm) -> None:
    """A control: strict validation really catches a misplaced field in a rendered object."""
    deployment = copy.deepcopy(one(helm.template(), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["preStop"] = {"sleep": {"seconds": 5}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_MINOR, strict=True)


def test_kinds_per_cert_mode(helm: Helm) -> None:
    def kinds(render: str) -> set[str]:
        return {d["kind"] for d in helm.template(*RENDERS[render])}

    common = {
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    assert kinds("helm-certs") == common | {"Secret"}
    assert kinds("cert-manager") == common | {"Issuer", "Certificate"}
    assert kinds("secret") == common
    issuer = helm.template(*RENDERS["cert-manager-issuer"])
    assert {d["kind"] for d in issuer} == common | {"Certificate"}
    assert one(issuer, "Certificate")["spec"]["issuerRef"]["name"] == "corp-ca"


def test_kube_version_floor(helm: Helm) -> None:
    done = helm.run("template", RELEASE, str(CHART), "--kube-version", "1.29.9")
    assert done.returncode != 0
    assert ">=1.30.0-0" in done.stderr


# --- values schema ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicaCount=two"], "at '/replicaCount': got string, want integer"),
        (["--set", "webhook.failurePolicy=Sometimes"], "/webhook/failurePolicy"),
        (["--set", "webhook.timeoutSeconds=31"], "/webhook/timeoutSeconds"),
        (["--set-json", 'webhook.excludeNamespaces="kube-public"'], "/webhook/excludeNamespaces"),
        (["--set-json", 'webhook.customResources=[{"apiGroups":["x.io"]}]'], "/webhook/customResources/0"),
        (["--set", "webhook.url=http://127.0.0.1:9443"], "/webhook/url"),
        (["--set", "certs.mode=vault"], "/certs/mode"),
        (["--set", "certs.secret.caBundle=not base64!"], "/certs/secret/caBundle"),
        (["--set", "server.drainSeconds=soon"], "/server/drainSeconds"),
        (["--set", "preStopSleepSeconds=-1"], "/preStopSleepSeconds"),
        (["--set-json", "resources.limits=[1]"], "/resources/limits"),
        (["--set", "bogus=1"], "additional properties 'bogus' not allowed"),
        (["--set", "webhook.failurePolcy=Fail"], "additional properties 'failurePolcy' not allowed"),
        (["--set", "policy.enforcement=block"], "/policy/enforcement"),
        (["--set", "policy.limits.perPod=-1"], "/policy/limits/perPod"),
        (["--set", "policy.tolerations=yes"], "/policy/tolerations"),
        (["--set-json", "policy.resources=[]"], "/policy/resources"),
        (["--set", "policy.namespaces.ml.resources=x"], "/policy/namespaces/ml"),
    ],
)
def test_schema_rejects_wrong_values(helm: Helm, args: list[str], message: str) -> None:
    error = helm.template_error(*args)
    assert "values don't meet the specifications of the schema" in error
    assert message in error


def test_policy_schema_is_the_webhooks_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["properties"]["policy"] == sync_schema.policy_schema()
    assert sync_schema.main(["--check"]) == 0, "run: .venv/bin/python tests/chart/sync_schema.py"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "terminationGracePeriodSeconds=8"],
            "must be greater than preStopSleepSeconds + server.drainSeconds",
        ),
        (
            ["--set", "certs.mode=secret", "--set", f"certs.secret.caBundle={CA_BUNDLE}"],
            "certs.secret.name is required",
        ),
        (["--set", "certs.mode=secret", "--set", "certs.secret.name=x"], "certs.secret.caBundle"),
        (
            ["--set", "certs.mode=secret", "--set", "certs.secret.name=x", "--set", "certs.secret.caBundle=aGVsbG8="],
            "must be the base64 encoding of PEM certificates",
        ),
        (["--set-json", 'policy.accelerator={"allowed":["a100"],"default":"t4"}'], "policy.accelerator.default"),
        (
            [
                "--set-json",
                'policy={"accelerator":{"allowed":["a"]},"namespaces":{"ml":{"accelerator":{"default":"b"}}}}',
            ],
            "policy.namespaces.ml.accelerator.default",
        ),
    ],
)
def test_render_refuses_what_the_schema_cannot_express(helm: Helm, args: list[str], message: str) -> None:
    assert message in helm.template_error(*args)


@pytest.mark.parametrize(
    "policy",
    [
        {"accelerator": {"allowed": ["a100"], "default": "t4"}},
        {"accelerator": {"allowed": ["a"]}, "namespaces": {"ml": {"accelerator": {"default": "b"}}}},
        {"accelerator": {"allowed": ["a"], "default": "a"}, "namespaces": {"ml": {"accelerator": {"allowed": ["b"]}}}},
    ],
)
def test_render_refuses_exactly_what_the_webhook_refuses(helm: Helm, policy: dict[str, Any]) -> None:
    with pytest.raises(PolicyError):
        parse_policy(json.dumps(policy))
    helm.template_error(*values_args({"policy": policy}))


# --- policy ConfigMap --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [None, {}, {"limits": {"perPod": 4}}, CUSTOM_POLICY],
    ids=["chart-default", "empty", "one-key", "custom"],
)
def test_policy_configmap_loads_in_the_webhook(helm: Helm, policy: dict[str, Any] | None) -> None:
    args = [] if policy is None else values_args({"policy": policy})
    configmap = one(helm.template(*args), "ConfigMap", f"{FULLNAME}-policy")
    text = configmap["data"]["policy.yaml"]
    policies = parse_policy(text, "rendered policy.yaml")
    assert (yaml.safe_load(text) or {}) == (policy or {})
    if not policy:
        assert policies.default.resources == tuple(DEFAULTS["resources"])


# --- Deployment and friends --------------------------------------------------------------------


def test_deployment_production_settings(helm: Helm) -> None:
    docs = helm.template()
    deployment = one(docs, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    c = container(docs)
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(next(a for a in c["args"] if a.startswith("--drain-seconds=")).split("=", 1)[1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert volumes[mounts["/tls"]["name"]]["secret"]["secretName"] == f"{FULLNAME}-tls"
    assert volumes[mounts["/etc/gpu-webhook"]["name"]]["configMap"]["name"] == f"{FULLNAME}-policy"
    assert all("subPath" not in m for m in c["volumeMounts"]), "subPath mounts never see updates"
    assert c["args"][:5] == [
        "serve",
        "--cert-file=/tls/tls.crt",
        "--key-file=/tls/tls.key",
        "--policy=/etc/gpu-webhook/policy.yaml",
        "--port=8443",
    ]
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert "annotations" not in spec["template"]["metadata"], "no checksum annotation: the server reloads the policy"
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["port"] == 443 and service["spec"]["ports"][0]["targetPort"] == "https"
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    labels = deployment["metadata"]["labels"]
    for key in ("name", "instance", "version", "managed-by", "component", "part-of"):
        assert f"app.kubernetes.io/{key}" in labels


def test_no_pdb_for_a_single_replica(helm: Helm) -> None:
    docs = helm.template(*RENDERS["single-replica"])
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]


def test_client_ca_switches_probes_to_tcp(helm: Helm) -> None:
    docs = helm.template(*RENDERS["custom"])
    c = container(docs)
    assert "--client-ca=/etc/gpu-webhook-client-ca/ca.crt" in c["args"]
    assert "--drain-seconds=2.5" in c["args"]
    assert c["readinessProbe"]["tcpSocket"] == {"port": "https"} and "httpGet" not in c["readinessProbe"]
    assert c["livenessProbe"]["tcpSocket"] == {"port": "https"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "client-ca", "configMap": {"name": "apiserver-client-ca"}} in pod["volumes"]


# --- webhook configurations --------------------------------------------------------------------


def test_webhook_configurations(helm: Helm) -> None:
    docs = helm.template()
    hooks = webhooks(docs)
    assert set(hooks) == {"mutate.gpu-webhook.io", "validate.gpu-webhook.io", "validate-dra.gpu-webhook.io"}
    mutate, validate = hooks["mutate.gpu-webhook.io"], hooks["validate.gpu-webhook.io"]
    dra = hooks["validate-dra.gpu-webhook.io"]
    for hook, path in ((mutate, "/mutate"), (validate, "/validate"), (dra, "/validate")):
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["failurePolicy"] == "Fail"
        assert hook["timeoutSeconds"] == 5
        assert hook["clientConfig"]["service"] == {"name": FULLNAME, "namespace": NAMESPACE, "path": path, "port": 443}
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
        [expr] = hook["namespaceSelector"]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
        assert expr["values"] == ["kube-system", "kube-node-lease", NAMESPACE]
    for hook in (mutate, validate):
        assert [c["name"] for c in hook["matchConditions"]] == ["names-gpu-resource"]
    assert [c["name"] for c in dra["matchConditions"]] == ["requests-devices-or-names-extended-resource"]
    assert dra["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"},
        {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
         "resources": ["deviceclasses"], "scope": "Cluster"},
    ]
    assert mutate["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in validate
    assert mutate["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    covered = {(g, r) for rule in validate["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert covered == {
        ("", "pods"),
        ("", "podtemplates"),
        ("", "replicationcontrollers"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("apps", "statefulsets"),
        ("apps", "daemonsets"),
        ("batch", "jobs"),
        ("batch", "cronjobs"),
    }
    assert all(rule["operations"] == ["CREATE", "UPDATE"] for rule in validate["rules"])


def test_custom_values_reach_the_webhooks(helm: Helm) -> None:
    hooks = webhooks(helm.template(*RENDERS["custom"]))
    assert set(hooks) == {"mutate.gpu-webhook.io", "validate.gpu-webhook.io", "validate-dra.gpu-webhook.io",
                          "validate-custom.gpu-webhook.io"}
    for hook in hooks.values():
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 10
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
            "kube-system",
            "kube-node-lease",
            NAMESPACE,
            "batch-system",
        ]
        assert hook["objectSelector"] == {"matchLabels": {"gpu-webhook.io/skip": "false"}}
        assert hook["clientConfig"]["caBundle"] == CA_BUNDLE
        assert hook["clientConfig"]["service"]["name"] == FULLNAME
    custom = hooks["validate-custom.gpu-webhook.io"]
    assert "matchConditions" not in custom, "custom resources hold pod templates anywhere"
    assert custom["clientConfig"]["service"]["path"] == "/validate"
    assert custom["rules"] == [
        {
            "apiGroups": ["kubeflow.org"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pytorchjobs"],
            "scope": "*",
        },
        {
            "apiGroups": ["ray.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["rayclusters", "rayjobs"],
            "scope": "Namespaced",
        },
    ]


def test_url_switch_for_test_beds(helm: Helm) -> None:
    """What the e2e test applies to a real apiserver: only the two configurations, calling a URL."""
    docs = helm.template(*RENDERS["url"], "--show-only", "templates/webhooks.yaml")
    assert [d["kind"] for d in docs] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    hooks = webhooks(docs)
    assert hooks["mutate.gpu-webhook.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate",
        "caBundle": CA_BUNDLE,
    }
    for name in ("validate.gpu-webhook.io", "validate-dra.gpu-webhook.io"):
        assert hooks[name]["clientConfig"] == {"url": "https://127.0.0.1:9443/validate", "caBundle": CA_BUNDLE}


def test_helm_mode_certificate(helm: Helm) -> None:
    docs = helm.template("--set-json", 'certs.extraIPAddresses=["127.0.0.1"]')
    secret = one(docs, "Secret", f"{FULLNAME}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
    for hook in webhooks(docs).values():
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"], "one CA for the Secret and the webhooks"
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    svc = FULLNAME
    assert sans.get_values_for_type(x509.DNSName) == [
        svc,
        f"{svc}.{NAMESPACE}",
        f"{svc}.{NAMESPACE}.svc",
        f"{svc}.{NAMESPACE}.svc.cluster.local",
    ]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_cert_manager_mode(helm: Helm) -> None:
    docs = helm.template(*RENDERS["cert-manager"])
    serving = one(docs, "Certificate", f"{FULLNAME}-tls")
    svc = FULLNAME
    assert serving["spec"]["dnsNames"] == [
        svc,
        f"{svc}.{NAMESPACE}",
        f"{svc}.{NAMESPACE}.svc",
        f"{svc}.{NAMESPACE}.svc.cluster.local",
    ]
    assert serving["spec"]["secretName"] == f"{FULLNAME}-tls"
    assert serving["spec"]["issuerRef"] == {"name": f"{FULLNAME}-ca", "kind": "Issuer", "group": "cert-manager.io"}
    ca = one(docs, "Certificate", f"{FULLNAME}-ca")
    assert ca["spec"]["isCA"] is True
    assert one(docs, "Issuer", f"{FULLNAME}-ca")["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert one(docs, "Issuer", f"{FULLNAME}-selfsigned")["spec"] == {"selfSigned": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(docs, kind)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{FULLNAME}-tls"
        assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])


# --- the matchConditions expression ------------------------------------------------------------


def gpu(name: str = "nvidia.com/gpu", where: str = "limits") -> dict[str, Any]:
    return {"name": "c", "image": "busybox", "resources": {where: {name: "1"}}}


PLAIN = {"name": "c", "image": "busybox", "resources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}}}
BARE = {"name": "c", "image": "busybox"}


def pod_spec(*containers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"containers": list(containers), **extra}


def template_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}}, "spec": spec}


def wrap(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """An object of ``kind`` holding ``spec`` where that kind keeps its pod spec."""
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "p"}, "spec": spec}
    if kind == "PodTemplate":
        return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "t"}, "template": template_of(spec)}
    if kind == "CronJob":
        job = {"template": template_of(spec)}
        return {"apiVersion": "batch/v1", "kind": kind, "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": job}}}
    group = {"Job": "batch/v1", "ReplicationController": "v1"}.get(kind, "apps/v1")
    return {"apiVersion": group, "kind": kind, "metadata": {"name": "w"}, "spec": {"template": template_of(spec)}}


KINDS = ["Pod", "PodTemplate", "ReplicationController", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job"]
KINDS += ["CronJob"]

# (id, pod spec, expected) evaluated for every kind.
SPEC_CASES = [
    ("gpu-limit", pod_spec(gpu()), True),
    ("gpu-request-only", pod_spec(gpu(where="requests")), True),
    ("amd", pod_spec(gpu("amd.com/gpu")), True),
    ("intel-prefix", pod_spec(gpu("gpu.intel.com/i915")), True),
    ("mig-prefix", pod_spec(gpu("nvidia.com/mig-1g.5gb")), True),
    ("gpu-in-second-container", pod_spec(PLAIN, gpu()), True),
    ("gpu-in-init-container", pod_spec(PLAIN, initContainers=[gpu()]), True),
    ("gpu-in-ephemeral-container", pod_spec(PLAIN, ephemeralContainers=[gpu()]), True),
    ("gpu-in-pod-level-resources", pod_spec(PLAIN, resources={"limits": {"nvidia.com/gpu": "1"}}), True),
    ("cpu-and-memory-only", pod_spec(PLAIN), False),
    ("no-resources-field", pod_spec(BARE), False),
    ("empty-resources", pod_spec({**BARE, "resources": {}}), False),
    ("empty-limits", pod_spec({**BARE, "resources": {"limits": {}, "requests": {}}}), False),
    ("no-containers-field", {}, False),
    ("empty-containers", pod_spec(), False),
    (
        "near-miss-names",
        pod_spec(gpu("nvidia.com/gpus"), gpu("example.com/nvidia.com/gpu"), gpu("gpu.intel.com")),
        False,
    ),
    ("case-matters", pod_spec(gpu("NVIDIA.com/gpu")), False),
    ("pod-level-cpu-only", pod_spec(BARE, resources={"requests": {"cpu": "1"}}), False),
    # DRA: the GPUs are in the claim, which the expression cannot see; and the implicit extended resource.
    ("dra-claims", pod_spec(BARE, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "t"}]), True),
    ("empty-claims", pod_spec(BARE, resourceClaims=[]), False),
    ("implicit-gpu-class-name", pod_spec(gpu("deviceclass.resource.kubernetes.io/gpu.nvidia.com")), True),
    ("implicit-other-class-name", pod_spec(gpu("deviceclass.resource.kubernetes.io/nic.example.com")), False),
]


class Condition:
    """A rendered matchConditions expression, compiled once with cel-python."""

    def __init__(self, expression: str):
        self.expression = expression
        env = celpy.Environment()
        self.program = env.program(env.compile(expression))

    def __call__(self, kind: str, obj: Any, group: str = "") -> Any:
        request = {"kind": {"group": group, "version": "v1", "kind": kind}, "operation": "CREATE"}
        activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj)}
        return self.program.evaluate(activation)

    def holds(self, kind: str, obj: Any) -> bool:
        result = self(kind, obj)
        assert isinstance(result, celpy.celtypes.BoolType), f"evaluation error for {kind}: {result!r}"
        return bool(result)


def conditions_of(docs: list[dict[str, Any]], name: str = "names-gpu-resource") -> list[str]:
    return [c["expression"] for hook in webhooks(docs).values() for c in hook.get("matchConditions", [])
            if c["name"] == name]


@pytest.fixture(scope="module")
def condition(helm: Helm) -> Condition:
    expressions = conditions_of(helm.template())
    assert len(expressions) == 2 and expressions[0] == expressions[1]
    return Condition(expressions[0])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_match_condition(condition: Condition, kind: str, spec: dict[str, Any], expected: bool) -> None:
    assert condition.holds(kind, wrap(kind, spec)) is expected


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        ("Pod", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
        ("Pod", {}),
        ("PodTemplate", {"metadata": {"name": "t"}}),
        ("PodTemplate", {"template": {"metadata": {}}}),
        ("Deployment", {"spec": {"replicas": 1}}),
        ("Deployment", {"spec": {"template": {"metadata": {}}}}),
        ("Job", {}),
        ("CronJob", {"spec": {"schedule": "* * * * *"}}),
        ("CronJob", {"spec": {"jobTemplate": {}}}),
        ("CronJob", {"spec": {"jobTemplate": {"spec": {"template": {}}}}}),
        # The pod spec where another kind would keep it: looked for only where this kind keeps it.
        ("CronJob", wrap("Deployment", pod_spec(gpu()))),
        ("Pod", wrap("Deployment", pod_spec(gpu()))),
        ("Deployment", wrap("Pod", pod_spec(gpu()))),
    ],
)
def test_match_condition_never_errors_on_missing_fields(condition: Condition, kind: str, obj: dict[str, Any]) -> None:
    assert condition.holds(kind, obj) is False


def test_match_condition_follows_policy_resources(helm: Helm) -> None:
    """Exact names, trailing-* prefixes and other globs, with the webhook's fnmatch meaning."""
    docs = helm.template(*values_args({"policy": {"resources": CUSTOM_POLICY["resources"] + ["acme.io/gpu-?"]}}))
    expressions = conditions_of(docs)
    assert len(expressions) == 2
    holds = Condition(expressions[0]).holds
    cases = {
        "nvidia.com/gpu": True,
        "example.com/big-gpu": True,
        "example.com/-gpu": True,
        "example.com/gpu": False,
        "example.com/big-gpus": False,
        "exampleXcom/big-gpu": False,  # the "." is literal
        "vendor.io/accel-x": True,
        "vendor.io/accel-": True,
        "acme.io/gpu-1": True,
        "acme.io/gpu-12": False,
        "amd.com/gpu": False,  # the defaults are replaced, as the webhook replaces them
    }
    for name, expected in cases.items():
        assert holds("Pod", wrap("Pod", pod_spec(gpu(name)))) is expected, name
    policy = parse_policy(yaml.safe_dump({"resources": CUSTOM_POLICY["resources"] + ["acme.io/gpu-?"]})).default
    assert {name: policy.is_gpu(name) for name in cases} == cases, "the cases agree with the webhook"


def test_default_patterns_are_the_webhooks(condition: Condition) -> None:
    """The chart's fallback GPU patterns (policy: {}) are the webhook's DEFAULTS['resources']."""
    policy = parse_policy("{}").default
    for pattern in DEFAULTS["resources"]:
        name = pattern.replace("*", "x")
        assert policy.is_gpu(name)
        assert condition.holds("Pod", wrap("Pod", pod_spec(gpu(name)))), pattern
    implicit = [f"deviceclass.resource.kubernetes.io/{c}" for c in DEFAULTS["dra"]["gpuClasses"]]
    for k in re.findall(r"'([^']+)'", condition.expression):
        if "/" in k:
            assert any(p.startswith(k) or p == k for p in DEFAULTS["resources"] + implicit), k


# --- NOTES.txt ---------------------------------------------------------------------------------


def notes(helm: Helm, *args: str) -> str:
    # `helm install --dry-run=client` renders NOTES.txt without a cluster (it takes no --kube-version).
    done = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("NOTES:", 1)[1]


def test_notes_test_pod_is_denied_as_the_notes_say(helm: Helm) -> None:
    """The one-line kubectl test in NOTES.txt: its pod really is denied, with the message shown."""
    text = notes(helm)
    [line] = [ln.strip() for ln in text.splitlines() if " run gpu-test " in ln]
    argv = shlex.split(line)
    assert argv[:2] == ["kubectl", "-n"] and "--restart=Never" in argv
    overrides = json.loads(next(a for a in argv if a.startswith("--overrides=")).split("=", 1)[1])
    key, value = next(a for a in argv if a.startswith("--annotations=")).split("=", 1)[1].split("=", 1)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-test", "annotations": {key: value}}}
    pod["spec"] = overrides["spec"]
    response = decide(pod, "", "Pod", argv[2], parse_policy("{}"))
    assert response.allowed is False
    expected = next(ln.strip() for ln in text.splitlines() if "denied the request" in ln)
    prefix = 'Error from server (Forbidden): admission webhook "validate.gpu-webhook.io" denied the request: '
    assert expected == prefix + response.message
    assert "kubectl -n gpu-system rollout status deployment/gw-gpu-webhook" in text
    assert "WARNING" not in text


def test_notes_warn_about_test_settings_and_avoid_excluded_namespaces(helm: Helm) -> None:
    text = notes(helm, *RENDERS["url"], "--set", "webhook.failurePolicy=Ignore", "--namespace", "default")
    assert "webhook.url is set" in text and "failurePolicy is Ignore" in text
    assert "kubectl create namespace gpu-webhook-test" in text
    assert "kubectl -n gpu-webhook-test run gpu-test" in text


def test_cluster_checks_bring_read_only_node_access_and_nothing_else(helm: Helm) -> None:
    assert not {"ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in helm.template()}
    docs = helm.template(*values_args({"policy": {"cluster": {"enabled": True}}}))
    role = one(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"],
         "resources": ["resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list", "watch"]},
    ]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True, "the watches authenticate with the service account"
    assert one(helm.template(), "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


DRA_OBJECTS = [
    ("ResourceClaim", {"spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "x"}}]}}}, True),
    ("ResourceClaim", {"spec": {"devices": {}}}, False),
    ("ResourceClaim", {"metadata": {"name": "c"}}, False),
    ("ResourceClaimTemplate", {"spec": {"spec": {"devices": {"requests": [{"name": "g"}]}}}}, True),
    ("ResourceClaimTemplate", {"spec": {"metadata": {}}}, False),
    ("ResourceClaimTemplate", {}, False),
    ("DeviceClass", {"spec": {"extendedResourceName": "example.com/gpu"}}, True),
    ("DeviceClass", {"spec": {"selectors": []}}, False),
    ("DeviceClass", {}, False),
]


@pytest.mark.parametrize(("kind", "obj", "expected"), DRA_OBJECTS)
def test_dra_match_condition(helm: Helm, kind: str, obj: dict[str, Any], expected: bool) -> None:
    [expression] = conditions_of(helm.template(), "requests-devices-or-names-extended-resource")
    assert Condition(expression).holds(kind, obj) is expected
