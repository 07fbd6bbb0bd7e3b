"""``python -m server generate "prompt"``: one-shot offline generation, streamed to the terminal."""

import argparse
import sys

from server.engine_args import add_engine_args, engine_config_from_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="generate text offline, without a server")
    parser.add_argument("prompt", nargs="+", help="one or more prompts")
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=None)
    add_engine_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from server.engine.builder import build_engine
    from server.engine.request import SamplingParams

    engine = build_engine(engine_config_from_args(args))
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed, max_tokens=args.max_tokens
    )
    for index, prompt in enumerate(args.prompt):
        text = prompt
        if args.chat:
            text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        token_ids = engine.tokenizer.encode(text, add_special_tokens=not args.chat)
        engine.add_request(engine.make_request(f"cli-{index}", token_ids, params))
        print(f"\n>>> {prompt}\n", flush=True)
        while engine.has_unfinished_requests():
            for output in engine.step():
                sys.stdout.write(output.outputs[0].delta_text)
                sys.stdout.flush()
        print()
    return 0
