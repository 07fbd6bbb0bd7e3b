"""Block-manager invariants under random operation sequences, and prefix reuse."""

from hypothesis import given, settings
from hypothesis import strategies as st

from server.engine.block_manager import NO_PREFIX, BlockManager, CachedPrefix
from server.engine.request import Request
from tests.engine_helpers import make_request

NUM_BLOCKS = 24
BLOCK_SIZE = 4

operation = st.one_of(
    st.tuples(st.just("allocate"), st.integers(1, 30), st.integers(0, 3)),
    st.tuples(st.just("append"), st.integers(0, 10), st.integers(1, 6)),
    st.tuples(st.just("share"), st.integers(0, 10), st.integers(0, 3)),
    st.tuples(st.just("free"), st.integers(0, 10), st.just(0)),
    # Room for b guesses, then a rollback that keeps a of them (speculative decoding).
    st.tuples(st.just("speculate"), st.integers(0, 10), st.integers(1, 9)),
)


def check_invariants(manager: BlockManager, live: list[Request]) -> None:
    owners: dict[int, int] = {}
    for request in live:
        held = manager.block_ids(request.request_id)
        assert len(set(held)) == len(held), "a request holds a block twice"
        for block_id in held:
            owners[block_id] = owners.get(block_id, 0) + 1
    for block_id in range(manager.num_blocks):
        assert manager.ref_counts[block_id] == owners.get(block_id, 0)
        assert (block_id in manager.free_blocks) == (owners.get(block_id, 0) == 0)
    for block_hash, block_id in manager.cached_blocks.items():
        assert manager.block_hash[block_id] == block_hash
    for block_hash in manager.block_hash:
        assert block_hash is None or block_hash in manager.cached_blocks, "a computed block the cache lost"


def compute(manager: BlockManager, request: Request, num_tokens: int, prefix: CachedPrefix = NO_PREFIX) -> bool:
    """What the scheduler does for a step of ``num_tokens`` new tokens, starting a new request from ``prefix``."""
    computed = request.num_computed_tokens or prefix.num_tokens
    if not manager.allocate_slots(request.request_id, computed + num_tokens, prefix):
        return False
    request.num_computed_tokens = computed + num_tokens
    manager.cache_full_blocks(request, request.num_computed_tokens)
    return True


