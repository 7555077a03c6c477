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
from kubernetes.config import incluster_config

from tests.chart import sync_schema
from tests.tools import control_plane_bin, missing_binaries, unavailable, versions
from webhook.core.policyfile import PolicyError, parse_policy
from webhook.core.policyschema import DEFAULTS
from webhook.native.chart import registry_rules
from webhook.rules.admission import decide

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-webhook"
INSTALL_PAGE = ROOT / "docs" / "install.md"  # "Install on a cluster", formerly a section of README.md

RELEASE = "gw"
NAMESPACE = "gpu-system"
FULLNAME = "gw-gpu-webhook"

# CRD kinds: kubernetes-validate ships only the built-in API's schemas.
CRD_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("gpu-webhook.io/v1alpha1", "GPUPolicy"),  # the chart's own: test_gpupolicy_chart.py and e2e check it
}

# The chart has no default image (it refuses to render without one): every render here names this one.
IMAGE_REPOSITORY = "localhost/gpu-webhook"
IMAGE = ["--set", f"image.repository={IMAGE_REPOSITORY}"]

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
        """``helm template`` with IMAGE first, so that ``args`` can override it."""
        return self.run(
            "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *IMAGE, *args
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
    "cluster-checks": values_args({"policy": {"cluster": {"enabled": True}}}),
    "network-policy": ["--set", "networkPolicy.enabled=true"],
    "network-policy-egress": [
        *values_args(
            {
                "networkPolicy": {
                    "enabled": True,
                    "admission": {"from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]},
                    "metrics": {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prom"}}}]},
                    "egress": {"enabled": True, "apiserver": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]},
                },
                "policy": {"cluster": {"enabled": True}},
            }
        ),
    ],
}


# --- lint and Kubernetes validity ----------------------------------------------------------------


LINTS = {
    "helm": [],
    "cm": ["--set", "certs.mode=cert-manager"],
    "secret": SECRET_MODE,
    "everything-on": [
        *RENDERS["network-policy-egress"],
        *["--set", "metrics.serviceMonitor.enabled=true", "--set", "server.clientCA.configMapName=client-ca"],
    ],
}


@pytest.mark.parametrize("args", list(LINTS.values()), ids=list(LINTS))
def test_helm_lint_passes(helm: Helm, args: list[str]) -> None:
    done = helm.run(
        "lint", str(CHART), "--strict", "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *IMAGE, *args
    )
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
        # the policy's custom resource, and the webhook's right to read it (templates/gpupolicy*.yaml, crd.yaml)
        "CustomResourceDefinition",
        "GPUPolicy",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    }
    assert kinds("helm-certs") == common | {"Secret"}
    assert kinds("cert-manager") == common | {"Issuer", "Certificate"}
    assert kinds("secret") == common
    issuer = helm.template(*RENDERS["cert-manager-issuer"])
    assert {d["kind"] for d in issuer} == common | {"Certificate"}
    assert one(issuer, "Certificate")["spec"]["issuerRef"]["name"] == "corp-ca"


@pytest.mark.parametrize("version", ["1.29.9", "1.20.0"])  # 1.20.0: what a helm without version stamps assumes
def test_kube_version_floor(helm: Helm, version: str) -> None:
    done = helm.run("template", RELEASE, str(CHART), "--kube-version", version)
    assert done.returncode != 0
    assert ">=1.30.0-0" in done.stderr


def test_documented_offline_renders_pass_a_kube_version() -> None:
    """Every `helm template` command shown in the install page and the chart README passes --kube-version (issue
    11) and an image.repository (the chart renders nothing without one), and both say why."""
    for readme in (INSTALL_PAGE, CHART / "README.md"):
        text = readme.read_text(encoding="utf-8")
        commands = re.findall(r"^\$ (helm template .*?)(?<!\\)$", text, flags=re.MULTILINE | re.DOTALL)
        assert commands, readme
        for command in commands:
            assert "--kube-version" in command, f"{readme.name}: {command}"
            assert "image.repository=" in command, f"{readme.name}: {command}"
        assert "v1.20" in text and "--kube-version" in text, readme


# --- the READMEs -------------------------------------------------------------------------------

READMES = (INSTALL_PAGE, CHART / "README.md", ROOT / "certs" / "README.md")
NOT_VALUES = {"webhook.core.policyschema.SCHEMA", "policy.yaml"}  # a module attribute and a file name
VALUES_THE_READMES_EXPLAIN = {
    "metrics.port",
    "metrics.serviceMonitor.enabled",
    "networkPolicy.enabled",
    "networkPolicy.admission.from",
    "networkPolicy.metrics.from",
    "networkPolicy.egress.enabled",
    "networkPolicy.egress.apiserver",
    "policy.cluster.enabled",
}


