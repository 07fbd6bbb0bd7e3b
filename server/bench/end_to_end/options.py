"""The flags of ``bench e2e``; kept apart from the code that runs it so that building the CLI stays light."""

import argparse
import shlex
from pathlib import Path

from server.argument_types import positive_int
from server.bench.end_to_end.cells import KEYS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    table = parser.add_argument_group("table")
    table.add_argument("--cells", type=cell_keys, default=list(KEYS), metavar="KEYS",
                       help=f"comma-separated, of: {', '.join(KEYS)} (default: all)")
    table.add_argument("--concurrency", type=positive_ints, default=[1, 8], metavar="C,...",
                       help="requests in flight; every cell runs at each (default: 1,8)")
    table.add_argument("--num-prompts", type=positive_int, metavar="N",
                       help="requests a round (default: 4 a stream, at least 8)")
    table.add_argument("--rounds", type=positive_int, default=2, help="A and B alternated this many times")
    table.add_argument("--input-len", type=positive_int, default=128, help="tokens of each random prompt")
    table.add_argument("--output-len", type=positive_int, default=128, help="output tokens (ignore_eos)")
    table.add_argument("--seed", type=int, default=0)
    vigil = parser.add_argument_group("Vigil's servers")
    vigil.add_argument("--max-num-seqs", type=positive_int, default=8,
                       help="of every Vigil server; llama-server gets as many slots")
    vigil.add_argument("--speculative-config", metavar="JSON",
                       help="the speculation arm's (default: n-gram speculation's defaults)")
    vigil.add_argument("--vigil-args", type=shlex.split, default=[], metavar="FLAGS",
                       help="more serve flags for every Vigil server, in one argument: --vigil-args='--dtype float32'")
    peer = parser.add_argument_group("llama.cpp's llama-server (docs/performance.md has the build recipe)")
    peer.add_argument("--llama-server", type=existing_file, metavar="PATH",
                      help="the binary; without it the llama-server cells are left out")
    peer.add_argument("--q4-gguf", type=existing_file, metavar="PATH",
                      help="its Q4_1 model (default: the bundled SmolLM2's own GGUF)")
    peer.add_argument("--bf16-gguf", type=existing_file, metavar="PATH",
                      help="its BF16 model, made by llama-quantize from the same weights")
    peer.add_argument("--llama-args", type=shlex.split, default=[], metavar="FLAGS",
                      help="more llama-server flags, in one argument: --llama-args=--no-repack")
    out = parser.add_argument_group("results")
    out.add_argument("--result-json", type=Path,
                     help="default: bench-results/e2e-<time>.json; the servers' logs go beside it")


def cell_keys(text: str) -> list[str]:
    keys = [key.strip() for key in text.split(",") if key.strip()]
    unknown = [key for key in keys if key not in KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"unknown cell {', '.join(unknown) or repr(text)}; known: {', '.join(KEYS)}")
    return keys


def positive_ints(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",")]


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path
