"""Serve a trace for real: each iteration takes the scheduler's step batch, runs it through the
torch model, samples greedily and reports back to the scheduler.

The scheduler objects are the simulator's own (simulator.schedulers): the engine adds no
scheduling logic. KV memory is real tensors per request, sized by the scheduler's block
accounting; a preempted request's cache is dropped and its tokens recomputed for real.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from profiler.engine.clock import CLOCKS
from simulator.batch import feature_row
from simulator.errors import InputError
from simulator.kv_cache import BlockManager, blocks_for
from simulator.logs import request_log
from simulator.metrics import summarize
from simulator.request import Request, make_requests
from simulator.schedulers import ScheduledStep, SchedulerConfig, make_scheduler
from simulator.step_log import StepLogBuilder
from simulator.trace import Trace


@dataclass
class EngineConfig:
    scheduler: str = "vllm"
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    block_size: int = 16
    kv_blocks: int | None = None      # None: as many as the trace could ever need
    clock: str = "virtual"
    seed: int = 0                     # prompt token ids are drawn from (seed, request_id)
    skip_oversize: bool = False
    keep_outputs: bool = False        # keep each request's tokens and last logits (for tests)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


@dataclass
class EngineResult:
    requests: object                  # DataFrame: the request log
    steps: object                     # DataFrame: the step log, with host_ms and device_ms
    summary: dict
    tokens: dict[int, list[int]]      # request_id -> generated tokens (keep_outputs)
    last_logits: dict[int, torch.Tensor]
    wall_s: float


class Engine:
    def __init__(self, model, trace: Trace, config: EngineConfig) -> None:
        if config.clock not in CLOCKS:
            raise InputError(f"--clock: unknown clock {config.clock!r}; choose wall or virtual")
        self.model, self.config = model, config
        self.requests, self.num_skipped = make_requests(trace, config.block_size, config.kv_blocks,
                                                        config.skip_oversize)
        if not self.requests:
            raise InputError(f"{trace.source}: no request fits the KV cache")
        num_blocks = config.kv_blocks or sum(blocks_for(r.max_kv_tokens, config.block_size) for r in self.requests)
        self.kv = BlockManager(num_blocks, config.block_size)
        self.scheduler = make_scheduler(config.scheduler, self.kv, config.scheduler_config)
        self.clock = CLOCKS[config.clock]()
        self.log = StepLogBuilder(0, record_batches=True)
        self.host_ms: list[float] = []
        self.device_ms: list[float] = []
        self.caches: dict[int, object] = {}
        self.token_ids: dict[int, list[int]] = {r.request_id: self._prompt(r) for r in self.requests}
        self.last_logits: dict[int, torch.Tensor] = {}
        self._carry_s = 0.0    # host bookkeeping after a step, charged to the next one

    def _prompt(self, request: Request) -> list[int]:
        rng = np.random.default_rng([self.config.seed, request.request_id])
        return rng.integers(0, self.model.spec.vocab_size, request.num_prompt_tokens).tolist()

    # -- the serving loop ------------------------------------------------------------------------
    def run(self) -> EngineResult:
        wall0 = time.perf_counter()
        gc.collect()
        gc.disable()   # no collector pauses inside timed steps
        try:
            self._serve()
        finally:
            gc.enable()
        return self._result(time.perf_counter() - wall0)

    def _serve(self) -> None:
        requests, scheduler, clock = self.requests, self.scheduler, self.clock
        n, i = len(requests), 0
        clock.start()
        while i < n or scheduler.has_work():
            now = clock.now()
            while i < n and requests[i].arrival_s <= now:
                scheduler.add(requests[i])
                i += 1
            if not scheduler.has_work():
                clock.wait_until(requests[i].arrival_s)
                self._carry_s = 0.0    # idle time absorbs the bookkeeping
                continue
            self._step(now)

    def _step(self, now: float) -> None:
        t0 = time.perf_counter()
        step = self.scheduler.schedule(now)   # called only while the scheduler has work: never None
        self._drop_caches(step.preempted)
        token_ids, caches, emit = self._inputs(step)
        inputs = self.model.prepare_step(token_ids, caches, emit)
        t1 = time.perf_counter()
        logits = self.model.run_step(inputs)
        next_tokens = logits.argmax(dim=-1).tolist()   # .tolist() synchronises the device
        t2 = time.perf_counter()
        self._append_tokens(step.requests, emit, next_tokens, logits)
        t3 = time.perf_counter()
        elapsed_s = (t3 - t0) + self._carry_s
        end_s = self.clock.step_end(now, elapsed_s)
        duration_ms, device_ms = (end_s - now) * 1000.0, (t2 - t1) * 1000.0
        batch = step.batch
        self.log.add_step(now, duration_ms, feature_row(batch.q_lens, batch.kv_lens),
                          batch.request_ids, batch.q_lens, batch.kv_lens)
        self.device_ms.append(device_ms)
        self.host_ms.append(duration_ms - device_ms)
        t4 = time.perf_counter()
        for request in self.scheduler.on_step_done(step, end_s):
            self.caches.pop(request.request_id, None)
        self._carry_s = time.perf_counter() - t4 + (t4 - t3)

    def _inputs(self, step: ScheduledStep):
        token_ids, caches, emit = [], [], []
        for request, q in zip(step.requests, step.batch.q_lens.tolist()):
            cache = self.caches.get(request.request_id)
            if cache is None:
                cache = self.caches[request.request_id] = self.model.new_cache()
            start = request.num_computed_tokens
            if cache.length != start:   # recomputing after a preemption
                cache.truncate(start)
            ids = self.token_ids[request.request_id][start:start + q]
            token_ids.append(torch.tensor(ids, dtype=torch.long))
            caches.append(cache)
            emit.append(start + q == request.num_known_tokens)
        return token_ids, caches, emit

    def _append_tokens(self, requests: list[Request], emit, next_tokens, logits) -> None:
        rows = iter(range(len(next_tokens)))
        for request, emits in zip(requests, emit):
            if emits:
                row = next(rows)
                self.token_ids[request.request_id].append(next_tokens[row])
                if self.config.keep_outputs:
                    self.last_logits[request.request_id] = logits[row].float().cpu()

    def _drop_caches(self, preempted: list[Request]) -> None:
        """Free the device memory of requests the scheduler preempted (recompute policy)."""
        for request in preempted:
            cache = self.caches.pop(request.request_id, None)
            if cache is not None:
                cache.reset(free=True)

    # -- results ---------------------------------------------------------------------------------
    def _result(self, wall_s: float) -> EngineResult:
        requests = request_log(self.requests)
        steps = self.log.to_frame()
        steps["host_ms"] = np.asarray(self.host_ms, dtype=np.float64)
        steps["device_ms"] = np.asarray(self.device_ms, dtype=np.float64)
        itl_s, itl_w = self.scheduler.itl.arrays()
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update({"num_skipped": self.num_skipped, "num_steps": len(steps), "kv_blocks": self.kv.num_blocks,
                        "block_size": self.config.block_size, "scheduler": self.config.scheduler,
                        "clock": self.config.clock})
        tokens = {}
        if self.config.keep_outputs:
            tokens = {r.request_id: self.token_ids[r.request_id][r.num_prompt_tokens:] for r in self.requests}
        return EngineResult(requests, steps, summary, tokens, self.last_logits, wall_s)
