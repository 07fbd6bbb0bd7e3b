"""The perplexity of an engine's model on a fixed text, to weigh what quantisation costs in quality.

The text (server/bench/texts/perplexity.txt) is public domain: the opening of the US Declaration of Independence
and the Gettysburg Address. It runs through the engine's own model, kernels and KV cache in one prefill.
"""

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.backend import AttentionBatch
from server.engine.engine import LLMEngine

TEXT_PATH = Path(__file__).parent / "texts" / "perplexity.txt"
LOGITS_ROWS = 256  # output-layer rows at a time: 256 x 49152 fp32 logits is 50 MB


def perplexity(engine: LLMEngine, token_ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of every token after the first. The engine must be idle: the
    text's K/V is written into its pool's first blocks."""
    if engine.has_unfinished_requests():
        raise RuntimeError("perplexity needs an idle engine")
    runner = engine.runner
    block_size = runner.block_size
    count = len(token_ids)
    if count > engine.max_model_len:  # positions past the model's rotary table would read garbage
        raise ValueError(f"a {count}-token text is longer than the model's {engine.max_model_len} tokens")
    blocks = list(range(-(-count // block_size)))
    if len(blocks) > runner.kv_caches[0][0].shape[0]:
        raise ValueError(f"a {count}-token text does not fit the KV pool")
    batch = AttentionBatch(
        slot_mapping=list(range(count)),
        decode_block_tables=[],
        decode_seq_lens=[],
        prefill_block_tables=[blocks],
        prefill_query_starts=[0, count],
        prefill_seq_lens=[count],
    )
    model = runner.model
    device = runner.device
    with torch.inference_mode():
        hidden = model.forward(
            torch.tensor(token_ids, device=device), torch.arange(count, device=device), runner.kv_caches,
            model.attention.prepare(batch),
        )
        targets = torch.tensor(token_ids[1:], device=device)
        total = 0.0
        for first in range(0, count - 1, LOGITS_ROWS):
            logits = model.compute_logits(hidden[first : min(first + LOGITS_ROWS, count - 1)]).float()
            total += float(F.cross_entropy(logits, targets[first : first + logits.shape[0]], reduction="sum"))
    return math.exp(total / (count - 1))


def text_perplexity(engine: LLMEngine) -> float:
    return perplexity(engine, engine.tokenizer.encode(TEXT_PATH.read_text()))
