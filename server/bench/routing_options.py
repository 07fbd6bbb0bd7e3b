"""``bench routing``'s flags (server/bench/routing.py), kept apart so that the command line loads no engine."""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--small", default=None, help="the small model (default: the bundled SmolLM2-135M)")
    parser.add_argument("--large", default=None, help="the large model (default: Gemma 3 270M, if installed)")
    parser.add_argument("--num-prompts", type=int, default=60)
    parser.add_argument("--hard-share", type=float, default=0.25, help="share of the workload that is hard")
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-args", default="", help="more serve flags, e.g. '--dtype float32'")
