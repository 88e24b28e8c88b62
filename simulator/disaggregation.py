"""Prefill/decode disaggregation (DistServe, Splitwise): a prefill pool, a KV transfer, a decode pool.

Each request is prefilled by a replica of the prefill pool, which computes the prompt's KV cache
and the first output token. The KV cache of the prompt, `kv_bytes_per_token · num_prompt_tokens`
bytes (ModelSpec.kv_bytes_per_token), then travels to the decode pool in
`kv_transfer_alpha_ms + bytes / bandwidth`; transfers do not contend for the link (each has the
whole bandwidth). On arrival the request joins a decode replica's queue (the second queue), with its
prompt already cached, and decodes the remaining output tokens there.

TTFT, precisely. The client's token stream is served by the decode pool (as in vLLM's and
Splitwise's P/D deployments): the first token, computed by the prefill pool, travels with the KV
cache and is emitted when the decode pool starts the request's first decode step. So

    TTFT = prefill queue + prefill + KV transfer + decode queue,

i.e. `first_token_s` is the start of that first decode step. This is Splitwise's accounting
extended by the decode queue; DistServe's narrower TTFT (up to prefill completion) can be read
from the request log's `prefill_end_s`. TPOT = (finish − first token) / (output tokens − 1) as
everywhere, so it covers decode steps only. A one-token request has nothing to decode: its token is
returned by the prefill pool at prefill completion, with no transfer.

The same scheduler classes run both pools, with their own sizes, KV caches and step-time models.
Everything is composed from the simulator's parts (schedulers, block managers, step logs, metrics);
simulator.simulation is not touched. Decode runs (many identical decode steps advanced in one move)
are planned optimistically and cut back when a KV transfer lands on the replica, which gives the same
logs as stepping one by one; `fast_path=False` steps one by one.
"""
from __future__ import annotations

import gc
import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from simulator.batch import StepFeatures, feature_row
from simulator.errors import InputError
from simulator.kv_cache import BlockManager, blocks_for
from simulator.logs import request_log
from simulator.metrics import distribution, summarize
from simulator.request import Request
from simulator.router import make_router
from simulator.schedulers import SchedulerConfig, make_scheduler
from simulator.simulation import SimResult, make_requests, next_batch
from simulator.step_log import StepLogBuilder
from simulator.step_model import FeatureStepModel
from simulator.trace import Trace

ARRIVAL, STEP_DONE, WAKE = 0, 1, 2   # priorities at equal times, as in simulator.simulation


@dataclass
class PoolConfig:
    """One pool of identical replicas."""
    num_replicas: int = 1
    scheduler: str = "vllm"
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_blocks: int | None = None          # per replica; None: as many as the whole trace could need
    router: str = "round-robin"


@dataclass
class DisaggConfig:
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    kv_bytes_per_token: int = 0           # ModelSpec.kv_bytes_per_token
    kv_transfer_alpha_ms: float = 0.0     # fixed cost of one transfer (setup, latency)
    kv_transfer_gb_per_s: float = 25.0    # link bandwidth in 10^9 bytes/s
    block_size: int = 16
    step_overhead_ms: float = 0.0
    fast_path: bool = True
    record_batches: bool = True
    skip_oversize: bool = False
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name, pool in (("prefill", self.prefill), ("decode", self.decode)):
            if pool.num_replicas < 1:
                raise InputError(f"--disaggregated: the {name} pool needs at least 1 replica, got {pool.num_replicas}")
        if self.kv_bytes_per_token < 0 or self.kv_transfer_alpha_ms < 0:
            raise InputError("KV transfer: bytes per token and --kv-transfer-alpha-ms must not be negative")
        if not self.kv_transfer_gb_per_s > 0:
            raise InputError(f"--kv-transfer-gbps must be positive, got {self.kv_transfer_gb_per_s!r}")

    @property
    def num_replicas(self) -> int:
        return self.prefill.num_replicas + self.decode.num_replicas

    def transfer_ms(self, num_prompt_tokens: int) -> float:
        """α + bytes / bandwidth for the prompt's KV cache."""
        num_bytes = self.kv_bytes_per_token * num_prompt_tokens
        return self.kv_transfer_alpha_ms + num_bytes / (self.kv_transfer_gb_per_s * 1e9) * 1000.0


