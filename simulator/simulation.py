"""The discrete-event loop: arrivals, routing, and each replica's steps, timed by a StepTimeModel.

Events are keyed (time_s, priority, seq): at equal times arrivals come first, then step
completions, then wake-ups of idle replicas (so requests arriving together start together).
Between arrivals, a run of decode-only steps that changes nothing but KV lengths is advanced in
one vectorised move; `fast_path=False` takes every step one by one and gives the same logs.
"""
from __future__ import annotations

import gc
import heapq
import math
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from simulator.batch import StepFeatures, feature_row
from simulator.errors import InputError
from simulator.kv_cache import BlockManager, blocks_for
from simulator.logs import request_log
from simulator.metrics import summarize
from simulator.request import Request
from simulator.router import make_router
from simulator.schedulers import SchedulerConfig, make_scheduler
from simulator.step_log import StepLogBuilder
from simulator.step_model import FeatureStepModel
from simulator.trace import Trace

ARRIVAL, STEP_DONE, RUN_DONE, WAKE = 0, 1, 1, 2   # priorities at equal times


@dataclass
class SimConfig:
    scheduler: str = "vllm"
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    block_size: int = 16
    kv_blocks: int | None = None          # None: as many as the whole trace could ever need
    num_replicas: int = 1
    router: str = "round-robin"
    step_overhead_ms: float = 0.0         # host time added to every step
    request_overhead_ms: float = 0.0      # request path before the scheduler sees a request (TTFT, E2E)
    fast_path: bool = True
    record_batches: bool = True           # keep each step's q_lens / kv_lens in the step log
    skip_oversize: bool = False
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


@dataclass
class SimResult:
    requests: object          # DataFrame, the request log
    steps: object             # DataFrame, the step log
    summary: dict
    itl_s: np.ndarray
    itl_weights: np.ndarray
    num_skipped: int
    wall_s: float


class _Replica:
    def __init__(self, index: int, config: SimConfig, num_blocks: int) -> None:
        self.index = index
        self.kv = BlockManager(num_blocks, config.block_size)
        self.scheduler = make_scheduler(config.scheduler, self.kv, config.scheduler_config)
        self.log = StepLogBuilder(index, config.record_batches)
        self.busy = False
        self.wake_pending = False
        self.in_flight = None   # (batch, features, duration_ms) or (batch, ends_s, durations_ms)


