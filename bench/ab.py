"""A/B: two versions of webhook/ served at once on the same core and driven alternately (A B B A ...), so a
before/after number is not a difference between two noisy minutes.

    python -m bench.ab fix.patch [--base PATCH ...] [--endpoint mutate]        # A: this checkout, B: + patches
    python -m bench.ab --ref f2c05b6 --endpoint validate --body seed pod50 --rate 50 --max-duration 0
                                                                              # A: webhook/ at a commit, B: now

``--base`` patches go into both sides (B = base + the patches under test). ``--ref REV`` makes A the webhook/
of commit REV (``git archive``) and B this checkout with the patches, if any. With several ``--body``, each
side's p50 of every body is also given as a ratio to the first body's, from the same rounds (the container
sweep's "50 ÷ 1 container"). Each answer is judged as in the full benchmark (200, the request's uid, allowed,
a patch exactly when one is due). Prints a table and writes bench/results/ab-<first patch name, or the ref>.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import bodies, harness, loadgen, runner
from bench.stats import latency_summary, spread

RESULTS = harness.REPO / "bench" / "results"


def export(ref: str, into: Path) -> Path:
    """webhook/ as it was at commit ``ref``, under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref, "webhook"], cwd=harness.REPO, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab")
    parser.add_argument("patches", type=Path, nargs="*")
    parser.add_argument("--base", type=Path, nargs="*", default=[])
    parser.add_argument("--ref", help="side A is webhook/ at this commit; side B this checkout (and the patches)")
    parser.add_argument("--endpoint", nargs="+", default=["mutate"])
    parser.add_argument("--body", nargs="+", default=["seed"], choices=list(bodies.BODIES))
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--max-duration", type=float, default=3.0, help="0: no max-throughput runs")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    if not args.patches and not args.ref:
        parser.error("give patches to apply, or --ref")

    vegeta = loadgen.find_vegeta()
    pins = harness.pinning()
    variants = bodies.bodies()
    uids = {name: {json.loads(b)["request"]["uid"] for b in variants[name]} for name in args.body}
    cases = [(endpoint, body) for endpoint in args.endpoint for body in args.body]
    with tempfile.TemporaryDirectory(prefix="gpu-webhook-ab-") as tmp:
        work = Path(tmp)
        sides: dict[str, dict] = {}
        plans = {"A": args.base, "B": [*args.base, *args.patches]}
        for name, patches in plans.items():
            side = work / name
            side.mkdir()
            if name == "A" and args.ref:
                source: Path | None = export(args.ref, side / "src")
                if patches:
                    for patch in patches:
                        subprocess.run(["git", "apply", str(patch.resolve())], cwd=source, check=True)
                label = f"webhook/ at {args.ref}" + (" + " + ", ".join(p.name for p in patches) if patches else "")
            else:
                source = runner.apply_patches(patches, side / "src") if patches else None
                label = "this checkout" + (" + " + ", ".join(p.name for p in patches) if patches else "")
            certs = harness.make_certs(side, source)
            server = harness.start_server(side, certs, pins.server, source)
            sides[name] = {"server": server, "dir": side, "label": label, "memory_start": {},
                           "targets": {}, "latencies": {c: [] for c in cases}, "p50": {c: [] for c in cases},
                           "p99": {c: [] for c in cases}, "max": {c: [] for c in cases}, "wrong": 0}
            for endpoint, body in cases:
                sides[name]["targets"][(endpoint, body)] = loadgen.write_targets(
                    side / f"targets-{endpoint}-{body}.json",
                    f"https://127.0.0.1:{server.port}/{endpoint}?timeout=10s", variants[body])
        try:
            for s in sides.values():  # warm-up, then the memory at start
                for endpoint, body in cases:
                    loadgen.attack(vegeta, loadgen.Attack(s["targets"][(endpoint, body)], 100, 2), s["server"].ca,
                                   s["dir"], pins.loadgen)
                s["memory_start"] = harness.memory_mb(s["server"].workers()[0])
            order = []
            for rnd in range(args.rounds):
                order += ["A", "B"] if rnd % 2 == 0 else ["B", "A"]
            for name in order:
                s = sides[name]
                server = s["server"]
                for case in cases:
                    endpoint, body = case
                    fixed = loadgen.attack(vegeta, loadgen.Attack(s["targets"][case], args.rate, args.duration,
                                                                  max_connections=server.threads),
                                           server.ca, s["dir"], pins.loadgen)
                    lat = [ns / 1e6 for ns in fixed.latencies_ns]
                    s["latencies"][case] += lat
                    summary = latency_summary(lat)
                    s["p50"][case].append(summary["p50"])
                    s["p99"][case].append(summary["p99"])
                    answers = list(zip(fixed.codes, fixed.bodies, strict=True))
                    line = f"  {name}: /{endpoint} {body}: p50 {summary['p50']:6.2f} p99 {summary['p99']:6.2f} ms"
                    if args.max_duration > 0:
                        maxed = loadgen.attack(vegeta, loadgen.Attack(s["targets"][case], 0, args.max_duration,
                                                                      max_connections=server.threads),
                                               server.ca, s["dir"], pins.loadgen)
                        s["max"][case].append(sum(1 for c in maxed.codes if c == 200) / maxed.span_s)
                        answers += list(zip(maxed.codes, maxed.bodies, strict=True))
                        line += f", max {s['max'][case][-1]:6.0f} rps"
                    wrong = sum(1 for c, b in answers if c != 200 or not runner.check_answer(endpoint, body, b,
                                                                                                uids[body]))
                    s["wrong"] += wrong
                    print(line + (f", {wrong} wrong answers" if wrong else ""), file=sys.stderr, flush=True)
            out: dict = {"endpoints": args.endpoint, "bodies": args.body, "rate": args.rate,
                         "duration_s": args.duration, "rounds": args.rounds, "machine": harness.machine(),
                         "pinning": pins.description, "ref": args.ref}
            for name, s in sides.items():
                worker = s["server"].workers()[0]
                side_out: dict = {"code": s["label"], "patches": [p.name for p in plans[name]],
                                  "wrong_answers": s["wrong"], "full_gc": s["server"].full_collections(),
                                  "memory_mb_start": s["memory_start"], "memory_mb": harness.memory_mb(worker),
                                  "cases": {}}
                for endpoint, body in cases:
                    case = (endpoint, body)
                    entry = {"latency_ms": latency_summary(s["latencies"][case]),
                             "p50_ms_by_round": spread(s["p50"][case]), "p99_ms_by_round": spread(s["p99"][case])}
                    if s["max"][case]:
                        entry["max_rps"] = spread(s["max"][case], 1)
                    if body != args.body[0]:
                        first = s["p50"][(endpoint, args.body[0])]
                        entry[f"p50_over_{args.body[0]}"] = spread(
                            [b / a for a, b in zip(first, s["p50"][case], strict=True) if a], 2)
                        pooled = side_out["cases"][f"{endpoint} {args.body[0]}"]["latency_ms"]["p50"]
                        entry[f"pooled_p50_over_{args.body[0]}"] = round(entry["latency_ms"]["p50"] / pooled, 2)
                    side_out["cases"][f"{endpoint} {body}"] = entry
                out[name] = side_out
        finally:
            for s in sides.values():
                s["server"].stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"ab-{args.patches[0].stem if args.patches else args.ref}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(table(out))
    print(f"wrote {path}", file=sys.stderr)
    return 0 if not out["A"]["wrong_answers"] and not out["B"]["wrong_answers"] else 1


