"""The aggregated simulation: arrivals routed over identical replicas, each timed by a StepTimeModel.

Events (simulator.events) are keyed (time_s, priority, seq): at equal times arrivals come first,
then step completions, then wake-ups of idle replicas (so requests arriving together start together).
Between arrivals, a run of decode-only steps that changes nothing but KV lengths is advanced in
one vectorised move (simulator.replica); `fast_path=False` takes every step one by one and gives
the same logs.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.metrics import prefix_cache_summary, summarize
from stepcal.core.trace import Trace
from stepcal.simulator.client import Release, Timeout, count_timeouts, link_turns
from stepcal.simulator.events import ARRIVAL, EventLoop, paused_gc
from stepcal.simulator.frontend import FrontEnd, entry_order, path_of
from stepcal.simulator.kv_cache import blocks_for, uses_prefix_caching
from stepcal.simulator.logs import request_log
from stepcal.simulator.prefix_cache import key_answers
from stepcal.simulator.replica import Replica, ReplicaSettings, itl_arrays, steps_table
from stepcal.simulator.request import make_requests
from stepcal.simulator.router import make_router
from stepcal.simulator.schedulers import SchedulerConfig
from stepcal.simulator.spec_decode import merge_summaries


@dataclass
class SimConfig:
    scheduler: str = "vllm"
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    block_size: int = 16
    kv_blocks: int | None = None          # None: as many as the whole trace could ever need
    num_replicas: int = 1
    router: str = "round-robin"
    step_overhead_ms: float = 0.0         # host time added to every step
    front_end: FrontEnd = field(default_factory=FrontEnd)   # request path before the scheduler (TTFT, E2E)
    front_end_seed: int = 0               # seeds the front end's per-request draws
    fast_path: bool = True
    record_batches: bool = True           # keep each step's q_lens / kv_lens in the step log
    skip_oversize: bool = False
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    prefix_caching: bool | None = None    # None: the scheduler's default (on for vllm)
    timeout_s: float | None = None        # client timeout of requests whose trace gives none
    scatter: object = None                # simulator.scatter.Scatter: step-to-step scatter (ranges)
    scatter_seed: int = 0

    @property
    def uses_prefix_caching(self) -> bool:
        return uses_prefix_caching(self.scheduler, self.prefix_caching)


@dataclass
class SimResult:
    requests: object          # DataFrame, the request log
    steps_table: object       # pyarrow Table, the step log (written to Parquet as it is)
    summary: dict
    itl_s: np.ndarray
    itl_weights: np.ndarray
    num_skipped: int
    wall_s: float

    @cached_property
    def steps(self):
        """The step log as a DataFrame, built on first use (writing it needs only the table)."""
        return self.steps_table.to_pandas()


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
        spec_decode = config.scheduler_config.spec_decode
        if spec_decode is not None:   # an acceptance trace must cover every request
            spec_decode.acceptance.check_requests([r.request_id for r in self.requests])
        if self.prefix_caching:
            key_answers(trace, self.requests, config.block_size)   # a turn's answer: its next turn's prefix
        # When each request reaches the scheduler: its arrival plus the request path (simulator.frontend).
        self.front_end = config.front_end
        self.reads_load = config.front_end.reads_load   # read per arrival and per planned run: a plain bool
        self.path_s = config.front_end.paths_s(self.requests, config.front_end_seed)
        self.num_active = 0            # requests sent and not yet finished or given up (load-dependent paths)
        self.pending_entries_s: list[float] = []   # a heap: when pushed requests reach the scheduler
        if self.reads_load:
            # the delay is known only at the arrival: the trace's arrivals are the clients' send times
            arrival_s = [r.arrival_s for r in self.open_requests]
        else:   # open_requests is put in the order they reach the scheduler
            self.open_requests, arrival_s = entry_order(self.open_requests, self.path_s)
        self.loop = EventLoop(arrival_s, self._on_arrival)
        # an unlimited cache holds every request at its largest, lookahead slots of its drafts included
        lookahead = spec_decode.num_lookahead_tokens if spec_decode is not None else 0
        self.num_blocks = config.kv_blocks or max(1, sum(blocks_for(r.max_kv_tokens + lookahead, config.block_size)
                                                         for r in self.requests))
        self.router = make_router(config.router)
        # Without prefix ids nothing can be reused: the counting manager does the same, faster.
        self.reuses_prefixes = self.prefix_caching and trace.prefix_hash_ids is not None
        settings = ReplicaSettings(config.scheduler, config.scheduler_config, self.num_blocks, config.block_size,
                                   config.step_overhead_ms, config.record_batches, self.reuses_prefixes,
                                   config.scatter, config.scatter_seed)
        has_turns = len(self.open_requests) < len(self.requests)
        pushes_entries = has_turns or self.reads_load   # requests enter by pushed events
        # A router that reads the replicas' state must see it up to date when a pushed request enters;
        # the decode runs apply their steps only at their end, so such runs are off then.
        plan_runs = config.fast_path and not (pushes_entries and self.router.reads_state)
        self.replicas = [Replica(self.loop, i, settings, step_model, plan_runs=plan_runs,
                                 run_horizon=self._run_horizon,
                                 on_finished=self.end_requests if pushes_entries else None)
                         for i in range(config.num_replicas)]
        self.schedulers = [r.scheduler for r in self.replicas]

    def run(self, progress: bool = False) -> SimResult:
        """Simulate to the end; `progress` shows a bar over arrivals on stderr."""
        with paused_gc():
            wall0 = time.perf_counter()
            self.loop.run(progress)
            return self._result(time.perf_counter() - wall0)

    def _on_arrival(self, i: int, now_s: float) -> None:
        if self.reads_load:
            self.enter_front_end(self.open_requests[i], now_s)
        else:
            self.send(self.open_requests[i], now_s)

    def enter_front_end(self, request, now_s: float) -> None:
        """The client sends `request` at now_s: it reaches the router after its path, which grows with
        the streams already active (a pushed entry, which cuts decode runs planned past it)."""
        path_s = path_of(self.path_s, request) + self.front_end.per_stream_ms * self.num_active / 1000.0
        self.num_active += 1
        heapq.heappush(self.pending_entries_s, now_s + path_s)
        self.loop.push(now_s + path_s, ARRIVAL, Entry(self, request))

    def send(self, request, now_s: float, cut_runs: bool = False) -> None:
        """A request reaches the router at now_s (its arrival plus the request path). A turn released
        during a decode run cuts the runs there (trace arrivals bound the runs when they are planned)."""
        if request.timeout_s is not None:
            deadline_s = request.arrival_s + request.timeout_s
            if deadline_s <= now_s:   # gave up on the request path
                request.give_up()
                self.end_requests([request], deadline_s)
                return
            self.loop.push(deadline_s, ARRIVAL, Timeout(self, request))
        if cut_runs:
            for replica in self.replicas:
                replica.cut_run(now_s)
        index = self.router.pick(self.schedulers)
        self.replicas[index].add(request, now_s)

    def end_requests(self, done, now_s: float) -> None:
        """Requests done at now_s (finished, or given up on): they stop counting as active streams, and
        each closed-loop turn among them sends its session's next one a think time later."""
        self.num_active -= len(done)
        reads_load = self.reads_load
        for request in done:
            turn = request.next_turn
            if turn is not None:
                turn.arrival_s = now_s + turn.think_time_s
                if reads_load:
                    self.loop.push(turn.arrival_s, ARRIVAL, Sent(self, turn))
                else:
                    self.loop.push(turn.arrival_s + path_of(self.path_s, turn), ARRIVAL, Release(self, turn))

    def _run_horizon(self) -> tuple[float, bool]:
        """A decode run ends at the next arrival. It may include the step in flight then, since
        nothing reads the replica's state at an arrival, unless the router does.

        Behind a load-dependent front end the next request to reach the scheduler is the earliest
        entry already pushed; a send does not bound the run (it reads only the count of requests done,
        and a run's requests finish at its end), and an entry it pushes inside the run cuts it."""
        if not self.reads_load:
            return self.loop.next_arrival_s(), not self.router.reads_state
        pending = self.pending_entries_s
        return (pending[0] if pending else math.inf), not self.router.reads_state

    def _result(self, wall_s: float) -> SimResult:
        requests = request_log(self.requests)
        steps = steps_table(self.replicas)
        itl_s, itl_w = itl_arrays(self.replicas)
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update(prefix_cache_summary(requests, [r.kv for r in self.replicas], self.prefix_caching,
                                            self.reuses_prefixes))
        summary["num_timeouts"] = count_timeouts(self.requests)
        summary["spec_decode"] = merge_summaries([s.verifier.summary() for s in self.schedulers
                                                  if s.verifier is not None])
        summary["mean_tokens_per_step"] = (float(steps.column("num_tokens").to_numpy().sum()) / steps.num_rows
                                           if steps.num_rows else None)
        summary.update({"num_skipped": self.num_skipped, "num_steps": steps.num_rows,
                        "kv_blocks": self.num_blocks, "block_size": self.config.block_size,
                        "num_replicas": self.config.num_replicas, "scheduler": self.config.scheduler})
        return SimResult(requests, steps, summary, itl_s, itl_w, self.num_skipped, wall_s)


@dataclass(slots=True, eq=False)
class Entry:
    """A request behind a load-dependent front end reaches the router (the earliest pending entry)."""
    sim: Simulation
    request: object

    def fire(self, now_s: float) -> None:
        heapq.heappop(self.sim.pending_entries_s)
        self.sim.send(self.request, now_s, cut_runs=True)


@dataclass(slots=True, eq=False)
class Sent:
    """A closed-loop turn leaves its client and enters a load-dependent front end."""
    sim: Simulation
    request: object

    def fire(self, now_s: float) -> None:
        self.sim.enter_front_end(self.request, now_s)


def simulate(trace: Trace, step_model, config: SimConfig | None = None) -> SimResult:
    return Simulation(trace, step_model, config or SimConfig()).run()
