"""vLLM v1 style: one token budget per step, running requests first, then waiting ones; chunked prefill."""
from __future__ import annotations

from stepcal.simulator.request import Request, Status
from stepcal.simulator.schedulers.base import SchedulerBase
from stepcal.simulator.schedulers.spec import SpecDecodeMixin


class VllmScheduler(SpecDecodeMixin, SchedulerBase):
    """Each running request, in order, gets min(its pending tokens, budget left); when its KV does not
    fit, the newest running requests are preempted. Then waiting requests are admitted in FCFS order
    with chunks of the remaining budget, unless this step preempted someone.
    """
    name = "vllm"

    def _plan(self, now_s: float) -> list[tuple[Request, int]]:
        schedule_running = self._schedule_running if self.verifier is None else self._schedule_running_spec
        scheduled, budget, preempted = schedule_running(self.running, self.token_budget)
        if not preempted:
            scheduled += self._admit_waiting(budget)
        return scheduled

    def _schedule_running(self, candidates: list[Request], budget: int):
        """Give each candidate (a running request) its tokens, in order; preempt on KV shortage.

        Written for speed: this loop runs once per request per step."""
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        block_size = self.kv.block_size
        running = Status.RUNNING
        for request in candidates:
            if budget <= 0:
                break
            if request.status is not running:
                continue   # preempted by an earlier candidate
            n = request.num_prompt_tokens + request.num_generated_tokens - request.num_computed_tokens
            n = min(n, budget)
            if request.num_computed_tokens + n > request.num_blocks * block_size:
                before = self.num_preemptions
                ok = self._reserve_or_preempt(request, n)
                preempted |= self.num_preemptions != before
                if not ok:
                    break   # the candidate was the newest left: everyone after it is gone too
            scheduled.append((request, n))
            budget -= n
        return scheduled, budget, preempted

    def _admit_waiting(self, budget: int, max_num_seqs: int | None = None):
        """Admit waiting requests in queue order, each with a chunk of what is left of the budget."""
        max_num_seqs = max_num_seqs or self.config.max_num_seqs
        scheduled = []
        while self.waiting and budget > 0 and len(self.running) < max_num_seqs:
            request = self.waiting[0]
            hit = self.kv.lookup(request)
            n = min(request.num_pending_tokens - self._hit_tokens(hit), budget)
            if not self.kv.allocate(request, n, hit):
                break
            self._admit(request, hit)
            scheduled.append((request, n))
            budget -= n
        return scheduled
