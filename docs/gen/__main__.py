"""``python -m docs.gen [--check]``: rewrite the generated blocks of the docs pages, or report stale ones."""

from __future__ import annotations

import argparse
import sys

from docs import gen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a block is stale")
    parser.add_argument("--list", action="store_true", help="list the registered and pending blocks")
    args = parser.parse_args(argv)
    if args.list:
        for name, function in gen.BLOCKS.items():
            print(f"{name}: {function.__doc__.strip().splitlines()[0] if function.__doc__ else function.__name__}")
        for name, why in gen.PENDING.items():
            print(f"{name}: pending, {why}")
        return 0
    if args.check:
        stale = gen.stale()
        for page in stale:
            print(f"stale: {page}", file=sys.stderr)
        if stale:
            print(f"regenerate with: {gen.REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for page in gen.write():
        print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
