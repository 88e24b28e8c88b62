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
Both pools run on the simulator's event core and replica driver (simulator.events, simulator.replica),
as the aggregated simulation does. Decode runs (many identical decode steps advanced in one move)
are planned optimistically and cut back when a KV transfer lands on the replica, which gives the same
logs as stepping one by one; `fast_path=False` steps one by one.

The request path (simulator.frontend: HTTP, tokenisation, hand-over to the engine) is the
deployment's, paid once per request before the prefill pool sees it: the client talks to one API
server (or proxy), which hands the request to a prefill replica. Its load-dependent part counts the
streams active in the whole deployment when the request is sent (sent, and not yet finished by the
decode pool, or by the prefill pool for a one-token request). A pool's per-step host time is part of
that pool's step model (simulator.step_model.HostTermsModel), so each pool pays its own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.metrics import distribution, summarize
from stepcal.core.trace import Trace
from stepcal.simulator.events import ARRIVAL, EventLoop, paused_gc
from stepcal.simulator.frontend import FrontEnd, entry_order, path_of
from stepcal.simulator.kv_cache import blocks_for
from stepcal.simulator.logs import request_log
from stepcal.simulator.replica import Replica, ReplicaSettings, itl_arrays, steps_table
from stepcal.simulator.request import Request, make_requests
from stepcal.simulator.router import make_router
from stepcal.simulator.schedulers import ScheduledStep, SchedulerConfig
from stepcal.simulator.simulation import SimResult


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
    front_end: FrontEnd = field(default_factory=FrontEnd)   # the request path before the prefill pool
    front_end_seed: int = 0                                  # seeds its per-request draws

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


@dataclass(slots=True, eq=False)
class _Handoff:
    """A request between the pools: the prefill-side request and its decode-side twin."""
    final: Request              # what the request log reports (decode side, or the whole request if 1 token)
    prefill_replica: int
    prefill_end_s: float | None = None
    kv_ready_s: float | None = None
    transfer_ms: float | None = None


@dataclass(slots=True, eq=False)
class _KvReady:
    """The prompt's KV cache lands at the decode pool."""
    simulation: DisaggSimulation
    request: Request

    def fire(self, now_s: float) -> None:
        self.simulation._on_kv_ready(self.request, now_s)


