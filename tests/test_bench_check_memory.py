"""bench/check_memory.py: the inputs it generates are what it says, and a small run measures every tool it has."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from bench import check_memory


def test_the_three_inputs_hold_the_same_pods_in_kubectls_shapes(tmp_path):
    inputs = check_memory.generate(tmp_path, 100_000)
    documents = list(yaml.safe_load_all((tmp_path / "pods.yaml").read_text()))
    listing = yaml.safe_load((tmp_path / "list.yaml").read_text())
    as_json = json.loads((tmp_path / "list.json").read_text())
    assert [inputs[name]["pods"] for name in ("pods.yaml", "list.yaml", "list.json")] == [
        len(documents), len(listing["items"]), len(as_json["items"])]
    assert all(90_000 < inputs[name]["bytes"] < 110_000 for name in inputs)
    assert list(as_json) == ["apiVersion", "items", "kind", "metadata"] == list(listing)
    assert documents[1] == listing["items"][1] == as_json["items"][1]
    limits = [d["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for d in documents]
    assert limits[0] == "500m" and limits[1:10] == [1] * 9  # every tenth pod is refused


@pytest.mark.process
def test_a_run_measures_check_and_says_what_it_found(tmp_path):
    check_memory.generate(tmp_path, 20_000)
    row = check_memory.measure([sys.executable, "-m", "webhook", "check", str(tmp_path / "list.json")],
                               check_memory.harness.REPO)
    assert row["exit"] == 1 and row["says"].endswith(" denied, 0 warned")
    assert 10 < float(row["peak_mb"]) < 500 and float(row["seconds"]) > 0
