"""Speculative decoding in a token-budget scheduler (vllm, sarathi): drafts scheduled with each
decode, their KV and lookahead slots reserved or trimmed, and the verification's results applied.
The mechanics are simulator.spec_decode's; this mixin puts them into SchedulerBase's contract."""
from __future__ import annotations

from stepcal.simulator.request import Request, Status


class SpecDecodeMixin:
    """For a SchedulerBase whose policy gives running requests their tokens in order."""
    supports_spec_decode = True

    def _schedule_running_spec(self, candidates: list[Request], budget: int):
        """_schedule_running with drafts: a decoding request brings 1 + d tokens, d = k trimmed by the
        budget, by the outputs it has left, and by the KV cache (before anyone is preempted)."""
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        block_size = self.kv.block_size
        running = Status.RUNNING
        config = self.verifier.config
        k, lookahead = config.num_draft_tokens, config.num_lookahead_tokens
        for request in candidates:
            if budget <= 0:
                break
            if request.status is not running:
                continue   # preempted by an earlier candidate
            n = request.num_prompt_tokens + request.num_generated_tokens - request.num_computed_tokens
            drafts = extra = 0
            if n == 1 and request.num_generated_tokens:   # decoding: its drafts exist
                drafts = min(k, budget - 1, request.num_output_tokens - request.num_generated_tokens - 1)
                extra = lookahead if drafts > 0 else 0
            n = min(n, budget)
            if request.num_computed_tokens + n + drafts + extra > request.num_blocks * block_size:
                drafts, extra = self._fit_drafts(request, n, drafts, extra)
                if request.num_computed_tokens + n + drafts > request.num_blocks * block_size:
                    before = self.num_preemptions
                    ok = self._reserve_or_preempt(request, n)
                    preempted |= self.num_preemptions != before
                    if not ok:
                        break   # the candidate was the newest left: everyone after it is gone too
            request.num_scheduled_drafts = drafts
            scheduled.append((request, n + drafts))
            budget -= n + drafts
        return scheduled, budget, preempted

    def _fit_drafts(self, request: Request, n: int, drafts: int, extra: int) -> tuple[int, int]:
        """Reserve n tokens, the drafts and the lookahead slots; where the free blocks cannot hold them
        all, lookahead slots go first, then drafts. (0, 0) and nothing reserved when even the drafts'
        first token cannot be added to the n tokens (the caller then reserves n, preempting if need be)."""
        if self.kv.allocate(request, n + drafts + extra):
            return drafts, extra
        room = (request.num_blocks + self.kv.num_free_blocks) * self.kv.block_size - request.num_computed_tokens - n
        if room <= 0:
            return 0, 0
        drafts = min(drafts, room)
        extra = min(extra, room - drafts)
        ok = self.kv.allocate(request, n + drafts + extra)
        assert ok, "trimmed drafts must fit the free blocks"
        return drafts, extra

    def _on_verify_step_done(self, step, end_s: float) -> list[Request]:
        """on_step_done for a step that verified drafts: each request keeps its last token and the
        accepted drafts (the rejected ones roll back its computed tokens) and emits accepted + 1."""
        finished = []
        itl, accept = self.itl, self.verifier.accept
        previous_end, num_consecutive, num_computed = self._last_end_s, 0, 0
        for request, q in zip(step.requests, step.batch.q_lens.tolist()):
            drafts = request.num_scheduled_drafts
            if drafts:
                request.num_scheduled_drafts = 0
                accepted = accept(request.request_id, request.num_verify_rounds, drafts)
                request.num_verify_rounds += 1
                request.num_accepted_tokens += accepted
                q -= drafts - accepted
            request.num_computed_tokens += q
            num_computed += q
            num_emitted = request.num_computed_tokens - request.num_prompt_tokens - request.num_generated_tokens + 1
            if num_emitted > 0:
                last = request.last_token_s
                if last is None:
                    request.first_token_s = end_s
                elif last == previous_end:
                    num_consecutive += 1     # emitted in the previous step too: the shared gap
                else:
                    itl.add(end_s - last)
                request.last_token_s = end_s
                request.num_generated_tokens += num_emitted
                if request.num_generated_tokens >= request.num_output_tokens:
                    request.num_generated_tokens = request.num_output_tokens
                    finished.append(request)
        if num_consecutive:
            itl.add(end_s - previous_end, num_consecutive)
        self._last_end_s = end_s
        self.num_outstanding_tokens -= num_computed
        self._retire(finished, end_s)
        return finished
