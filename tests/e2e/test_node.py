"""The node bed (tests/e2e/node.py): pods from imported images run on a real kubelet, Services work through
kube-proxy, the apiserver reaches pods (service proxy and an admission webhook registered by
``clientConfig.service``), and pods reach the apiserver with their projected service-account token."""

from __future__ import annotations

import base64
import datetime
import json
import time

import pytest

from tests.e2e.node import AGENT_IMAGE, CA, KUBERNETES_SERVICE_IP, PAUSE_IMAGE, POD_CIDR, NodeBed, until
from tests.manifests import tls_secret
from tests.tools import versions

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(480)]

NAMESPACE = "node-e2e"
WEBHOOK = "agent.node-e2e.gw-e2e.invalid"


def _apply(bed: NodeBed, *documents: dict) -> None:
    bed.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)}),
                check=True)


def _time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture(scope="module")
def agent(node_bed: NodeBed):
    """The agent image as a one-replica Deployment behind the Service ``agent`` (http 80, https 443), with a
    serving certificate for ``agent.node-e2e.svc`` in a Secret; the namespace is deleted afterwards."""
    bed = node_bed
    ca = CA.create("node-e2e-webhook-ca")
    cert, key = ca.issue("agent", hosts=("agent", f"agent.{NAMESPACE}", f"agent.{NAMESPACE}.svc",
                                         f"agent.{NAMESPACE}.svc.cluster.local"))
    labels = {"app": "agent"}
    created = time.monotonic()
    _apply(bed, {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {"gw-e2e/webhook": "on"}}})
    _apply(bed,
           tls_secret("agent-tls", NAMESPACE, cert, key),
           {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "agent", "namespace": NAMESPACE},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "terminationGracePeriodSeconds": 2,
                         "securityContext": {"runAsNonRoot": True},
                         "containers": [{
                             "name": "agent", "image": AGENT_IMAGE, "imagePullPolicy": "Never",
                             # Not ready for 3 s: the readiness probe, not container start, makes it Ready.
                             "args": ["-ready-after=3s"],
                             "ports": [{"name": "http", "containerPort": 8080},
                                       {"name": "https", "containerPort": 8443}],
                             "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"},
                                                "periodSeconds": 1, "failureThreshold": 1},
                             "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                             "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                           "limits": {"memory": "64Mi"}},
                             "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                 "capabilities": {"drop": ["ALL"]}},
                             "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}],
                         }],
                         "volumes": [{"name": "tls", "secret": {"secretName": "agent-tls"}}],
                     }}}},
           {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "agent", "namespace": NAMESPACE},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                                                   {"name": "https", "port": 443, "targetPort": "https"}]}})

    def ready_pod() -> dict | None:
        pods = bed.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", "app=agent")["items"]
        for pod in pods:
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return pod
        return None

    pod = until("the agent pod Ready", ready_pod, 120, interval=0.5,
                diagnose=lambda: bed.kubectl("describe", "pods", "-n", NAMESPACE).stdout + bed.logs("kubelet"))
    bed.timings["agent pod Ready after create"] = time.monotonic() - created
    print(f"node bed timings (s): { {k: round(v, 1) for k, v in bed.timings.items()} }")
    service = bed.kubectl_json("get", "service", "agent", "-n", NAMESPACE)
    yield {"pod": pod, "service": service, "ca": ca}
    bed.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK, "--ignore-not-found")
    bed.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=60s", timeout=90)


def test_images_are_imported_and_the_sandbox_image_is_ours(node_bed):
    names = node_bed.image_names()
    assert PAUSE_IMAGE in names and AGENT_IMAGE in names
    config = node_bed.workdir.joinpath("containerd/config.toml").read_text()
    assert f'sandbox = "{PAUSE_IMAGE}"' in config


def test_node_is_registered_ready_with_the_bed_address(node_bed):
    node = node_bed.kubectl_json("get", "node")["items"]
    assert len(node) == 1
    status = node[0]["status"]
    assert {"type": "InternalIP", "address": node_bed.node_ip} in status["addresses"]
    assert status["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")
    assert status["nodeInfo"]["kubeletVersion"] == versions()["KUBERNETES_VERSION"]  # the kubelet build-node.sh built


