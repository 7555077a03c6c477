"""What each generated admission policy costs on the bench's 7-container GPU pod, outside any apiserver.

    .venv/bin/python -m bench.policy_cost --before 90e4bde --policy default     # about a minute

The policies of today's generator (and, with ``--before REF``, of the tree at REF: ``git archive`` of its webhook/
and charts/, as ``bench.admission_paths --before`` uses it) go through tests/celeval, k8s.io/apiserver's own
admission policy code (``tests/prepare celeval`` builds it), with ``repeat``: the mean wall time of one admission of
the pod (the apiserver's decoding and defaulting of the Pod first), for all the policies together and for each
policy with its binding alone, the best of ``--trials`` runs (the machine is shared), and the CEL cost of each
policy that got past its matchConditions; "none" (no policy) is the harness's own floor. It says which policy the
apiserver's validating or mutating step spends its time in (the apiserver reports per-policy durations only for
refusals and errors). Results go to stdout and to bench/results/policy-cost.json (policy-cost-default-policy.json
with ``--policy default``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.admission_paths import POLICIES, ROOT, export_tree, generate_before, gpu_pod, inline_document

RESULTS = ROOT / "bench" / "results" / "policy-cost.json"


def admit(objects: list[dict[str, Any]], obj: dict[str, Any], repeat: int) -> dict[str, Any]:
    """One celeval run: the object admitted ``repeat`` times after a first, untimed admission."""
    from tests.celeval import Request, binary

    request = dict(Request(obj, "bench").to_json(), id="pod")
    document = {"compatibility": "", "repeat": repeat, "objects": objects, "requests": [request], "cost": True}
    done = subprocess.run([str(binary())], input=json.dumps(document), capture_output=True, text=True, timeout=600,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"celeval failed ({done.returncode}): {done.stderr.strip()}")
    out = json.loads(done.stdout)
    if out["compileErrors"]:
        raise RuntimeError(f"compile errors: {out['compileErrors'][:3]}")
    result = out["results"][0]
    return {"ms": result["nanos"] / 1e6, "cost": result["cost"], "allowed": result["allowed"],
            "decisions": len(result["decisions"]),
            # celeval's "mutated": a MutatingAdmissionPolicy got past its matchConditions and ran (even to no patch).
            "mutation_ran": result.get("mutated") is not None}


def measure(documents: list[dict[str, Any]], obj: dict[str, Any], repeat: int, trials: int,
            params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """All the policies together and each alone with its binding; trials interleaved, the best of each kept.
    ``params``: objects every case holds besides (GPUPolicy/default, which the live policies read)."""
    # "none": no policy at all, the harness's own decoding and defaulting of the Pod (the floor of every case).
    extra = list(params or [])
    cases: dict[str, list[dict[str, Any]]] = {"none": [*extra], "all": [*documents, *extra]}
    for policy in documents:
        if not policy["kind"].endswith("Binding"):
            name = policy["metadata"]["name"]
            bindings = [d for d in documents
                        if d["kind"] == policy["kind"] + "Binding" and d["spec"]["policyName"] == name]
            cases[f"{policy['kind']}/{name}"] = [policy, *bindings, *extra]
    best: dict[str, dict[str, Any]] = {}
    for _ in range(trials):
        for case, objects in cases.items():
            got = admit(objects, obj, repeat)
            if case not in best or got["ms"] < best[case]["ms"]:
                best[case] = got
    return {case: {**got, "ms": round(got["ms"], 3)} for case, got in best.items()}


def table(result: dict[str, Any]) -> str:
    lines = ["| generator | policy | ms per admission | CEL cost | validating decisions | mutation ran |",
             "|---|---|---|---|---|---|"]
    for generator, cases in result["generators"].items():
        for case, got in cases.items():
            cost = sum(got["cost"].values()) if got["cost"] else "-"
            lines.append(f"| {generator} | {case} | {got['ms']:.3f} | {cost} | {got['decisions']} | "
                         f"{'yes' if got['mutation_ran'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=sorted(POLICIES), default="bench",
                        help="bench: bench.admission_paths' policy (default); default: the embedded default policy")
    parser.add_argument("--before", metavar="REF", default=None, help="also the generator of this commit")
    parser.add_argument("--modes", action="store_true",
                        help="today's generator inline and params (live, with GPUPolicy/default) instead of 'after'")
    parser.add_argument("--repeat", type=int, default=300, help="timed admissions per run")
    parser.add_argument("--trials", type=int, default=3, help="runs per case; the fastest is kept")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.trials < 1:
        parser.error("--repeat and --trials must be at least 1")
    output = args.output or (RESULTS if args.policy == "bench"
                             else RESULTS.with_name("policy-cost-default-policy.json"))
    workdir = Path(tempfile.mkdtemp(prefix="gw-policy-cost-"))
    try:
        policy = POLICIES[args.policy]
        policy_file = None
        if policy is not None:
            policy_file = workdir / "policy.yaml"
            policy_file.write_text(yaml.safe_dump(policy))
        trees = {}
        if args.before:
            trees["before"] = workdir / "before"
            export_tree(args.before, trees["before"])
        trees["after"] = ROOT
        obj = gpu_pod("bench")
        result: dict[str, Any] = {"policy": args.policy, "before": args.before, "repeat": args.repeat,
                                  "trials": args.trials, "load_average_before": list(os.getloadavg()),
                                  "generators": {}}
        for generator, tree in trees.items():
            documents, _ = generate_before(tree, policy_file)
            result["generators"][generator] = measure(documents, obj, args.repeat, args.trials)
        if args.modes:
            # Today's generator both ways: inline (the values written in) and params (live, GPUPolicy/default read
            # through params; every case holds the object).
            from webhook.core.policyfile import parse_policy
            from webhook.native.generate import generate

            result["generators"].pop("after", None)
            inline = generate(parse_policy(yaml.safe_dump(inline_document(policy)))).objects
            result["generators"]["inline"] = measure(inline, obj, args.repeat, args.trials)
            live = generate(parse_policy(yaml.safe_dump(policy or {})))
            assert live.policy_object is not None
            result["generators"]["params"] = measure(live.objects, obj, args.repeat, args.trials,
                                                     [live.policy_object])
        result["load_average_after"] = list(os.getloadavg())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
