"""Serve a trace for real: each iteration takes the scheduler's step batch, runs it through the
torch model, samples greedily and reports back to the scheduler.

The scheduler objects are the simulator's own (simulator.schedulers): the engine adds no
scheduling logic. KV memory is one paged pool per engine (profiler.engine.paged): the block
manager is always the simulator's PrefixCachingBlockManager, whose block ids are the requests'
block tables, and attention reads each request's K/V through its table. With prefix caching on
(and prefix ids in the trace), an admitted request starts on blocks that another request, or
itself before a preemption, computed: it prefills only the rest, for real. A preempted request
loses its blocks and recomputes its tokens for real.

Prompt tokens are random from (seed, request_id), except that the tokens of a trace prefix block
come from (seed, its prefix id): requests with equal ids have equal tokens there, so reusing
another request's K/V gives what computing them would.
"""
from __future__ import annotations

import gc
import heapq
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from stepcal.core.batch import feature_row
from stepcal.core.errors import InputError
from stepcal.core.metrics import prefix_cache_summary, summarize
from stepcal.core.step_log import StepLogBuilder
from stepcal.core.trace import Trace, continued_turns
from stepcal.profiler.engine.clock import CLOCKS
from stepcal.profiler.engine.paged import PagedKVCache, default_read_copies
from stepcal.profiler.model import StepInputs, step_inputs
from stepcal.simulator.client import count_timeouts, link_turns
from stepcal.simulator.kv_cache import blocks_for, uses_prefix_caching
from stepcal.simulator.logs import request_log
from stepcal.simulator.prefix_cache import key_answers, make_block_manager
from stepcal.simulator.request import Request, Status, make_requests
from stepcal.simulator.schedulers import ScheduledStep, SchedulerConfig, make_scheduler


