"""``gpu-webhook check`` on a large input: wall time and peak memory, before and after a change, beside
kubeconform and ``kyverno apply`` on the same files, in one run.

    python -m bench.check_memory [--size-mb 50] [--ref main] [--kubeconform PATH] [--kyverno PATH]

Generates three inputs of about ``--size-mb`` each, of the same pod (the seed pod as the apiserver hands it to
admission, bench/bodies.py: defaulted fields, token volume, tolerations, managedFields, last-applied annotation;
every tenth with a GPU limit of ``500m``): YAML documents one after the other (a rendered chart, or
``kubectl get -o yaml`` of each), a YAML ``List`` as ``kubectl get pods -A -o yaml`` writes it and a JSON
``List`` as ``kubectl get pods -A -o json`` writes it (4-space indents). Each tool
runs as a subprocess of a small measuring process, which keeps its output: wall time and peak RSS
(``ru_maxrss`` of the measuring process's children). ``--ref`` runs webhook/ of that commit (``git archive``) as
"before"; this checkout is "after". kubeconform and kyverno are found on PATH, in ``$(go env GOPATH)/bin``, or
given; offline, kubeconform has no schemas (``-schema-location`` an empty directory with
``-ignore-missing-schemas``): it only reads and splits the input, and skips every resource.
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

import yaml

from bench import ab, bodies, harness

RESULTS = harness.REPO / "bench" / "results" / "check_memory.json"
# Runs a command and prints its exit code, wall seconds, peak RSS (KiB) and the last line it wrote (kubeconform's
# summary is on stdout, check's on stderr), or the line a Go panic starts with.
_MEASURE = """
import json, resource, subprocess, sys, time
start = time.monotonic()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.monotonic() - start
lines = (done.stderr.strip() or done.stdout.strip()).splitlines() or [""]
tail = next((line for line in lines if line.startswith("panic:")), lines[-1])
print(json.dumps([done.returncode, wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, tail]))
"""
# A Kyverno policy with the quantity rule check denies in these pods: a GPU limit that is not a whole number.
KYVERNO_POLICY = """\
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata: {name: whole-gpus}
spec:
  validationFailureAction: Enforce
  background: true
  rules:
  - name: whole-gpus
    match: {any: [{resources: {kinds: [Pod]}}]}
    validate:
      message: "nvidia.com/gpu limits must be whole numbers"
      foreach:
      - list: "request.object.spec.containers"
        deny:
          conditions:
            any:
            - key: "{{ contains(to_string(element.resources.limits.\\"nvidia.com/gpu\\" || '1'), 'm') }}"
              operator: Equals
              value: true
