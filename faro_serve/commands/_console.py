"""A rich console that keeps tables readable when output is piped (no terminal width)."""

from rich.console import Console


def console() -> Console:
    c = Console()
    return c if c.is_terminal else Console(width=140)