@dataclass
class EngineConfig:
    scheduler: str = "vllm"
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    block_size: int = 16
    kv_blocks: int | None = None      # None: as many as the trace could ever need
    clock: str = "virtual"
    seed: int = 0                     # prompt token ids are drawn from (seed, request_id) and (seed, prefix id)
    skip_oversize: bool = False
    keep_outputs: bool = False        # keep each request's tokens and last logits (for tests)
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    prefix_caching: bool | None = None   # None: the scheduler's default (on for vllm)
    kv_read_copies: bool | None = None   # None: on the CPU only (profiler.engine.paged: read copies or gather)
    timeout_s: float | None = None       # client timeout of requests whose trace gives none

    @property
    def uses_prefix_caching(self) -> bool:
        return uses_prefix_caching(self.scheduler, self.prefix_caching)


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
        self.prefix_caching = config.uses_prefix_caching
        self.requests, self.num_skipped = make_requests(trace, config.block_size, config.kv_blocks,
                                                        config.skip_oversize, self.prefix_caching, config.timeout_s)
        if not self.requests:
            raise InputError(f"{trace.source}: no request fits the KV cache")
        self.open_requests = link_turns(trace, self.requests)   # the others follow a previous turn
        self.has_prefix_ids = trace.prefix_hash_ids is not None
        num_blocks = config.kv_blocks or sum(blocks_for(r.max_kv_tokens, config.block_size) for r in self.requests)
        # Always the manager with block ids: they are the block tables. Requests without prefix keys
        # (caching off, or no ids in the trace) share nothing and are allocated as by the counting one.
        self.kv = make_block_manager(num_blocks, config.block_size, prefix_caching=True)
        read_copies = default_read_copies(model.device) if config.kv_read_copies is None else config.kv_read_copies
        self.pool = PagedKVCache.for_model(model, config.block_size, num_blocks, read_copies=read_copies)
        self.scheduler = make_scheduler(config.scheduler, self.kv, config.scheduler_config)
        self.clock = CLOCKS[config.clock]()
        self.log = StepLogBuilder(0, record_batches=True)
        self.host_ms: list[float] = []
        self.device_ms: list[float] = []
        self.token_ids: dict[int, list[int]] = prompt_tokens(self.requests, trace, config.seed,
                                                             model.spec.vocab_size)
        # a session turn's answer is what its next turn's prompt says it was (the stream goes on)
        self.scripted = session_streams(trace, self.requests, self.token_ids)
        if self.prefix_caching:
            key_answers(trace, self.requests, config.block_size)
        self.last_logits: dict[int, torch.Tensor] = {}
        self._carry_s = 0.0    # host bookkeeping after a step, charged to the next one

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
        """Requests join the scheduler when they arrive (closed-loop turns when released), leave it
        when their client gives up; between those, steps."""
        scheduler, clock = self.scheduler, self.clock
        self._arrivals = [(r.arrival_s, k, r) for k, r in enumerate(self.open_requests)]   # sorted: a heap
        self._deadlines: list = []
        self._seq = len(self._arrivals)
        arrivals = self._arrivals
        clock.start()
        while arrivals or scheduler.has_work():
            now = clock.now()
            while arrivals and arrivals[0][0] <= now:
                self._send(heapq.heappop(arrivals)[2], now)
            self._expire(now)
            if not scheduler.has_work():
                if arrivals:
                    clock.wait_until(arrivals[0][0])
                    self._carry_s = 0.0    # idle time absorbs the bookkeeping
                continue
            self._step(now)

    # -- clients: closed-loop turns and timeouts (as simulator.client) ----------------------------
    def _send(self, request: Request, now: float) -> None:
        if request.timeout_s is not None:
            deadline_s = request.arrival_s + request.timeout_s
            if deadline_s <= now:   # gave up before it was served at all
                request.give_up()
                self._release_next_turn(request, deadline_s)
                return
            self._seq += 1
            heapq.heappush(self._deadlines, (deadline_s, self._seq, request))
        self.scheduler.add(request)

    def _expire(self, now: float) -> None:
        """Abort the requests whose client gave up by now (a step boundary): their blocks go back."""
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline_s, _, request = heapq.heappop(self._deadlines)
            if request.status is not Status.FINISHED and request.status is not Status.ABORTED:
                self.scheduler.abort(request)
                self.pool.release([request.request_id])
                self._release_next_turn(request, deadline_s)

    def _on_finished(self, finished: list[Request], end_s: float) -> None:
        """A request whose answer ends at or after its deadline counts as timed out (its client
        left), as in the simulator; each finished turn releases its session's next one."""
        for request in finished:
            if request.timeout_s is not None and end_s >= request.arrival_s + request.timeout_s:
                request.give_up()
                self._release_next_turn(request, request.arrival_s + request.timeout_s)
            else:
                self._release_next_turn(request, end_s)

    def _release_next_turn(self, request: Request, done_s: float) -> None:
        turn = request.next_turn
        if turn is not None:
            turn.arrival_s = done_s + turn.think_time_s
            self._seq += 1
            heapq.heappush(self._arrivals, (turn.arrival_s, self._seq, turn))

    def _step(self, now: float) -> None:
        t0 = time.perf_counter()
        step = self.scheduler.schedule(now)   # called only while the scheduler has work: never None
        self.pool.release(r.request_id for r in step.preempted)   # their blocks are back with the manager
        inputs = self._inputs(step)
        t1 = time.perf_counter()
        logits = self.model.run_step(inputs)
        next_tokens = logits.argmax(dim=-1).tolist()   # .tolist() synchronises the device
        t2 = time.perf_counter()
        self._append_tokens(step.requests, inputs, next_tokens, logits)
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
        finished = self.scheduler.on_step_done(step, end_s)   # frees their blocks
        self.pool.release(r.request_id for r in finished)
        if finished:
            self._on_finished(finished, end_s)
        self._carry_s = time.perf_counter() - t4 + (t4 - t3)

    def _inputs(self, step: ScheduledStep) -> StepInputs:
        """The step's new tokens over the K/V in each request's blocks: the first kv_lens[i] tokens
        are there already (computed by this request, or a cached prefix another one computed)."""
        q_lens, kv_lens = step.batch.q_lens.tolist(), step.batch.kv_lens.tolist()
        token_ids, emit, block_tables, max_tokens = [], [], [], []
        for request, q, start in zip(step.requests, q_lens, kv_lens):
            ids = self.token_ids[request.request_id][start:start + q]
            token_ids.append(torch.tensor(ids, dtype=torch.long))
            emit.append(start + q == request.num_known_tokens)
            block_tables.append(request.block_ids)
            max_tokens.append(request.max_kv_tokens)
        kv = self.pool.step_kv(list(step.batch.request_ids), block_tables, kv_lens, q_lens, max_tokens)
        return step_inputs(token_ids, kv_lens, emit, self.model.device, kv)

    def _append_tokens(self, requests: list[Request], inputs: StepInputs, next_tokens, logits) -> None:
        rows = iter(range(len(next_tokens)))
        for request, q, start in zip(requests, inputs.q_lens, inputs.kv_lens):
            if start + q == request.num_known_tokens:   # this request emitted
                row = next(rows)
                token = next_tokens[row]
                script = self.scripted.get(request.request_id)
                if script is not None and request.num_generated_tokens < len(script):
                    token = script[request.num_generated_tokens]   # the answer the next turn quotes
                self.token_ids[request.request_id].append(token)
                if self.config.keep_outputs:
                    self.last_logits[request.request_id] = logits[row].float().cpu()

    # -- results ---------------------------------------------------------------------------------
    def _result(self, wall_s: float) -> EngineResult:
        requests = request_log(self.requests)
        steps = self.log.to_frame()
        steps["host_ms"] = np.asarray(self.host_ms, dtype=np.float64)
        steps["device_ms"] = np.asarray(self.device_ms, dtype=np.float64)
        itl_s, itl_w = self.scheduler.itl.arrays()
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update(prefix_cache_summary(requests, [self.kv], self.prefix_caching,
                                            self.prefix_caching and self.has_prefix_ids))
        summary["num_timeouts"] = count_timeouts(self.requests)
        summary.update({"num_skipped": self.num_skipped, "num_steps": len(steps), "kv_blocks": self.kv.num_blocks,
                        "block_size": self.config.block_size, "scheduler": self.config.scheduler,
                        "clock": self.config.clock})
        tokens = {}
        if self.config.keep_outputs:
            tokens = {r.request_id: self.token_ids[r.request_id][r.num_prompt_tokens:] for r in self.requests}
        return EngineResult(requests, steps, summary, tokens, self.last_logits, wall_s)


