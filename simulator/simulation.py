"""The aggregated simulation: arrivals routed over identical replicas, each timed by a StepTimeModel.

Events (simulator.events) are keyed (time_s, priority, seq): at equal times arrivals come first,
then step completions, then wake-ups of idle replicas (so requests arriving together start together).
Between arrivals, a run of decode-only steps that changes nothing but KV lengths is advanced in
one vectorised move (simulator.replica); `fast_path=False` takes every step one by one and gives
the same logs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from simulator.client import Release, Timeout, count_timeouts, link_turns
from simulator.errors import InputError
from simulator.events import ARRIVAL, EventLoop, paused_gc
from simulator.kv_cache import blocks_for, uses_prefix_caching
from simulator.logs import request_log
from simulator.metrics import prefix_cache_summary, summarize
from simulator.prefix_cache import key_answers
from simulator.replica import Replica, ReplicaSettings, itl_arrays, steps_frame
from simulator.request import make_requests
from simulator.router import make_router
from simulator.schedulers import SchedulerConfig
from simulator.trace import Trace


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
    prefix_caching: bool | None = None    # None: the scheduler's default (on for vllm)
    timeout_s: float | None = None        # client timeout of requests whose trace gives none
    scatter: object = None                # simulator.ranges.Scatter: step-to-step scatter (ranges)
    scatter_seed: int = 0

    @property
    def uses_prefix_caching(self) -> bool:
        return uses_prefix_caching(self.scheduler, self.prefix_caching)


@dataclass
class SimResult:
    requests: object          # DataFrame, the request log
    steps: object             # DataFrame, the step log
    summary: dict
    itl_s: np.ndarray
    itl_weights: np.ndarray
    num_skipped: int
    wall_s: float


class Simulation:
    def __init__(self, trace: Trace, step_model, config: SimConfig) -> None:
        if config.num_replicas < 1:
            raise InputError(f"--replicas must be at least 1, got {config.num_replicas}")
        self.model = step_model
        self.config = config
        self.prefix_caching = config.uses_prefix_caching
        self.requests, self.num_skipped = make_requests(trace, config.block_size, config.kv_blocks,
                                                         config.skip_oversize, self.prefix_caching, config.timeout_s)
        self.open_requests = link_turns(trace, self.requests)   # the others follow a previous turn
        if self.prefix_caching:
            key_answers(trace, self.requests, config.block_size)   # a turn's answer: its next turn's prefix
        self.request_path_s = config.request_overhead_ms / 1000.0
        # when each request reaches the scheduler: its arrival plus the request path
        arrival_s = np.array([r.arrival_s for r in self.open_requests], dtype=np.float64)
        if self.request_path_s:
            arrival_s = arrival_s + self.request_path_s
        self.loop = EventLoop(arrival_s.tolist(), self._on_arrival)
        self.num_blocks = config.kv_blocks or max(1, sum(blocks_for(r.max_kv_tokens, config.block_size)
                                                         for r in self.requests))
        self.router = make_router(config.router)
        # Without prefix ids nothing can be reused: the counting manager does the same, faster.
        self.reuses_prefixes = self.prefix_caching and trace.prefix_hash_ids is not None
        settings = ReplicaSettings(config.scheduler, config.scheduler_config, self.num_blocks, config.block_size,
                                   config.step_overhead_ms, config.record_batches, self.reuses_prefixes,
                                   config.scatter, config.scatter_seed)
        has_turns = len(self.open_requests) < len(self.requests)
        # A router that reads the replicas' state must see it up to date when a turn is released; the
        # decode runs apply their steps only at their end, so such runs are off for closed loops.
        plan_runs = config.fast_path and not (has_turns and self.router.reads_state)
        self.replicas = [Replica(self.loop, i, settings, step_model, plan_runs=plan_runs,
                                 run_horizon=self._run_horizon,
                                 on_finished=self.release_next_turns if has_turns else None)
                         for i in range(config.num_replicas)]
        self.schedulers = [r.scheduler for r in self.replicas]

    def run(self, progress: bool = False) -> SimResult:
        """Simulate to the end; `progress` shows a bar over arrivals on stderr."""
        with paused_gc():
            wall0 = time.perf_counter()
            self.loop.run(progress)
            return self._result(time.perf_counter() - wall0)

    def _on_arrival(self, i: int, now_s: float) -> None:
        self.send(self.open_requests[i], now_s)

    def send(self, request, now_s: float, cut_runs: bool = False) -> None:
        """A request reaches the router at now_s (its arrival plus the request path). A turn released
        during a decode run cuts the runs there (trace arrivals bound the runs when they are planned)."""
        if request.timeout_s is not None:
            deadline_s = request.arrival_s + request.timeout_s
            if deadline_s <= now_s:   # gave up on the request path
                request.give_up()
                self.release_next_turns([request], deadline_s)
                return
            self.loop.push(deadline_s, ARRIVAL, Timeout(self, request))
        if cut_runs:
            for replica in self.replicas:
                replica.cut_run(now_s)
        index = self.router.pick(self.schedulers)
        self.replicas[index].add(request, now_s)

    def release_next_turns(self, done, now_s: float) -> None:
        """Each closed-loop turn done at now_s (finished, or given up on) sends its session's next
        one a think time later."""
        for request in done:
            turn = request.next_turn
            if turn is not None:
                turn.arrival_s = now_s + turn.think_time_s
                self.loop.push(turn.arrival_s + self.request_path_s, ARRIVAL, Release(self, turn))

    def _run_horizon(self) -> tuple[float, bool]:
        """A decode run ends at the next arrival. It may include the step in flight then, since
        nothing reads the replica's state at an arrival, unless the router does."""
        return self.loop.next_arrival_s(), not self.router.reads_state

    def _result(self, wall_s: float) -> SimResult:
        requests = request_log(self.requests)
        steps = steps_frame(self.replicas)
        itl_s, itl_w = itl_arrays(self.replicas)
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update(prefix_cache_summary(requests, [r.kv for r in self.replicas], self.prefix_caching,
                                            self.reuses_prefixes))
        summary["num_timeouts"] = count_timeouts(self.requests)
        summary.update({"num_skipped": self.num_skipped, "num_steps": len(steps),
                        "kv_blocks": self.num_blocks, "block_size": self.config.block_size,
                        "num_replicas": self.config.num_replicas, "scheduler": self.config.scheduler})
        return SimResult(requests, steps, summary, itl_s, itl_w, self.num_skipped, wall_s)


def simulate(trace: Trace, step_model, config: SimConfig | None = None) -> SimResult:
    return Simulation(trace, step_model, config or SimConfig()).run()
