"""An experiment, not a tool: today's generated policies with the fixes proposed in bench/README.md ("Admission
paths", "What would fix it") written by hand into the generated YAML, measured by ``bench.admission_paths`` in the
place of its ``-before`` configurations, beside today's unpatched ones. The generator is not changed.

    .venv/bin/python -m bench.fix_experiment --policy default        # about a minute
    .venv/bin/python -m bench.fix_experiment --policy bench --check  # only: same decisions? (tests/celeval)

The patches are string edits of the generator's output at 9572e8c: their asserts fail once webhook/native writes
something else, which is the point (re-derive them, or measure the generator that carries the fixes with
``bench.admission_paths --before``). In the results, "native-before" and "hybrid-before" are the patched policies
(the hybrid webhooks are today's chart's, rendered as a second hybrid release).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

import bench.admission_paths as paths
from bench.admission_paths import POLICIES, ROOT, claim_pod, conflict_pod, cpu_pod, gpu_pod

COUNTED = "['amd.com/gpu', 'nvidia.com/gpu']"  # the names the deny policy's per-container trigger lets through


def _lits(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def patch(documents: list[dict[str, Any]], policy: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The proposed fixes, by hand: (1) the MutatingAdmissionPolicy asks "does any container hold a GPU?" with
    ``exists`` instead of computing every distinct GPU name with an indexOf de-duplication over whole containers;
    with the default policy, whose only mutation is the annotation's accelerator, a matchCondition on the
    annotation. (2) With the bench's policy, the deny policy's matchConditions test what could really fire: a
    nodeSelector accelerator outside the allowed list (not its presence, which the mutation itself just injected),
    and a pod total over ``perPod`` (not "any GPU name"); (3) its per-pod rule tests each GPU name once per template
    instead of once per container and name."""
    from webhook.core.policy import build_policy
    from webhook.native import mutations
    from webhook.native.snippets import Ctx, Shape

    ctx = Ctx(build_policy(policy or {}), Shape(True), True, True)
    out = copy.deepcopy(documents)
    for document in out:
        spec = document["spec"]
        if document["kind"] == "MutatingAdmissionPolicy":
            gpu = ("[object.spec.?containers.orValue([]), object.spec.?initContainers.orValue([])].exists(L, "
                   f"L.exists(c, size({mutations._names('c', ctx)}) > 0))")
            spec["variables"].insert(0, {"name": "gpu", "expression": gpu})
            for mutation in spec["mutations"]:
                expression = mutation["jsonPatch"]["expression"]
                assert "size(variables.used) > 0" in expression
                mutation["jsonPatch"]["expression"] = expression.replace("size(variables.used) > 0", "variables.gpu")
            if policy is None:
                assert len(spec["mutations"]) == 1, "the default policy's only mutation is the accelerator"
                spec["matchConditions"].append({
                    "name": "annotation-asks-an-accelerator",
                    "expression": "object.metadata.?annotations[?'gpu-webhook/accelerator'].orValue('') != ''"})
        if document["kind"] == "ValidatingAdmissionPolicy" and document["metadata"]["name"] == "gpu-webhook-deny" \
                and policy is not None:
            allowed, cap = _lits(policy["accelerator"]["allowed"]), policy["limits"]["perPod"]
            condition = spec["matchConditions"][0]
            expression = condition["expression"]
            present = "(has(t.spec.nodeSelector) && 'accelerator' in t.spec.nodeSelector)"
            assert expression.count(present) == 1 and expression.count(" || (true)") == 2
            total = ("[(has(t.spec.containers) ? t.spec.containers : []) + (has(t.spec.initContainers) ? "
                     f"t.spec.initContainers : [])].exists(L, {COUNTED}.exists(k, L.map(c, has(c.resources) && "
                     "has(c.resources.limits) && k in c.resources.limits && c.resources.limits[k].matches("
                     f"'^[0-9]{{1,6}}$') ? int(c.resources.limits[k]) : 0).sum() > {cap}))")
            outside = ("(has(t.spec.nodeSelector) && 'accelerator' in t.spec.nodeSelector && "
                       f"!(t.spec.nodeSelector['accelerator'] in {allowed}))")
            condition["expression"] = expression.replace(present, f"{total} || {outside}").replace(" || (true)", "")
            for variable in spec["variables"]:
                if variable["name"] == "per_pod_limit":
                    head = (f"variables.templates.exists(t, {cap} != 0 && t.uses && (t.gpuCounts.exists(c, "
                            "(c.counts.exists(g, ([")
                    assert variable["expression"].startswith(head)
                    inner, sep, _ = variable["expression"][len(head):].rpartition(
                        f"].exists(n, n > {cap} && !t.gpuCounts.exists(o,")
                    assert sep
                    variable["expression"] = (f"variables.templates.exists(t, {cap} != 0 && t.uses && "
                                              f"variables.gpus.exists(gn, [{inner.replace('g.name', 'gn')}]"
                                              f".exists(n, n > {cap})))")
    return out