def value_exists(path: str) -> bool:
    """``a.b.c`` is a key of values.yaml, or of the policy schema under ``policy``."""
    parts = path.split(".")
    if parts[0] == "policy":
        node: Any = sync_schema.policy_schema()
        for part in parts[1:]:
            node = node.get("properties", {}).get(part)
            if node is None:
                return False
        return True
    node = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_readmes_name_real_values_and_explain_the_new_ones() -> None:
    top = set(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")))
    named: dict[Path, set[str]] = {}
    for readme in READMES:
        found = re.findall(r"`([A-Za-z]+(?:\.[A-Za-z]+)+)(?:=[^`]*)?`", readme.read_text(encoding="utf-8"))
        named[readme] = {path for path in found if path.split(".")[0] in top} - NOT_VALUES
        assert not [path for path in named[readme] if not value_exists(path)], readme
    for readme in READMES[:2]:
        assert VALUES_THE_READMES_EXPLAIN <= named[readme], readme


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
        (["--set", "metrics.port=80"], "/metrics/port"),
        (["--set", "metrics.port=http"], "/metrics/port"),
        (["--set-json", 'networkPolicy.admission.from="10.0.0.0/24"'], "/networkPolicy/admission/from"),
        (["--set-json", 'networkPolicy.metrics.from=[{"namespaceSelctor":{}}]'], "/networkPolicy/metrics/from/0"),
        (["--set-json", 'networkPolicy.egress.apiserver=[{"ipBlock":{}}]'], "/networkPolicy/egress/apiserver/0"),
        (["--set", "networkPolicy.egres.enabled=true"], "additional properties 'egres' not allowed"),
        (["--set-json", "resources.limits=[1]"], "/resources/limits"),
        (["--set", "bogus=1"], "additional properties 'bogus' not allowed"),
        (["--set", "webhook.failurePolcy=Fail"], "additional properties 'failurePolcy' not allowed"),
        (["--set", "policy.enforcement=block"], "/policy/enforcement"),
        (["--set", "policy.limits.perPod=-1"], "/policy/limits/perPod"),
        (["--set", "policy.tolerations=yes"], "/policy/tolerations"),
        (["--set-json", "policy.resources=[]"], "/policy/resources"),
        (["--set", "policy.namespaces.ml.resources=x"], "/policy/namespaces/ml"),
        (["--set", "policy.platform=openshift"], "/policy/platform"),
        (["--set", "policy.isolation.hideGpus=all"], "/policy/isolation/hideGpus"),
        (["--set", "policy.namespaces.ml.isolation.runtimeClass=NVIDIA"],
         "/policy/namespaces/ml/isolation/runtimeClass"),
        (["--set-json", 'policy.isolation.trusted.serviceAccounts=["dcgm"]'], "/policy/isolation/trusted"),
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
            "terminationGracePeriodSeconds (8) must be greater than "
            "preStopSleepSeconds + server.drainSeconds + 20 (28)",
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
        (["--set", "metrics.port=8443"], "metrics.port (8443) must differ from server.port"),
        (
            [*RENDERS["network-policy"], "--set", "networkPolicy.egress.enabled=true"]
            + ["--set", "policy.cluster.enabled=true"],
            "networkPolicy.egress.apiserver must list the apiserver's addresses",
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
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
    assert set(c["resources"]) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(next(a for a in c["args"] if a.startswith("--drain-seconds=")).split("=", 1)[1])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain + 20
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
    assert "--metrics-port=8080" in c["args"]
    assert c["ports"] == [
        {"name": "https", "containerPort": 8443, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
    ]
    assert "annotations" not in spec["template"]["metadata"], "no checksum annotation: the server reloads the policy"
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP", "appProtocol": "https"},
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP", "appProtocol": "http"},
    ]
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    labels = deployment["metadata"]["labels"]
    for key in ("name", "instance", "version", "managed-by", "component", "part-of"):
        assert f"app.kubernetes.io/{key}" in labels


@pytest.mark.parametrize("render", ["helm-certs", "custom"])
def test_rollouts_and_drains_keep_a_ready_pod_for_the_apiserver(helm: Helm, render: str) -> None:
    """What zero failed admissions during a rollout or a node drain needs: a surge pod before any old pod goes, a
    PodDisruptionBudget, a preStop sleep before SIGTERM, and a grace period that outlasts the sleep, the drain
    and the server's 20 s for requests in flight."""
    docs = helm.template(*RENDERS[render])
    spec = one(docs, "Deployment")["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pdb = one(docs, "PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 1 and pdb["selector"] == spec["selector"]
    pod = spec["template"]["spec"]
    c = container(docs)
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    drain = float(next(a for a in c["args"] if a.startswith("--drain-seconds=")).split("=", 1)[1])
    assert pod["terminationGracePeriodSeconds"] > 5 + drain + 20
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", "the drain's 503 reaches the kubelet"


@pytest.mark.parametrize(
    ("values", "ok"),
    [
        ({"terminationGracePeriodSeconds": 28}, False),  # 5 + 3 + 20: no room left
        ({"terminationGracePeriodSeconds": 29}, True),
        ({"terminationGracePeriodSeconds": 30, "server": {"drainSeconds": 5.5}}, False),
        ({"terminationGracePeriodSeconds": 24, "preStopSleepSeconds": 0}, True),
        ({"terminationGracePeriodSeconds": 60, "preStopSleepSeconds": 15, "server": {"drainSeconds": 10}}, True),
    ],
)
def test_grace_period_boundary(helm: Helm, values: dict[str, Any], ok: bool) -> None:
    args = values_args(values)
    if ok:
        assert one(helm.template(*args), "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    else:
        assert "must be greater than preStopSleepSeconds + server.drainSeconds + 20" in helm.template_error(*args)


def test_no_pdb_for_a_single_replica(helm: Helm) -> None:
    docs = helm.template(*RENDERS["single-replica"])
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]


def test_client_ca_keeps_http_probes_on_the_metrics_port(helm: Helm) -> None:
    """A client CA guards the HTTPS port only: the kubelet still probes /readyz (and sees the drain's 503)."""
    docs = helm.template(*RENDERS["custom"])
    c = container(docs)
    assert "--client-ca=/etc/gpu-webhook-client-ca/ca.crt" in c["args"]
    assert "--drain-seconds=2.5" in c["args"]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics", "scheme": "HTTP"}
        assert "tcpSocket" not in c[probe]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "client-ca", "configMap": {"name": "apiserver-client-ca"}} in pod["volumes"]


@pytest.mark.parametrize("render", ["helm-certs", "secret", "custom"])
def test_service_monitor_scrapes_the_metrics_port_over_plain_http(helm: Helm, render: str) -> None:
    """No tlsConfig, so no CA Secret: in secret mode the README's `kubectl create secret tls` makes no ca.crt,
    and a client CA ("custom") would refuse a scraper without a client certificate."""
    docs = helm.template(*RENDERS[render], "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.port=9090")
    monitor = one(docs, "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "30s"}
    service_ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    assert service_ports["metrics"]["port"] == 9090 and service_ports["metrics"]["targetPort"] == "metrics"
    c = container(docs)
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
    assert "--metrics-port=9090" in c["args"]


# --- webhook configurations --------------------------------------------------------------------


def test_webhook_configurations(helm: Helm) -> None:
    docs = helm.template()
    hooks = webhooks(docs)
    assert set(hooks) == {"mutate.gpu-webhook.io", "validate.gpu-webhook.io", "validate-dra.gpu-webhook.io",
                          "validate-custom.gpu-webhook.io"}
    mutate, validate = hooks["mutate.gpu-webhook.io"], hooks["validate.gpu-webhook.io"]
    dra, custom = hooks["validate-dra.gpu-webhook.io"], hooks["validate-custom.gpu-webhook.io"]
    # No kind the registry of kinds knows passes unseen: every custom kind of it, by default.
    assert custom["rules"] == [{"apiGroups": rule["apiGroups"], "apiVersions": ["*"],
                                "operations": ["CREATE", "UPDATE"], "resources": rule["resources"], "scope": "*"}
                               for rule in registry_rules()]
    assert {r for rule in custom["rules"] for r in rule["resources"]} >= {
        "pytorchjobs", "rayjobs", "inferenceservices", "nimservices", "vllmruntimes", "trainjobs", "workspacekinds"}
    for hook, path in ((mutate, "/mutate"), (validate, "/validate"), (dra, "/validate"), (custom, "/validate")):
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["failurePolicy"] == "Fail"
        assert hook["timeoutSeconds"] == 5
        assert hook["clientConfig"]["service"] == {"name": FULLNAME, "namespace": NAMESPACE, "path": path, "port": 443}
        assert base64.b64decode(hook["clientConfig"]["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
        [expr] = hook["namespaceSelector"]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
        assert expr["values"] == ["kube-system", "kube-node-lease", NAMESPACE]
    assert [c["name"] for c in mutate["matchConditions"]] == ["gpu-or-hidden-namespace"]
    assert [c["name"] for c in validate["matchConditions"]] == ["gpu-or-isolation"]
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
    # The registry's custom kinds first (every version, any scope), then webhook.customResources.
    registry = [{"apiGroups": r["apiGroups"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                 "resources": r["resources"], "scope": "*"} for r in registry_rules()]
    assert custom["rules"][:len(registry)] == registry
    assert custom["rules"][len(registry):] == [
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

    def __call__(self, kind: str, obj: Any, group: str = "", namespace: str = "default") -> Any:
        request = {"kind": {"group": group, "version": "v1", "kind": kind}, "operation": "CREATE",
                   "namespace": namespace}
        activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj)}
        return self.program.evaluate(activation)

    def holds(self, kind: str, obj: Any, namespace: str = "default") -> bool:
        result = self(kind, obj, namespace=namespace)
        assert isinstance(result, celpy.celtypes.BoolType), f"evaluation error for {kind}: {result!r}"
        return bool(result)


def conditions_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The one matchConditions expression of each webhook, by webhook name."""
    out = {}
    for name, hook in webhooks(docs).items():
        if "matchConditions" in hook:
            [only] = hook["matchConditions"]
            out[name] = only["expression"]
    return out


MUTATE, VALIDATE, VALIDATE_DRA = "mutate.gpu-webhook.io", "validate.gpu-webhook.io", "validate-dra.gpu-webhook.io"


@pytest.fixture(scope="module")
def conditions(helm: Helm) -> dict[str, Condition]:
    """The pod webhooks' conditions (validate-dra's is tested on its own, by test_dra_match_condition)."""
    expressions = conditions_of(helm.template())
    assert set(expressions) == {MUTATE, VALIDATE, VALIDATE_DRA}
    return {name: Condition(expressions[name]) for name in (MUTATE, VALIDATE)}


@pytest.fixture(scope="module")
def condition(conditions: dict[str, Condition]) -> Condition:
    """The validating webhook's: it takes all the mutating one takes, and what the isolation rules need."""
    return conditions[VALIDATE]


@pytest.mark.parametrize("hook", [MUTATE, VALIDATE], ids=["mutate", "validate"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("spec", "expected"), [(s, e) for _, s, e in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_match_condition(
    conditions: dict[str, Condition], hook: str, kind: str, spec: dict[str, Any], expected: bool
) -> None:
    assert conditions[hook].holds(kind, wrap(kind, spec)) is expected


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
def test_match_condition_never_errors_on_missing_fields(
    conditions: dict[str, Condition], kind: str, obj: dict[str, Any]
) -> None:
    for hook in conditions.values():
        assert hook.holds(kind, obj) is False


def test_match_condition_follows_policy_resources(helm: Helm) -> None:
    """Exact names, trailing-* prefixes and other globs, with the webhook's fnmatch meaning."""
    docs = helm.template(*values_args({"policy": {"resources": CUSTOM_POLICY["resources"] + ["acme.io/gpu-?"]}}))
    expressions = conditions_of(docs)
    assert set(expressions) == {MUTATE, VALIDATE, VALIDATE_DRA}
    holds = Condition(expressions[MUTATE]).holds  # the validating one also takes the registry's vendor names
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


def test_default_patterns_are_the_webhooks(conditions: dict[str, Condition]) -> None:
    """The chart's fallback GPU patterns (policy: {}) are the webhook's DEFAULTS['resources']."""
    condition = conditions[MUTATE]  # policy.resources alone
    policy = parse_policy("{}").default
    for pattern in DEFAULTS["resources"]:
        name = pattern.replace("*", "x")
        assert policy.is_gpu(name)
        assert condition.holds("Pod", wrap("Pod", pod_spec(gpu(name)))), pattern
    implicit = [f"deviceclass.resource.kubernetes.io/{c}" for c in DEFAULTS["dra"]["gpuClasses"]]
    for k in re.findall(r"'([^']+)'", condition.expression):
        if "/" in k:
            assert any(p.startswith(k) or p == k for p in DEFAULTS["resources"] + implicit), k


# --- what the isolation rules need, and nothing more ---------------------------------------------


def annotated(obj: dict[str, Any], kind: str, annotations: dict[str, str]) -> dict[str, Any]:
    """``obj`` with ``annotations`` on its pod template's metadata (a Pod's own)."""
    if kind == "Pod":
        template = obj
    elif kind == "PodTemplate":
        template = obj["template"]
    elif kind == "CronJob":
        template = obj["spec"]["jobTemplate"]["spec"]["template"]
    else:
        template = obj["spec"]["template"]
    template.setdefault("metadata", {})["annotations"] = annotations
    return obj


def env(name: str, value: str = "all") -> dict[str, Any]:
    return {**BARE, "env": [{"name": "A", "value": "1"}, {"name": name, "value": value}]}


def limits(name: str) -> dict[str, Any]:
    return {**BARE, "resources": {"limits": {name: "1"}}}


# (id, pod spec, annotations, sent to /validate, sent to /mutate)
ISOLATION_CASES = [
    ("NVIDIA_VISIBLE_DEVICES", pod_spec(env("NVIDIA_VISIBLE_DEVICES")), {}, True, False),
    ("NVIDIA_VISIBLE_DEVICES=void too (the webhook decides)", pod_spec(env("NVIDIA_VISIBLE_DEVICES", "void")), {},
     True, False),
    ("NVIDIA_MIG_CONFIG_DEVICES in an init container",
     pod_spec(BARE, initContainers=[env("NVIDIA_MIG_CONFIG_DEVICES")]),
     {}, True, False),
    ("a privileged container", pod_spec({**BARE, "securityContext": {"privileged": True}}), {}, True, False),
    ("a privileged init container", pod_spec(BARE, initContainers=[{**BARE, "securityContext": {"privileged": True}}]),
     {}, True, False),
    ("a hostPath volume", pod_spec(BARE, volumes=[{"name": "d", "hostPath": {"path": "/dev/nvidia0"}}]), {}, True,
     False),
    ("any hostPath volume (paths can be spelt many ways)",
     pod_spec(BARE, volumes=[{"name": "d", "hostPath": {"path": "/var/log"}}]), {}, True, False),
    ("a mount into the device list directory",
     pod_spec({**BARE, "volumeMounts": [{"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}]}), {},
     True, False),
    ("runtimeClassName nvidia", pod_spec(BARE, runtimeClassName="nvidia"), {}, True, False),
    ("runtimeClassName nvidia-cdi", pod_spec(BARE, runtimeClassName="nvidia-cdi"), {}, True, False),
    ("a cdi.k8s.io annotation", pod_spec(BARE), {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}, True, False),
    ("an NRI plugin annotation", pod_spec(BARE), {"nvidia.cdi.k8s.io/container.c": "nvidia.com/gpu=0"}, True, False),
    ("the NRI plugin's bare key", pod_spec(BARE), {"nvidia.cdi.k8s.io": "nvidia.com/gpu=0"}, True, False),
    ("a time-sliced replica", pod_spec(limits("nvidia.com/gpu.shared")), {}, True, False),
    ("HAMi memory", pod_spec(limits("nvidia.com/gpumem")), {}, True, False),
    ("a Volcano vGPU", pod_spec(limits("volcano.sh/vgpu-number")), {}, True, False),
    ("an AMD partition", pod_spec(limits("amd.com/cpx_nps4")), {}, True, False),
    ("NVIDIA management devices", pod_spec(limits("management.nvidia.com/gpu")), {}, True, False),
    ("Intel monitoring (a policy pattern too)", pod_spec(limits("gpu.intel.com/monitoring")), {}, True, True),
    # Ordinary CPU pods: never sent.
    ("CUDA_VISIBLE_DEVICES", pod_spec(env("CUDA_VISIBLE_DEVICES")), {}, False, False),
    ("a variable whose value names the device variable", pod_spec(env("X", "NVIDIA_VISIBLE_DEVICES")), {}, False,
     False),
    ("envFrom a ConfigMap", pod_spec({**BARE, "envFrom": [{"configMapRef": {"name": "c"}}]}), {}, False, False),
    ("privileged: false", pod_spec({**BARE, "securityContext": {"privileged": False}}), {}, False, False),
    ("a security context without privileged", pod_spec({**BARE, "securityContext": {"runAsUser": 1000}}), {}, False,
     False),
    ("emptyDir and configMap volumes", pod_spec(BARE, volumes=[{"name": "e", "emptyDir": {}},
                                                               {"name": "c", "configMap": {"name": "c"}}]), {},
     False, False),
    ("an ordinary mount", pod_spec({**BARE, "volumeMounts": [{"name": "v", "mountPath": "/data"}]}), {}, False, False),
    ("runtimeClassName kata", pod_spec(BARE, runtimeClassName="kata"), {}, False, False),
    ("ordinary annotations", pod_spec(BARE), {"prometheus.io/scrape": "true", "example.com/cdi.k8s.io": "x"}, False,
     False),
    # A fractional scheduler's pod is a GPU pod to the rules (GpuUse.fractional): hostPID, privileged... speak of it.
    ("a KAI fraction annotation", pod_spec(BARE), {"gpu-fraction": "0.5"}, True, False),
    ("a Run:ai memory annotation with hostPID", pod_spec(BARE, hostPID=True), {"gpu-memory": "4000"}, True, False),
    ("a GPU pod with hostPID", pod_spec(limits("nvidia.com/gpu"), hostPID=True), {}, True, True),
    # cpuPodOnGpuNodes (on by default): a CPU pod that tolerates a GPU taint or selects the accelerator label.
    ("a CPU pod tolerating nvidia.com/gpu", pod_spec(BARE, tolerations=[{"key": "nvidia.com/gpu",
                                                                           "operator": "Exists"}]), {}, True, False),
    ("a CPU pod selecting the accelerator label", pod_spec(BARE, nodeSelector={"accelerator": "nvidia-l4"}), {},
     True, False),
    ("the tolerations every pod gets", pod_spec(BARE, tolerations=[
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]), {}, False, False),
    ("a DRA claim (its devices count against the caps; mutation gives it the accelerator selector)",
     pod_spec({**BARE, "resources": {"claims": [{"name": "gpu"}]}}, resourceClaims=[{"name": "gpu"}]), {}, True,
     True),
    ("a CPU pod with every ordinary field", pod_spec(
        {**PLAIN, "env": [{"name": "PATH", "value": "/bin"}], "volumeMounts": [{"name": "e", "mountPath": "/e"}],
         "securityContext": {"runAsNonRoot": True}},
        volumes=[{"name": "e", "emptyDir": {}}], nodeSelector={"zone": "a"},
        tolerations=[{"key": "x", "operator": "Exists"}]), {"team": "a"}, False, False),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("spec", "annotations", "validate", "mutate"), [c[1:] for c in ISOLATION_CASES], ids=[c[0] for c in ISOLATION_CASES]
)
def test_match_conditions_take_what_the_isolation_rules_need(
    conditions: dict[str, Condition], kind: str, spec: dict[str, Any], annotations: dict[str, str], validate: bool,
    mutate: bool,
) -> None:
    obj = annotated(wrap(kind, copy.deepcopy(spec)), kind, annotations)
    assert conditions[VALIDATE].holds(kind, obj) is validate
    assert conditions[MUTATE].holds(kind, obj) is mutate


@pytest.mark.parametrize("case", ISOLATION_CASES, ids=[c[0] for c in ISOLATION_CASES])
def test_what_reaches_validate_is_what_the_webhook_may_refuse(case: tuple[Any, ...]) -> None:
    """Every object a rule can speak about is sent; what is not sent draws nothing from the default policy
    (only check's warning on envFrom, a source admission cannot read anyway)."""
    name, spec, annotations, sent, _ = case
    obj = annotated(wrap("Pod", copy.deepcopy(spec)), "Pod", annotations)
    rules = {v.rule for v in decide(obj, "", "Pod", "default", parse_policy("{}")).violations}
    if not sent:
        assert rules <= {"visible-devices-unread"}, (name, rules)


@pytest.mark.parametrize(
    ("policy", "hidden"),
    [
        ({"namespaces": {"shared": {"isolation": {"hideGpus": "void"}}, "lab": {"isolation": {"hideGpus": "none"}}}},
         {"shared", "lab"}),
        ({"isolation": {"hideGpus": "void"}, "namespaces": {"gpu-jobs": {"isolation": {"hideGpus": False}},
                                                            "ml": {"isolation": {"hideGpus": "off"}}}},
         {"default", "shared", "lab", "team-a"}),
        ({"isolation": {"hideGpus": "none"}}, {"default", "shared", "lab", "team-a", "gpu-jobs", "ml"}),
        ({"isolation": {"hideGpus": False}, "namespaces": {"ml": {"enforcement": "warn"}}}, set()),
        ({}, set()),
    ],
    ids=["named-namespaces", "everywhere-but", "everywhere", "bare-off", "default"],
)
def test_mutate_takes_every_pod_where_hide_gpus_applies(helm: Helm, policy: dict[str, Any], hidden: set[str]) -> None:
    expressions = conditions_of(helm.template(*values_args({"policy": policy})))
    mutate, validate = Condition(expressions[MUTATE]), Condition(expressions[VALIDATE])
    policies = parse_policy(json.dumps(policy))
    cpu_pod = wrap("Pod", pod_spec(PLAIN))
    for namespace in ("default", "shared", "lab", "team-a", "gpu-jobs", "ml"):
        assert mutate.holds("Pod", cpu_pod, namespace) is (namespace in hidden), namespace
        webhook_hides = policies.for_namespace(namespace).hide_gpus != "off"
        assert webhook_hides is (namespace in hidden), "the chart agrees with the webhook"
        assert validate.holds("Pod", cpu_pod, namespace) is False


# --- NOTES.txt ---------------------------------------------------------------------------------


def notes(helm: Helm, *args: str) -> str:
    # `helm install --dry-run=client` renders NOTES.txt without a cluster (it takes no --kube-version).
    done = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *IMAGE, *args)
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
    assert "port-forward service/gw-gpu-webhook 8080:metrics" in text
    assert "curl http://localhost:8080/metrics" in text and "https://localhost" not in text
    assert "WARNING" not in text


def test_the_readme_cluster_quick_start_verifies_with_the_notes_command_and_its_answer(helm: Helm) -> None:
    """The README's "Quick start: cluster" dry run and the denial it shows are the NOTES' (held to the real
    decision above and, through the apiserver, by tests/e2e/test_helm.py), so the README cannot drift."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start: cluster", 1)[1].split("\n## ", 1)[0]
    block = section.split("```console\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("$ kubectl ") and len(block) == 2, block
    text = [ln.strip() for ln in notes(helm).splitlines()]
    assert block[0].removeprefix("$ ") in text
    assert block[1] in text and block[1].startswith("Error from server (Forbidden): ")


def test_notes_warn_about_test_settings_and_avoid_excluded_namespaces(helm: Helm) -> None:
    text = notes(helm, *RENDERS["url"], "--set", "webhook.failurePolicy=Ignore", "--namespace", "default")
    assert "webhook.url is set" in text and "failurePolicy is Ignore" in text
    assert "kubectl create namespace gpu-webhook-test" in text
    assert "kubectl -n gpu-webhook-test run gpu-test" in text


def test_notes_of_hybrid_mode_with_cluster_checks_name_the_cluster_rules_the_policies_carry(helm: Helm) -> None:
    cluster = values_args({"policy": {"cluster": {"enabled": True}}})
    live = notes(helm, "--set", "admissionPolicies.enabled=true", *cluster)
    assert "The webhook still sees every GPU object" not in live
    assert "The webhook sees the pods that have DRA claims" in " ".join(live.split())
    sentence = " ".join(live.split()).split(" and carry ")[1].split(" without it")[0]
    assert set(sentence.split(", ")) == {"unknown-accelerator", "exceeds-node-capacity", "unadvertised-resource",
                                         "unknown-runtime-class", "runtime-class-conflict", "unknown-device-class",
                                         "exceeds-device-capacity"}
    inline = notes(helm, "--set", "admissionPolicies.enabled=true", *values_args(
        {"policy": {"cluster": {"enabled": True}, "nativePolicies": {"params": "inline"}}}))
    assert "The webhook still sees every GPU object" in inline and "unknown-accelerator" not in inline


def test_cluster_checks_bring_read_only_node_and_runtime_class_access_and_nothing_else(helm: Helm) -> None:
    reader = f"{FULLNAME}-cluster-reader"
    assert not [d for d in helm.template() if d["metadata"]["name"] == reader]
    docs = helm.template(*values_args({"policy": {"cluster": {"enabled": True}}}))
    role = one(docs, "ClusterRole", reader)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"],
         "resources": ["resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list", "watch"]},
    ]
    binding = one(docs, "ClusterRoleBinding", reader)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.mark.parametrize("render", ["helm-certs", "custom"])
def test_without_cluster_checks_no_token_reaches_the_pod(helm: Helm, render: str) -> None:
    """Without the policy object (policyObject.enabled false) the webhook calls no Kubernetes API: no automatic
    token, no projected one, no RBAC."""
    docs = helm.template(*RENDERS[render], "--set", "policyObject.enabled=false")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    assert not [v for v in pod["volumes"] if "projected" in v]
    assert all(not m["mountPath"].startswith("/var/run/secrets") for m in container(docs)["volumeMounts"])


def test_cluster_checks_mount_a_projected_token_where_the_client_looks(helm: Helm) -> None:
    """policy.cluster.enabled lists and watches Nodes with the in-cluster config: without a token there the watch
    fails ("Service token file does not exist"), /readyz stays 503 and failurePolicy Fail refuses every GPU pod."""
    docs = helm.template(*RENDERS["cluster-checks"])
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    # Still no automatic token: the projected one is mounted into the webhook container alone.
    assert pod["automountServiceAccountToken"] is False
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    [mount] = [m for m in container(docs)["volumeMounts"] if m["mountPath"] == SA_DIR]
    assert mount["readOnly"] is True and "subPath" not in mount
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {
            "downwardAPI": {
                "items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]
            }
        },
    ]
    # The files kubernetes.config.load_incluster_config() reads.
    files = {f"{SA_DIR}/{path}" for path in ("token", "ca.crt", "namespace")}
    assert {incluster_config.SERVICE_TOKEN_FILENAME, incluster_config.SERVICE_CERT_FILENAME} <= files
    # The token belongs to the account the node-reader binding names.
    binding = one(docs, "ClusterRoleBinding", f"{FULLNAME}-cluster-reader")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


# --- NetworkPolicy -----------------------------------------------------------------------------


def network_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    policy = one(docs, "NetworkPolicy")
    assert policy["spec"]["podSelector"] == one(docs, "Deployment")["spec"]["selector"]
    return policy["spec"]


def test_no_network_policy_unless_enabled(helm: Helm) -> None:
    assert "NetworkPolicy" not in {d["kind"] for d in helm.template()}


def test_network_policy_defaults_admit_the_apiserver_from_anywhere_and_metrics_from_monitoring(helm: Helm) -> None:
    """Ingress to exactly two ports; the admission port open to any source (where the apiserver calls from depends
    on the distribution), the metrics port to the monitoring namespace; egress untouched."""
    spec = network_policy(helm.template(*RENDERS["network-policy"]))
    assert spec["policyTypes"] == ["Ingress"]
    assert "egress" not in spec
    assert spec["ingress"] == [
        {"ports": [{"port": 8443, "protocol": "TCP"}]},
        {
            "ports": [{"port": 8080, "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        },
    ]


def test_network_policy_follows_ports_and_sources(helm: Helm) -> None:
    peers = [{"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.99/32"]}}]
    args = values_args({"networkPolicy": {"enabled": True, "admission": {"from": peers}, "metrics": {"from": []}}})
    spec = network_policy(helm.template(*args, "--set", "server.port=9443", "--set", "metrics.port=9090"))
    assert spec["ingress"] == [
        {"ports": [{"port": 9443, "protocol": "TCP"}], "from": peers},
        {"ports": [{"port": 9090, "protocol": "TCP"}]},
    ]


def test_network_policy_egress_with_cluster_checks_reaches_the_apiserver_and_dns_only(helm: Helm) -> None:
    spec = network_policy(helm.template(*RENDERS["network-policy-egress"]))
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert spec["ingress"][1]["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "prom"}}}]
    assert spec["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}],
            "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
        },
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
    ]
    ports = helm.template(*RENDERS["network-policy-egress"], "--set-json", "networkPolicy.egress.apiserverPorts=[]")
    assert "ports" not in network_policy(ports)["egress"][0], "no ports: any port of the apiserver peers"


@pytest.mark.parametrize(
    "values",
    [
        {"networkPolicy": {"enabled": True, "egress": {"enabled": True}}, "policyObject": {"enabled": False}},
        {
            "networkPolicy": {
                "enabled": True,
                "egress": {"enabled": True, "apiserver": [{"ipBlock": {"cidr": "1.2.3.4/32"}}]},
            },
            "policyObject": {"enabled": False},
        },
    ],
    ids=["no-peers", "peers-unused"],
)
def test_network_policy_egress_without_cluster_checks_allows_nothing(helm: Helm, values: dict[str, Any]) -> None:
    """Without policy.cluster.enabled, the audit and the policy object the webhook opens no connection, so
    restricting egress denies all of it."""
    spec = network_policy(helm.template(*values_args(values)))
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"] == []


def test_cluster_checks_leave_egress_alone_unless_asked(helm: Helm) -> None:
    spec = network_policy(helm.template(*RENDERS["network-policy"], *RENDERS["cluster-checks"]))
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec


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
    expression = conditions_of(helm.template())["validate-dra.gpu-webhook.io"]
    assert Condition(expression).holds(kind, obj) is expected
