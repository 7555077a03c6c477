"""Every object the generator writes in live mode (the default) fits ``generate.MAX_BYTES`` (128,000 bytes) as
compact JSON, the form kubectl's client-side apply stores in the ``last-applied-configuration`` annotation (at most
256 KiB) and GitOps tools keep: on every target version, for the default policy and a few larger ones.

tests/e2e/test_native_size.py applies the default policy's objects with client-side ``kubectl apply`` on the real
apiserver. Inline mode (``nativePolicies.params: inline``) writes one policy per family and action, as before, and
is not bound: its custom-kind deny policy is some 175 KB for the default policy.
"""

from __future__ import annotations

import pytest

from tests.native_corpus import POLICY as CORPUS_POLICY
from webhook.core.policyfile import load_policy, parse_policy
from webhook.native.generate import MAX_BYTES, generate, size
from webhook.native.target import every_version

BENCH_POLICY = """\
accelerator: {allowed: [nvidia-tesla-p100, nvidia-tesla-k80, nvidia-l4], default: nvidia-tesla-k80}
limits: {perContainer: 4, perPod: 8}
checks: {processCountMismatch: "off", replicaAcceleratorMismatch: "off"}
"""
# Several custom kinds with deep template paths and many namespaces: the most CEL a policy file makes here.
MANY_KINDS = CORPUS_POLICY.replace(
    '  - {group: example.com, resource: trainjobs, kind: TrainJob, templates: ["spec.roles[*].template", '
    '"spec.launcher"]}\n',
    '  - {group: example.com, resource: trainjobs, kind: TrainJob, templates: ["spec.roles[*].template", '
    '"spec.launcher"]}\n'
    '  - {group: example.org, resource: sweeps, kind: Sweep, templates: ["spec.trials[*].workers[*].template"]}\n'
    '  - {group: example.net, resource: servers, kind: Server, templates: ["spec.template", "spec.canary.template"]}\n')
POLICIES = {"default": None, "bench": BENCH_POLICY, "corpus": CORPUS_POLICY, "many-kinds": MANY_KINDS}


@pytest.mark.parametrize("target", every_version(), ids=lambda t: f"{t.version}-{t.mutating or 'nomap'}")
@pytest.mark.parametrize("name", list(POLICIES))
def test_every_live_object_fits(name, target):
    text = POLICIES[name]
    policies = load_policy(None) if text is None else parse_policy(text)
    out = generate(policies, target)
    assert out.policy_object is not None, "not generated in live mode"
    too_big = {f"{o['kind']}/{o['metadata']['name']}": size(o) for o in out.objects if size(o) > MAX_BYTES}
    assert not too_big, f"over {MAX_BYTES} bytes as compact JSON on {target.describe()}: {too_big}"
    assert size(out.policy_object) <= MAX_BYTES


def test_many_kinds_is_a_policy_with_three_custom_kinds():
    policies = parse_policy(MANY_KINDS)
    assert len(policies.document["nativePolicies"]["customKinds"]) == 3
