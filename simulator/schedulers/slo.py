"""The SLO-aware policy of the seeds: urgency-ranked admission, adaptive batch size, eager vs batch mode."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stepcal.core.batch import StepBatch
from stepcal.simulator.request import Request
from stepcal.simulator.schedulers.sarathi import decode_first
from stepcal.simulator.schedulers.vllm import VllmScheduler


@dataclass
class SloSettings:
    ls_ttft_threshold_ms: float = 1000.0   # a request whose TTFT SLO is at most this is latency-sensitive
    ls_max_latency_s: float = 1.0          # default max latency of a latency-sensitive request
    tp_max_latency_s: float = 10.0         # ... and of a throughput request
    ls_weight: float = 1.0                 # head start of latency-sensitive requests in the score
    eager_max_queue: int = 4               # eager mode while the queue is this short ...
    eager_max_wait_s: float = 0.25         # ... and its average wait this small
    base_num_seqs: int = 32                # adaptive batch size starts here


class SloScheduler(VllmScheduler):
    """Requests are latency-sensitive (priority > 0, or a tight TTFT SLO) or throughput-oriented.

    Waiting requests are admitted by score = class weight + urgency, with urgency = wait / max latency.
    Eager mode (short queue, small waits): decode-first steps with small prefill chunks (chunk_size),
    which keeps TPOT low. Batch mode (a queue builds up): the full token budget, for throughput.
    The batch size limit adapts: base + queue length + base · (average wait / latency-sensitive max latency),
    capped by max_num_seqs.
    """
    name = "slo"
    supports_spec_decode = False   # its own plan: drafts are not scheduled

    def __init__(self, block_manager, config=None, settings: SloSettings | None = None) -> None:
        super().__init__(block_manager, config)
        self.settings = settings or SloSettings()
        self.mode = "eager"
        self.num_mode_switches = 0

    def is_latency_sensitive(self, request: Request) -> bool:
        slo = request.slo_ttft_ms
        return request.priority > 0 or (slo is not None and slo <= self.settings.ls_ttft_threshold_ms)

    def score(self, request: Request, now_s: float) -> float:
        ls = self.is_latency_sensitive(request)
        if request.slo_ttft_ms is not None:
            max_latency_s = request.slo_ttft_ms / 1000.0
        else:
            max_latency_s = self.settings.ls_max_latency_s if ls else self.settings.tp_max_latency_s
        urgency = (now_s - request.arrival_s) / max_latency_s
        return (self.settings.ls_weight if ls else 0.0) + urgency

    def _plan(self, now_s: float) -> list[tuple[Request, int]]:
        s = self.settings
        queue_len = len(self.waiting)
        avg_wait_s = sum(now_s - r.arrival_s for r in self.waiting) / queue_len if queue_len else 0.0
        mode = "eager" if queue_len <= s.eager_max_queue and avg_wait_s <= s.eager_max_wait_s else "batch"
        if mode != self.mode:
            self.mode, self.num_mode_switches = mode, self.num_mode_switches + 1
        adaptive = s.base_num_seqs + queue_len + round(s.base_num_seqs * avg_wait_s / s.ls_max_latency_s)
        self.max_seqs_now = min(self.config.max_num_seqs, adaptive)
        full_budget = self.config.max_num_batched_tokens or self.default_max_batched_tokens
        budget = min(self.config.chunk_size, full_budget) if mode == "eager" else full_budget
        if queue_len > 1:
            self.waiting = deque(sorted(self.waiting, key=lambda r: -self.score(r, now_s)))
        scheduled, budget, preempted = self._schedule_running(decode_first(self.running), budget)
        if not preempted:
            scheduled += self._admit_waiting(budget, self.max_seqs_now)
        return scheduled

    def _may_admit(self, batch: StepBatch) -> bool:
        return bool(self.waiting)   # scores and modes move with time: never fast-forward past a queue
