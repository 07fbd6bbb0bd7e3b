"""CPU seconds (user + system) that a process, or one of its threads, has used so far, read from /proc."""

import os
from pathlib import Path

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _stat_cpu_s(stat_path: Path) -> float:
    # The command name (field 2) may hold spaces: the fields after it start past the last ')'.
    fields = stat_path.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_SECOND  # utime, stime


def process_cpu_s(pid: int) -> float:
    """All of the process's threads."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def main_thread_cpu_s(pid: int) -> float:
    """The thread that started the process (a server's event loop)."""
    return _stat_cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))
