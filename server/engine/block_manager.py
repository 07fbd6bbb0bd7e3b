"""Paged KV blocks: allocation, reference counts and prefix caching by chained block hashes.

The block manager alone knows which blocks a request holds. The scheduler asks it for a request's cached prefix
and for room, and reads block ids back; it never sees the pool's bookkeeping, and the block manager never writes
a request's fields.
"""

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from server.engine.request import Request

BlockHash = bytes


def hash_block(parent_hash: BlockHash | None, token_ids: Sequence[int], salt: str = "") -> BlockHash:
    """A full block's identity: SHA-256 of its own tokens chained to everything before it. The first block of a
    chain carries the salt, so that chains with different salts never meet (vLLM's ``cache_salt``)."""
    digest = hashlib.sha256(b"\x01" + parent_hash if parent_hash is not None else b"\x00" + salt.encode())
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


@dataclass(frozen=True)
class CachedPrefix:
    """The longest run of full blocks at the start of a prompt that the cache already holds."""

    block_ids: tuple[int, ...] = ()
    hashes: tuple[BlockHash, ...] = ()
    num_tokens: int = 0


NO_PREFIX = CachedPrefix()


class BlockManager:
    """Hands out KV blocks to requests, by request id.

    A freed block keeps its hash (and so its cached KV) until it is handed out again. Free blocks are
    evicted oldest first; blocks without a hash go to the front of that line, as they hold nothing reusable.
    A cache hit needs the hash and the block's own tokens to match: a hash alone is never trusted.
    Two requests scheduled in one step can compute the same block twice; the second copy is kept as a spare, so
    that the cache still finds those tokens when the first copy is evicted.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.cached_blocks: dict[BlockHash, int] = {}
        self._spare_copies: dict[BlockHash, list[int]] = {}
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._held: dict[str, list[int]] = {}
        self._held_hashes: dict[str, list[BlockHash]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def block_ids(self, request_id: str) -> list[int]:
        """The blocks ``request_id`` holds, in token order (read them; do not change them)."""
        return self._held.get(request_id, [])

    def find_cached_prefix(self, token_ids: Sequence[int], salt: str = "") -> CachedPrefix:
        """Look up, without claiming anything. The last token is never served from cache, so that the request
        still computes its next logits."""
        if not self.enable_prefix_caching:
            return NO_PREFIX
        block_ids: list[int] = []
        hashes: list[BlockHash] = []
        parent: BlockHash | None = None
        for start in range(0, len(token_ids) - self.block_size, self.block_size):
            tokens = tuple(token_ids[start : start + self.block_size])
            block_hash = hash_block(parent, tokens, salt)
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None or self.block_tokens[block_id] != tokens:
                break
            block_ids.append(block_id)
            hashes.append(block_hash)
            parent = block_hash
        return CachedPrefix(tuple(block_ids), tuple(hashes), len(block_ids) * self.block_size)

    def allocate_slots(self, request_id: str, num_tokens: int, prefix: CachedPrefix = NO_PREFIX) -> bool:
        """Let ``request_id`` hold room for ``num_tokens`` tokens in all, starting a request that holds nothing
        yet from ``prefix``. All or nothing: False, changing nothing, when the free blocks are too few."""
        held = self._held.get(request_id)
        claimed = prefix.block_ids if held is None else ()
        needed = max(0, -(-num_tokens // self.block_size) - (len(claimed) if held is None else len(held)))
        reclaimed = sum(1 for block_id in claimed if self.ref_counts[block_id] == 0)
        if needed + reclaimed > len(self.free_blocks):
            return False
        if held is None:
            for block_id in claimed:
                if self.ref_counts[block_id] == 0:
                    del self.free_blocks[block_id]
                self.ref_counts[block_id] += 1
            held = self._held[request_id] = list(claimed)
            self._held_hashes[request_id] = list(prefix.hashes)
        for _ in range(needed):
            held.append(self._take_free_block())
        return True

    def cache_full_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publish the hashes of the request's blocks that ``num_computed_tokens`` have filled."""
        if not self.enable_prefix_caching:
            return
        held, hashes = self._held[request.request_id], self._held_hashes[request.request_id]
        num_full = min(num_computed_tokens, request.num_tokens) // self.block_size
        for index in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else None
            start = index * self.block_size
            tokens = tuple(request.token_at(p) for p in range(start, start + self.block_size))
            block_hash = hash_block(parent, tokens, request.cache_salt)
            hashes.append(block_hash)
            block_id = held[index]
            if self.block_hash[block_id] is not None:
                continue
            if block_hash in self.cached_blocks:
                self._spare_copies.setdefault(block_hash, []).append(block_id)
            else:
                self.cached_blocks[block_hash] = block_id
            self.block_hash[block_id] = block_hash
            self.block_tokens[block_id] = tokens

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Keep only the blocks that ``num_tokens`` tokens fill: the rollback of speculative tokens the target
        rejected. The blocks dropped hold no published hash (only computed tokens' blocks are hashed)."""
        held = self._held.get(request_id, [])
        keep = -(-num_tokens // self.block_size)
        for block_id in reversed(held[keep:]):
            self._release(block_id)
        del held[keep:]

    def free(self, request_id: str) -> None:
        """Drop the request's claim on its blocks, tail first so that shared prefixes are evicted last."""
        self._held_hashes.pop(request_id, None)
        for block_id in reversed(self._held.pop(request_id, [])):
            self._release(block_id)

    def _release(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self.free_blocks[block_id] = None
            if self.block_hash[block_id] is None:
                self.free_blocks.move_to_end(block_id, last=False)

    def _take_free_block(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)
        stale_hash = self.block_hash[block_id]
        if stale_hash is not None:
            self._forget(stale_hash, block_id)
            self.block_hash[block_id] = None
            self.block_tokens[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def _forget(self, block_hash: BlockHash, block_id: int) -> None:
        """Drop one copy of a cached block; a spare copy, if any, takes over the hash."""
        spares = self._spare_copies.get(block_hash, [])
        if self.cached_blocks[block_hash] == block_id:
            if spares:
                self.cached_blocks[block_hash] = spares.pop()
            else:
                del self.cached_blocks[block_hash]
        else:
            spares.remove(block_id)
        if not spares:
            self._spare_copies.pop(block_hash, None)
