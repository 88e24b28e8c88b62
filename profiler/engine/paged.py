"""The engine's paged KV cache: one pool of fixed-size blocks per engine, read through block tables.

The block manager (simulator.prefix_cache.PrefixCachingBlockManager) decides which blocks a
request holds: `request.block_ids`, in token order, so token t of a request sits in block
block_ids[t // block_size] at offset t % block_size. This module stores every new token's K/V
there and reads them back from there. A block that another request computed (a cached prefix) is
read like one's own: reuse recomputes nothing, and a preempted request simply loses its blocks.

Layout: per layer, [blocks, block_size, 2 (K, V), kv_heads, head_dim], K and V of a token side
by side, so one index_copy_ per layer stores the step's new tokens.

SDPA wants each sequence's K/V as one [1, kv_heads, s+q, head_dim] tensor, and torch has no
paged attention kernel, so the blocks are gathered. Two ways, same bits:
- gather (`read_copies=False`): every layer of every step gathers the step's blocks into a
  scratch buffer. No memory beyond the pool, but each step copies every cached token again:
  on the CPU that costs as much as the attention itself at long contexts.
- read copies (`read_copies=True`): each running request keeps a contiguous copy of what the
  gather would give (a profiler.model.KVCache). A request's blocks never change while it holds
  them (its own are written once; shared ones are full and written by nobody), so the copy only
  grows: by the step's new tokens, and, once at admission, by the cached prefix gathered from
  the pool's blocks. Attention then costs what it costs over a contiguous cache (the profiler's
  `step` op), for the memory of a second copy of the running requests' K/V.
SDPA gives the same bits either way, and as over a contiguous KVCache, so a request's outputs
do not depend on where its blocks are.

The pool grows (doubling) as higher block ids come into use, up to the manager's block count: a
trace served with a cache sized for the whole trace only pays for the blocks it touches.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from torch import Tensor

from stepcal.profiler.model import ContiguousKV, KVCache, step_inputs

MIN_POOL_BLOCKS = 64   # first allocation; growth doubles from there


def default_read_copies(device: torch.device | str) -> bool:
    """Read copies on the CPU, where gathering every step would double the attention's cost;
    gather on an accelerator, whose memory is the scarce part."""
    return torch.device(device).type == "cpu"


class PagedKVCache:
    """K/V of every request of one engine, in blocks of block_size tokens, for every layer."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *, block_size: int,
                 max_blocks: int, dtype: torch.dtype, device: torch.device | str,
                 read_copies: bool = True) -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.block_size, self.max_blocks = block_size, max_blocks
        self.dtype, self.device = dtype, torch.device(device)
        self.data = self._empty(num_layers, 0)   # [layers, blocks, block_size, 2, kv_heads, head_dim]
        self.scratch = self._empty(0)            # gather mode: [blocks read by a step, block_size, 2, ...]
        self.read_copies: dict[int, KVCache] | None = {} if read_copies else None   # request_id -> copy

    @classmethod
    def for_model(cls, model, block_size: int, max_blocks: int, read_copies: bool = True) -> PagedKVCache:
        spec = model.spec
        return cls(spec.num_layers, spec.num_kv_heads, spec.head_dim, block_size=block_size,
                   max_blocks=max_blocks, dtype=model.dtype, device=model.device, read_copies=read_copies)

    @property
    def num_blocks(self) -> int:
        """Blocks with storage so far: ids 0 .. num_blocks-1."""
        return self.data.shape[1]

    def _empty(self, *leading: int) -> Tensor:
        return torch.empty(*leading, self.block_size, 2, self.num_kv_heads, self.head_dim,
                           dtype=self.dtype, device=self.device)

    def reserve(self, num_blocks: int) -> None:
        """Storage for block ids 0 .. num_blocks-1, keeping what the blocks hold."""
        if num_blocks <= self.num_blocks:
            return
        if num_blocks > self.max_blocks:
            raise ValueError(f"block id {num_blocks - 1} is outside the pool of {self.max_blocks} blocks")
        grown = self._empty(self.num_layers, min(self.max_blocks, max(num_blocks, 2 * self.num_blocks,
                                                                      MIN_POOL_BLOCKS)))
        grown[:, :self.num_blocks] = self.data
        self.data = grown

    def release(self, request_ids) -> None:
        """Requests that lost their blocks (finished or preempted): their read copies go."""
        if self.read_copies is not None:
            for request_id in request_ids:
                self.read_copies.pop(request_id, None)

    def step_kv(self, request_ids: list[int], block_tables: list[list[int]], kv_lens: list[int],
                q_lens: list[int], max_tokens: list[int] | None = None):
        """The StepKV (profiler.model) of one step: sequence i stores q_lens[i] new tokens after its
        kv_lens[i] cached ones, all in the blocks of block_tables[i]. max_tokens[i], when given, is
        what sequence i will hold when it finishes: its read copy is allocated that large at once."""
        write_slots = self._write_slots(block_tables, kv_lens, q_lens)
        self.reserve(int(write_slots.max()) // self.block_size + 1)   # reads only touch blocks written before
        write_slots = self._to_device(write_slots)
        if self.read_copies is None:
            num_tokens = np.asarray(kv_lens, dtype=np.int64) + np.asarray(q_lens, dtype=np.int64)
            return self._gather_kv(block_tables, num_tokens, write_slots)
        return self._copies_kv(request_ids, block_tables, kv_lens, q_lens, write_slots,
                               max_tokens or [0] * len(request_ids))

    def _write_slots(self, block_tables, kv_lens: list[int], q_lens: list[int]) -> np.ndarray:
        """Slots of the step's new tokens, in batch order."""
        size = self.block_size
        if len(q_lens) == sum(q_lens):   # all decodes: plain Python beats ten numpy calls
            try:
                return np.array([table[s // size] * size + s % size for table, s in zip(block_tables, kv_lens)],
                                dtype=np.int64)
            except (TypeError, IndexError):
                pass   # token_slots says which
        return token_slots(block_tables, np.asarray(kv_lens, dtype=np.int64), np.asarray(q_lens, dtype=np.int64),
                           size)

    def _to_device(self, array: np.ndarray) -> Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def _gather_kv(self, block_tables, num_tokens: np.ndarray, write_slots: Tensor) -> GatherStepKV:
        blocks = table_blocks(block_tables, num_tokens, self.block_size)
        num_blocks = -(-num_tokens // self.block_size)
        first_row = (np.cumsum(num_blocks) - num_blocks) * self.block_size   # of sequence i, gathered
        if len(blocks) > len(self.scratch):   # grown by doubling, never shrunk
            self.scratch = self._empty(max(len(blocks), 2 * len(self.scratch)))
        return GatherStepKV(self.data, write_slots, self.scratch[:len(blocks)], self._to_device(blocks),
                            first_row.tolist(), num_tokens.tolist())

    def _copies_kv(self, request_ids, block_tables, kv_lens, q_lens, write_slots: Tensor,
                   max_tokens: list[int]) -> CopiesStepKV:
        copies, fills = [], []
        for i, (request_id, s, q) in enumerate(zip(request_ids, kv_lens, q_lens)):
            copy = self.read_copies.get(request_id)
            if copy is None:
                # Room for the whole request at once: a copy grown by doubling copies its K/V again in
                # the decode step after the prefill (a host spike a paged server does not have).
                copy = self.read_copies[request_id] = KVCache(self.num_layers, self.num_kv_heads, self.head_dim,
                                                              dtype=self.dtype, device=self.device,
                                                              capacity=max(max_tokens[i], s + q))
            if copy.length > s:
                raise RuntimeError(f"request {request_id}: its read copy holds {copy.length} tokens, "
                                   f"more than its {s} cached ones; it lost its blocks unreleased")
            if copy.length < s:   # a cached prefix it starts on: read once from the blocks
                fills.append((i, copy.length))
            copy.reserve(s + q)
            copies.append(copy)
        fill = None
        if fills:
            rows, starts = zip(*fills)
            counts = [kv_lens[i] - start for i, start in zip(rows, starts)]
            slots = token_slots([block_tables[i] for i in rows], np.asarray(starts, dtype=np.int64),
                                np.asarray(counts, dtype=np.int64), self.block_size)
            fill = PrefixFill([copies[i] for i in rows], list(starts), counts, self._to_device(slots))
        return CopiesStepKV(self.data, write_slots, ContiguousKV(copies), fill)


def token_slots(block_tables: list[list[int]], first_tokens: np.ndarray, num_tokens: np.ndarray,
                block_size: int) -> np.ndarray:
    """Pool slot (block * block_size + offset) of tokens first_tokens[i] .. first_tokens[i] +
    num_tokens[i] - 1 of each sequence i, sequence after sequence. Only the blocks those tokens
    touch are read from the tables, so a decode step costs the same at any context length."""
    first_block = first_tokens // block_size
    num_blocks = (first_tokens + num_tokens - 1) // block_size - first_block + 1
    try:
        blocks = np.fromiter(chain.from_iterable(table[f:f + n] for table, f, n in
                                                 zip(block_tables, first_block.tolist(), num_blocks.tolist())),
                             np.int64, int(num_blocks.sum()))
    except (TypeError, ValueError):   # None, or fewer blocks than tokens: the manager and the batch disagree
        raise RuntimeError(_short_tables(block_tables, first_tokens + num_tokens, block_size)) from None
    first_row = np.cumsum(num_tokens) - num_tokens
    position = np.arange(int(num_tokens.sum())) + np.repeat(first_tokens - first_row, num_tokens)   # in its sequence
    start = np.cumsum(num_blocks) - num_blocks - first_block     # blocks[start[i] + p // block_size]: token p's
    block = blocks[np.repeat(start, num_tokens) + position // block_size]
    return block * block_size + position % block_size


def table_blocks(block_tables: list[list[int]], num_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """The blocks holding the first num_tokens[i] tokens of sequence i, sequence after sequence."""
    needed = (-(-num_tokens // block_size)).tolist()
    try:
        return np.fromiter(chain.from_iterable(table[:n] for table, n in zip(block_tables, needed)),
                           np.int64, sum(needed))
    except (TypeError, ValueError):
        raise RuntimeError(_short_tables(block_tables, num_tokens, block_size)) from None


def _short_tables(block_tables, num_tokens: np.ndarray, block_size: int) -> str:
    needed = (-(-num_tokens // block_size)).tolist()
    short = [i for i, (t, n) in enumerate(zip(block_tables, needed)) if t is None or len(t) < n]
    return f"sequences {short} of the step hold fewer KV blocks than their tokens need"


# Both index ops below see 2-D views (a row per slot, a row per block): torch's CPU kernels then
# copy whole rows, several times faster than over the 5-D shape.
def store_rows(data: Tensor, layer: int, write_slots: Tensor, k: Tensor, v: Tensor) -> None:
    """Store new tokens' K/V ([T, kv_heads, head_dim] each) at their pool slots."""
    row_size = 2 * k[0].numel()
    slots = data[layer].view(-1, row_size)
    slots.index_copy_(0, write_slots, torch.stack((k, v), dim=1).view(-1, row_size))


@dataclass
class GatherStepKV:
    """A StepKV that gathers every sequence's blocks, per layer, after storing the new tokens."""
    data: Tensor              # the pool: [layers, blocks, block_size, 2, kv_heads, head_dim]
    write_slots: Tensor       # [T] slots of the new tokens, in batch order
    scratch: Tensor           # [len(blocks), block_size, 2, kv_heads, head_dim], overwritten per layer
    blocks: Tensor            # every sequence's blocks, sequence after sequence
    first_rows: list[int]     # first row of sequence i in the gathered rows
    num_tokens: list[int]     # s_i + q_i

    def store(self, layer: int, k: Tensor, v: Tensor, inputs) -> None:
        store_rows(self.data, layer, self.write_slots, k, v)

    def sequences(self, layer: int, inputs) -> list[tuple[Tensor, Tensor]]:
        blocks = self.data[layer].view(self.data.shape[1], -1)
        torch.index_select(blocks, 0, self.blocks, out=self.scratch.view(len(self.scratch), -1))
        packed = self.scratch.flatten(0, 1).permute(1, 2, 0, 3)   # [2, kv_heads, rows, head_dim]
        keys, values = packed[0], packed[1]
        return [(keys[:, row:row + n][None], values[:, row:row + n][None])
                for row, n in zip(self.first_rows, self.num_tokens)]

    def advance(self, inputs) -> None:
        """Nothing to do: the block manager counts the tokens."""


@dataclass
class PrefixFill:
    """Cached prefixes to copy from the pool into read copies: tokens starts[j] .. starts[j] +
    counts[j] - 1 of copies[j], from the pool slots `slots` (all of them, in order)."""
    copies: list[KVCache]
    starts: list[int]
    counts: list[int]
    slots: Tensor

    def apply(self, data: Tensor, layer: int) -> None:
        rows = data[layer].view(-1, 2 * data.shape[-2] * data.shape[-1]).index_select(0, self.slots)
        kv = rows.view(len(rows), 2, data.shape[-2], data.shape[-1]).permute(1, 2, 0, 3)   # [2, kv_heads, n, D]
        row = 0
        for copy, start, n in zip(self.copies, self.starts, self.counts):
            copy.k[layer, :, start:start + n] = kv[0, :, row:row + n]
            copy.v[layer, :, start:start + n] = kv[1, :, row:row + n]
            row += n


@dataclass
class CopiesStepKV:
    """A StepKV that stores new tokens in the pool and in each request's read copy, and reads the
    copies; a cached prefix is copied from the pool per layer, after that layer's stores (its
    blocks may be computed in this very step by a request admitted just before)."""
    data: Tensor
    write_slots: Tensor
    copies: ContiguousKV
    fill: PrefixFill | None

    def store(self, layer: int, k: Tensor, v: Tensor, inputs) -> None:
        store_rows(self.data, layer, self.write_slots, k, v)
        self.copies.store(layer, k, v, inputs)

    def sequences(self, layer: int, inputs) -> list[tuple[Tensor, Tensor]]:
        if self.fill is not None:
            self.fill.apply(self.data, layer)
        return self.copies.sequences(layer, inputs)

    def advance(self, inputs) -> None:
        self.copies.advance(inputs)


def held_batch(model, q_lens: list[int], kv_lens: list[int], block_size: int,
               generator: torch.Generator) -> tuple:
    """A batch as the engine holds it, outside an engine (the profiler's `step` and `kv_store`
    points): a fresh pool with each sequence on consecutive blocks of its own, the cached K/V
    noise, on the CPU each sequence's read copy filled with its s_i tokens, and the step's inputs
    built once. -> (inputs, read copies); a timing loop rewinds the copies (copy.length = s_i)."""
    tables, start = [], 0
    for q, s in zip(q_lens, kv_lens):
        count = -(-(s + q) // block_size)
        tables.append(list(range(start, start + count)))
        start += count
    pool = PagedKVCache.for_model(model, block_size, start, read_copies=default_read_copies(model.device))
    pool.reserve(start)
    pool.data.normal_(generator=generator if pool.data.device.type == "cpu" else None)
    copies = []
    if pool.read_copies is not None:
        for request_id, (q, s) in enumerate(zip(q_lens, kv_lens)):
            # The engine allocates a copy for its request's whole length: past its prefill a sequence's
            # copy holds more than its tokens, and attention reads a strided view of it (slower than a
            # whole tensor). Here, where the output length is unknown, the room is as many again.
            copy = pool.read_copies[request_id] = model.new_cache(capacity=s + q if s == 0 else max(s + q, 2 * s))
            copy.fill_random(s, generator)
            copies.append(copy)
    tokens = [torch.randint(0, model.spec.vocab_size, (q,), generator=generator) for q in q_lens]
    kv = pool.step_kv(list(range(len(q_lens))), tables, kv_lens, q_lens)
    return step_inputs(tokens, kv_lens, [True] * len(q_lens), model.device, kv), copies
