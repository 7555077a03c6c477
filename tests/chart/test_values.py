"""Values that keep a failurePolicy Fail webhook from blocking GPU pods, or from running weaker than meant.

- image.repository has no default: a made-up name leaves the pods in ImagePullBackOff and every GPU pod creation
  failing `failed calling webhook`, so the chart refuses to render without it; image.digest pins the image.
- replicaCount 0 (no pod to answer) is refused by the schema.
- securityContext and podSecurityContext take the Kubernetes fields only: a misspelt field (which the apiserver
  would drop, silently weakening the pod) fails the install.
- priorityClassName renders, is checked as a name, and the chart README says which class to use and why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart import test_chart
from tests.chart.test_chart import (
    CHART,
    IMAGE_REPOSITORY,
    KUBE_MINOR,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    Helm,
    container,
    one,
    values_args,
)

# test_chart's session fixtures, found here by name.
helm_bin, helm_env, helm = test_chart.helm_bin, test_chart.helm_env, test_chart.helm

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))["appVersion"]
DIGEST = "sha256:" + "0123456789abcdef" * 4
SCHEMA_ERROR = "values don't meet the specifications of the schema"


def bare_template(helm: Helm, *args: str):
    """``helm template`` without the image the other tests always pass."""
    return helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args)


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


# --- the image ----------------------------------------------------------------------------------


def test_values_name_no_image() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert values["image"]["repository"] == ""


MISSING_IMAGE = (
    "image.repository is required: the registry repository your nodes pull the gpu-webhook image from "
    "(helm install ... --set image.repository=<your registry>/gpu-webhook)"
)


@pytest.mark.parametrize(
    "args",
    [[], ["--set", "image.tag=0.1.0"], ["--set", f"image.digest={DIGEST}"], ["--set", "image.repository="]],
    ids=["defaults", "tag-only", "digest-only", "explicitly-empty"],
)
def test_no_repository_no_render(helm: Helm, args: list[str]) -> None:
    """One line naming the value and what to set, from `helm template` and from `helm install`."""
    done = bare_template(helm, *args)
    assert done.returncode != 0 and done.stdout == ""
    # The message is one line; helm adds only its generic hint about --debug.
    line, *rest = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line.startswith("Error: ") and line.endswith(MISSING_IMAGE), line
    assert rest == ["Use --debug flag to render out invalid YAML"], rest
    install = helm.run("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *args)
    assert install.returncode != 0 and MISSING_IMAGE in install.stderr


def test_lint_without_repository_warns_what_to_set(helm: Helm) -> None:
    """`helm lint` never fails on `required` values (by design, even with --strict): it warns, with our line."""
    done = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION)
    assert "missing required values" in done.stderr and MISSING_IMAGE in done.stderr


@pytest.mark.parametrize(
    ("values", "reference"),
    [
        ({}, f"{IMAGE_REPOSITORY}:{APP_VERSION}"),
        ({"tag": "1.2.3"}, f"{IMAGE_REPOSITORY}:1.2.3"),
        ({"digest": DIGEST}, f"{IMAGE_REPOSITORY}@{DIGEST}"),
        ({"tag": "1.2.3", "digest": DIGEST}, f"{IMAGE_REPOSITORY}@{DIGEST}"),
        ({"repository": "localhost:5000/team/gpu-webhook"}, f"localhost:5000/team/gpu-webhook:{APP_VERSION}"),
    ],
    ids=["app-version", "tag", "digest", "digest-over-tag", "registry-port"],
)
def test_image_reference(helm: Helm, values: dict[str, str], reference: str) -> None:
    """A digest pins the image, repository@sha256:..., and the tag is then ignored."""
    args = [arg for key, value in values.items() for arg in ("--set", f"image.{key}={value}")]
    assert container(helm.template(*args))["image"] == reference


@pytest.mark.parametrize(
    ("repository", "message"),
    [
        ("localhost/gpu-webhook:1.0", "must not carry a tag: give the repository alone and the tag in image.tag"),
        ("localhost:5000/gpu-webhook:1.0", "must not carry a tag"),
        (f"localhost/gpu-webhook@{DIGEST}", "must not carry a digest: give the repository alone and the digest in"),
        ("localhost/gpu webhook", "must not contain white space"),
    ],
)
def test_repository_with_a_tag_or_digest_is_refused(helm: Helm, repository: str, message: str) -> None:
    error = helm.template_error("--set", f"image.repository={repository}")
    assert f'image.repository "{repository}" {message}' in error


@pytest.mark.parametrize("digest", ["0123abcd", "sha256:abc", "sha512:" + "0" * 64, "SHA256:" + "0" * 64])
def test_digest_must_be_sha256(helm: Helm, digest: str) -> None:
    error = helm.template_error("--set", f"image.digest={digest}")
    assert SCHEMA_ERROR in error and "/image/digest" in error


# --- replicas -----------------------------------------------------------------------------------


def test_zero_replicas_are_refused(helm: Helm) -> None:
    """With failurePolicy Fail, a Deployment scaled to 0 leaves every GPU pod creation failing."""
    error = helm.template_error("--set", "replicaCount=0")
    assert SCHEMA_ERROR in error and "/replicaCount" in error and "minimum" in error
    assert one(helm.template("--set", "replicaCount=1"), "Deployment")["spec"]["replicas"] == 1


# --- security contexts ---------------------------------------------------------------------------


def kubernetes_definitions() -> dict[str, Any]:
    """The OpenAPI definitions kubernetes-validate ships for the e2e bed's Kubernetes minor version."""
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{KUBE_MINOR}.0-local-strict"
    return json.loads((root / "_definitions.json").read_text(encoding="utf-8"))["$defs"]


