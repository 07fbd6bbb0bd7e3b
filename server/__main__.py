"""``python -m server serve|generate|bench|top`` (also installed as ``vigil``)."""

import argparse
import logging
import os
import sys

from kernels.cpu_variants import chosen_variant
from server import bench_cli, generate_cli, serve_cli, top_cli
from server.allocator import run_again_with_jemalloc
from server.distributed.environment import launched_rank


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vigil", description="Vigil: an observability-first LLM server")
    subparsers = parser.add_subparsers(dest="command", required=True)
    serve_cli.add_parser(subparsers)
    generate_cli.add_parser(subparsers)
    bench_cli.add_parser(subparsers)
    top_cli.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``argv`` None: this process's command line, which first runs again with jemalloc (server/allocator.py)."""
    if argv is None:
        try:
            run_again_with_jemalloc()
        except ValueError as error:
            print(f"vigil: error: {error}", file=sys.stderr)
            return 2
    if (rank := launched_rank(os.environ)) is not None and rank > 0:
        # Under torchrun every rank runs this command line; rank 0 serves it, and the others are its workers.
        from server.distributed.worker import main as worker_main

        return worker_main()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        chosen_variant()  # a VIGIL_CPU_ISA this CPU cannot run is refused like a bad flag
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        # Flags that do not fit together, a KV cache too small, a model that is missing or unsupported: one
        # line, as argparse reports a bad flag, instead of a traceback. The traceback stays in the debug log.
        logging.getLogger("vigil").debug("%s failed", args.command, exc_info=True)
        parser.exit(2, f"vigil {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