class Simulation:
    def __init__(self, trace: Trace, step_model, config: SimConfig) -> None:
        self.model = step_model
        self.config = config
        self.requests, self.num_skipped = make_requests(trace, config.block_size, config.kv_blocks,
                                                         config.skip_oversize)
        # when each request reaches the scheduler: its arrival plus the request path
        self.arrival_s = np.array([r.arrival_s for r in self.requests], dtype=np.float64)
        if config.request_overhead_ms:
            self.arrival_s = self.arrival_s + config.request_overhead_ms / 1000.0
        num_blocks = config.kv_blocks or max(1, sum(blocks_for(r.max_kv_tokens, config.block_size)
                                                      for r in self.requests))
        if config.num_replicas < 1:
            raise InputError(f"--replicas must be at least 1, got {config.num_replicas}")
        self.replicas = [_Replica(i, config, num_blocks) for i in range(config.num_replicas)]
        self.schedulers = [r.scheduler for r in self.replicas]
        self.router = make_router(config.router)
        self.heap: list = []
        self.seq = 0
        self.next_arrival = 0
        self.num_blocks = num_blocks

    # -- event loop ------------------------------------------------------------------------------
    def run(self, progress: bool = False) -> SimResult:
        """Simulate to the end; `progress` shows a bar over arrivals on stderr."""
        # The loop allocates no reference cycles, but the cyclic GC would rescan every live Request
        # on each collection, making long traces quadratic: pause it for the loop.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _run(self, progress: bool) -> SimResult:
        wall0 = time.perf_counter()
        arrivals, n = self.arrival_s, len(self.requests)
        heap = self.heap
        bar = _progress_bar(n) if progress else None
        while self.next_arrival < n or heap:
            i = self.next_arrival
            if i < n and (not heap or arrivals[i] <= heap[0][0]):
                self.next_arrival = i + 1
                self._on_arrival(self.requests[i], float(arrivals[i]))
                if bar is not None and not (i + 1) & 1023:
                    bar.update(1024)
                continue
            now, priority, _, replica = heapq.heappop(heap)
            if priority == WAKE:
                replica.wake_pending = False
                if not replica.busy:
                    self._start_step(replica, now)
            else:
                self._finish_step(replica, now)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        return self._result(time.perf_counter() - wall0)

    def _push(self, time_s: float, priority: int, replica: _Replica) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_s, priority, self.seq, replica))

    def _on_arrival(self, request: Request, now: float) -> None:
        index = self.router.pick(self.schedulers)
        replica = self.replicas[index]
        request.replica = index
        replica.scheduler.add(request)
        if not replica.busy and not replica.wake_pending:
            replica.wake_pending = True
            self._push(now, WAKE, replica)

    # -- steps -----------------------------------------------------------------------------------
    def _start_step(self, replica: _Replica, now: float) -> None:
        scheduler = replica.scheduler
        batch = next_batch(scheduler, now, f"replica {replica.index}")
        replica.busy = batch is not None
        if batch is None:
            return
        if self.config.fast_path and scheduler.in_flight_is_decode:
            num_steps = scheduler.decode_run_length(batch)
            if num_steps > 1 and self._start_run(replica, batch, now, num_steps):
                return
        row = feature_row(batch.q_lens, batch.kv_lens)
        duration_ms = self._step_ms(batch, row) + self.config.step_overhead_ms
        end = now + duration_ms / 1000.0
        replica.in_flight = (batch, row, duration_ms, now)
        self._push(end, STEP_DONE, replica)

    def _start_run(self, replica: _Replica, batch, now: float, num_steps: int) -> bool:
        """Advance up to num_steps decode steps in one move, stopping at the next arrival.

        The run may include the step in flight when the next request arrives, since nothing reads
        the replica's state at an arrival, unless the router does (then the run ends before it)."""
        if isinstance(self.model, FeatureStepModel):
            features = StepFeatures.decode_run(batch.kv_lens, num_steps)
            durations_ms = self.model.features_ms(features)
        else:
            features = None
            durations_ms = np.asarray(self.model.decode_run_ms(batch.kv_lens, num_steps), dtype=np.float64)
        durations_ms = durations_ms + self.config.step_overhead_ms
        ends_s = np.cumsum(np.concatenate(([now], durations_ms / 1000.0)))   # sequential: same bits as one by one
        next_arrival = self.arrival_s[self.next_arrival] if self.next_arrival < len(self.arrival_s) else math.inf
        # Steps ending strictly before the arrival; an end tied with it is processed after the arrival.
        num_before = int(np.searchsorted(ends_s[1:], next_arrival, side="left"))
        num_steps = min(num_steps, num_before + (0 if self.router.reads_state else 1))
        if num_steps < 2:
            return False
        features = features.head(num_steps) if features is not None else StepFeatures.decode_run(batch.kv_lens, num_steps)
        replica.in_flight = (batch, (ends_s[: num_steps + 1], features), durations_ms[:num_steps], None)
        self._push(float(ends_s[num_steps]), RUN_DONE, replica)
        return True

    def _finish_step(self, replica: _Replica, now: float) -> None:
        batch, second, durations, start = replica.in_flight
        replica.in_flight = None
        if start is None:   # a decode run
            ends_s, features = second
            replica.log.add_steps(ends_s[:-1], durations, features, batch.request_ids, batch.q_lens, batch.kv_lens)
            replica.scheduler.on_decode_run_done(batch, ends_s)
        else:
            replica.log.add_step(start, durations, second, batch.request_ids, batch.q_lens, batch.kv_lens)
            replica.scheduler.on_step_done(batch, now)
        self._start_step(replica, now)

    def _step_ms(self, batch, row: tuple) -> float:
        if isinstance(self.model, FeatureStepModel):
            return self.model.row_ms(row)
        return float(self.model.step_ms(batch))

    # -- results ---------------------------------------------------------------------------------
    def _result(self, wall_s: float) -> SimResult:
        import pandas as pd
        requests = request_log(self.requests)
        steps = pd.concat([r.log.to_frame() for r in self.replicas], ignore_index=True)
        itl = [s.itl.arrays() for s in self.schedulers]
        itl_s = np.concatenate([v for v, _ in itl])
        itl_w = np.concatenate([w for _, w in itl])
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update({"num_skipped": self.num_skipped, "num_steps": len(steps),
                        "kv_blocks": self.num_blocks, "block_size": self.config.block_size,
                        "num_replicas": self.config.num_replicas, "scheduler": self.config.scheduler})
        return SimResult(requests, steps, summary, itl_s, itl_w, self.num_skipped, wall_s)