def chart_fields(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Field names of an object node of values.schema.json, nested objects as dicts, leaves as None."""
    if "$ref" in node:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    if node.get("type") == "array":
        node = node["items"]
    if node.get("type") != "object":
        return {}
    assert node.get("additionalProperties") is False, node
    return {name: chart_fields(schema, sub) or None for name, sub in node["properties"].items()}


def kubernetes_fields(defs: dict[str, Any], name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, sub in defs[name]["properties"].items():
        ref = sub.get("$ref") or (sub.get("items") or {}).get("$ref")
        out[field] = kubernetes_fields(defs, ref.rsplit("/", 1)[1]) if ref else None
    return out


@pytest.mark.parametrize(
    ("value", "kind"), [("securityContext", "SecurityContext"), ("podSecurityContext", "PodSecurityContext")]
)
def test_security_contexts_take_exactly_the_kubernetes_fields(value: str, kind: str) -> None:
    """The schema's fields, nested ones included, are those of core/v1 <kind> in the bed's Kubernetes version."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    defs = kubernetes_definitions()
    assert chart_fields(schema, schema["properties"][value]) == kubernetes_fields(defs, f"io.k8s.api.core.v1.{kind}")


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--set", "securityContext.readOnlyRootFileSystem=true"], "additional properties 'readOnlyRootFileSystem'"),
        (["--set", "podSecurityContext.runAsUSer=1000"], "additional properties 'runAsUSer'"),
        (["--set", "securityContext.capabilities.dorp[0]=ALL"], "additional properties 'dorp'"),
        (["--set", "securityContext.capabilities.drop=ALL"], "/securityContext/capabilities/drop"),
        (["--set", "securityContext.runAsNonRoot=yes"], "/securityContext/runAsNonRoot"),
        (["--set", "securityContext.runAsUser=-1"], "/securityContext/runAsUser"),
        (["--set", "securityContext.seccompProfile.type=Default"], "/securityContext/seccompProfile/type"),
        (["--set", "podSecurityContext.seccompProfile.tpye=RuntimeDefault"], "additional properties 'tpye'"),
        (["--set", "podSecurityContext.fsGroupChangePolicy=Sometimes"], "/podSecurityContext/fsGroupChangePolicy"),
        (["--set-json", 'podSecurityContext.sysctls=[{"name":"net.core.somaxconn"}]'], "/podSecurityContext/sysctls/0"),
        (["--set", "podSecurityContext.readOnlyRootFilesystem=true"], "additional properties 'readOnlyRootFilesystem'"),
    ],
)
def test_security_context_typos_fail_the_install(helm: Helm, args: list[str], where: str) -> None:
    error = helm.template_error(*args)
    assert SCHEMA_ERROR in error and where in error


