"""Shared test helpers: a place for tests to report figures in the terminal summary."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def with_batching(models):
    """``models`` whose replicas batch, with a ResNet34-sized profile (154 ms alone, 3/4 of
    it per request): what a policy that needs batching (Sponge) runs on in the tests."""
    from faro_serve.config import Batching

    b = Batching(gamma=0.1155, eps=0.0385, max_batch_size=8)
    return [m.model_copy(update={"batching": b}) for m in models]

_REPORT: list[str] = []


@pytest.fixture
def report():
    """``report("...")`` prints a line in pytest's terminal summary (figures tests measure)."""
    return _REPORT.append


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("faro-serve figures")
        for line in _REPORT:
            terminalreporter.write_line(line)


@pytest.fixture
def cli(capsys):
    """Run the real ``faro-serve`` entry point in-process: returns (exit code, stdout, stderr)."""
    from faro_serve.cli import main

    def run(*args: str):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse usage errors
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session, exitstatus):
    _STATUS["exit"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave without the interpreter's finalisation once pytest is done. Native libraries
    loaded in this process (Ray's core worker, torch, numba) can crash in their own exit
    handlers after every test has passed and the summary is out: a fresh-clone CI run ended
    in a segfault after "208 passed", with no Python frame to blame. The exit status is the
    session's, so failures still fail."""
    if "exit" in _STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_STATUS["exit"])
