"""The audit's cost measured the way bench/audit_cost.py measures it, at 300 pods and 30 workload objects.

In a module of its own: no webhook is registered while the bench's objects (one in ten breaking the bench
policy) are created directly.
"""

from __future__ import annotations

import json

import pytest

from bench import audit_cost
from webhook.kube.client import Kube

pytestmark = pytest.mark.e2e


def test_audit_cost_small(cluster, tmp_path) -> None:
    """bench/audit_cost.py runs 10,000 pods and 1,000 workload objects; this is its small version."""
    admin = Kube.connect(str(cluster.kubeconfig), pool_size=8)
    policy = tmp_path / "bench-policy.yaml"
    policy.write_text(audit_cost.POLICY)
    try:
        audit_cost.generate(admin, pods=300, workloads=30, namespaces=3, prefix="cost")
        result = audit_cost.run_audit(str(cluster.kubeconfig), str(policy),
                                      selector="gpu-webhook.io/bench=audit-cost", admin=admin)
    finally:
        # Pending GPU pods would take the GPUs of the nodes later modules schedule onto.
        for namespace in ("cost-00", "cost-01", "cost-02"):
            cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false")
    print(json.dumps(result))
    assert (result["exit"], result["objects"], result["violations"]) == (1, 330, 33)
    # Discovery (2), then one page per resource: every list fits in one 500-object page here.
    assert result["client_requests"] == 2 + result["resources"]
    assert result["client_requests"] <= result["apiserver_requests_delta"] <= result["client_requests"] + 20
    assert result["peak_rss_mib"] < 150
