"""Sarathi-Serve: decode-first, chunked prefill with a fixed chunk size as the per-step token budget."""
from __future__ import annotations

from stepcal.simulator.request import Request
from stepcal.simulator.schedulers.vllm import VllmScheduler


class SarathiScheduler(VllmScheduler):
    """Stall-free batching: every step first carries all decodes, then continues running prefills, then
    admits new requests, each prefill chunked to what is left of the budget. The budget is
    `chunk_size` (bounded by max_num_batched_tokens when that is given).
    """
    name = "sarathi"

    def __init__(self, block_manager, config=None) -> None:
        super().__init__(block_manager, config)
        cap = self.config.max_num_batched_tokens
        self.token_budget = min(self.config.chunk_size, cap) if cap else self.config.chunk_size

    def _plan(self, now_s: float) -> list[tuple[Request, int]]:
        schedule_running = self._schedule_running if self.verifier is None else self._schedule_running_spec
        scheduled, budget, preempted = schedule_running(decode_first(self.running), self.token_budget)
        if not preempted:
            scheduled += self._admit_waiting(budget)
        return scheduled


def decode_first(running: list[Request]) -> list[Request]:
    """Running requests with decodes (one pending token) first, each group in running order."""
    decodes, prefills = [], []
    for r in running:
        (decodes if r.num_prompt_tokens + r.num_generated_tokens - r.num_computed_tokens == 1
         else prefills).append(r)
    return decodes + prefills if prefills else decodes
