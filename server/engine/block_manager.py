"""Paged KV blocks: allocation, reference counts and prefix caching by chained block hashes."""

from collections import OrderedDict
from collections.abc import Sequence

from server.engine.request import Request


def hash_block(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """A full block's identity: its own tokens chained to everything before it."""
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:
    """Hands out KV blocks to requests.

    A freed block keeps its hash (and so its cached KV) until it is handed out again. Free blocks are
    evicted oldest first; blocks without a hash go to the front of that line, as they hold nothing reusable.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached_blocks: dict[int, int] = {}
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def find_cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Block ids and hashes of the longest cached run of full blocks at the start of ``token_ids``.

        The last token is never served from cache, so that the request still computes its next logits.
        """
        if not self.enable_prefix_caching:
            return [], []
        block_ids: list[int] = []
        hashes: list[int] = []
        parent: int | None = None
        for start in range(0, len(token_ids) - 1 - self.block_size + 1, self.block_size):
            block_hash = hash_block(parent, token_ids[start : start + self.block_size])
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
            hashes.append(block_hash)
            parent = block_hash
        return block_ids, hashes

    def allocate_prefix(self, request: Request, block_ids: list[int], hashes: list[int]) -> None:
        """Give a waiting request the cached blocks found for it."""
        for block_id in block_ids:
            if self.ref_counts[block_id] == 0:
                del self.free_blocks[block_id]
            self.ref_counts[block_id] += 1
        request.block_ids = list(block_ids)
        request.block_hashes = list(hashes)
        request.num_computed_tokens = len(block_ids) * self.block_size
        request.num_cached_tokens = request.num_computed_tokens

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        total = request.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(request.block_ids))

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more tokens; False, changing nothing, if blocks are short."""
        needed = self.num_blocks_needed(request, num_new_tokens)
        if needed > len(self.free_blocks):
            return False
        for _ in range(needed):
            request.block_ids.append(self._take_free_block())
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Publish the hashes of the request's blocks that are now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        for index in range(len(request.block_hashes), num_full):
            parent = request.block_hashes[-1] if request.block_hashes else None
            start = index * self.block_size
            tokens = [request.token_at(p) for p in range(start, start + self.block_size)]
            block_hash = hash_block(parent, tokens)
            request.block_hashes.append(block_hash)
            block_id = request.block_ids[index]
            if block_hash not in self.cached_blocks and self.block_hash[block_id] is None:
                self.cached_blocks[block_hash] = block_id
                self.block_hash[block_id] = block_hash

    def free(self, request: Request) -> None:
        """Drop the request's claim on its blocks, tail first so that shared prefixes are evicted last."""
        for block_id in reversed(request.block_ids):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_blocks[block_id] = None
                if self.block_hash[block_id] is None:
                    self.free_blocks.move_to_end(block_id, last=False)
        request.block_ids = []
        request.block_hashes = []

    def _take_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        stale_hash = self.block_hash[block_id]
        if stale_hash is not None:
            del self.cached_blocks[stale_hash]
            self.block_hash[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id
