"""One step batch timed inside the engine: real iterations of profiler.engine.Engine held at it.

An iteration of profiler.engine.Engine is: the scheduler's schedule(), input building (token
tensors, positions, masks, the paged pool's slots and read copies), the forward and greedy
sampling (the engine's `device_ms`), appending the tokens, then the scheduler's on_step_done and
the pool's release, which the engine charges to the next step. Its `host_ms` is the step's
duration less `device_ms`; the profiler's `step` op times the device part alone, so that
T_step = step + host, each measured once.

EngineProbe holds a real Engine at one batch shape and runs real iterations on it: the decodes are
prefilled once (untimed) and then decode for real; prefills are fresh requests of one output
token, added before each iteration and finished by it. A call returns the engine's own host_ms
(the `host` op) or device_ms (the `step` op) of that iteration, so the profile measures exactly
what the engine's step log records. Timed apart from the engine, the forward alone ran 5-20%
faster than inside it on the CPU (the host work between steps evicts what a tight loop keeps in
the caches; tiny, 1 to 16 decodes, interleaved in one process), so whole steps are timed here
too wherever a probe can hold the batch.
"""
from __future__ import annotations

import gc

import numpy as np

from stepcal.core.trace import Trace
from stepcal.profiler.batches import check_host_batch
from stepcal.profiler.engine.engine import Engine, EngineConfig
from stepcal.simulator.kv_cache import blocks_for
from stepcal.simulator.request import Request, Status
from stepcal.simulator.schedulers import SchedulerConfig

GROWTH_STEPS = 256     # decode iterations a probe serves before it is rebuilt (each adds a token per sequence)
BLOCK_SIZE = 16        # `stepcal measure`'s default KV block size
PARTS = ("host", "device")


def split_batch(q_lens, kv_lens) -> tuple[list[int], list[int]]:
    """(the decodes' KV lengths, the fresh prefills' prompt lengths) of a batch a probe can hold."""
    return ([int(s) for q, s in zip(q_lens, kv_lens) if s > 0],
            [int(q) for q, s in zip(q_lens, kv_lens) if s == 0])


def probe_budget(decode_kv: list[int], prefill_q: list[int]) -> int:
    """The probe engine's token budget: the held batch in one step (every decode and fresh prefill),
    any one prompt in one chunk, at least vLLM's 8,192; not the decodes' prompts all at once, whose
    single prefill step would need activations for all of them (an 8B model at 512 x 4k tokens)."""
    return max(8192, len(decode_kv) + sum(prefill_q), max(decode_kv, default=0))


def probe_output_tokens(decode_kv: list[int], budget: int) -> int:
    """Output tokens of a held decode: enough never to finish while the probe runs, counting the steps
    in which it decodes while the others are still prefilled (at most one per budget of prompts)."""
    return GROWTH_STEPS + 4 + -(-sum(decode_kv) // budget)


def probe_tokens(q_lens, kv_lens) -> tuple[int, int]:
    """(tokens the probe engine's KV pool holds at most, tokens of its largest step): for the memory
    check before a point runs."""
    decode_kv, prefill_q = split_batch(q_lens, kv_lens)
    budget = probe_budget(decode_kv, prefill_q)
    num_output = probe_output_tokens(decode_kv, budget)
    return sum(decode_kv) + num_output * len(decode_kv) + sum(prefill_q), budget


class EngineProbe:
    """An engine held at one step batch; each call runs one iteration and returns the ms of its
    `part`: host (the engine's host_ms) or device (its device_ms: the forward and sampling)."""

    def __init__(self, model, q_lens, kv_lens, part: str = "host", scheduler: str = "vllm") -> None:
        check_host_batch(q_lens, kv_lens, "host batch")
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        self.model, self.scheduler, self.part = model, scheduler, part
        self.decode_kv, self.prefill_q = split_batch(q_lens, kv_lens)
        self.engine = None
        self._next_id = 0

    def __call__(self, _call: int = 0) -> float:
        if self.engine is None or self._steps >= GROWTH_STEPS:
            self._build()
        engine = self.engine
        for q in self.prefill_q:
            engine.scheduler.add(self._prefill_request(q))
        was_enabled = gc.isenabled()
        gc.disable()    # as Engine.run: no collector pauses inside timed steps
        try:
            engine._step(engine.clock.now())
        finally:
            if was_enabled:
                gc.enable()
        self._steps += 1
        return engine.host_ms[-1] if self.part == "host" else engine.device_ms[-1]

    def _build(self) -> None:
        """A fresh engine whose decodes have all been prefilled (their prefill steps are not timed)."""
        decode_kv = np.asarray(self.decode_kv, dtype=np.int64)
        budget = probe_budget(self.decode_kv, self.prefill_q)
        num_output = probe_output_tokens(self.decode_kv, budget)
        prompts = np.concatenate([decode_kv, self.prefill_q]).astype(np.int64)
        outputs = np.concatenate([np.full(len(decode_kv), num_output), np.ones(len(self.prefill_q))]).astype(np.int64)
        trace = Trace.from_arrays(np.zeros(len(prompts)), prompts, outputs)
        kv_blocks = sum(blocks_for(int(p + o), BLOCK_SIZE) for p, o in zip(prompts, outputs))
        config = EngineConfig(scheduler=self.scheduler, block_size=BLOCK_SIZE, kv_blocks=kv_blocks,
                              prefix_caching=False, scheduler_config=SchedulerConfig(
                                  max_num_seqs=max(256, len(prompts)), max_num_batched_tokens=budget))
        engine = Engine(self.model, trace, config)
        # ids 0 .. d-1 are the decodes, the next ones the prefills' prototypes (never scheduled)
        self._prototypes = {q: engine.token_ids[len(decode_kv) + i] for i, q in enumerate(self.prefill_q)}
        self._next_id = len(prompts)
        engine.clock.start()
        decodes = [r for r in engine.requests if r.request_id < len(decode_kv)]
        for request in decodes:
            engine.scheduler.add(request)
        while decodes and not all(r.status is Status.RUNNING and r.num_generated_tokens > 0 for r in decodes):
            engine._step(engine.clock.now())
        self.engine, self._steps = engine, 0

    def _prefill_request(self, q: int) -> Request:
        """A new request of q prompt tokens and one output token: its prefill is its last step."""
        request = Request(self._next_id, self.engine.clock.now(), q, 1)
        self.engine.token_ids[request.request_id] = list(self._prototypes[q])
        self._next_id += 1
        return request
