"""``faro-serve policies``: every autoscaling policy, with one line on what it does, and the
installed plug-ins (policies and forecasters) with where they come from."""

from __future__ import annotations

import json

from autoscaler.catalogue.plugins import forecaster_plugins
from autoscaler.catalogue.registry import policy_catalog, policy_summaries


def register(sub) -> None:
    p = sub.add_parser(
        "policies",
        help="list the autoscaling policies and installed plug-ins",
        description="Every policy the autoscaler (policy: in the faro "
        "application's args), simulate, suite, validate and compare accept, "
        "with its kind (built-in, registered, plug-in) and one line on what it "
        "does; then the installed forecaster plug-ins. The default is "
        "faro-<objective>. Any import path (my_pkg.policies:MyPolicy) is "
        "accepted too; plug-ins are entry points of the groups "
        "faro_serve.policies and faro_serve.forecasters.",
    )
    p.add_argument("--json", action="store_true", help="print JSON {name: summary}")
    p.add_argument(
        "--details",
        action="store_true",
        help="with --json: {policies: [{name, kind, source, summary, needs_batching}], "
        "forecasters: [{name, kind, source}]}",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    forecasters = forecaster_plugins()
    if args.json:
        doc = (
            policy_summaries()
            if not args.details
            else {
                "policies": policy_catalog(),
                "forecasters": [{"name": n, "kind": "plug-in", "source": s} for n, s in forecasters.items()],
            }
        )
        print(json.dumps(doc, indent=2))
        return 0
    rows = policy_catalog()
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['kind']:<8}  {r['summary']}")
    if forecasters:
        print("\nforecaster plug-ins:")
        for name, source in forecasters.items():
            print(f"  {name}  {source}")
    return 0
