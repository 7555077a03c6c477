"""Keep the ``policy`` section of the chart's values.schema.json equal to the webhook's own schema.

The webhook validates its policy file with ``webhook.policy.SCHEMA``; the chart validates
``values.policy`` (which becomes that file) with the same schema, so a bad policy fails
``helm install`` instead of crash-looping the pods. Run this after changing SCHEMA:

    .venv/bin/python tests/chart/sync_schema.py          # rewrite the section
    .venv/bin/python tests/chart/sync_schema.py --check  # exit 1 if it drifted

tests/chart/test_chart.py asserts the same equality.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from webhook.policy import SCHEMA

VALUES_SCHEMA = Path(__file__).resolve().parents[2] / "charts" / "gpu-webhook" / "values.schema.json"
DROPPED_KEYS = ("$schema", "title")


def policy_schema() -> dict[str, Any]:
    """The webhook's SCHEMA as the chart embeds it: without $schema and title."""
    section = copy.deepcopy(SCHEMA)
    for key in DROPPED_KEYS:
        section.pop(key, None)
    return section


def synced(document: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(document)
    updated["properties"]["policy"] = policy_schema()
    return updated


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report drift (exit 1), write nothing")
    args = parser.parse_args(argv)
    current = VALUES_SCHEMA.read_text(encoding="utf-8")
    wanted = render(synced(json.loads(current)))
    if current == wanted:
        return 0
    if args.check:
        print(f"{VALUES_SCHEMA}: policy section differs from webhook.policy.SCHEMA; run {__file__}", file=sys.stderr)
        return 1
    VALUES_SCHEMA.write_text(wanted, encoding="utf-8")
    print(f"updated {VALUES_SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