def admit(manager: BlockManager, request: Request) -> bool:
    """Start a request from its cached prefix, computing the rest of its prompt; all or nothing."""
    prefix = manager.find_cached_prefix(request.prompt_token_ids)
    return compute(manager, request, request.num_tokens - prefix.num_tokens, prefix)


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=60))
def test_random_operations_never_hand_out_a_block_twice_and_free_everything(ops):
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
    live = []
    for index, (kind, a, b) in enumerate(ops):
        if kind == "allocate":
            # Few distinct prompt families, so that prefixes repeat and get shared.
            request = make_request(f"r{index}", prompt_len=a, first_token=100 * b)
            free_before = manager.num_free_blocks
            if admit(manager, request):
                live.append(request)
            else:
                assert manager.num_free_blocks == free_before and not manager.block_ids(request.request_id)
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
            prefix = manager.find_cached_prefix(child.prompt_token_ids)
            full_parent_blocks = parent.num_computed_tokens // BLOCK_SIZE
            assert len(prefix.block_ids) == min(full_parent_blocks, (len(child.prompt_token_ids) - 1) // BLOCK_SIZE)
            if admit(manager, child):
                live.append(child)
        elif kind == "free" and live:
            manager.free(live.pop(a % len(live)).request_id)
        elif kind == "speculate" and live:
            request = live[a % len(live)]
            kept = index % (b + 1)
            if manager.allocate_slots(request.request_id, request.num_computed_tokens + 1 + b):
                request.output_token_ids += [7] * kept
                request.num_computed_tokens += kept
                manager.trim(request.request_id, request.num_computed_tokens)
                manager.cache_full_blocks(request, request.num_computed_tokens)
                held = manager.block_ids(request.request_id)
                assert len(held) == -(-request.num_computed_tokens // BLOCK_SIZE)
        check_invariants(manager, live)
    for request in live:
        manager.free(request.request_id)
    check_invariants(manager, [])
    assert manager.num_free_blocks == NUM_BLOCKS


def test_a_repeated_prefix_reuses_the_cached_blocks():
    manager = BlockManager(16, BLOCK_SIZE)
    first = make_request("first", prompt_len=10)
    compute(manager, first, 10)
    first_blocks = list(manager.block_ids("first"))
    manager.free("first")
    second = make_request("second", prompt_len=10)
    prefix = manager.find_cached_prefix(second.prompt_token_ids)
    assert prefix.block_ids == tuple(first_blocks[:2]) and prefix.num_tokens == 8
    assert compute(manager, second, 2, prefix)
    assert manager.block_ids("second")[:2] == first_blocks[:2]
    assert all(manager.ref_counts[b] == 1 for b in prefix.block_ids)


def test_a_different_parent_changes_every_later_block_hash():
    manager = BlockManager(16, BLOCK_SIZE)
    first = make_request("first", prompt_len=12)
    compute(manager, first, 12)
    other = make_request("other", prompt_len=12)
    other.prompt_token_ids[0] = 999
    assert manager.find_cached_prefix(other.prompt_token_ids) == NO_PREFIX


def test_a_freed_block_keeps_its_hash_until_reused():
    manager = BlockManager(3, BLOCK_SIZE)
    first = make_request("first", prompt_len=9)
    compute(manager, first, 9)
    manager.free("first")
    again = make_request("again", prompt_len=9).prompt_token_ids
    assert len(manager.find_cached_prefix(again).block_ids) == 2
    hog = make_request("hog", prompt_len=12, first_token=5000)
    assert compute(manager, hog, 12)
    assert manager.find_cached_prefix(again) == NO_PREFIX


def test_a_failed_allocation_claims_no_cached_block():
    manager = BlockManager(4, BLOCK_SIZE)
    first = make_request("first", prompt_len=9)
    compute(manager, first, 9)
    manager.free("first")
    long = make_request("long", prompt_len=30)
    prefix = manager.find_cached_prefix(long.prompt_token_ids)
    assert prefix.num_tokens == 8
    assert not compute(manager, long, 22, prefix)
    assert manager.num_free_blocks == 4 and all(count == 0 for count in manager.ref_counts)
    assert manager.find_cached_prefix(long.prompt_token_ids) == prefix


def test_a_block_with_the_same_hash_but_other_tokens_is_never_served(monkeypatch):
    from server.engine import block_manager

    # Every block collides: only the token comparison stands between a victim and an attacker's KV.
    monkeypatch.setattr(block_manager, "hash_block", lambda parent, tokens, salt="": b"collision")
    manager = BlockManager(16, BLOCK_SIZE)
    attacker = make_request("attacker", prompt_len=9, first_token=100)
    compute(manager, attacker, 9)
    victim = make_request("victim", prompt_len=9, first_token=700)
    assert manager.find_cached_prefix(victim.prompt_token_ids) == NO_PREFIX
    assert manager.find_cached_prefix(attacker.prompt_token_ids).num_tokens == 4


def test_salted_chains_never_meet():
    manager = BlockManager(16, BLOCK_SIZE)
    first = make_request("first", prompt_len=9)
    first.cache_salt = "tenant-a"
    compute(manager, first, 9)
    same_tokens = make_request("other", prompt_len=9).prompt_token_ids
    assert manager.find_cached_prefix(same_tokens, salt="tenant-b") == NO_PREFIX
    assert manager.find_cached_prefix(same_tokens, salt="tenant-a").num_tokens == 8


def test_a_copy_computed_twice_is_found_after_the_first_copy_is_evicted():
    # Two identical prompts scheduled in one step both compute their blocks before either is cached.
    manager = BlockManager(6, BLOCK_SIZE)
    first, second = make_request("first", prompt_len=9), make_request("second", prompt_len=9)
    assert manager.allocate_slots("first", 9) and manager.allocate_slots("second", 9)
    for request in (first, second):
        request.num_computed_tokens = 9
        manager.cache_full_blocks(request, 9)
    manager.free("first")
    hog = make_request("hog", prompt_len=12, first_token=5000)
    assert compute(manager, hog, 12)
    prefix = manager.find_cached_prefix(make_request("again", prompt_len=9).prompt_token_ids)
    assert prefix.block_ids == tuple(manager.block_ids("second")[:2])
    manager.free("second")
    manager.free("hog")
    assert manager.num_free_blocks == 6 and all(count == 0 for count in manager.ref_counts)
