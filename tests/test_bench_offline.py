"""``bench offline`` times the prefix cache's block hashing apart from the engine's run: over exactly the blocks
the run's requests filled, the same hashes the block manager published."""

from server.bench.offline import random_prompts, run_engine, time_block_hashing
from server.config import EngineConfig
from server.engine.block_manager import hash_block
from server.engine.builder import build_engine


def test_the_blocks_hashed_are_the_blocks_the_engine_published(tiny_folder):
    engine = build_engine(EngineConfig(model=str(tiny_folder), dtype="float32", kv_cache_memory=16 * 2**20))
    block_size = engine.cache_info.block_size
    # 40 + 9 tokens, of which 48 are stored (the last is sampled, never stored): three full blocks each;
    # 33 + 15 tokens: 47 stored, two full blocks.
    prompts = random_prompts(2, 40, engine.vocab_size, seed=5) + random_prompts(1, 33, engine.vocab_size, seed=6)
    _, short = run_engine(engine, prompts[:2], 9)
    _, long = run_engine(engine, prompts[2:], 15)

    hashing = time_block_hashing(short + long, block_size)

    published = set(engine.scheduler.block_manager.cached_blocks)
    assert hashing.calls == len(published) == 8 and hashing.seconds > 0
    for tokens, num_blocks in zip(short + long, (3, 3, 2), strict=True):
        parent = None
        for start in range(0, num_blocks * block_size, block_size):
            parent = hash_block(parent, tokens[start : start + block_size])
            assert parent in published