def next_batch(scheduler, now: float, label: str):
    """The scheduler's next step batch, or None when it has nothing to run; a scheduler that holds
    work but schedules nothing is a bug, not an idle replica."""
    batch = scheduler.schedule(now)
    if batch is None and scheduler.has_work():
        raise RuntimeError(f"{label}: scheduler {scheduler.name} is stuck with {len(scheduler.waiting)} "
                           f"waiting requests and nothing running")
    return batch


def _progress_bar(total: int):
    from tqdm import tqdm
    return tqdm(total=total, unit="req", desc="simulate", leave=False, mininterval=0.5, file=sys.stderr,
                disable=total < 20000)


def simulate(trace: Trace, step_model, config: SimConfig | None = None) -> SimResult:
    return Simulation(trace, step_model, config or SimConfig()).run()


def make_requests(trace: Trace, block_size: int, kv_blocks: int | None,
                  skip_oversize: bool = False) -> tuple[list[Request], int]:
    """Request objects of a trace; requests that could never fit the KV cache fail (or are skipped)."""
    optional = {name: getattr(trace, name) for name in ("priority", "slo_ttft_ms", "slo_tpot_ms")}
    max_kv = trace.num_prompt_tokens + trace.num_output_tokens - 1
    keep = np.ones(len(trace), dtype=bool)
    if kv_blocks is not None:
        need = -(-max_kv // block_size)
        keep = need <= kv_blocks
        if not keep.all() and not skip_oversize:
            row = int(np.flatnonzero(~keep)[0])
            raise InputError(
                f"{trace.source}: request {int(trace.request_id[row])} (row {row}) needs {int(need[row])} KV blocks "
                f"of {block_size} tokens but the cache holds {kv_blocks}; "
                f"use --skip-oversize to drop such requests")
    ids, arr = trace.request_id.tolist(), trace.arrival_s.tolist()
    prompt, output = trace.num_prompt_tokens.tolist(), trace.num_output_tokens.tolist()
    priority = optional["priority"].tolist() if optional["priority"] is not None else None
    slo_ttft = _optional_floats(optional["slo_ttft_ms"])
    slo_tpot = _optional_floats(optional["slo_tpot_ms"])
    requests = [Request(ids[i], arr[i], prompt[i], output[i],
                        priority=int(priority[i]) if priority else 0,
                        slo_ttft_ms=slo_ttft[i] if slo_ttft else None,
                        slo_tpot_ms=slo_tpot[i] if slo_tpot else None)
                for i in np.flatnonzero(keep).tolist()]
    return requests, int((~keep).sum())


def _optional_floats(column) -> list | None:
    if column is None:
        return None
    return [None if not math.isfinite(v) else float(v) for v in np.asarray(column, dtype=np.float64).tolist()]
