"""Keep the chart's copies of the webhook's facts equal to the webhook's own.

- The ``policy`` section of values.schema.json is ``webhook.core.policy.SCHEMA``: the chart validates
  ``values.policy`` (which becomes the policy file) with the webhook's schema, so a bad policy fails
  ``helm install`` instead of crash-looping the pods.
- ``templates/_webhooks.tpl`` holds ``webhook.native.webhooks.template()``: the matchConditions of the webhooks,
  their CEL built from the rules' triggers, with the GPU defaults, the glob conversion and the policy's values
  filled in by generated helpers.
- ``templates/_native.tpl`` holds ``webhook.native.chart.helpers()``: how the chart chooses the engines from
  ``.Capabilities`` and the CEL of hybrid mode's webhook conditions, written by the generator.

Run this after changing either:

    .venv/bin/python tests/chart/sync_schema.py          # rewrite them
    .venv/bin/python tests/chart/sync_schema.py --check  # exit 1 if one drifted

tests/chart/test_chart.py asserts the same equality.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from webhook.core.policy import SCHEMA
from webhook.native.chart import helpers as native_helpers
from webhook.native.webhooks import template as webhooks_template

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpu-webhook"
VALUES_SCHEMA = CHART / "values.schema.json"
WEBHOOKS_TEMPLATE = CHART / "templates" / "_webhooks.tpl"
NATIVE_TEMPLATE = CHART / "templates" / "_native.tpl"
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
    targets = [
        (
            VALUES_SCHEMA,
            current,
            render(synced(json.loads(current))),
            "policy section differs from webhook.core.policy.SCHEMA",
        ),
        (
            WEBHOOKS_TEMPLATE,
            WEBHOOKS_TEMPLATE.read_text(encoding="utf-8") if WEBHOOKS_TEMPLATE.exists() else "",
            webhooks_template(),
            "differs from webhook.native.webhooks.template()",
        ),
        (
            NATIVE_TEMPLATE,
            NATIVE_TEMPLATE.read_text(encoding="utf-8") if NATIVE_TEMPLATE.exists() else "",
            native_helpers(),
            "differs from webhook.native.chart.helpers()",
        ),
    ]
    status = 0
    for path, text, wanted, drift in targets:
        if text == wanted:
            continue
        if args.check:
            print(f"{path}: {drift}; run {__file__}", file=sys.stderr)
            status = 1
            continue
        path.write_text(wanted, encoding="utf-8")
        print(f"updated {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
