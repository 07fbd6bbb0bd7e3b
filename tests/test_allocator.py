"""The process's allocator (server/allocator.py): ``python -m server`` runs itself again, in place, with jemalloc
preloaded where the system has it, says so in its plan, keeps glibc's malloc with VIGIL_MALLOC=system, and refuses
any other value in one line."""

import os
import subprocess
import sys

import pytest

from server.allocator import ALLOCATOR_ENV, jemalloc_library, preloaded_environment, process_allocator
from tests.ops_stack import ROOT

LIBRARY = "libjemalloc.so.2"
needs_jemalloc = pytest.mark.skipif(jemalloc_library() is None, reason="Debian's libjemalloc2 is not installed")


def test_jemalloc_goes_first_in_ld_preload_and_what_was_there_stays():
    assert preloaded_environment({"PATH": "/bin"}, "system", LIBRARY) == {"PATH": "/bin", "LD_PRELOAD": LIBRARY}
    again = preloaded_environment({"LD_PRELOAD": "libother.so"}, "system", LIBRARY)
    assert again == {"LD_PRELOAD": f"{LIBRARY}:libother.so"}


@pytest.mark.parametrize(
    ("environ", "allocator", "library"),
    [
        pytest.param({ALLOCATOR_ENV: "system"}, "system", LIBRARY, id="chosen-away"),
        pytest.param({}, "system", None, id="not-installed"),
        pytest.param({}, "tcmalloc", LIBRARY, id="another-preloaded"),
        pytest.param({"LD_PRELOAD": f"/usr/lib/x86_64-linux-gnu/{LIBRARY}"}, "system", LIBRARY,
                     id="preload-failed-once"),
    ],
)
def test_the_command_runs_as_it_is(environ, allocator, library):
    assert preloaded_environment(environ, allocator, library) is None


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="VIGIL_MALLOC='tcmalloc': choose one of jemalloc, system"):
        preloaded_environment({ALLOCATOR_ENV: "tcmalloc"}, "system", LIBRARY)


def test_the_allocator_is_read_from_the_mapped_libraries():
    mapped = "7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/{}\n"
    assert process_allocator(mapped.format("libjemalloc.so.2")) == "jemalloc"
    assert process_allocator(mapped.format("libtcmalloc_minimal.so.4")) == "tcmalloc"
    assert process_allocator(mapped.format("libc.so.6")) == "system"


def print_plan(**environ: str) -> subprocess.CompletedProcess:
    """``vigil serve --print-plan`` through a ``-c`` program that prints its process id first: run again in
    place, the process prints the same id twice."""
    program = "import os, sys; print(os.getpid(), flush=True); from server.__main__ import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", program, "serve", "--print-plan", "--kv-cache-memory", "32MiB"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **environ})  # fmt: skip


@pytest.mark.slow
@needs_jemalloc
def test_the_server_runs_itself_again_in_place_on_jemalloc():
    printed = print_plan()
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert lines[0] == lines[1] and lines[0].isdigit()
    assert lines[-1].endswith("memory allocator: jemalloc")
    kept = print_plan(**{ALLOCATOR_ENV: "system"})
    assert kept.returncode == 0, kept.stderr
    assert len([line for line in kept.stdout.splitlines() if line.isdigit()]) == 1
    assert kept.stdout.splitlines()[-1].endswith("memory allocator: system")


def test_a_bad_choice_stops_the_command_in_one_line():
    refused = print_plan(**{ALLOCATOR_ENV: "fast"})
    assert refused.returncode == 2
    assert refused.stderr.strip() == "vigil: error: VIGIL_MALLOC='fast': choose one of jemalloc, system"
