"""Static batching: a batch is formed when the engine is idle and runs until every member finishes."""
from __future__ import annotations

from stepcal.core.batch import StepBatch
from stepcal.simulator.request import Request, Status
from stepcal.simulator.schedulers.base import SchedulerBase


class StaticScheduler(SchedulerBase):
    """FasterTransformer-style: prefill the whole batch in one step, then decode until all are done.

    No request joins a running batch; a request preempted for lack of KV waits for the next batch.
    `max_num_batched_tokens`, when given, bounds the prompt tokens of the prefill step.
    """
    name = "static"
    default_max_batched_tokens = None

    def _plan(self, now_s: float) -> list[tuple[Request, int]]:
        if not self.running:
            return self._admit_whole_prompts()
        scheduled = []
        for request in list(self.running):
            if request.status is not Status.RUNNING:
                continue   # preempted earlier in this loop
            if self._reserve_or_preempt(request, 1):
                scheduled.append((request, request.num_pending_tokens))
        return scheduled

    def _may_admit(self, batch: StepBatch) -> bool:
        return False   # nobody joins a running batch