FULL_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "appArmorProfile": {"type": "RuntimeDefault"},
    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    "privileged": False,
    "procMount": "Default",
    "readOnlyRootFilesystem": True,
    "runAsGroup": 65532,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seLinuxOptions": {"level": "s0:c123,c456", "type": "container_t"},
    "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/gpu-webhook.json"},
}
FULL_POD = {
    "appArmorProfile": {"type": "Localhost", "localhostProfile": "gpu-webhook"},
    "fsGroup": 65532,
    "fsGroupChangePolicy": "OnRootMismatch",
    "runAsGroup": 65532,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "seLinuxChangePolicy": "MountOption",
    "seLinuxOptions": {"user": "system_u", "role": "system_r"},
    "seccompProfile": {"type": "RuntimeDefault"},
    "supplementalGroups": [1000, 2000],
    "supplementalGroupsPolicy": "Strict",
    "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
}


def test_every_field_renders_into_a_valid_pod(helm: Helm) -> None:
    """The typed schema refuses nothing Kubernetes takes: a context using most fields renders unchanged and
    passes strict validation."""
    docs = helm.template(*values_args({"securityContext": FULL_CONTAINER, "podSecurityContext": FULL_POD}))
    assert container(docs)["securityContext"] == FULL_CONTAINER
    assert pod_spec(docs)["securityContext"] == FULL_POD
    kubernetes_validate.validate(one(docs, "Deployment"), KUBE_MINOR, strict=True)


def test_null_drops_a_default_field(helm: Helm) -> None:
    """How values.yaml says to remove a default: null, which Helm deletes before the schema sees it."""
    docs = helm.template("--set", "podSecurityContext.fsGroup=null", "--set", "securityContext.seccompProfile=null")
    assert "fsGroup" not in pod_spec(docs)["securityContext"]
    assert "seccompProfile" not in container(docs)["securityContext"]
    assert container(docs)["securityContext"]["readOnlyRootFilesystem"] is True


# --- priority class ----------------------------------------------------------------------------------


def test_priority_class(helm: Helm) -> None:
    assert "priorityClassName" not in pod_spec(helm.template())
    docs = helm.template("--set", "priorityClassName=system-cluster-critical")
    assert pod_spec(docs)["priorityClassName"] == "system-cluster-critical"


@pytest.mark.parametrize("name", ["System-Cluster-Critical", "critical_webhooks", "-critical", "a" * 254])
def test_priority_class_must_be_a_name(helm: Helm, name: str) -> None:
    error = helm.template_error("--set", f"priorityClassName={name}")
    assert SCHEMA_ERROR in error and "/priorityClassName" in error


def test_chart_readme_recommends_a_priority_class_and_says_its_caveat() -> None:
    text = (CHART / "README.md").read_text(encoding="utf-8")
    section = text.split("## Priority", 1)[1].split("\n## ", 1)[0]
    for words in ("priorityClassName=system-cluster-critical", "failurePolicy: Fail", "ResourceQuota",
                  "kube-system", "scopeSelector", "PriorityClass"):
        assert words in section, words


def test_chart_readme_shows_the_error_helm_prints(helm: Helm) -> None:
    text = (CHART / "README.md").read_text(encoding="utf-8")
    command = "$ helm install gpu-webhook charts/gpu-webhook --namespace gpu-system --create-namespace\n"
    shown = text.split(command, 1)[1].splitlines()[0]
    done = helm.run("install", "gpu-webhook", str(CHART), "--namespace", "gpu-system", "--create-namespace",
                    "--dry-run=client")
    assert done.stderr.splitlines()[0] == shown
