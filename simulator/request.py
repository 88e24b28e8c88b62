"""A request's life as counters: num_computed_tokens chases the tokens known so far; and the
requests of a trace."""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from stepcal.core.errors import InputError
from stepcal.core.trace import Trace
from stepcal.simulator.prefix_keys import trace_prefix_keys


class Status(IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED = 3
    ABORTED = 4      # the client gave up (its timeout passed) before the last token


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
    # prefix caching (simulator.prefix_cache): keys of the full prompt blocks, blocks held, reuse
    prefix_keys: object = None          # int64 array of small non-negative keys, or None: shares nothing
    block_ids: np.ndarray | None = None   # ids of the blocks held, in token order (int64)
    num_registered_blocks: int = 0      # leading blocks whose keys are published
    num_cached_tokens: int = 0          # prompt tokens reused at the first admission
    # the client (simulator.client): a timeout, and the session's next turn in a closed loop
    timeout_s: float | None = None      # the client gives up this long after arrival_s
    timed_out: bool = False
    think_time_s: float | None = None   # sent this long after the previous turn finished
    next_turn: Request | None = None    # the session's next closed-loop turn
    # speculative decoding (simulator.spec_decode): drafts in the step in flight, and the request's totals
    num_scheduled_drafts: int = 0       # drafts the step in flight verifies (its q is 1 + this)
    num_verify_rounds: int = 0          # steps that verified drafts of this request
    num_accepted_tokens: int = 0        # drafts of this request that passed

    def give_up(self) -> None:
        """The client left (its timeout passed): the request ends aborted, and an answer that was
        still to come, or came too late, does not count as finished."""
        self.status, self.timed_out, self.finish_s = Status.ABORTED, True, None

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


def kv_blocks_needed(trace: Trace, block_size: int) -> np.ndarray:
    """The KV blocks of `block_size` tokens each request of the trace holds at its end (its most)."""
    max_kv = trace.num_prompt_tokens + trace.num_output_tokens - 1
    return -(-max_kv // block_size)


def make_requests(trace: Trace, block_size: int, kv_blocks: int | None, skip_oversize: bool = False,
                  prefix_caching: bool = False, timeout_s: float | None = None) -> tuple[list[Request], int]:
    """Request objects of a trace, and how many were skipped: a request that could never fit a KV
    cache of kv_blocks blocks fails the run with an InputError (or is skipped with skip_oversize).
    With prefix_caching, each request carries the keys of its full prompt blocks (if the trace has ids);
    timeout_s is the client timeout of requests whose trace gives none."""
    keep = np.ones(len(trace), dtype=bool)
    if kv_blocks is not None:
        need = kv_blocks_needed(trace, block_size)
        keep = need <= kv_blocks
        if not keep.all() and not skip_oversize:
            row = int(np.flatnonzero(~keep)[0])
            raise InputError(
                f"{trace.source}: request {int(trace.request_id[row])} (row {row}) needs {int(need[row])} KV blocks "
                f"of {block_size} tokens but the cache holds {kv_blocks}; "
                f"use --skip-oversize to drop such requests")
    ids, arr = trace.request_id.tolist(), trace.arrival_s.tolist()
    prompt, output = trace.num_prompt_tokens.tolist(), trace.num_output_tokens.tolist()
    priority = trace.priority.tolist() if trace.priority is not None else None
    slo_ttft = _optional_floats(trace.slo_ttft_ms)
    slo_tpot = _optional_floats(trace.slo_tpot_ms)
    timeout = _optional_floats(trace.timeout_s)
    think = _optional_floats(trace.think_time_s)
    keys = None
    if prefix_caching and trace.prefix_hash_ids is not None:
        keys = trace_prefix_keys(trace, block_size)
    requests = [Request(ids[i], arr[i], prompt[i], output[i],
                        priority=int(priority[i]) if priority else 0,
                        slo_ttft_ms=slo_ttft[i] if slo_ttft else None,
                        slo_tpot_ms=slo_tpot[i] if slo_tpot else None,
                        prefix_keys=keys[i] if keys is not None and len(keys[i]) else None,
                        timeout_s=timeout[i] if timeout and timeout[i] is not None else timeout_s,
                        think_time_s=think[i] if think else None)
                for i in np.flatnonzero(keep).tolist()]
    return requests, int((~keep).sum())


def _optional_floats(column) -> list | None:
    """A column of floats with NaN for 'absent' as a list with None there."""
    if column is None:
        return None
    return [None if not math.isfinite(v) else float(v) for v in np.asarray(column, dtype=np.float64).tolist()]
