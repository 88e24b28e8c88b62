"""How much of a trace's prompts an unbounded prefix cache would serve."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from stepcal.core.trace import Trace, continued_turns


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
    """Requests one at a time in arrival order over a cache of block ids (LRU, or unbounded). A
    session turn also leaves the blocks of its answer, named by its next turn's ids."""
    if trace.prefix_hash_ids is None:
        return None
    answers = _answer_ids(trace)
    cache: OrderedDict[int, None] = OrderedDict()
    hits = np.zeros(len(trace), dtype=np.int64)
    for i, ids in enumerate(trace.prefix_hash_ids):
        num_hit_blocks = 0
        for block_id in ids:
            if block_id not in cache:
                break
            num_hit_blocks += 1
        hits[i] = num_hit_blocks * trace.prefix_block_tokens
        for block_id in ids + answers.get(i, []):
            cache[block_id] = None
            cache.move_to_end(block_id)
        while capacity_blocks is not None and len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return np.minimum(hits, trace.num_prompt_tokens - 1)


def _answer_ids(trace: Trace) -> dict[int, list[int]]:
    """Per row of a session turn, the ids of the next turn's blocks that lie within this turn's KV
    (its prompt and all but the last answer token), where the next turn continues this one
    (core.trace.continued_turns, as simulator.prefix_cache.key_answers)."""
    block, out = trace.prefix_block_tokens, {}
    for row, next_row in continued_turns(trace):
        num_full = int(trace.num_prompt_tokens[row]) // block
        kv_blocks = int(trace.num_prompt_tokens[row] + trace.num_output_tokens[row] - 1) // block
        if kv_blocks > num_full:
            out[row] = trace.prefix_hash_ids[next_row][num_full:kv_blocks]
    return out
