"""The grammar-checking worker process: ``python -m server.api.grammar_worker``.

It compiles each grammar it is sent exactly as the server will, under a memory limit and on a thread with a
small stack, and answers with the compile error or none. A grammar that overflows a native compiler's stack or
memory takes down this process, never the server (see ``grammar_process.py``). One JSON object per line: first
``{"tokenizer", "n_vocab", "eos", "memory_bytes", "stack_bytes"}`` (answered ``{"ready": true}``), then
``{"kind", "source"}`` (answered ``{"error": str | null}``) until stdin closes.
"""

import json
import os
import resource
import sys
import threading
from typing import BinaryIO

import llguidance

from server.api.llguidance_grammar import compile_matcher


def _limit_memory(extra_bytes: int) -> None:
    """Allow the address space this process has now plus ``extra_bytes``."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra_bytes, resource.RLIM_INFINITY))


def _check(tokenizer: llguidance.LLTokenizer, kind: str, source: str) -> str | None:
    compiled = compile_matcher(tokenizer, kind, source)
    return compiled if isinstance(compiled, str) else None


def _check_on_small_stack(tokenizer: llguidance.LLTokenizer, kind: str, source: str, stack_bytes: int) -> str | None:
    answer: list[str | None] = []
    threading.stack_size(stack_bytes)
    thread = threading.Thread(target=lambda: answer.append(_check(tokenizer, kind, source)))
    thread.start()
    thread.join()
    if not answer:
        raise MemoryError("the compile thread ended without an answer")
    return answer[0]


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    def answer(message: dict) -> None:
        answers.write(json.dumps(message).encode() + b"\n")
        answers.flush()

    setup = json.loads(requests.readline())
    tokenizer = llguidance.LLTokenizer(setup["tokenizer"], n_vocab=setup["n_vocab"], eos_token=setup["eos"])
    _limit_memory(setup["memory_bytes"])
    answer({"ready": True})
    for line in requests:
        request = json.loads(line)
        answer({"error": _check_on_small_stack(tokenizer, request["kind"], request["source"], setup["stack_bytes"])})


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not corrupt the answers
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
