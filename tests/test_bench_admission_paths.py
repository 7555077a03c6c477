"""``python -m bench.admission_paths`` with tiny counts: the five configurations take effect on the e2e control plane
(each namespace refused and mutated by whom it should be), every measured create is answered as expected, the
apiserver's step metrics moved, and the webhook saw requests only where it is registered.

Nothing about timing is asserted. The control plane is built by ``tests/prepare control-plane``: missing, this test
skips locally and fails under ``CI=true`` (tests/tools.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import CONTROL_PLANE_BINARIES, control_plane_bin, missing_binaries, unavailable

pytestmark = [pytest.mark.bench, pytest.mark.e2e]  # on the e2e control plane

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_admission_paths_smoke(tmp_path):
    missing = missing_binaries(control_plane_bin(), CONTROL_PLANE_BINARIES)
    if missing:
        unavailable("e2e control plane", f"{', '.join(missing)} not built in {control_plane_bin()}", "control-plane")
    output = tmp_path / "admission-paths.json"
    done = subprocess.run([sys.executable, "-m", "bench.admission_paths", "--creates", "4", "--rounds", "1",
                           "--corpus", "20", "--memory-rounds", "0", "--output", str(output)],
                          cwd=REPO, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(output.read_text())
    summary = result["summary"]
    assert set(summary) == {"none", "webhook", "inline", "params", "hybrid"}
    for config, entry in summary.items():
        assert entry["creates"] == 4 and entry["unexpected_answers"] == 0, (config, entry)
        assert entry["admit_ms"] and entry["validate_ms"], (config, entry)  # the apiserver's metrics moved
    # Two calls per create to the webhook (mutate, validate), none elsewhere: hybrid keeps plain GPU pods native.
    configs = ("none", "webhook", "inline", "params", "hybrid")
    assert [summary[c]["webhook_requests"] for c in configs] == [0, 8, 0, 0, 0]
    assert result["ratios"]["params_over_inline"], result["ratios"]
    traffic = result["traffic"]
    assert traffic["webhook"]["webhook_requests"] > traffic["hybrid"]["webhook_requests"] > 0, traffic
    # The same objects refused in both, by the webhook in one and by the native policies in the other.
    refused = traffic["webhook"]["outcomes"].get("refused by the webhook")
    assert refused and traffic["hybrid"]["outcomes"].get("refused by a ValidatingAdmissionPolicy") == refused, traffic


def test_before_objects_keep_to_their_namespaces():
    """``--before``: the old generator's objects get names, a label and namespaces of their own, so that today's
    ``admission-policies --apply`` neither prunes nor patches them, and their bindings select only the -before
    namespaces."""
    from bench.admission_paths import BEFORE_LABEL, POLICY_SELECTOR, expected, rename_before

    labels = {"app.kubernetes.io/name": "gpu-webhook", "app.kubernetes.io/component": "admission-policies"}
    rules = ["CREATE"]
    documents = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "gpu-webhook-deny", "labels": dict(labels)},
         "spec": {"matchConstraints": {"resourceRules": [{"operations": rules}, {"operations": rules}]}}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": "gpu-webhook-deny", "labels": dict(labels)},
         "spec": {"policyName": "gpu-webhook-deny", "validationActions": ["Deny"]}},
    ]
    renamed = rename_before(documents)
    assert [d["metadata"]["name"] for d in renamed] == ["before-gpu-webhook-deny"] * 2
    assert documents[0]["metadata"]["name"] == "gpu-webhook-deny"  # the input is left alone
    component = dict(pair.split("=") for pair in POLICY_SELECTOR.split(","))["app.kubernetes.io/component"]
    assert all(d["metadata"]["labels"]["app.kubernetes.io/component"] != component for d in renamed)
    assert renamed[1]["spec"]["policyName"] == "before-gpu-webhook-deny"
    assert renamed[1]["spec"]["matchResources"] == {"namespaceSelector": {"matchLabels": {BEFORE_LABEL: "true"}}}
    assert renamed[0]["spec"]["matchConstraints"]["resourceRules"][1]["operations"] is not \
        renamed[0]["spec"]["matchConstraints"]["resourceRules"][0]["operations"]  # YAML anchors undone
    # The probe expects each namespace refused by its own generation's deny policy; no default accelerator in the
    # embedded default policy.
    assert expected(("none", "native-before", "hybrid"), None) == {
        "none": "nobody/None", "native-before": "native:before-gpu-webhook-deny/None",
        "hybrid": "native:gpu-webhook-live-deny/None"}
    # An old tree that generated the live policies refuses by its own live deny policy.
    live_before = ["ValidatingAdmissionPolicy/before-gpu-webhook-live-deny"]
    assert expected(("native-before", "hybrid-before"), None, live_before) == {
        "native-before": "native:before-gpu-webhook-live-deny/None",
        "hybrid-before": "native:before-gpu-webhook-live-deny/None"}


def test_the_probe_takes_any_of_a_familys_deny_policies_as_the_family():
    """With the cluster checks the probe violates rules of two deny policies, and the apiserver names whichever it
    evaluated first: a run of the bench once waited a minute for ``gpu-webhook-live-deny`` and failed while
    ``gpu-webhook-live-deny-2`` refused."""
    from bench.admission_paths import refused_by

    said = ("pods \"probe-conflict\" is forbidden: ValidatingAdmissionPolicy '{}' with binding '{}' denied request: "
            "1 GPU violation")
    assert refused_by(said.format("gpu-webhook-live-deny-2", "gpu-webhook-live-deny-2")) == \
        "native:gpu-webhook-live-deny"
    assert refused_by(said.format("gpu-webhook-live-deny", "gpu-webhook-live-deny")) == "native:gpu-webhook-live-deny"
    assert refused_by(said.format("inline-gpu-webhook-deny", "x")) == "native:inline-gpu-webhook-deny"
    assert refused_by('admission webhook "validate.gpu-webhook.io" denied the request: ...') == "webhook"
    assert refused_by("") == "nobody"
    assert refused_by("quota exceeded").startswith("other: ")


def test_a_kubernetes_version_outside_the_matrix_is_refused_in_one_line(capsys):
    """``--kubernetes`` takes only a version whose kube-apiserver ``tests/prepare matrix`` builds: any other exits 2,
    naming the versions it takes, before anything starts."""
    from bench.admission_paths import main
    from tests.tools import matrix_versions

    with pytest.raises(SystemExit) as exited:
        main(["--kubernetes", "1.29.0"])
    assert exited.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(f"--kubernetes: v1.29.0 is not a version of the test matrix ({', '.join(matrix_versions())})")
