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
_FIGURE = "faro-figure"


@pytest.fixture
def report(request):
    """``report("...")`` prints a line in pytest's terminal summary (figures tests measure).
    The line rides on the test's report (``user_properties``), so it reaches the summary
    from pytest-xdist's workers too (``make test`` runs the offline tests on two)."""
    return lambda line: request.node.user_properties.append((_FIGURE, line))


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        _REPORT.extend(v for k, v in report.user_properties if k == _FIGURE)


_CHAOS: list[dict] = []
CHAOS_COLUMNS = ("fault", "requests", "answered", "5xx", "lost", "recovered in", "what happened")


@pytest.fixture
def chaos():
    """``chaos(fault, requests=, answered=, bare_5xx=, lost=, recover_s=, note=)``: one row of
    the chaos suite's table (issue 50), printed in the terminal summary and written as
    markdown to ``$FARO_CHAOS_TABLE`` when set (docs/reliability.md shows it)."""

    def row(
        fault: str, requests: int, answered: int, bare_5xx: int, lost: int, recover_s: float | None, note: str
    ) -> None:
        _CHAOS.append(
            {
                "fault": fault,
                "requests": requests,
                "answered": answered,
                "5xx": bare_5xx,
                "lost": lost,
                "recovered in": "-" if recover_s is None else f"{recover_s:.1f} s",
                "what happened": note,
            }
        )

    return row


def chaos_table() -> list[str]:
    lines = ["| " + " | ".join(CHAOS_COLUMNS) + " |", "|" + "---|" * len(CHAOS_COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in CHAOS_COLUMNS) + " |" for r in _CHAOS]
    return lines


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("faro-serve figures")
        for line in _REPORT:
            terminalreporter.write_line(line)
    if _CHAOS:
        terminalreporter.section("faro-serve chaos suite (issue 50)")
        for line in chaos_table():
            terminalreporter.write_line(line)
        out = os.environ.get("FARO_CHAOS_TABLE")
        if out:
            Path(out).write_text("\n".join(chaos_table()) + "\n")


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