def test_pod_from_an_imported_image_becomes_ready_through_its_readiness_probe(node_bed, agent):
    pod = agent["pod"]
    status = pod["status"]
    (container,) = status["containerStatuses"]
    assert container["image"] == AGENT_IMAGE and container["ready"] and "running" in container["state"]
    assert container["restartCount"] == 0
    assert pod["spec"]["nodeName"] == "gw-e2e-node"
    assert status["podIP"].startswith(POD_CIDR.rsplit(".", 2)[0] + ".")
    # The probe answered 503 for the first 3 s, so the pod became Ready well after the container started.
    started = _time(container["state"]["running"]["startedAt"])
    ready = next(_time(c["lastTransitionTime"]) for c in status["conditions"] if c["type"] == "Ready")
    assert (ready - started).total_seconds() >= 2, (started, ready)
    events = node_bed.kubectl_json("get", "events", "-n", NAMESPACE,
                                   "--field-selector", f"involvedObject.name={pod['metadata']['name']}")["items"]
    assert any(e["reason"] == "Unhealthy" and "Readiness probe failed" in e["message"] and "503" in e["message"]
               for e in events), [e["message"] for e in events]


def test_service_cluster_ip_is_served_by_kube_proxy_inside_the_namespace(node_bed, agent):
    cluster_ip = agent["service"]["spec"]["clusterIP"]
    assert cluster_ip.startswith("10.96.0.")
    status, body = node_bed.http_in_netns(f"http://{cluster_ip}:80/hello")
    assert status == 200, body
    assert json.loads(body)["pod"] == agent["pod"]["metadata"]["name"]
    # The rules that did it are kube-proxy's.
    rules = node_bed.netns_run(["iptables", "-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"]).stdout
    assert f"{NAMESPACE}/agent:http" in rules and cluster_ip in rules


def test_apiserver_reaches_the_pod_through_its_service_proxy(node_bed, agent):
    result = node_bed.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/services/http:agent:http/proxy/hello",
                              check=True)
    assert json.loads(result.stdout)["pod"] == agent["pod"]["metadata"]["name"]


def test_apiserver_calls_an_admission_webhook_served_by_the_pod_through_its_service(node_bed, agent):
    _apply(node_bed, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK},
        "webhooks": [{
            "name": WEBHOOK, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {"service": {"namespace": NAMESPACE, "name": "agent", "path": "/validate", "port": 443},
                             "caBundle": base64.b64encode(agent["ca"].pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"gw-e2e/webhook": "on"}},
        }]})
    denied = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "denied", "namespace": NAMESPACE, "labels": {"e2e-deny": "yes"}}}

    def refused() -> str | None:  # the apiserver picks the configuration up asynchronously
        result = node_bed.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(denied))
        return result.stderr if result.returncode and "denied by agent pod" in result.stderr else None

    message = until("the webhook called", refused, 30, interval=0.5,
                    diagnose=lambda: node_bed.logs("kube-apiserver", tail=2000))
    assert agent["pod"]["metadata"]["name"] in message and WEBHOOK in message
    allowed = {**denied, "metadata": {"name": "allowed", "namespace": NAMESPACE}}
    node_bed.kubectl("create", "-f", "-", stdin=json.dumps(allowed), check=True)
    calls = node_bed.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/services/http:agent:http/proxy/calls",
                             check=True)
    assert json.loads(calls.stdout)["calls"] >= 2


def test_pod_reaches_the_apiserver_with_its_projected_token_via_the_kubernetes_service(node_bed, agent):
    volumes = agent["pod"]["spec"]["volumes"]
    assert any(v["name"].startswith("kube-api-access-") and "projected" in v for v in volumes)
    result = node_bed.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/services/http:agent:http/proxy/whoami",
                              check=True)
    who = json.loads(result.stdout)
    assert who["server"].startswith(f"https://{KUBERNETES_SERVICE_IP}:443/")
    assert who["username"] == f"system:serviceaccount:{NAMESPACE}:default"
    assert "system:serviceaccounts" in who["groups"]
