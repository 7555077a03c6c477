"""The GPUPolicy CRD (webhook.core.policycrd) on the bed's real apiserver, with the real kubectl: it becomes
Established; every valid policy of tests/policy_corpus.py is accepted by ``kubectl apply`` server-side and
client-side; the invalid ones are refused naming the field; a policy at the CRD's bounds passes its CEL rules
within their runtime cost. Also what a client that does not ask for strict field validation gets: an unknown
key pruned, with a warning."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.policy_corpus import INVALID, valid
from webhook.core import gpupolicy, policykeys
from webhook.core.policycrd import MAX_ACCELERATORS, MAX_ITEMS, MAX_NAMESPACES, as_spec, crd
from webhook.core.policyfile import parse_policy
from webhook.core.policyschema import DEFAULTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CRD_NAME = f"{gpupolicy.PLURAL}.{gpupolicy.GROUP}"
VALID = valid()
SERVER_SIDE_WORDS = {"typo": "field not declared in schema", "bare-off-in-kubectl": "expected string"}


def gpupolicy_object(name: str, spec: object) -> str:
    return json.dumps({"apiVersion": gpupolicy.API_VERSION, "kind": gpupolicy.KIND, "metadata": {"name": name},
                       "spec": spec})


@pytest.fixture(scope="module")
def installed(cluster):
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(crd()), check=True)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s", check=True)
    yield cluster
    cluster.kubectl("delete", gpupolicy.PLURAL, "--all", "--wait=false")
    cluster.kubectl("delete", "crd", CRD_NAME, "--timeout=60s")  # not left terminating for the next module


def test_the_crd_is_established_with_its_printer_columns(installed):
    stored = json.loads(installed.kubectl("get", "crd", CRD_NAME, "-o", "json", check=True).stdout)
    conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    installed.kubectl("apply", "-f", "-", stdin=gpupolicy_object("columns", {}), check=True)
    header = installed.kubectl("get", "gpupol", "columns", check=True).stdout.splitlines()[0].split()
    assert header == ["NAME", "ACCEPTED", "WEBHOOK", "NATIVE", "NATIVE-POLICIES", "AGE"]


@pytest.mark.parametrize("mode", ["server-side", "client-side"])
def test_every_valid_policy_is_accepted(installed, mode):
    refused = {}
    for i, (name, document) in enumerate(sorted(VALID.items())):
        object_name = f"{mode}-{i}"
        args = ["apply", "--server-side"] if mode == "server-side" else ["apply"]
        done = installed.kubectl(*args, "-f", "-", stdin=gpupolicy_object(object_name, as_spec(document)))
        if done.returncode != 0:
            refused[name] = done.stderr
            continue
        stored = json.loads(installed.kubectl("get", "gpupol", object_name, "-o", "json", check=True).stdout)
        assert stored["spec"] == as_spec(document), name  # nothing pruned, nothing defaulted
        # and the object as stored is a policy gpu-webhook reads the same way
        assert parse_policy(yaml.safe_dump(stored)).default == parse_policy(yaml.safe_dump(document)).default
        installed.kubectl("delete", "gpupol", object_name, check=True)
    assert refused == {}


@pytest.mark.parametrize("name", sorted(INVALID))
@pytest.mark.parametrize("mode", ["server-side", "client-side"])
def test_an_invalid_policy_is_refused_naming_the_field(installed, name, mode):
    spec, field, words = INVALID[name]
    args = ["apply", "--server-side"] if mode == "server-side" else ["apply"]
    done = installed.kubectl(*args, "-f", "-", stdin=gpupolicy_object(f"bad-{mode}", spec))
    assert done.returncode != 0, f"{name} was accepted"
    assert field in done.stderr, done.stderr
    if mode == "server-side":  # server-side apply types the object before validation, in words of its own
        words = SERVER_SIDE_WORDS.get(name, words)
    assert words in done.stderr, done.stderr


def test_kubectl_refuses_an_unknown_key_and_a_client_without_strict_validation_gets_it_pruned(installed):
    """kubectl's default is --validate=strict (fieldValidation=Strict): refused (above). A client that sends no
    fieldValidation, as the apiserver defaults it (Warn), or kubectl --validate=warn: stored without the key,
    and a warning says so."""
    spec = {"limits": {"perPod": 2}, "checks": {"cpuPodOnGPUNodes": "warn"}}
    done = installed.kubectl("apply", "--validate=warn", "-f", "-", stdin=gpupolicy_object("pruned", spec))
    assert done.returncode == 0, done.stderr
    assert 'unknown field "spec.checks.cpuPodOnGPUNodes"' in done.stderr
    stored = json.loads(installed.kubectl("get", "gpupol", "pruned", "-o", "json", check=True).stdout)
    assert stored["spec"] == {"limits": {"perPod": 2}, "checks": {}}


def test_the_default_policy_and_a_policy_at_the_bounds_are_accepted(installed):
    """The defaults written out; then every list at its maxItems, 1000 namespaces with overrides: the CEL rules
    run within their runtime cost, and the object stays far below the request limit (3 MiB)."""
    done = installed.kubectl("apply", "--server-side", "-f", "-", stdin=gpupolicy_object("defaults", as_spec(DEFAULTS)))
    assert done.returncode == 0, done.stderr
    allowed = [f"accelerator-model-{i:03d}" for i in range(MAX_ACCELERATORS)]
    spec = {
        "resources": [f"vendor-{i}.example.com/gpu" for i in range(MAX_ITEMS)],
        "accelerator": {"allowed": allowed, "default": allowed[-1]},
        "excludeNamespaces": [f"excluded-{i}" for i in range(MAX_ITEMS)],
        "dra": {"gpuClasses": [f"class-{i}.example.com" for i in range(MAX_ITEMS)]},
        "namespaces": {f"team-{i:04d}": {"accelerator": {"default": allowed[i % MAX_ACCELERATORS]},
                                         "limits": {"perPod": 8}, "enforcement": "warn"}
                       for i in range(MAX_NAMESPACES)},
    }
    text = gpupolicy_object("at-the-bounds", spec)
    assert len(text) < 512 * 1024
    started = time.monotonic()
    done = installed.kubectl("apply", "--server-side", "-f", "-", stdin=text)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    parse_policy(text)


def test_the_status_takes_the_cluster_facts_as_the_writer_patches_them_and_refuses_a_map_over_its_cap(installed):
    """status.cluster (webhook.core.clustersummary) through the status subresource, with the writer's merge patch: a
    summary stored as written, a model gone removed by its null, one RuntimeClass over the cap refused."""
    from tests.test_clustersummary import CLUSTER, summary_of
    from webhook.core.clustersummary import MAX_RUNTIME_CLASSES
    from webhook.serving.clusterfacts import merge_patch

    installed.kubectl("apply", "--server-side", "-f", "-", stdin=gpupolicy_object("facts", {}), check=True)

    def patch(cluster: object) -> object:
        return installed.kubectl("patch", "gpupol", "facts", "--subresource=status", "--type=merge", "-p",
                                 json.dumps({"status": {"cluster": cluster}}))

    def stored() -> object:
        got = json.loads(installed.kubectl("get", "gpupol", "facts", "-o", "json", check=True).stdout)
        return got["status"]["cluster"]

    facts = {**summary_of(CLUSTER), "writtenAt": "2026-12-05T17:10:09Z", "writer": "gpu-webhook-abc_0123abcd"}
    done = patch(facts)
    assert done.returncode == 0, done.stderr
    assert stored() == facts
    fewer = json.loads(json.dumps(facts))
    del fewer["models"]["nvidia-h100"]
    done = patch(merge_patch(facts, fewer))
    assert done.returncode == 0, done.stderr
    assert stored() == fewer
    over = {"runtimeClasses": {f"rc-{i:03d}": {} for i in range(MAX_RUNTIME_CLASSES + 1)}}
    done = patch(over)
    assert done.returncode != 0 and "runtimeClasses" in done.stderr, done.stderr


@pytest.mark.parametrize("path", ["limits.perContainer", "isolation.trusted", "checks.privilegedGpu"])
def test_kubectl_explain_prints_each_keys_description(installed, path):
    """The words of webhook.core.policykeys, as the apiserver publishes the CRD's OpenAPI to kubectl explain."""
    field = f"gpupolicy.spec.{path}"
    words = " ".join(policykeys.description(path).split())
    deadline = time.monotonic() + 60
    while True:  # the apiserver publishes a new CRD's OpenAPI a moment after it is Established
        done = installed.kubectl("explain", field)
        shown = " ".join(done.stdout.split())
        if done.returncode == 0 and words in shown or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert done.returncode == 0, done.stderr
    assert "DESCRIPTION:" in done.stdout and words in shown, done.stdout


def test_the_crd_fits_a_client_side_apply(installed):
    """kubectl apply without --server-side keeps the whole object in its last-applied annotation; the apiserver
    refuses annotations over 256 KiB."""
    done = installed.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(crd()))
    assert done.returncode == 0, done.stderr
