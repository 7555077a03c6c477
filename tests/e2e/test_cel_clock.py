"""What a ValidatingAdmissionPolicy can read as the time of a request: CEL has no clock, so whether a summary of the
cluster's facts is fresh enough to refuse on can only be judged against a time the apiserver writes into the object
before admission. On a real kube-apiserver (1.30 and 1.37):

- on CREATE, ``object.metadata.creationTimestamp`` is set before validating admission (the generic registry's
  ``Store.create`` fills the system fields first) and is the apiserver's clock, to the second;
- on UPDATE it is the object's creation time, however old: no clock. ``managedFields`` (written by the field
  manager before admission) carries the time of the update, to the second.

The policy refuses every labelled ConfigMap with the times it read as its message, so the test reads them back.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import ControlPlane
from tests.e2e.native_bed import BEDS, Answer, Api, apply

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300),
              pytest.mark.parametrize("matrix_cluster", [b for b in BEDS if b.id in ("1.30", "1.37")],
                                      ids=["1.30", "1.37"], indirect=True)]

NAMESPACE = "cel-clock"
NAME = "cel-clock"
TIMES = ("string(object.metadata.creationTimestamp) + ' ' + (has(object.metadata.managedFields) ? "
         "object.metadata.managedFields.map(entry, has(entry.time) ? string(entry.time) : '-').join(',') : '-')")


@pytest.fixture(scope="module")
def api(matrix_cluster: ControlPlane) -> Iterator[Api]:
    version = "admissionregistration.k8s.io/v1"
    labelled = {"matchExpressions": [{"key": NAME, "operator": "Exists"}]}
    policy = {"apiVersion": version, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": NAME},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE", "UPDATE"],
                                                               "resources": ["configmaps"]}],
                                            "objectSelector": labelled},
                       "validations": [{"expression": "false", "messageExpression": TIMES}]}}
    binding = {"apiVersion": version, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": NAME},
               "spec": {"policyName": NAME, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": NAMESPACE}}}}}
    matrix_cluster.kubectl("create", "namespace", NAMESPACE)
    apply(matrix_cluster, [policy, binding])
    client = Api(matrix_cluster)
    deadline = time.monotonic() + 60
    while "cel-clock" not in create(client, labelled=True).message:  # the policy compiles asynchronously
        assert time.monotonic() < deadline, "the policy never acted"
        time.sleep(0.5)
    yield client
    matrix_cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", NAME,
                           "--ignore-not-found")
    matrix_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def configmap(name: str, labelled: bool) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {NAME: "on"} if labelled else {}}, "data": {"a": "b"}}


def create(api: Api, labelled: bool, name: str = "probe", dry_run: bool = True) -> Answer:
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps" + ("?dryRun=All" if dry_run else "")
    return api.send("POST", path, configmap(name, labelled))


def times(answer: Answer) -> tuple[datetime.datetime, list[datetime.datetime]]:
    """(creationTimestamp, managedFields' times) from the policy's message."""
    assert not answer.admitted and "cel-clock" in answer.message, answer.message
    created, fields = answer.message.split(": ")[-1].split(" ")
    return parse(created), [parse(t) for t in fields.split(",") if t != "-"]


def parse(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_on_create_the_creation_timestamp_is_the_apiservers_clock(api):
    before = now().replace(microsecond=0)
    created, _ = times(create(api, labelled=True))
    assert before - datetime.timedelta(seconds=1) <= created <= now() + datetime.timedelta(seconds=1)


def test_on_update_the_creation_timestamp_is_old_and_managed_fields_carry_the_time(api):
    name = f"kept-{int(time.time())}"
    stored = create(api, labelled=False, name=name, dry_run=False)
    assert stored.admitted, stored.message
    time.sleep(3)
    body = stored.body
    body["metadata"]["labels"] = {NAME: "on"}
    before = now().replace(microsecond=0)
    answer = api.send("PUT", f"/api/v1/namespaces/{NAMESPACE}/configmaps/{name}", body)
    created, fields = times(answer)
    assert created <= before - datetime.timedelta(seconds=2)  # the object's creation, not the request's time
    assert fields and max(fields) >= before - datetime.timedelta(seconds=1), (created, fields)
