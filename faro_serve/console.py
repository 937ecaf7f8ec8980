"""A rich console that keeps tables readable when output is piped (no terminal width): the
commands' and the demo's."""

from rich.console import Console


def console() -> Console:
    c = Console()
    return c if c.is_terminal else Console(width=140)