"""


def pod_texts() -> tuple[str, str, str]:
    """One apiserver-shaped GPU pod as a YAML document, as an item of a YAML List and of a JSON List (its name and
    limit to be filled)."""
    pod = bodies.apiserver_object(bodies.seed_pod(), "team-a")
    as_yaml = yaml.safe_dump(pod, sort_keys=True)
    as_item = "".join(("- " if i == 0 else "  ") + line for i, line in enumerate(as_yaml.splitlines(keepends=True)))
    as_json = "\n".join("        " + line for line in json.dumps(pod, indent=4, sort_keys=True).splitlines())
    return as_yaml, as_item, as_json


def _filled(template: str, i: int) -> str:
    text = template.replace("cuda-vector-add", f"pod-{i:06d}")
    return text.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 500m").replace(
        '"nvidia.com/gpu": 1', '"nvidia.com/gpu": "500m"') if i % 10 == 0 else text


def generate(directory: Path, size: int) -> dict[str, dict[str, int]]:
    """Inputs of about ``size`` bytes each (YAML documents, a YAML List as kubectl get -o yaml writes it, a JSON
    List as kubectl get -o json writes it): their pod counts and sizes."""
    as_yaml, as_item, as_json = pod_texts()
    counts = {name: max(1, size // len(text)) for name, text in
              (("pods.yaml", as_yaml), ("list.yaml", as_item), ("list.json", as_json))}
    with open(directory / "pods.yaml", "w") as out:
        for i in range(counts["pods.yaml"]):
            out.write("---\n" if i else "")
            out.write(_filled(as_yaml, i))
    with open(directory / "list.yaml", "w") as out:
        out.write("apiVersion: v1\nitems:\n")
        for i in range(counts["list.yaml"]):
            out.write(_filled(as_item, i))
        out.write("kind: List\nmetadata:\n  resourceVersion: ''\n")
    with open(directory / "list.json", "w") as out:
        out.write('{\n    "apiVersion": "v1",\n    "items": [\n')
        for i in range(counts["list.json"]):
            out.write(",\n" if i else "")
            out.write(_filled(as_json, i))
        out.write('\n    ],\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n')
    return {name: {"pods": count, "bytes": (directory / name).stat().st_size} for name, count in counts.items()}


def measure(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True, cwd=cwd,
                            env=env, check=True, timeout=3600)
    code, wall, rss, tail = json.loads(result.stdout)
    return {"exit": code, "seconds": round(wall, 2), "peak_mb": round(rss / 1024, 1), "says": tail}


def find_tool(name: str, given: str | None) -> str | None:
    if given:
        return given
    found = shutil.which(name)
    if found:
        return found
    go = shutil.which("go")
    if go:
        gopath = subprocess.run([go, "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
        candidate = Path(gopath) / "bin" / name
        if candidate.exists():
            return str(candidate)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check_memory")
    parser.add_argument("--size-mb", type=float, default=50, help="size of each generated input (default 50)")
    parser.add_argument("--ref", help="also run webhook/ of this commit, as 'before' (e.g. main)")
    parser.add_argument("--kubeconform", help="the kubeconform binary (default: PATH, then $(go env GOPATH)/bin)")
    parser.add_argument("--kyverno", help="the kubectl-kyverno binary (default: PATH, then $(go env GOPATH)/bin)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="check-memory-") as tmp:
        work = Path(tmp)
        inputs = generate(work, int(args.size_mb * 1e6))
        print(", ".join(f"{name}: {v['pods']} pods, {v['bytes'] / 1e6:.1f} MB" for name, v in inputs.items()))
        tools: dict[str, tuple[list[str], Path, dict[str, str] | None]] = {}
        if args.ref:
            before = ab.export(args.ref, work / "before")
            tools[f"gpu-webhook check ({args.ref})"] = (
                [sys.executable, "-m", "webhook", "check"], before, {**os.environ, "PYTHONPATH": str(before)})
        tools["gpu-webhook check (this checkout)"] = (
            [sys.executable, "-m", "webhook", "check"], harness.REPO, {**os.environ, "PYTHONPATH": str(harness.REPO)})
        kubeconform = find_tool("kubeconform", args.kubeconform)
        if kubeconform:
            (work / "no-schemas").mkdir()
            schemas = str(work / "no-schemas" / "{{ .ResourceKind }}.json")
            tools["kubeconform (no schemas)"] = (
                [kubeconform, "-summary", "-ignore-missing-schemas", "-schema-location", schemas], work, None)
        kyverno = find_tool("kubectl-kyverno", args.kyverno)
        if kyverno:
            (work / "policy.yaml").write_text(KYVERNO_POLICY)
            tools["kyverno apply"] = ([kyverno, "apply", str(work / "policy.yaml"), "--resource"], work, None)
        rows = []
        for name in inputs:
            for tool, (command, cwd, env) in tools.items():
                row = {"input": name, "tool": tool, **measure([*command, str(work / name)], cwd, env)}
                print(f"{name:9} {tool:34} {row['seconds']:8.1f} s {row['peak_mb']:8.1f} MB  exit {row['exit']}  "
                      f"{row['says']}", flush=True)
                rows.append(row)
    missing = [name for name, path in (("kubeconform", kubeconform), ("kubectl-kyverno", kyverno)) if not path]
    document = {"inputs": inputs, "runs": rows, "missing": missing, "cpus": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"-> {args.out}" + (f" (not found: {', '.join(missing)})" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
