"""Automatic prefix caching: KV blocks with ids, reference counts and content keys.

The policy is vLLM's (v1 KVCacheManager), in the simulator and the engine alike:
- a full block is identified by a key standing for its tokens and every token before them; a
  request's keys come from its trace's prefix_hash_ids (prefix_keys.block_keys), or from its tokens;
- a new request reuses the longest chain of its leading keys that is cached, at most up to its
  last known token minus one (that one is always computed, for its logits);
- a block is reference-counted; a freed block keeps its key and stays cached; it is evicted, least
  recently freed first, only when no block without a key is free (the pool needs it);
- blocks are keyed when the scheduler allocates for the tokens that fill them, so a request
  scheduled later in the same step may already reuse them, as in vLLM;
- a request's blocks are freed tail first, so a chain's end is evicted before its start.
A request's blocks past its prompt (its answer) have keys only when the trace says what they hold:
in a multi-turn session, the next turn's prompt goes on with this turn's answer, so its ids name
those blocks too (`key_answers`), and the next turn reuses the answer as vLLM would.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from stepcal.core.trace import continued_turns
from stepcal.simulator.kv_cache import BlockManager, blocks_for
from stepcal.simulator.request import Request, Status


@dataclass(slots=True)
class Hit:
    """The cached prefix a request would reuse on admission: its blocks, and how many of them are
    free (held by nobody, so taking them uses up free blocks)."""
    block_ids: np.ndarray
    num_free: int


class PrefixCachingBlockManager(BlockManager):
    """A BlockManager whose blocks have ids (0..num_blocks-1), reference counts and keys.

    Counts (`num_free_blocks`, `request.num_blocks`) keep their meaning, so the schedulers do not
    change; `lookup` and the `hit` argument of `allocate` add the reuse. With no keys on any
    request it allocates exactly as the counting BlockManager does.

    Written for speed (the Mooncake trace moves ~10M blocks): per-block state is in numpy arrays
    and changes a request's blocks at once; the LRU order is a queue of freed chunks, where an
    entry is stale once its block was taken again (its stamp changed or it is referenced).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.num_blocks
        # keyless free blocks, a stack: the top (free_stack[num_keyless_free - 1]) is taken first, block 0 at the start
        self.free_stack = np.arange(n - 1, -1, -1, dtype=np.int64)
        self.num_keyless_free = n
        self.ref_count = np.zeros(n, dtype=np.int32)
        self.key_of = np.full(n, -1, dtype=np.int64)        # the key of a cached block, else -1
        self.stamp = np.zeros(n, dtype=np.int64)            # when the block last became evictable
        self.block_of_key = np.full(1024, -1, dtype=np.int64)   # key -> cached block id, else -1 (grows)
        self.lru: deque[tuple[np.ndarray, np.ndarray]] = deque()   # (blocks, their stamps), oldest first
        self.num_lru_entries = 0
        self.lru_pos = 0              # entries of the head chunk before it are used up
        self.num_evictable = 0        # cached blocks nobody holds
        self._clock = 0
        self.num_evictions = 0
        self.num_hit_tokens = 0       # tokens reused at admissions (re-admissions after preemption too)

    # -- reuse --------------------------------------------------------------------------------------
    def lookup(self, request: Request) -> Hit | None:
        """The cached chain a waiting request would reuse, without taking it; None if none."""
        keys = request.prefix_keys
        if keys is None or request.num_computed_tokens or request.num_blocks:
            return None
        limit = min(len(keys), (request.num_known_tokens - 1) // self.block_size)
        wanted = keys[:limit]
        known = len(self.block_of_key)
        blocks = self.block_of_key[np.minimum(wanted, known - 1)]
        blocks[wanted >= known] = -1
        missing = blocks < 0
        num_hit = int(np.argmax(missing)) if missing.any() else limit
        if num_hit == 0:
            return None
        blocks = blocks[:num_hit]
        return Hit(blocks, int(np.count_nonzero(self.ref_count[blocks] == 0)))

    def admission_blocks(self, request: Request, max_new_tokens: int) -> int:
        hit = self.lookup(request)
        if hit is None:
            return super().admission_blocks(request, max_new_tokens)
        num_cached = len(hit.block_ids) * self.block_size
        n = min(request.num_pending_tokens - num_cached, max_new_tokens)
        return blocks_for(num_cached + n, self.block_size) - len(hit.block_ids) + hit.num_free

    # -- allocation ---------------------------------------------------------------------------------
    def allocate(self, request: Request, num_new_tokens: int, hit: Hit | None = None) -> bool:
        """Reserve room for num_new_tokens more tokens (after the `hit` blocks, which it takes);
        False, and no change, if they do not fit."""
        if hit is not None:
            num_hit = len(hit.block_ids)
            need = blocks_for(num_hit * self.block_size + num_new_tokens, self.block_size) - num_hit
            if need + hit.num_free > self.num_free_blocks:
                return False
            self._take_hit(request, hit)
        else:
            need = self.blocks_needed(request, num_new_tokens)
            if need > self.num_free_blocks:
                return False
        if need > 0:
            self._grow(request, need)
        if request.prefix_keys is not None:
            self._register(request, request.num_computed_tokens + num_new_tokens)
        return True

    def grow_to(self, request: Request, num_tokens: int) -> None:
        need = blocks_for(num_tokens, self.block_size) - request.num_blocks
        if need > 0:
            assert need <= self.num_free_blocks, "decode run outgrew the KV cache"
            self._grow(request, need)
        if request.prefix_keys is not None:
            self._register(request, num_tokens)

    def grow_all(self, requests: list[Request], num_tokens: list[int]) -> None:
        """grow_to for each request in order, with one take from the free blocks for them all: the
        blocks each gets are those it would get one request after the other."""
        needs = [blocks_for(n, self.block_size) - r.num_blocks for r, n in zip(requests, num_tokens)]
        total = sum(need for need in needs if need > 0)
        assert total <= self.num_free_blocks, "decode run outgrew the KV cache"
        new = self._take(total) if total else None
        start = 0
        for request, need, n in zip(requests, needs, num_tokens):
            if need > 0:
                self._give(request, new[start:start + need])
                start += need
            if request.prefix_keys is not None:
                self._register(request, n)

    def free(self, request: Request) -> None:
        """Drop the request's references, tail first; its keyed blocks stay cached (evictable). Blocks
        its computed tokens filled since the last allocation are keyed first."""
        if request.prefix_keys is not None and request.block_ids is not None:
            self._register(request, request.num_computed_tokens)
        if request.block_ids is not None and len(request.block_ids):
            blocks = request.block_ids[::-1]
            self.ref_count[blocks] -= 1
            released = blocks[self.ref_count[blocks] == 0]
            keyed = self.key_of[released] >= 0
            self._push_keyless(released[~keyed])
            self._make_evictable(released[keyed])
            self.num_free_blocks += len(released)
        request.block_ids = None
        request.num_blocks = 0
        request.num_registered_blocks = 0
        if request.status is Status.FINISHED or request.status is Status.ABORTED:
            request.prefix_keys = None   # never looked up again

    # -- mechanics ----------------------------------------------------------------------------------
    def _take_hit(self, request: Request, hit: Hit) -> None:
        blocks = hit.block_ids
        self.num_evictable -= hit.num_free     # their LRU entries go stale: referenced again
        self.num_free_blocks -= hit.num_free
        self.ref_count[blocks] += 1
        num_tokens = len(blocks) * self.block_size
        request.block_ids = blocks.copy()
        request.num_blocks = request.num_registered_blocks = len(blocks)
        request.num_computed_tokens = num_tokens
        if request.status is Status.WAITING:
            request.num_cached_tokens = num_tokens
        self.num_hit_tokens += num_tokens

    def _grow(self, request: Request, need: int) -> None:
        """Give the request `need` more blocks: keyless free ones first, then the least recently freed
        cached ones, whose keys go."""
        self._give(request, self._take(need))

    def _take(self, count: int) -> np.ndarray:
        """`count` blocks, referenced once: keyless free ones first, then evicted cached ones."""
        top = self.num_keyless_free
        take = min(count, top)
        new = self.free_stack[top - take:top][::-1].copy()   # a copy: later frees overwrite the stack
        self.num_keyless_free = top - take
        if count > take:
            new = np.concatenate((new, self._evict(count - take)))
        self.ref_count[new] = 1
        self.num_free_blocks -= count
        return new

    def _give(self, request: Request, blocks: np.ndarray) -> None:
        request.block_ids = blocks if request.block_ids is None else np.concatenate((request.block_ids, blocks))
        request.num_blocks += len(blocks)

    def _push_keyless(self, blocks: np.ndarray) -> None:
        top = self.num_keyless_free
        self.free_stack[top:top + len(blocks)] = blocks
        self.num_keyless_free = top + len(blocks)

    def _make_evictable(self, blocks: np.ndarray) -> None:
        if not len(blocks):
            return
        stamps = np.arange(self._clock, self._clock + len(blocks), dtype=np.int64)
        self._clock += len(blocks)
        self.stamp[blocks] = stamps
        self.lru.append((blocks, stamps))
        self.num_lru_entries += len(blocks)
        self.num_evictable += len(blocks)
        if self.num_lru_entries > 4 * self.num_blocks:
            self._compact()

    def _evict(self, count: int) -> np.ndarray:
        """The `count` least recently freed cached blocks, keys dropped."""
        parts, found = [], 0
        while found < count:
            blocks, stamps = self.lru[0]
            part = self._live_head(blocks, stamps, count - found)
            parts.append(part)
            found += len(part)
        evicted = parts[0] if len(parts) == 1 else np.concatenate(parts)
        self.block_of_key[self.key_of[evicted]] = -1
        self.key_of[evicted] = -1
        self.stamp[evicted] = -1
        self.num_evictable -= count
        self.num_evictions += count
        return evicted

    def _live_head(self, blocks: np.ndarray, stamps: np.ndarray, count: int) -> np.ndarray:
        """Up to `count` live entries from the head chunk of the LRU queue, from the cursor on;
        the chunk leaves the queue once passed. A decode step evicts one block at a time: that case
        walks a few entries one by one instead of paying for a vector pass over the chunk."""
        pos, stamp, ref_count = self.lru_pos, self.stamp, self.ref_count
        if count <= 4:
            live = []
            window = 8
            while pos < len(blocks) and len(live) < count:
                for block, block_stamp in zip(blocks[pos:pos + window].tolist(), stamps[pos:pos + window].tolist()):
                    pos += 1
                    if stamp[block] == block_stamp and ref_count[block] == 0:
                        live.append(block)
                        if len(live) == count:
                            break
            live = np.array(live, dtype=np.int64)
        else:   # a window a little larger than needed: a chunk can hold a whole long prompt's blocks
            window = slice(pos, pos + 2 * count + 16)
            rest = np.flatnonzero((stamp[blocks[window]] == stamps[window]) & (ref_count[blocks[window]] == 0)) + pos
            if len(rest) > count:
                rest = rest[:count]
                pos = int(rest[-1]) + 1
            else:
                pos = min(len(blocks), window.stop)
            live = blocks[rest]
        self.num_lru_entries -= pos - self.lru_pos
        if pos == len(blocks):
            self.lru.popleft()
            pos = 0
        self.lru_pos = pos
        return live

    def _compact(self) -> None:
        """Drop stale LRU entries (blocks taken again since they were freed)."""
        if self.lru:   # the head chunk's used-up part first
            blocks, stamps = self.lru[0]
            self.lru[0] = (blocks[self.lru_pos:], stamps[self.lru_pos:])
            self.lru_pos = 0
        chunks = [(b[keep], s[keep]) for b, s in self.lru
                  for keep in [(self.stamp[b] == s) & (self.ref_count[b] == 0)] if keep.any()]
        self.lru = deque(chunks)
        self.num_lru_entries = sum(len(b) for b, _ in chunks)

    def _register(self, request: Request, num_tokens: int) -> None:
        """Key the request's blocks that num_tokens fill, unless an equal block is already cached
        (then this one stays private, as in vLLM)."""
        keys = request.prefix_keys
        end = min(num_tokens // self.block_size, len(keys))
        start = request.num_registered_blocks
        if end <= start:
            return
        new_keys = keys[start:end]
        largest = int(new_keys.max())
        if largest >= len(self.block_of_key):
            self._grow_key_space(largest + 1)
        blocks = request.block_ids[start:end]
        fresh = self.block_of_key[new_keys] < 0
        if not fresh.all():
            new_keys, blocks = new_keys[fresh], blocks[fresh]
        self.block_of_key[new_keys] = blocks
        self.key_of[blocks] = new_keys
        request.num_registered_blocks = end

    def _grow_key_space(self, size: int) -> None:
        grown = np.full(max(size, 2 * len(self.block_of_key)), -1, dtype=np.int64)
        grown[:len(self.block_of_key)] = self.block_of_key
        self.block_of_key = grown

    def check(self) -> None:
        """Invariants (for tests): counts conserved, no negative references, nothing in use evictable."""
        rc = self.ref_count
        assert rc.min() >= 0, "negative reference count"
        live = [b for i, (blocks, stamps) in enumerate(self.lru)
                for b, s in zip(blocks[self.lru_pos if i == 0 else 0:].tolist(),
                                stamps[self.lru_pos if i == 0 else 0:].tolist())
                if self.stamp[b] == s and rc[b] == 0]
        assert len(live) == len(set(live)) == self.num_evictable, "LRU entries drifted"
        free_ids = self.free_stack[:self.num_keyless_free].tolist()
        assert len(free_ids) + self.num_evictable == self.num_free_blocks, "free count drifted"
        assert int((rc > 0).sum()) + self.num_free_blocks == self.num_blocks, "blocks not conserved"
        assert all(self.key_of[b] >= 0 for b in live), "a keyless block is evictable"
        assert all(rc[b] == 0 and self.key_of[b] < 0 for b in free_ids), "a free block is in use or keyed"
        keyed = np.flatnonzero(self.block_of_key >= 0)
        assert (self.key_of[self.block_of_key[keyed]] == keyed).all(), "key map drifted"
        assert len(keyed) == int((self.key_of >= 0).sum()), "key map drifted"


def key_answers(trace, requests: list[Request], block_size: int) -> int:
    """Give each session turn's answer blocks the keys its next turn's prompt has for them.

    Turn k's KV holds its prompt and all but the last of its answer tokens; turn k+1's prompt is
    the same stream, longer. Where it continues turn k's (core.trace.continued_turns), turn k
    takes turn k+1's keys for every block full within its KV; that includes the blocks of turn k's
    partial last trace block, whose own id names tokens the next turn's block starts with. Returns
    the number of turns extended."""
    by_id = {r.request_id: r for r in requests}
    ids = trace.request_id.tolist()
    extended = 0
    for row, next_row in continued_turns(trace):
        turn, following = by_id.get(ids[row]), by_id.get(ids[next_row])
        if turn is None or following is None or turn.prefix_keys is None or following.prefix_keys is None:
            continue
        num_full = min(len(following.prefix_keys), turn.max_kv_tokens // block_size)
        if num_full > len(turn.prefix_keys):
            turn.prefix_keys = following.prefix_keys[:num_full].copy()
            extended += 1
    return extended


def make_block_manager(num_blocks: int, block_size: int, prefix_caching: bool) -> BlockManager:
    """The counting manager, or the one with block ids, reference counts and keys."""
    if prefix_caching:
        return PrefixCachingBlockManager(num_blocks, block_size)
    return BlockManager(num_blocks, block_size)