PREFIX_TOKEN_STREAM = 0x70726566   # separates the tokens drawn for prefix ids from those drawn for requests


def prompt_tokens(requests: list[Request], trace: Trace, seed: int, vocab_size: int) -> dict[int, list[int]]:
    """Each request's prompt token ids: random from (seed, request_id), and where the trace has
    prefix ids, the tokens of trace block j (prefix_block_tokens of them) from (seed, its id)."""
    ids_of = {}
    if trace.prefix_hash_ids is not None:
        ids_of = dict(zip(trace.request_id.tolist(), trace.prefix_hash_ids))
    block_tokens, drawn = trace.prefix_block_tokens, {}   # drawn: prefix id -> its block's tokens

    def block(prefix_id: int) -> np.ndarray:
        if prefix_id not in drawn:
            rng = np.random.default_rng([seed, PREFIX_TOKEN_STREAM, int(prefix_id)])
            drawn[prefix_id] = rng.integers(0, vocab_size, block_tokens)
        return drawn[prefix_id]

    tokens = {}
    for request in requests:
        n = request.num_prompt_tokens
        own = np.random.default_rng([seed, request.request_id]).integers(0, vocab_size, n)
        prefix_ids = ids_of.get(request.request_id, ())[:-(-n // block_tokens)]   # at most one per block
        for j, prefix_id in enumerate(prefix_ids):
            start = j * block_tokens
            own[start:start + block_tokens] = block(prefix_id)[:n - start]
        tokens[request.request_id] = own.tolist()
    return tokens


def session_streams(trace: Trace, requests: list[Request], token_ids: dict[int, list[int]]) -> dict[int, list[int]]:
    """Make each session turn's prompt the start of its next turn's (a session is one token stream),
    and return each turn's answer as the next turn's prompt has it (request_id -> tokens).

    Only where the next turn continues this one (core.trace.continued_turns). The engine emits
    the quoted answer instead of its own sample, so that the next turn's prompt holds the tokens
    whose K/V this turn computed, which a prefix cache then reuses."""
    by_id = {r.request_id: r for r in requests}
    ids = trace.request_id.tolist()
    scripted = {}
    for row, next_row in reversed(continued_turns(trace)):   # last turns first: a turn's tokens come from its successor's
        turn_id, next_id = ids[row], ids[next_row]
        turn, following = by_id.get(turn_id), by_id.get(next_id)
        if turn is None or following is None or following.num_prompt_tokens <= turn.num_prompt_tokens:
            continue
        stream = token_ids[next_id]
        token_ids[turn_id] = stream[:turn.num_prompt_tokens]
        scripted[turn_id] = stream[turn.num_prompt_tokens:turn.num_prompt_tokens + turn.num_output_tokens]
    return scripted