class DisaggSimulation:
    """A prefill pool and a decode pool driven by one event loop; `run()` returns a SimResult."""

    def __init__(self, trace: Trace, prefill_model, decode_model, config: DisaggConfig) -> None:
        # Prefix caching, closed-loop turns and timeouts are modelled for aggregated replicas only.
        for column in ("think_time_s", "timeout_s"):
            if getattr(trace, column) is not None:
                raise InputError(f"{trace.source}: column {column}: closed-loop sessions and client timeouts "
                                 f"are simulated for aggregated replicas only, not disaggregated pools")
        self.config = config
        limits = [b for b in (config.prefill.kv_blocks, config.decode.kv_blocks) if b is not None]
        originals, self.num_skipped = make_requests(trace, config.block_size, min(limits) if limits else None,
                                                    config.skip_oversize)
        self.originals = originals
        # When each request reaches the prefill pool: its arrival plus the request path.
        self.front_end = config.front_end
        self.reads_load = config.front_end.reads_load
        self.path_s = config.front_end.paths_s(originals, config.front_end_seed)
        self.num_active = 0        # requests sent and not yet finished (the load-dependent path reads it)
        if self.reads_load:   # a request enters at its send time: its delay is known only then
            self.entering, entry_s = list(originals), [r.arrival_s for r in originals]
        else:
            self.entering, entry_s = entry_order(originals, self.path_s)
        self.loop = EventLoop(entry_s, self._on_arrival)
        bs = config.block_size
        prefill_blocks = config.prefill.kv_blocks or max(1, sum(blocks_for(r.num_prompt_tokens, bs) for r in originals))
        decode_blocks = config.decode.kv_blocks or max(1, sum(blocks_for(r.max_kv_tokens, bs) for r in originals))
        self.prefill_router = make_router(config.prefill.router)
        self.decode_router = make_router(config.decode.router)
        # Runs are cut back when a transfer lands; a router that reads replica state would read stale counters.
        decode_runs = config.fast_path and not self.decode_router.reads_state
        self.prefill = [Replica(self.loop, i, self._settings(config.prefill, prefill_blocks), prefill_model,
                                plan_runs=False, pool="prefill", on_finished=self._on_prefilled)
                        for i in range(config.prefill.num_replicas)]
        self.decode = [Replica(self.loop, i, self._settings(config.decode, decode_blocks), decode_model,
                               plan_runs=decode_runs, pool="decode", on_step_start=_emit_first_tokens,
                               on_finished=self._on_decoded)
                       for i in range(config.decode.num_replicas)]
        self.handoffs: dict[int, _Handoff] = {}

    def _settings(self, pool: PoolConfig, num_blocks: int) -> ReplicaSettings:
        c = self.config
        return ReplicaSettings(pool.scheduler, pool.scheduler_config, num_blocks, c.block_size,
                               c.step_overhead_ms, c.record_batches)

    def run(self) -> SimResult:
        with paused_gc():
            wall0 = time.perf_counter()
            self.loop.run()
            return self._result(time.perf_counter() - wall0)

    def _on_arrival(self, i: int, now_s: float) -> None:
        original = self.entering[i]
        if self.reads_load:   # the client sends it now: its path grows with the streams already active
            path_s = path_of(self.path_s, original) + self.front_end.per_stream_ms * self.num_active / 1000.0
            self.num_active += 1
            self.loop.push(now_s + path_s, ARRIVAL, _Entry(self, original))
        else:
            self.num_active += 1
            self._enter(original, now_s)

    def _enter(self, original: Request, now_s: float) -> None:
        """The request reaches the prefill pool (its arrival plus the request path)."""
        index = self.prefill_router.pick([r.scheduler for r in self.prefill])
        prefill_side = Request(original.request_id, original.arrival_s, original.num_prompt_tokens, 1,
                               priority=original.priority, slo_ttft_ms=original.slo_ttft_ms,
                               slo_tpot_ms=original.slo_tpot_ms)
        self.handoffs[original.request_id] = _Handoff(original, index)
        self.prefill[index].add(prefill_side, now_s)

    def _on_prefilled(self, finished: list[Request], now_s: float) -> None:
        """The prefill pool emitted the first tokens: send each KV cache to the decode pool."""
        for prefill_side in finished:
            self._hand_off(prefill_side, now_s)

    def _hand_off(self, prefill_side: Request, now_s: float) -> None:
        handoff = self.handoffs[prefill_side.request_id]
        original = handoff.final
        handoff.prefill_end_s = now_s
        if original.num_output_tokens == 1:   # nothing to decode: the token goes out now
            self.num_active -= 1
            original.first_token_s = original.last_token_s = original.finish_s = now_s
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
        self.loop.push(now_s + handoff.transfer_ms / 1000.0, ARRIVAL, _KvReady(self, decode_side))

    def _on_decoded(self, finished: list[Request], now_s: float) -> None:
        self.num_active -= len(finished)

    def _on_kv_ready(self, request: Request, now_s: float) -> None:
        """The KV cache landed: the request queues at a decode replica with its prompt cached."""
        self.handoffs[request.request_id].kv_ready_s = now_s
        replica = self.decode[self.decode_router.pick([r.scheduler for r in self.decode])]
        replica.cut_run(now_s)
        replica.add(request, now_s)

    # -- results ---------------------------------------------------------------------------------
    def _result(self, wall_s: float) -> SimResult:
        import pandas as pd  # lazy: loads pandas
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
        steps = steps_table(self.prefill + self.decode, with_pool=True)
        itl_s, itl_w = itl_arrays(self.decode)
        summary = summarize(requests, itl_s, itl_w, self.config.slo_ttft_ms, self.config.slo_tpot_ms)
        summary.update({
            "num_skipped": self.num_skipped, "num_steps": steps.num_rows, "block_size": self.config.block_size,
            "num_replicas": self.config.num_replicas, "num_prefill_replicas": self.config.prefill.num_replicas,
            "num_decode_replicas": self.config.decode.num_replicas,
            "scheduler": f"{self.config.prefill.scheduler}/{self.config.decode.scheduler}",
            "kv_transfer_ms": distribution(requests["kv_transfer_ms"].to_numpy()),
        })
        return SimResult(requests, steps, summary, itl_s, itl_w, self.num_skipped, wall_s)


@dataclass(slots=True, eq=False)
class _Entry:
    """A request behind a load-dependent request path reaches the prefill pool."""
    simulation: DisaggSimulation
    request: Request

    def fire(self, now_s: float) -> None:
        self.simulation._enter(self.request, now_s)


def _emit_first_tokens(step: ScheduledStep, now_s: float) -> None:
    """At a decode replica, a request's first decode step is when its first token (computed by the
    prefill pool, travelling with the KV cache) goes out to the client."""
    for request in step.requests:
        if request.first_token_s is None:
            request.first_token_s = request.last_token_s = now_s


def _floats(values) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def simulate_disaggregated(trace: Trace, prefill_model, decode_model, config: DisaggConfig) -> SimResult:
    return DisaggSimulation(trace, prefill_model, decode_model, config).run()