class _Replica:
    def __init__(self, pool: str, index: int, config: PoolConfig, block_size: int, num_blocks: int,
                 record_batches: bool) -> None:
        self.pool = pool
        self.index = index
        self.kv = BlockManager(num_blocks, block_size)
        self.scheduler = make_scheduler(config.scheduler, self.kv, config.scheduler_config)
        self.log = StepLogBuilder(index, record_batches)
        self.busy = False
        self.wake_pending = False
        self.in_flight = None   # (batch, features row, duration_ms, start_s) or a decode run (batch, (ends_s, features), durations_ms, None)
        self.version = 0        # bumped when a planned decode run is cut back; older step-done events are stale


@dataclass(slots=True, eq=False)
class _Handoff:
    """A request between the pools: the prefill-side request and its decode-side twin."""
    final: Request              # what the request log reports (decode side, or the whole request if 1 token)
    prefill_replica: int
    prefill_end_s: float | None = None
    kv_ready_s: float | None = None
    transfer_ms: float | None = None


class DisaggSimulation:
    """A prefill pool and a decode pool driven by one event loop; `run()` returns a SimResult."""

    def __init__(self, trace: Trace, prefill_model, decode_model, config: DisaggConfig) -> None:
        self.prefill_model, self.decode_model = prefill_model, decode_model
        self.config = config
        limits = [b for b in (config.prefill.kv_blocks, config.decode.kv_blocks) if b is not None]
        originals, self.num_skipped = make_requests(trace, config.block_size, min(limits) if limits else None,
                                                    config.skip_oversize)
        self.originals = originals
        self.arrival_s = np.array([r.arrival_s for r in originals], dtype=np.float64)
        bs = config.block_size
        prefill_blocks = config.prefill.kv_blocks or max(1, sum(blocks_for(r.num_prompt_tokens, bs) for r in originals))
        decode_blocks = config.decode.kv_blocks or max(1, sum(blocks_for(r.max_kv_tokens, bs) for r in originals))
        self.prefill = [_Replica("prefill", i, config.prefill, bs, prefill_blocks, config.record_batches)
                        for i in range(config.prefill.num_replicas)]
        self.decode = [_Replica("decode", i, config.decode, bs, decode_blocks, config.record_batches)
                       for i in range(config.decode.num_replicas)]
        self.prefill_router = make_router(config.prefill.router)
        self.decode_router = make_router(config.decode.router)
        # Runs are cut back when a transfer lands; a router that reads replica state would read stale counters.
        self.decode_runs = config.fast_path and not self.decode_router.reads_state
        self.handoffs: dict[int, _Handoff] = {}
        self.heap: list = []
        self.seq = 0

    # -- event loop ------------------------------------------------------------------------------
    def run(self) -> SimResult:
        gc_was_enabled = gc.isenabled()
        gc.disable()   # as in Simulation.run: no cycles are made, and GC passes over every Request are slow
        try:
            wall0 = time.perf_counter()
            self._loop()
            return self._result(time.perf_counter() - wall0)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _loop(self) -> None:
        arrivals, originals, heap = self.arrival_s, self.originals, self.heap
        n, i = len(originals), 0
        while i < n or heap:
            if i < n and (not heap or arrivals[i] <= heap[0][0]):
                self._on_arrival(originals[i], float(arrivals[i]))
                i += 1
                continue
            now, priority, _, target, version = heapq.heappop(heap)
            if priority == ARRIVAL:
                self._on_kv_ready(target, now)
            elif priority == WAKE:
                target.wake_pending = False
                if not target.busy:
                    self._start_step(target, now)
            elif version == target.version:
                self._finish_step(target, now)

    def _push(self, time_s: float, priority: int, target, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_s, priority, self.seq, target, version))

    def _wake(self, replica: _Replica, now: float) -> None:
        if not replica.busy and not replica.wake_pending:
            replica.wake_pending = True
            self._push(now, WAKE, replica)

    def _on_arrival(self, original: Request, now: float) -> None:
        index = self.prefill_router.pick([r.scheduler for r in self.prefill])
        prefill_side = Request(original.request_id, original.arrival_s, original.num_prompt_tokens, 1,
                               priority=original.priority, slo_ttft_ms=original.slo_ttft_ms,
                               slo_tpot_ms=original.slo_tpot_ms, replica=index)
        self.handoffs[original.request_id] = _Handoff(original, index)
        self.prefill[index].scheduler.add(prefill_side)
        self._wake(self.prefill[index], now)

    def _on_prefilled(self, prefill_side: Request, now: float) -> None:
        """The prefill pool emitted the first token: send the KV cache to the decode pool."""
        handoff = self.handoffs[prefill_side.request_id]
        original = handoff.final
        handoff.prefill_end_s = now
        if original.num_output_tokens == 1:   # nothing to decode: the token goes out now
            original.first_token_s = original.last_token_s = original.finish_s = now
            original.num_generated_tokens = 1
            original.num_preemptions = prefill_side.num_preemptions
            return
        decode_side = Request(original.request_id, original.arrival_s, original.num_prompt_tokens,
                              original.num_output_tokens, priority=original.priority,
                              slo_ttft_ms=original.slo_ttft_ms, slo_tpot_ms=original.slo_tpot_ms,
                              num_computed_tokens=original.num_prompt_tokens, num_generated_tokens=1,
                              num_preemptions=prefill_side.num_preemptions)
        handoff.final = decode_side
        handoff.transfer_ms = self.config.transfer_ms(original.num_prompt_tokens)
        self._push(now + handoff.transfer_ms / 1000.0, ARRIVAL, decode_side)

    def _on_kv_ready(self, request: Request, now: float) -> None:
        """The KV cache landed: the request queues at a decode replica with its prompt cached."""
        self.handoffs[request.request_id].kv_ready_s = now
        index = self.decode_router.pick([r.scheduler for r in self.decode])
        replica = self.decode[index]
        request.replica = index
        replica.scheduler.add(request)
        # add() counts the whole request as outstanding; its prompt is computed already
        replica.scheduler.num_outstanding_tokens -= request.num_computed_tokens
        if replica.in_flight is not None and replica.in_flight[3] is None:
            self._cut_run(replica, now)
        self._wake(replica, now)

    # -- steps -----------------------------------------------------------------------------------
    def _start_step(self, replica: _Replica, now: float) -> None:
        scheduler = replica.scheduler
        batch = next_batch(scheduler, now, f"{replica.pool} replica {replica.index}")
        replica.busy = batch is not None
        if batch is None:
            return
        is_decode_pool = replica.pool == "decode"
        if is_decode_pool:
            for request in scheduler.in_flight:
                if request.first_token_s is None:   # its first decode step: the first token goes out now
                    request.first_token_s = request.last_token_s = now
            if self.decode_runs and scheduler.in_flight_is_decode:
                num_steps = scheduler.decode_run_length(batch)
                if num_steps > 1:
                    self._start_run(replica, batch, now, num_steps)
                    return
        model = self.decode_model if is_decode_pool else self.prefill_model
        row = feature_row(batch.q_lens, batch.kv_lens)
        duration_ms = _step_ms(model, batch, row) + self.config.step_overhead_ms
        replica.in_flight = (batch, row, duration_ms, now)
        self._push(now + duration_ms / 1000.0, STEP_DONE, replica, replica.version)

    def _start_run(self, replica: _Replica, batch, now: float, num_steps: int) -> None:
        """Plan num_steps decode steps; a transfer landing on this replica cuts the plan back (_cut_run)."""
        model = self.decode_model
        if isinstance(model, FeatureStepModel):
            durations_ms = model.features_ms(StepFeatures.decode_run(batch.kv_lens, num_steps))
        else:
            durations_ms = np.asarray(model.decode_run_ms(batch.kv_lens, num_steps), dtype=np.float64)
        durations_ms = durations_ms + self.config.step_overhead_ms
        ends_s = np.cumsum(np.concatenate(([now], durations_ms / 1000.0)))   # sequential: same bits as one by one
        replica.in_flight = (batch, ends_s, durations_ms, None)
        self._push(float(ends_s[-1]), STEP_DONE, replica, replica.version)

    def _cut_run(self, replica: _Replica, now: float) -> None:
        """Keep the steps that end before `now` and the one in flight at `now`; drop the rest.

        Step by step, the scheduler would see the new request at the first step start at or after
        `now`: the end of the step in flight (an end tied with `now` comes after the arrival)."""
        batch, ends_s, durations_ms, _ = replica.in_flight
        keep = int(np.searchsorted(ends_s[1:], now, side="left")) + 1
        if keep >= len(durations_ms):
            return
        replica.version += 1
        replica.in_flight = (batch, ends_s[: keep + 1], durations_ms[:keep], None)
        self._push(float(ends_s[keep]), STEP_DONE, replica, replica.version)

    def _finish_step(self, replica: _Replica, now: float) -> None:
        batch, second, durations, start = replica.in_flight
        replica.in_flight = None
        if start is None:   # a decode run; second holds its step ends
            features = StepFeatures.decode_run(batch.kv_lens, len(durations))
            replica.log.add_steps(second[:-1], durations, features, batch.request_ids, batch.q_lens, batch.kv_lens)
            finished = replica.scheduler.on_decode_run_done(batch, second)
        else:
            replica.log.add_step(start, durations, second, batch.request_ids, batch.q_lens, batch.kv_lens)
            finished = replica.scheduler.on_step_done(batch, now)
        if replica.pool == "prefill":
            for request in finished:
                self._on_prefilled(request, now)
        self._start_step(replica, now)

    # -- results ---------------------------------------------------------------------------------
    def _result(self, wall_s: float) -> SimResult:
        import pandas as pd
        handoffs = [self.handoffs[r.request_id] for r in self.originals]
        requests = request_log([h.final for h in handoffs])
        by_id = {h.final.request_id: h for h in handoffs}
        ordered = [by_id[i] for i in requests["request_id"].tolist()]
        # the decode replica; none for one-token requests, which never reach the decode pool
        requests["replica"] = pd.array([h.final.replica if h.transfer_ms is not None else None for h in ordered],
                                       dtype="Int64")
        requests["prefill_replica"] = np.array([h.prefill_replica for h in ordered], dtype=np.int64)
        requests["prefill_end_s"] = _floats(h.prefill_end_s for h in ordered)
        requests["kv_ready_s"] = _floats(h.kv_ready_s for h in ordered)
        requests["kv_transfer_ms"] = _floats(h.transfer_ms for h in ordered)
        steps = pd.concat([r.log.to_frame().assign(pool=r.pool) for r in self.prefill + self.decode],
                          ignore_index=True)
        itl = [r.scheduler.itl.arrays() for r in self.decode]
        itl_s = np.concatenate([v for v, _ in itl])
        itl_w = np.concatenate([w for _, w in itl])
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update({
            "num_skipped": self.num_skipped, "num_steps": len(steps), "block_size": self.config.block_size,
            "num_replicas": self.config.num_replicas, "num_prefill_replicas": self.config.prefill.num_replicas,
            "num_decode_replicas": self.config.decode.num_replicas,
            "scheduler": f"{self.config.prefill.scheduler}/{self.config.decode.scheduler}",
            "kv_transfer_ms": distribution(requests["kv_transfer_ms"].to_numpy()),
        })
        return SimResult(requests, steps, summary, itl_s, itl_w, self.num_skipped, wall_s)


def _step_ms(model, batch, row: tuple) -> float:
    if isinstance(model, FeatureStepModel):
        return model.row_ms(row)
    return float(model.step_ms(batch))


def _floats(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def simulate_disaggregated(trace: Trace, prefill_model, decode_model, config: DisaggConfig) -> SimResult:
    return DisaggSimulation(trace, prefill_model, decode_model, config).run()
