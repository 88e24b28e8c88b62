"""Static batching: a batch is formed when the engine is idle and runs until every member finishes."""
from __future__ import annotations

from simulator.batch import StepBatch
from simulator.request import Status
from simulator.schedulers.base import SchedulerBase


class StaticScheduler(SchedulerBase):
    """FasterTransformer-style: prefill the whole batch in one step, then decode until all are done.

    No request joins a running batch; a request preempted for lack of KV waits for the next batch.
    `max_num_batched_tokens`, when given, bounds the prompt tokens of the prefill step.
    """
    name = "static"
    default_max_batched_tokens = None

    def schedule(self, now_s: float) -> StepBatch | None:
        if not self.running:
            return self._batch(self._form_batch())
        scheduled = []
        for request in list(self.running):
            if request.status is not Status.RUNNING:
                continue   # preempted earlier in this loop
            if self._reserve_or_preempt(request, 1):
                scheduled.append((request, request.num_pending_tokens))
        return self._batch(scheduled)

    def _form_batch(self):
        scheduled, num_tokens = [], 0
        budget = self.token_budget
        while self.waiting and len(scheduled) < self.config.max_num_seqs:
            request = self.waiting[0]
            n = request.num_pending_tokens
            if scheduled and budget is not None and num_tokens + n > budget:
                break
            if not self.kv.allocate(request, n):
                break
            self._admit(request)
            scheduled.append((request, n))
            num_tokens += n
        return scheduled

    def _may_admit(self, batch: StepBatch) -> bool:
        return False   # nobody joins a running batch