def table(out: dict) -> str:
    a, b = out["A"], out["B"]
    lines = [f"| @{out['rate']} rps, {out['rounds']} rounds A B B A | A: {a['code']} | B: {b['code']} |",
             "|---|---|---|"]
    first = out["bodies"][0]
    for key in a["cases"]:
        rows = [("p50 / p99 ms, pooled", lambda d: f"{d['latency_ms']['p50']:.2f} / {d['latency_ms']['p99']:.2f}"),
                ("p50 ms by round, median (range)", lambda d: _spread(d["p50_ms_by_round"]))]
        if "max_rps" in a["cases"][key]:
            rows.append(("max rps, median (range)", lambda d: _spread(d["max_rps"], 0)))
        if f"p50_over_{first}" in a["cases"][key]:
            rows.append((f"p50 ÷ {first}: pooled · by round, median (range)",
                         lambda d: f"{d[f'pooled_p50_over_{first}']:.2f}× · {_spread(d[f'p50_over_{first}'])}×"))
        for label, cell in rows:
            lines.append(f"| /{key}: {label} | {cell(a['cases'][key])} | {cell(b['cases'][key])} |")

    def memory(d: dict) -> str:
        m, start = d["memory_mb"], d["memory_mb_start"]
        return f"{m.get('VmRSS')} / {m.get('Pss')} ({start.get('VmRSS')} at start)"

    lines.append(f"| worker VmRSS / Pss MB after the runs | {memory(a)} | {memory(b)} |")
    lines.append(f"| full GCs: count, mean / max pause | {_gc(a['full_gc'])} | {_gc(b['full_gc'])} |")
    lines.append(f"| wrong answers | {a['wrong_answers']} | {b['wrong_answers']} |")
    return "\n".join(lines)


def _spread(d: dict, digits: int = 2) -> str:
    return f"{d['median']:.{digits}f} ({d['min']:.{digits}f}–{d['max']:.{digits}f})"


def _gc(gc: dict) -> str:
    return f"{gc['count']}, {gc['mean_ms']} / {gc['max_ms']} ms"


if __name__ == "__main__":
    sys.exit(main())
