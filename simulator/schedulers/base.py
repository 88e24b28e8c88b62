"""What every scheduler shares: queues, KV accounting, preemption, and applying a step's results.

Contract (one scheduler, two drivers), the shape of vLLM v1's `SchedulerOutput` /
`update_from_output`: `schedule(now_s)` returns a ScheduledStep (or None when there is nothing to
run) and reserves its KV blocks; the driver runs its batch (simulated or on a device) and hands the
same ScheduledStep back to `on_step_done(step, end_s)`, which advances every request and returns
those that finished. Nothing passes through attributes: what the driver needs (the requests in
batch order, whether the step is pure decode, who was preempted while forming it) is in the step.
`decode_run_length(step)` and `on_decode_run_done(step, ends_s)` let a driver advance a run of
identical decode-only steps in one move.

A policy implements `_plan(now_s)`: the (request, num_new_tokens) pairs of the next step, in order.
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from stepcal.core.batch import StepBatch
from stepcal.core.errors import InputError
from stepcal.simulator.kv_cache import BlockManager
from stepcal.simulator.request import Request, Status
from stepcal.simulator.spec_decode import SpecDecodeConfig, Verifier


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None   # None: the scheduler's own default
    chunk_size: int = 512                       # sarathi / slo: prefill chunk, the token budget per step
    spec_decode: SpecDecodeConfig | None = None   # vllm / sarathi: speculative decoding, None: off


def checked_scheduler_config(max_num_seqs: int = SchedulerConfig.max_num_seqs, max_batched_tokens: int | None = None,
                             chunk_size: int = SchedulerConfig.chunk_size, *, block_size: int | None = None,
                             kv_blocks: int | None = None,
                             spec_decode: SpecDecodeConfig | None = None) -> SchedulerConfig:
    """A SchedulerConfig; every size given, the KV cache's block_size and kv_blocks too, must be
    positive (an InputError naming its flag)."""
    sizes = {"max_num_seqs": max_num_seqs, "max_batched_tokens": max_batched_tokens, "chunk_size": chunk_size,
             "block_size": block_size, "kv_blocks": kv_blocks}
    for name, value in sizes.items():
        if value is not None and value <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be positive, got {value}")
    return SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched_tokens,
                           chunk_size=chunk_size, spec_decode=spec_decode)


@dataclass(slots=True, eq=False)
class ScheduledStep:
    """One step as the scheduler planned it: the batch to run and what the drivers need about it."""
    batch: StepBatch
    requests: list[Request]              # in batch order: requests[i] brings batch.q_lens[i] tokens
    is_pure_decode: bool                 # every request feeds its last token over a cache and emits
    preempted: list[Request] = field(default_factory=list)   # lost their KV cache while this step was formed
    draft_lens: np.ndarray | None = None  # speculative decoding: drafts each request verifies (q = 1 + drafts)


class ItlSamples:
    """Inter-token latencies as (value_s, weight) pairs in typed arrays (16 bytes a pair).

    Requests that emitted in consecutive steps share one gap, so a step adds one pair for all of
    them, and a decode run adds one pair per step: memory grows with steps, not tokens.
    """

    def __init__(self) -> None:
        self.values = array("d")
        self.weights = array("q")

    def add(self, value_s: float, weight: int = 1) -> None:
        self.values.append(value_s)
        self.weights.append(weight)

    def add_many(self, values_s: np.ndarray, weight: int) -> None:
        self.values.frombytes(np.ascontiguousarray(values_s, dtype=np.float64).tobytes())
        self.weights.frombytes(np.full(len(values_s), weight, dtype=np.int64).tobytes())

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.frombuffer(self.values, dtype=np.float64).copy() if self.values else np.zeros(0),
                np.frombuffer(self.weights, dtype=np.int64).copy() if self.weights else np.zeros(0, np.int64))


class SchedulerBase:
    name = "base"
    default_max_batched_tokens: int | None = 8192
    supports_spec_decode = False

    def __init__(self, block_manager: BlockManager, config: SchedulerConfig | None = None) -> None:
        self.kv = block_manager
        self.config = config or SchedulerConfig()
        budget = self.config.max_num_batched_tokens
        self.token_budget = budget if budget is not None else self.default_max_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.itl = ItlSamples()
        self.num_outstanding_tokens = 0   # tokens still to compute, for least-outstanding-tokens routing
        self.num_preemptions = 0
        self._preempted: list[Request] = []     # preempted since the last schedule() returned
        self._last_end_s: float | None = None   # end of this scheduler's previous step
        spec = self.config.spec_decode
        if spec is not None and not self.supports_spec_decode:
            raise InputError(f"--spec-decode: the {self.name} scheduler has no speculative decoding; "
                             f"use vllm or sarathi")
        self.verifier = Verifier(spec) if spec is not None else None

    # -- the contract -------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request; one that arrives with tokens computed elsewhere (a disaggregated decode
        pool's, with its prompt cached) owes only the rest."""
        request.status = Status.WAITING
        self.waiting.append(request)
        self.num_outstanding_tokens += request.max_kv_tokens - request.num_computed_tokens

    def abort(self, request: Request) -> None:
        """The client gave up: drop the request (not part of a step in flight) and free its blocks."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.kv.free(request)
        else:   # waiting: it holds no blocks (admission gives them, preemption frees them)
            self.waiting.remove(request)
        self.num_outstanding_tokens -= request.max_kv_tokens - request.num_computed_tokens
        request.give_up()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now_s: float) -> ScheduledStep | None:
        """The next step, or None when there is nothing to run. A scheduler that holds work but
        plans nothing is a bug, not an idle replica: it raises instead of stalling its driver."""
        step = self._step(self._plan(now_s))
        if step is None and self.has_work():
            raise RuntimeError(f"scheduler {self.name} is stuck with {len(self.waiting)} waiting requests "
                               f"and nothing running")
        return step

    def _plan(self, now_s: float) -> list[tuple[Request, int]]:
        """The policy: (request, num_new_tokens) pairs of the next step, KV reserved for each."""
        raise NotImplementedError

    def on_step_done(self, step: ScheduledStep, end_s: float) -> list[Request]:
        """Advance each request of the step by its q tokens; return the ones that finished.

        Written for speed: this loop runs once per request per step."""
        if step.draft_lens is not None:
            return self._on_verify_step_done(step, end_s)
        finished = []
        itl = self.itl
        previous_end, num_consecutive = self._last_end_s, 0
        batch = step.batch
        for request, q in zip(step.requests, batch.q_lens.tolist()):
            request.num_computed_tokens += q
            if request.num_computed_tokens == request.num_prompt_tokens + request.num_generated_tokens:
                # the step fed every known token: it emits the next one
                last = request.last_token_s
                if last is None:
                    request.first_token_s = end_s
                elif last == previous_end:
                    num_consecutive += 1     # emitted in the previous step too: the shared gap
                else:
                    itl.add(end_s - last)
                request.last_token_s = end_s
                request.num_generated_tokens += 1
                if request.num_generated_tokens == request.num_output_tokens:
                    finished.append(request)
        if num_consecutive:
            itl.add(end_s - previous_end, num_consecutive)
        self._last_end_s = end_s
        self.num_outstanding_tokens -= batch.num_tokens
        self._retire(finished, end_s)
        return finished

    def decode_run_length(self, step: ScheduledStep) -> int:
        """How many consecutive steps, this one included, repeat this decode-only batch if nothing arrives.

        The run ends at the first step where a request finishes, where the KV cache could not hold
        the next tokens (a preemption would follow), or earlier if the policy might admit a waiting
        request (then 1).
        """
        requests = step.requests
        if self.verifier is not None:
            return 1   # each step's acceptances differ: no run repeats one batch
        if not step.is_pure_decode or len(requests) != len(self.running) or self._may_admit(step.batch):
            return 1
        num_steps = min(r.num_remaining_output_tokens for r in requests)
        if num_steps <= 1:
            return 1
        return self._kv_limited_steps(requests, num_steps)

    def on_decode_run_done(self, step: ScheduledStep, ends_s: np.ndarray) -> list[Request]:
        """Apply a run of len(ends_s) - 1 decode steps of `step`; ends_s[0] is the run's start."""
        requests = step.requests
        num_steps = len(ends_s) - 1
        first_end, last_end = float(ends_s[1]), float(ends_s[-1])
        previous_end, num_consecutive = self._last_end_s, 0
        block_size, itl = self.kv.block_size, self.itl
        growing = [r for r in requests if r.num_computed_tokens + num_steps > r.num_blocks * block_size]
        if growing:
            self.kv.grow_all(growing, [r.num_computed_tokens + num_steps for r in growing])
        for request in requests:
            request.num_computed_tokens += num_steps
            last = request.last_token_s
            if last is None:
                request.first_token_s = first_end
            elif last == previous_end:
                num_consecutive += 1
            else:
                itl.add(first_end - last)
            request.num_generated_tokens += num_steps
            request.last_token_s = last_end
        if num_consecutive:
            itl.add(first_end - previous_end, num_consecutive)
        if num_steps > 1:
            itl.add_many(np.diff(ends_s[1:]), len(requests))
        self._last_end_s = last_end
        self.num_outstanding_tokens -= num_steps * len(requests)
        finished = [r for r in requests if r.num_generated_tokens == r.num_output_tokens]
        self._retire(finished, last_end)
        return finished

    # -- shared mechanics -----------------------------------------------------------------------
    def _may_admit(self, batch: StepBatch) -> bool:
        """Could the next schedule() admit a waiting request? Blocked stays blocked during a decode run,
        because free KV blocks only shrink and the budget left after the decodes is fixed."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return False
        budget_left = (self.token_budget or 1 << 62) - batch.num_seqs
        if budget_left <= 0:
            return False
        return self.kv.admission_blocks(self.waiting[0], budget_left) <= self.kv.num_free_blocks

    def _kv_limited_steps(self, requests: list[Request], max_steps: int) -> int:
        """Largest k ≤ max_steps whose extra blocks (beyond step 1, already reserved) fit in the free ones."""
        computed = np.fromiter((r.num_computed_tokens for r in requests), np.int64, len(requests))
        held = np.fromiter((r.num_blocks for r in requests), np.int64, len(requests))
        bs, free = self.kv.block_size, self.kv.num_free_blocks

        def extra_blocks(k: int) -> int:
            return int(np.maximum(0, -(-(computed + k) // bs) - held).sum())

        if extra_blocks(max_steps) <= free:
            return max_steps
        lo, hi = 1, max_steps   # extra_blocks(1) == 0 <= free; extra_blocks(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if extra_blocks(mid) <= free else (lo, mid)
        return lo

    def _retire(self, finished: list[Request], end_s: float) -> None:
        if not finished:
            return
        done = set(map(id, finished))
        self.running = [r for r in self.running if id(r) not in done]
        for request in finished:
            request.status = Status.FINISHED
            request.finish_s = end_s
            self.kv.free(request)

    def _preempt(self, request: Request) -> None:
        """Recompute policy: drop the cache, go back to the front of the queue."""
        self.kv.free(request)
        self.num_outstanding_tokens += request.num_computed_tokens
        request.num_computed_tokens = 0
        request.num_scheduled_drafts = 0
        request.status = Status.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted.append(request)
        self.waiting.appendleft(request)

    def _reserve_or_preempt(self, request: Request, num_tokens: int) -> bool:
        """Reserve KV for a running request, preempting the newest running ones until it fits.

        Returns False when `request` itself had to go (it was the newest left)."""
        while not self.kv.allocate(request, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _admit_whole_prompts(self) -> list[tuple[Request, int]]:
        """Admit waiting requests in FCFS order with all their pending tokens (no chunking), while
        they fit max_num_seqs, the token budget (the first one is admitted alone even when larger)
        and the KV cache."""
        scheduled, num_tokens = [], 0
        budget = self.token_budget
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hit = self.kv.lookup(request)
            n = request.num_pending_tokens - self._hit_tokens(hit)
            if scheduled and budget is not None and num_tokens + n > budget:
                break
            if not self.kv.allocate(request, n, hit):
                break
            self._admit(request, hit)
            scheduled.append((request, n))
            num_tokens += n
        return scheduled

    def _hit_tokens(self, hit) -> int:
        """Tokens of a cached prefix (simulator.prefix_cache.Hit) that admission would reuse."""
        return len(hit.block_ids) * self.kv.block_size if hit is not None else 0

    def _admit(self, request: Request, hit=None) -> None:
        """Move the head of the queue to running; its reused prefix is no longer outstanding."""
        self.waiting.popleft()
        request.status = Status.RUNNING
        self.running.append(request)
        if hit is not None:
            self.num_outstanding_tokens -= self._hit_tokens(hit)

    def _step(self, scheduled: list[tuple[Request, int]]) -> ScheduledStep | None:
        """The ScheduledStep of (request, num_new_tokens) pairs, with the requests preempted since
        the last one; None when nothing is scheduled."""
        if not scheduled:
            return None
        preempted, self._preempted = self._preempted, []
        requests = [r for r, _ in scheduled]
        q_lens = [q for _, q in scheduled]
        kv_lens = [r.num_computed_tokens for r in requests]
        draft_lens = None
        if self.verifier is not None:
            draft_lens = [r.num_scheduled_drafts for r in requests]
        # A pure decode batch (what decode runs repeat): each request feeds its one pending token over a
        # non-empty cache and emits. A 1-token prefill chunk with more prompt after it is not one, nor
        # is a step that verifies drafts.
        is_pure_decode = len(scheduled) == sum(q_lens) and min(kv_lens) > 0 and all(
            r.num_prompt_tokens + r.num_generated_tokens - r.num_computed_tokens == 1 for r in requests)
        batch = StepBatch(tuple([r.request_id for r in requests]), np.array(q_lens, dtype=np.int64),
                          np.array(kv_lens, dtype=np.int64))
        if draft_lens is not None:
            draft_lens = np.array(draft_lens, dtype=np.int64)
        return ScheduledStep(batch, requests, is_pure_decode, preempted, draft_lens)
