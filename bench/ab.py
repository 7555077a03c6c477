"""A/B: this checkout's webhook/ (A) against a patched copy (B), both served at once on the same core and
driven alternately (A B B A ...), so a before/after number is not a difference between two noisy minutes.

    python -m bench.ab fix.patch [--base PATCH ...] [--endpoint mutate]

``--base`` patches go into both sides (B = base + the patches under test). Prints a table and writes
bench/results/ab-<first patch name>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench import bodies, harness, loadgen, runner
from bench.stats import latency_summary, spread

RESULTS = harness.REPO / "bench" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab")
    parser.add_argument("patches", type=Path, nargs="+")
    parser.add_argument("--base", type=Path, nargs="*", default=[])
    parser.add_argument("--endpoint", default="mutate")
    parser.add_argument("--body", default="seed")
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)

    vegeta = loadgen.find_vegeta()
    pins = harness.pinning()
    variants = bodies.bodies()[args.body]
    with tempfile.TemporaryDirectory(prefix="gpu-webhook-ab-") as tmp:
        work = Path(tmp)
        sides = {}
        for name, patches in (("A", args.base), ("B", [*args.base, *args.patches])):
            side = work / name
            side.mkdir()
            source = runner.apply_patches(patches, side / "src") if patches else None
            certs = harness.make_certs(side, source)
            server = harness.start_server(side, certs, pins.server, source)
            targets = loadgen.write_targets(
                side / "targets.json", f"https://127.0.0.1:{server.port}/{args.endpoint}", variants)
            sides[name] = {"server": server, "targets": targets, "dir": side, "patches": [p.name for p in patches],
                           "fixed": [], "max": [], "latencies": []}
        try:
            for name in sides:  # warm-up
                s = sides[name]
                loadgen.attack(vegeta, loadgen.Attack(s["targets"], 100, 2), s["server"].ca, s["dir"], pins.loadgen)
            order = []
            for rnd in range(args.rounds):
                order += ["A", "B"] if rnd % 2 == 0 else ["B", "A"]
            for name in order:
                s = sides[name]
                server = s["server"]
                fixed = loadgen.attack(vegeta, loadgen.Attack(s["targets"], args.rate, args.duration,
                                                              max_connections=server.threads),
                                       server.ca, s["dir"], pins.loadgen)
                lat = [ns / 1e6 for ns in fixed.latencies_ns]
                s["latencies"] += lat
                s["fixed"].append(latency_summary(lat)["p99"])
                maxed = loadgen.attack(vegeta, loadgen.Attack(s["targets"], 0, 3, max_connections=server.threads),
                                       server.ca, s["dir"], pins.loadgen)
                s["max"].append(sum(1 for c in maxed.codes if c == 200) / maxed.span_s)
                bad = sum(1 for c in fixed.codes + maxed.codes if c != 200)
                print(f"  {name}: p99 @{args.rate} {s['fixed'][-1]:7.2f} ms, max {s['max'][-1]:6.0f} rps"
                      + (f", {bad} non-200" if bad else ""), file=sys.stderr, flush=True)
            out = {"endpoint": args.endpoint, "body": args.body, "rate": args.rate, "machine": harness.machine(),
                   "pinning": pins.description}
            for name, s in sides.items():
                worker = s["server"].workers()[0]
                out[name] = {
                    "patches": s["patches"],
                    "latency_ms": latency_summary(s["latencies"]),
                    "p99_ms_by_round": spread(s["fixed"]),
                    "max_rps": spread(s["max"], 1),
                    "full_gc": s["server"].full_collections(),
                    "memory_mb": harness.memory_mb(worker),
                }
        finally:
            for s in sides.values():
                s["server"].stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"ab-{args.patches[0].stem}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"| /{args.endpoint} {args.body} | A: {', '.join(out['A']['patches']) or 'this checkout'} | "
          f"B: + {', '.join(p.name for p in args.patches)} |\n|---|---|---|")
    def cells(d: dict) -> list[str]:
        lat, p99, mx, gc = d["latency_ms"], d["p99_ms_by_round"], d["max_rps"], d["full_gc"]
        return [
            f"{lat['p50']:.2f} / {lat['p99']:.2f} / {lat['p99.9']:.2f}",
            f"{p99['median']:.2f} ({p99['min']:.2f}–{p99['max']:.2f})",
            f"{mx['median']:.0f} ({mx['min']:.0f}–{mx['max']:.0f})",
            f"{gc['count']}, {gc['mean_ms']} / {gc['max_ms']} ms",
            f"{d['memory_mb'].get('VmRSS')} / {d['memory_mb'].get('Pss')}",
        ]

    labels = [f"p50 / p99 / p99.9 ms @{args.rate} rps", "p99 by round (median, range)", "max rps (median, range)",
              "full GCs: count, mean / max pause", "worker VmRSS / Pss MB"]
    for label, a, b in zip(labels, cells(out["A"]), cells(out["B"]), strict=True):
        print(f"| {label} | {a} | {b} |")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
