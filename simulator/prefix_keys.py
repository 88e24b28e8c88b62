"""The keys of a request's full prompt blocks, from its trace's prefix hash ids: equal keys mean
equal tokens up to the block's end, whatever the trace's own block size."""
from __future__ import annotations

import numpy as np


def block_keys(dense_ids: np.ndarray, num_prompt_tokens: int, trace_block_tokens: int,
               block_size: int) -> np.ndarray:
    """Keys of a prompt's full KV blocks of `block_size` tokens, from its trace ids given as dense
    ints 0..U-1 (one per `trace_block_tokens` tokens, each standing for its tokens and all before).

    KV block k ends at token e = (k+1)·block_size. The prefix up to e is identified by the id of the
    trace block j holding token e-1 and by how far into it e is; KV blocks ending in the same trace
    block are (e - j·trace_block_tokens - 1) // block_size apart, so key = id · M + that, with
    M = ceil(trace_block_tokens / block_size): keys are dense, 0..U·M-1, and index arrays directly.
    Blocks past the ids, or not full within the prompt, get no key.
    """
    per_id = -(-trace_block_tokens // block_size)
    covered = min(num_prompt_tokens, len(dense_ids) * trace_block_tokens)
    ends = np.arange(1, covered // block_size + 1, dtype=np.int64) * block_size
    trace_block = (ends - 1) // trace_block_tokens
    within = (ends - trace_block * trace_block_tokens - 1) // block_size
    return dense_ids[trace_block] * per_id + within


def trace_prefix_keys(trace, block_size: int) -> list[np.ndarray] | None:
    """Per request of `trace` (in trace order), the keys of its full prompt blocks at `block_size`;
    None when the trace carries no prefix ids. Equal keys mean equal tokens up to the block's end,
    whatever the trace's own block size."""
    if trace.prefix_hash_ids is None:
        return None
    lengths = np.fromiter((len(ids) for ids in trace.prefix_hash_ids), np.int64, len(trace))
    flat = np.fromiter((i for ids in trace.prefix_hash_ids for i in ids), np.int64, int(lengths.sum()))
    _, dense = np.unique(flat, return_inverse=True)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    prompt = trace.num_prompt_tokens.tolist()
    return [block_keys(dense[starts[i]:starts[i + 1]], prompt[i], trace.prefix_block_tokens, block_size)
            for i in range(len(trace))]
