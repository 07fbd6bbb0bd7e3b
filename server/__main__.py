"""``python -m server serve|generate|bench`` (also installed as ``vigil``)."""

import argparse
import logging
import sys

from server import bench_cli, generate_cli, serve_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vigil", description="Vigil: an observability-first LLM server")
    subparsers = parser.add_subparsers(dest="command", required=True)
    serve_cli.add_parser(subparsers)
    generate_cli.add_parser(subparsers)
    bench_cli.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
