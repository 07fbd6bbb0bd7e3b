"""The chaos table, whole, at the end of the run: one row per scenario that ran (pytest -s also shows each row as
its scenario ends)."""

from tests.chaos.stack import HEADER, ROWS


def pytest_terminal_summary(terminalreporter) -> None:
    if ROWS:
        terminalreporter.section("chaos table")
        for line in (HEADER, *ROWS):
            terminalreporter.write_line(line)
