"""docs/cli.md "In CI": what a live cluster holds, read by kubectl and checked against a policy not deployed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.manifests import container, pod, workload

REPO = Path(__file__).resolve().parents[2]
KINDS = "pods,deployments,statefulsets,daemonsets,jobs,cronjobs"


def test_kubectl_get_all_namespaces_as_json_piped_into_check(cluster, tmp_path):
    cluster.kubectl("create", "namespace", "cli-recipes", check=True)
    try:
        two = workload("Deployment", pod(container("train", limits={"nvidia.com/gpu": 2})), name="two-gpus")
        two["metadata"]["namespace"] = "cli-recipes"
        two["spec"].update(replicas=0, selector={"matchLabels": {"app": "train"}})
        two["spec"]["template"]["metadata"]["labels"] = {"app": "train"}
        cluster.kubectl("create", "-f", "-", stdin=yaml.safe_dump(two), check=True)
        policy = tmp_path / "policy.yaml"
        policy.write_text("limits: {perContainer: 1}\n")
        with subprocess.Popen([cluster.binary("kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get", "-A", "-o",
                               "json", KINDS], stdout=subprocess.PIPE) as kubectl:
            result = subprocess.run([sys.executable, "-m", "webhook", "check", "--policy", str(policy), "-"],
                                    stdin=kubectl.stdout, capture_output=True, text=True, timeout=120, cwd=REPO)
            assert kubectl.wait(timeout=60) == 0
        assert result.returncode == 1, result.stderr
        # Each finding names the line and column of the field in what kubectl wrote.
        found = [line for line in result.stdout.splitlines() if "Deployment cli-recipes/two-gpus" in line]
        assert len(found) == 1, result.stdout
        assert re.fullmatch(r'<stdin>:\d+:\d+: Deployment cli-recipes/two-gpus: spec\.template\.spec\.containers\[0\]'
                            r'\.resources\.limits\[nvidia\.com/gpu\]: container "train": 2 nvidia\.com/gpu is over the '
                            r'limit of 1 per container', found[0]), found
    finally:
        cluster.kubectl("delete", "namespace", "cli-recipes", "--wait=false")
