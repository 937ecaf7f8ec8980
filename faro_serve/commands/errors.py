"""The one error a command raises for bad user input, in a module of its own so that the
commands import it at their top and ``faro_serve.cli`` (which imports the commands) does
not have to be imported back from a function body."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
