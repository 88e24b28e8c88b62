"""How much of a trace's prompts an unbounded prefix cache would serve (issue 15)."""
from __future__ import annotations

import numpy as np

from simulator.trace import Trace


def unbounded_prefix_hits(trace: Trace) -> np.ndarray | None:
    """Per request (in trace order, i.e. arrival order), the prompt tokens an unbounded cache hits.

    Requests are taken in arrival order and every block id they carry is remembered forever. A
    request hits the longest run of its leading ids already seen (a chain: it stops at the first
    unseen id), times prefix_block_tokens, capped at its prompt length minus one: the last prompt
    token is always computed, as vLLM does. int64; None when the trace carries no ids.
    """
    if trace.prefix_hash_ids is None:
        return None
    seen: set[int] = set()
    hits = np.zeros(len(trace), dtype=np.int64)
    for i, ids in enumerate(trace.prefix_hash_ids):
        num_hit_blocks = 0
        for block_id in ids:
            if block_id not in seen:
                break
            num_hit_blocks += 1
        hits[i] = num_hit_blocks * trace.prefix_block_tokens
        seen.update(ids)
    return np.minimum(hits, trace.num_prompt_tokens - 1)
