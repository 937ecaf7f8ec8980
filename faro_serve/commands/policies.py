"""``faro-serve policies``: every autoscaling policy, with one line on what it does."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("policies", help="list the autoscaling policies",
                       description="Every policy the autoscaler (policy: in the faro "
                       "application's args), simulate, suite, validate and compare accept, "
                       "with one line on what it does. The default is faro-<objective>.")
    p.add_argument("--json", action="store_true", help="print JSON {name: summary}")
    p.set_defaults(func=run)


def run(args) -> int:
    from autoscaler.registry import policy_summaries

    rows = policy_summaries()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(map(len, rows))
    for name, summary in rows.items():
        print(f"{name:<{width}}  {summary}")
    return 0
