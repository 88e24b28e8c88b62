"""A request's life as counters: num_computed_tokens chases the tokens known so far."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Status(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3


@dataclass(slots=True, eq=False)
class Request:
    """One request. Known tokens = prompt + tokens generated so far.

    A step feeds q tokens; when computed reaches known, the step emits one output token.
    So a prefill (possibly chunked) ends by emitting token 1, and each decode feeds the last
    emitted token and emits the next. After a preemption by recompute, computed drops to 0 and
    the request prefills prompt + generated tokens again before it emits the next one.
    """
    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    priority: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    num_blocks: int = 0                 # KV blocks held, kept by the block manager
    status: Status = Status.WAITING
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    num_preemptions: int = 0
    replica: int = 0

    @property
    def num_known_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_generated_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens to feed before the next output token: 1 for a decode, the rest of the prompt in prefill."""
        return self.num_prompt_tokens + self.num_generated_tokens - self.num_computed_tokens

    @property
    def num_remaining_output_tokens(self) -> int:
        return self.num_output_tokens - self.num_generated_tokens

    @property
    def max_kv_tokens(self) -> int:
        """Tokens in the cache when the request finishes (the last output token is never fed)."""
        return self.num_prompt_tokens + self.num_output_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
