"""``faro-serve`` command line: one sub-command per module in ``faro_serve.commands``.

Every command reports bad input (files, flags, values) as one ``faro-serve: error: ...``
message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands.errors import UsageError  # re-exported: faro_serve.cli.UsageError

# Sub-command modules, each exposing ``register(subparsers)`` that sets ``func`` on its parser.
COMMANDS = [
    "faro_serve.commands.estimate",
    "faro_serve.commands.plan",
    "faro_serve.commands.status",
    "faro_serve.commands.forecast",
    "faro_serve.commands.simulate",
    "faro_serve.commands.suite",
    "faro_serve.commands.replay",
    "faro_serve.commands.demo",
    "faro_serve.commands.kuberay",
    "faro_serve.commands.validate",
    "faro_serve.commands.compare",
    "faro_serve.commands.policies",
    "faro_serve.commands.profile",
    "faro_serve.commands.init",
    "faro_serve.commands.run",
    "faro_serve.commands.drain",
    "faro_serve.commands.whatif",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="faro-serve", description="SLO-aware autoscaling for multi-model Ray Serve clusters (Faro)."
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"faro-serve {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .config import ConfigError

    try:
        return int(args.func(args) or 0)
    except (UsageError, ConfigError, ValueError, FileNotFoundError) as err:
        msg = str(err).strip() or type(err).__name__
        print(f"faro-serve: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("faro-serve: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
