"""How much of a trace's prompts an unbounded prefix cache would serve (issue 15)."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from simulator.trace import Trace


def unbounded_prefix_hits(trace: Trace) -> np.ndarray | None:
    """Per request (in trace order, i.e. arrival order), the prompt tokens an unbounded cache hits.

    Requests are taken in arrival order and every block id they carry is remembered forever. A
    request hits the longest run of its leading ids already seen (a chain: it stops at the first
    unseen id), times prefix_block_tokens, capped at its prompt length minus one: the last prompt
    token is always computed, as vLLM does. int64; None when the trace carries no ids.
    """
    return _prefix_hits(trace, None)


def lru_prefix_hits(trace: Trace, cache_tokens: int) -> np.ndarray | None:
    """Per request, the prompt tokens an LRU cache of `cache_tokens` tokens would hit, requests taken
    one at a time in arrival order (no two in flight), in blocks of the trace's own size.

    A bound to hold a simulation against: with a KV cache of that size, a serving run hits about
    this much (more blocks are held while requests overlap, fewer while they wait). int64; None when
    the trace carries no ids.
    """
    return _prefix_hits(trace, max(0, cache_tokens // trace.prefix_block_tokens))


def _prefix_hits(trace: Trace, capacity_blocks: int | None) -> np.ndarray | None:
    """Requests one at a time in arrival order over a cache of block ids (LRU, or unbounded)."""
    if trace.prefix_hash_ids is None:
        return None
    cache: OrderedDict[int, None] = OrderedDict()
    hits = np.zeros(len(trace), dtype=np.int64)
    for i, ids in enumerate(trace.prefix_hash_ids):
        num_hit_blocks = 0
        for block_id in ids:
            if block_id not in cache:
                break
            num_hit_blocks += 1
        hits[i] = num_hit_blocks * trace.prefix_block_tokens
        for block_id in ids:
            cache[block_id] = None
            cache.move_to_end(block_id)
        while capacity_blocks is not None and len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return np.minimum(hits, trace.num_prompt_tokens - 1)
