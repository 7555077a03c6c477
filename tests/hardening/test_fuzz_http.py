"""Property tests against one real server: generated AdmissionReviews get the in-process decision and never
a 5xx, raw bodies get a 200 or a 4xx, and the ``gpu-webhook check`` CLI agrees with ``/validate``."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
from collections import defaultdict

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.hardening.harness import children, start_server
from tests.hardening.strategies import POLICIES, POLICY_TEXTS, json_values, objects, reviews
from tests.manifests import admission_review, seed_pod
from tests.server import GPU_WEBHOOK, client_context
from webhook.core import review
from webhook.rules import admission

POLICY = "namespaced"
EXAMPLES = int(os.environ.get("GPU_WEBHOOK_HTTP_FUZZ_EXAMPLES", "150"))


def bounded(examples: int):
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class Caller:
    """One kept-alive connection to the server, reopened if it breaks (a break is still reported)."""

    def __init__(self, server):
        self.server = server
        self.context = client_context(server.ca)
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPSConnection("127.0.0.1", self.server.port, context=self.context, timeout=10)
        try:
            self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = self.conn.getresponse()
            data = response.read()
            if response.will_close:
                self.close()
            return response.status, data
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    policy = tmp / "policy.yaml"
    policy.write_text(POLICY_TEXTS[POLICY])
    server = start_server(tmp, "--policy", str(policy))
    server.policy_file = policy
    server.workers = children(server.proc.pid)
    yield server
    server.stop()


def expected(path: str, document: dict) -> dict:
    request = document["request"]
    handler = admission.validate if path == "/validate" else admission.mutate
    return review.encode(review.Review(document["apiVersion"], request), handler(request, POLICIES[POLICY]))


@pytest.mark.slow
def test_generated_reviews_get_the_in_process_answer_and_never_a_5xx(fuzzed, figures):
    caller = Caller(fuzzed)
    runs = defaultdict(int)

    @bounded(EXAMPLES)
    @given(st.one_of(reviews(), reviews("admission.k8s.io/v1beta1")), st.sampled_from(["/validate", "/mutate"]))
    def prop(document, path):
        runs["examples"] += 1
        status, data = caller.post(path, json.dumps(document).encode())
        assert status == 200, (status, data[:300])
        answer = json.loads(data)
        runs[f"{path} allowed={answer['response']['allowed']}"] += 1
        assert answer["response"].get("status", {}).get("code") != 500, "a handler raised"
        assert answer == expected(path, document)

    try:
        prop()
    finally:
        caller.close()
        figures.update(runs)
    assert children(fuzzed.proc.pid) == fuzzed.workers, "a worker died during the run"


@st.composite
def _mutations(draw) -> bytes:
    """A valid review with bytes flipped, cut, repeated or inserted, as a mutation fuzzer would make."""
    body = bytearray(json.dumps(admission_review(seed_pod())).encode())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(body)))
        action = draw(st.sampled_from(["flip", "cut", "insert", "repeat"]))
        if action == "flip" and at < len(body):
            body[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del body[at:]
        elif action == "insert":
            body[at:at] = draw(st.sampled_from([b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"\x00",
                                                     b"\xff", b"null", b"1e999", b"-", b"\\ud800"]))
        else:
            body[at:at] = body[at:at + draw(st.integers(1, 64))] * draw(st.integers(1, 50))
    return bytes(body)


def _nested(depth: int, opener: str) -> bytes:
    closer = {"[": "]", '{"a":': "}"}[opener]
    return (opener * depth + "1" + closer * depth).encode()


raw_bodies = st.one_of(
    st.binary(max_size=512),
    st.text(max_size=200).map(str.encode),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(lambda v: json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                    "request": v}).encode(), json_values),
    _mutations(),
    # Nesting: a JSON parser's recursion is its weak point.
    st.builds(_nested, st.integers(1, 5000), st.sampled_from(["[", '{"a":'])),
)


@pytest.mark.slow
def test_raw_bodies_get_a_200_or_a_4xx_and_never_a_5xx(fuzzed, figures):
    caller = Caller(fuzzed)
    runs = defaultdict(int)

    @bounded(EXAMPLES * 2)
    @given(raw_bodies, st.sampled_from(["/validate", "/mutate"]),
           st.sampled_from([{}, {"Content-Type": "text/plain"}, {"Content-Type": ""}]))
    def prop(body, path, headers):
        runs["examples"] += 1
        status, data = caller.post(path, body, headers)
        runs[f"HTTP {status}"] += 1
        assert status in (200, 400), (status, data[:300])
        json.loads(data)

    try:
        prop()
    finally:
        caller.close()
        figures.update(runs)
    assert children(fuzzed.proc.pid) == fuzzed.workers, "a worker died during the run"


def _cli_lines(path, policy) -> tuple[int, dict[str, list[tuple[bool, str]]]]:
    """Exit code and, per ``Kind namespace/name``, the lines of ``gpu-webhook check`` (denied?, ``path: message``)."""
    result = subprocess.run([*GPU_WEBHOOK, "check", "--policy", str(policy), "--namespace", "default", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode in (0, 1), result.stderr
    by_object: dict[str, list[tuple[bool, str]]] = defaultdict(list)
    prefix = re.compile(rf"{re.escape(str(path))}:\d+:\d+: ")  # FILE:LINE:COLUMN of the field
    for line in result.stdout.splitlines():
        where_in_file = prefix.match(line)
        assert where_in_file, line
        identity, _, rest = line[where_in_file.end():].partition(": ")
        where, _, message = rest.partition(": ")
        warned = message.startswith("warning: ")
        by_object[identity].append((not warned, f"{where}: {message.removeprefix('warning: ')}"))
    return result.returncode, by_object


@pytest.mark.slow
def test_the_check_cli_and_the_server_agree(fuzzed, tmp_path, figures):
    caller = Caller(fuzzed)
    runs = defaultdict(int)

    @bounded(4)
    @given(st.lists(objects, min_size=10, max_size=25))
    def prop(batch):
        for i, obj in enumerate(batch):
            obj["metadata"] = {**obj.get("metadata", {}), "name": f"obj-{i}"}
        text = yaml.safe_dump_all(batch, sort_keys=False)
        assume(list(yaml.safe_load_all(text)) == batch)  # YAML must carry the objects unchanged
        manifest = tmp_path / "manifests.yaml"
        manifest.write_text(text)
        code, lines = _cli_lines(manifest, fuzzed.policy_file)
        runs["cli_runs"] += 1
        any_denied = False
        for obj in batch:
            runs["objects"] += 1
            status, data = caller.post("/validate", json.dumps(admission_review(obj, namespace="default")).encode())
            assert status == 200
            response = json.loads(data)["response"]
            any_denied |= not response["allowed"]
            said = lines.get(f"{obj['kind']} default/{obj['metadata']['name']}", [])
            denials = [text for denied, text in said if denied]
            warnings = [text for denied, text in said if not denied]
            assert response["allowed"] is (not denials), (obj, said, response)
            assert response.get("warnings", []) == warnings
            if denials:
                assert all(d in response["status"]["message"] for d in denials)
        assert code == (1 if any_denied else 0)

    try:
        prop()
    finally:
        caller.close()
        figures.update(runs)

