"""Block-manager invariants under random operation sequences, and prefix reuse."""

from hypothesis import given, settings
from hypothesis import strategies as st

from server.engine.block_manager import BlockManager
from tests.engine_helpers import make_request

NUM_BLOCKS = 24
BLOCK_SIZE = 4

operation = st.one_of(
    st.tuples(st.just("allocate"), st.integers(1, 30), st.integers(0, 3)),
    st.tuples(st.just("append"), st.integers(0, 10), st.integers(1, 6)),
    st.tuples(st.just("share"), st.integers(0, 10), st.integers(0, 3)),
    st.tuples(st.just("free"), st.integers(0, 10), st.just(0)),
)


def check_invariants(manager: BlockManager, live: list) -> None:
    owners: dict[int, int] = {}
    for request in live:
        assert len(set(request.block_ids)) == len(request.block_ids), "a request holds a block twice"
        for block_id in request.block_ids:
            owners[block_id] = owners.get(block_id, 0) + 1
    for block_id in range(manager.num_blocks):
        assert manager.ref_counts[block_id] == owners.get(block_id, 0)
        assert (block_id in manager.free_blocks) == (owners.get(block_id, 0) == 0)
    for block_hash, block_id in manager.cached_blocks.items():
        assert manager.block_hash[block_id] == block_hash


def compute(manager: BlockManager, request, num_tokens: int) -> bool:
    if not manager.allocate_slots(request, num_tokens):
        return False
    request.num_computed_tokens += num_tokens
    manager.cache_full_blocks(request)
    return True


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=60))
def test_random_operations_never_hand_out_a_block_twice_and_free_everything(ops):
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
    live = []
    for index, (kind, a, b) in enumerate(ops):
        if kind == "allocate":
            # Few distinct prompt families, so that prefixes repeat and get shared.
            request = make_request(f"r{index}", prompt_len=a, first_token=100 * b)
            blocks, hashes = manager.find_cached_prefix(request.prompt_token_ids)
            manager.allocate_prefix(request, blocks, hashes)
            if compute(manager, request, request.num_tokens - request.num_computed_tokens):
                live.append(request)
            else:
                manager.free(request)
        elif kind == "append" and live:
            request = live[a % len(live)]
            for step in range(b):
                request.output_token_ids.append(step)
                if not compute(manager, request, 1):
                    request.output_token_ids.pop()
                    break
        elif kind == "share" and live:
            parent = live[a % len(live)]
            child = make_request(f"c{index}", prompt_len=0)
            child.prompt_token_ids = list(parent.all_token_ids) + [b]
            blocks, hashes = manager.find_cached_prefix(child.prompt_token_ids)
            assert len(blocks) == min(len(parent.block_hashes), (len(child.prompt_token_ids) - 1) // BLOCK_SIZE)
            manager.allocate_prefix(child, blocks, hashes)
            if compute(manager, child, child.num_tokens - child.num_computed_tokens):
                live.append(child)
            else:
                manager.free(child)
        elif kind == "free" and live:
            manager.free(live.pop(a % len(live)))
        check_invariants(manager, live)
    for request in live:
        manager.free(request)
    check_invariants(manager, [])
    assert manager.num_free_blocks == NUM_BLOCKS


def test_a_repeated_prefix_reuses_the_cached_blocks():
    manager = BlockManager(16, BLOCK_SIZE)
    first = make_request("first", prompt_len=10)
    compute(manager, first, 10)
    manager.free(first)
    second = make_request("second", prompt_len=10)
    blocks, hashes = manager.find_cached_prefix(second.prompt_token_ids)
    assert blocks == first_blocks_of(manager, hashes) and len(blocks) == 2
    manager.allocate_prefix(second, blocks, hashes)
    assert second.num_computed_tokens == 8 and second.num_cached_tokens == 8
    assert all(manager.ref_counts[b] == 1 for b in blocks)


def test_a_different_parent_changes_every_later_block_hash():
    manager = BlockManager(16, BLOCK_SIZE)
    first = make_request("first", prompt_len=12)
    compute(manager, first, 12)
    other = make_request("other", prompt_len=12)
    other.prompt_token_ids[0] = 999
    assert manager.find_cached_prefix(other.prompt_token_ids) == ([], [])


def test_a_freed_block_keeps_its_hash_until_reused():
    manager = BlockManager(3, BLOCK_SIZE)
    first = make_request("first", prompt_len=9)
    compute(manager, first, 9)
    manager.free(first)
    again = make_request("again", prompt_len=9).prompt_token_ids
    assert len(manager.find_cached_prefix(again)[0]) == 2
    hog = make_request("hog", prompt_len=12, first_token=5000)
    assert compute(manager, hog, 12)
    assert manager.find_cached_prefix(again) == ([], [])


def first_blocks_of(manager: BlockManager, hashes: list[int]) -> list[int]:
    return [manager.cached_blocks[h] for h in hashes]
