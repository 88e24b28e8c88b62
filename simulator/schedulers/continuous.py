"""Continuous batching, Orca / vLLM v0 style: iteration-level, prefill-prioritised."""
from __future__ import annotations

from stepcal.core.batch import StepBatch
from stepcal.simulator.request import Request, Status
from stepcal.simulator.schedulers.base import SchedulerBase


class ContinuousScheduler(SchedulerBase):
    """Each iteration: if waiting requests can be admitted, run a prefill-only step of as many as fit
    (max_num_seqs, max_num_batched_tokens, KV blocks for their whole prompt); otherwise one decode
    step over every running request, preempting the newest when the KV cache is full.

    A prompt longer than the token budget is admitted alone rather than rejected.
    """
    name = "continuous"

    def _plan(self, now_s: float) -> list[tuple[Request, int]]:
        prefills = self._admit_whole_prompts()
        if prefills:
            return prefills
        scheduled = []
        for request in list(self.running):
            if request.status is not Status.RUNNING:
                continue   # preempted earlier in this loop
            if self._reserve_or_preempt(request, 1):
                scheduled.append((request, 1))
        return scheduled

    def _may_admit(self, batch: StepBatch) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        head = self.waiting[0]
        return self.kv.admission_blocks(head, head.num_pending_tokens) <= self.kv.num_free_blocks
