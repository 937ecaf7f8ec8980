"""Sub-commands of the faro-serve CLI (see faro_serve.cli)."""