def check(policy_name: str) -> int:
    """Today's and the patched policies decide alike (allowed, message, warnings, the accelerator injected) on pods
    around the caps and accelerators."""
    import tests.celeval as celeval

    policy = POLICIES[policy_name]
    workdir = Path(tempfile.mkdtemp(prefix="gw-fix-experiment-"))
    try:
        policy_file = None
        if policy is not None:
            policy_file = workdir / "policy.yaml"
            policy_file.write_text(yaml.safe_dump(policy))
        documents, _ = paths.generate_before(ROOT, policy_file)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    patched = patch(documents, policy)
    pods = [gpu_pod("a"), gpu_pod("b", containers=3, gpus="3"), gpu_pod("c", containers=2, gpus="4"),
            gpu_pod("d", containers=9), gpu_pod("e", containers=1, gpus="5"),
            gpu_pod("f", containers=1, selector="nvidia-h100"), gpu_pod("g", containers=1, selector="nvidia-l4"),
            conflict_pod("h"), cpu_pod("i"), claim_pod("j")]
    annotated = gpu_pod("k", containers=2)
    annotated["metadata"]["annotations"] = {"gpu-webhook/accelerator": "nvidia-l4"}
    pods.append(annotated)
    for name, gpus, init_gpus in (("l", "2", "4"), ("m", "4", "4")):
        pod = gpu_pod(name, containers=2, gpus=gpus)
        pod["spec"]["initContainers"] = [dict(gpu_pod("x", containers=1, gpus=init_gpus)["spec"]["containers"][0],
                                              name="init")]
        pods.append(pod)
    requests = [celeval.Request(p, "bench") for p in pods]
    before = celeval.evaluate(documents, requests).answers
    after = celeval.evaluate(patched, requests).answers
    differ = 0
    for pod, x, y in zip(pods, before, after, strict=True):
        def seen(a: Any, pod: dict[str, Any] = pod) -> tuple[Any, ...]:
            selector = ((a.mutated or pod).get("spec") or {}).get("nodeSelector")
            return a.allowed, a.message, sorted(a.warnings), selector
        same = seen(x) == seen(y)
        differ += not same
        print(f"{policy_name} {pod['metadata']['name']}: allowed={x.allowed} "
              f"{'same' if same else f'DIFFERENT: {seen(x)} / {seen(y)}'}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=sorted(POLICIES), default="bench")
    parser.add_argument("--check", action="store_true", help="only compare decisions through tests/celeval")
    args, rest = parser.parse_known_args(argv)
    if args.check:
        return check(args.policy)
    policy = POLICIES[args.policy]
    generate = paths.generate_before

    def generate_patched(tree: Path, policy_file: Path | None) -> tuple[list[dict[str, Any]], str]:
        documents, said = generate(ROOT, policy_file)
        return patch(documents, policy), said

    def export_today(ref: str, into: Path) -> str:
        into.mkdir(parents=True)
        shutil.copytree(ROOT / "charts", into / "charts")
        return "today, patched by bench.fix_experiment"

    paths.generate_before = generate_patched  # type: ignore[assignment]
    paths.export_tree = export_today  # type: ignore[assignment]
    output = ROOT / "bench" / "results" / f"fix-experiment-{args.policy}-policy.json"
    return paths.main(["--before", "patched", "--policy", args.policy, "--output", str(output), *rest])


if __name__ == "__main__":
    sys.exit(main())
