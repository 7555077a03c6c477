"""``python -m bench``: the full timed benchmark (about 8 minutes), or ``--smoke`` (seconds, for CI).

    python -m bench                      # -> bench/results/latest.{json,png}, tables in bench/README.md
    python -m bench --smoke              # every endpoint and scenario briefly; fails unless all got 200s
    python -m bench --apply fix.patch    # the same on a patched copy of webhook/ -> results/proposed.*
    python -m bench --profile            # py-spy profiles of each endpoint at max throughput
    python -m bench --peer               # beside the Go controller-runtime peer (python -m bench.peer)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from bench import loadgen, report, runner
from bench.harness import REPO

RESULTS = REPO / "bench" / "results"
README = REPO / "bench" / "README.md"


def _refresh_readme() -> None:
    latest = RESULTS / "latest.json"
    if not latest.exists():
        return
    current = json.loads(latest.read_text())
    body = report.section(current, "results/latest.png")
    columns = []
    for name, label in (("before-fixes", "before the fixes"), ("after-mutate-gc", "mutate + gc.freeze applied"),
                        ("latest", "current code"), ("proposed", "with the --apply patches")):
        path = RESULTS / f"{name}.json"
        if path.exists():
            columns.append((label, json.loads(path.read_text())))
    if len(columns) > 1:
        body += "\n\n### Before the fixes and now\n\n" + report.comparison(columns)
        if (RESULTS / "before-fixes.png").exists():
            body += "\n\nThe same plot before the fixes: [results/before-fixes.png](results/before-fixes.png)."
    report.update_readme(README, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a few seconds of everything; asserts only 200s")
    parser.add_argument("--out", type=Path, help="JSON result (default bench/results/latest.json)")
    parser.add_argument("--png", type=Path, help="plot (default: the JSON path with .png)")
    parser.add_argument("--apply", type=Path, nargs="+", metavar="PATCH",
                        help="benchmark a copy of webhook/ with these patches (default out: results/proposed.json)")
    parser.add_argument("--source", type=Path, help="benchmark the webhook package in this directory instead")
    parser.add_argument("--quick", action="store_true", help="one round of everything (about 3 minutes)")
    parser.add_argument("--rounds", type=int, help="rounds of the fixed-rate and max scenarios (default 3)")
    parser.add_argument("--no-readme", action="store_true", help="leave bench/README.md alone")
    parser.add_argument("--profile", action="store_true", help="profile each endpoint with py-spy instead")
    parser.add_argument("--peer", action="store_true",
                        help="ours beside the Go controller-runtime peer (bench/peer) -> results/peer.json")
    parser.add_argument("--readme-only", action="store_true",
                        help="rewrite bench/README.md's results from results/latest.json (and proposed.json)")
    args = parser.parse_args(argv)
    if args.readme_only:
        _refresh_readme()
        return 0

    if args.peer:
        from bench import peer

        passed = (["--smoke"] if args.smoke else []) + (["--rounds", str(args.rounds)] if args.rounds else [])
        passed += (["--out", str(args.out)] if args.out else []) + (["--no-readme"] if args.no_readme else [])
        return peer.main(passed)

    try:
        loadgen.find_vegeta()
    except loadgen.LoadToolMissing as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2

    if args.profile:
        from bench import profile

        return profile.main(args.source)

    plan = runner.SMOKE if args.smoke else runner.QUICK if args.quick else runner.FULL
    if args.rounds:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    default_name = "smoke" if args.smoke else ("proposed" if args.apply else "latest")
    out = args.out or RESULTS / f"{default_name}.json"
    png = args.png or out.with_suffix(".png")

    summary = runner.run(plan, source=args.source, patches=args.apply)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    from bench.plot import plot

    plot(summary, png)
    print(report.section(summary, None))
    print(f"\nwrote {out} and {png}", file=sys.stderr)

    if args.smoke:
        bad = [r for r in summary["runs"] if r["requests"] == 0 or r["ok"] != r["requests"]]
        for r in bad:
            print(f"smoke: {r['scenario']} /{r['endpoint']} {r['body']}: {r['ok']} of {r['requests']} ok, "
                  f"errors {r['errors']}", file=sys.stderr)
        if bad or not out.stat().st_size or not png.stat().st_size:
            return 1
        print("smoke: every request got a 200 and a correct AdmissionReview", file=sys.stderr)
    elif not args.no_readme and out.resolve().parent == RESULTS.resolve():
        _refresh_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
