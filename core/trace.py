"""Trace: the requests of a workload, as columns (docs/design.md contract 3)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np

from stepcal.core.errors import InputError, shown

REQUIRED_COLUMNS = ("arrival_s", "num_prompt_tokens", "num_output_tokens")
# per-request columns a trace may carry
OPTIONAL_COLUMNS = ("priority", "slo_ttft_ms", "slo_tpot_ms", "session_id", "turn", "think_time_s", "timeout_s")
PREFIX_BLOCK_TOKENS = 16     # default block size of prefix_hash_ids (Mooncake's hash_ids: 512)


@dataclass
class Trace:
    """Requests in arrival order.

    prefix_hash_ids[i], where given, has one id per prefix_block_tokens-token block of request
    i's prompt, from the start: an id stands for that block's tokens and everything before them
    (a chain), and a prompt's last partial block has an id of its own. A list may stop short of
    the prompt's ceil(num_prompt_tokens / prefix_block_tokens) blocks; the blocks it leaves out
    are shared with no other request. The readers check this; a generated trace has no ids.
    """
    arrival_s: np.ndarray            # float64, seconds from the trace start, sorted
    num_prompt_tokens: np.ndarray    # int64 > 0
    num_output_tokens: np.ndarray    # int64 > 0
    request_id: np.ndarray           # int64, unique
    priority: np.ndarray | None = None       # int64, larger = more latency-sensitive
    slo_ttft_ms: np.ndarray | None = None    # float64, NaN where absent
    slo_tpot_ms: np.ndarray | None = None
    session_id: np.ndarray | None = None     # int64: requests of one multi-turn session share it
    turn: np.ndarray | None = None           # int64 >= 0: order within the session (else arrival order)
    think_time_s: np.ndarray | None = None   # float64 >= 0, NaN where absent: a closed-loop turn,
                                             # sent this long after the session's previous turn finished
    timeout_s: np.ndarray | None = None      # float64 > 0, NaN where absent: the client gives up then
    prefix_hash_ids: list | None = None      # per request, ids of its prompt blocks (see below)
    prefix_block_tokens: int = PREFIX_BLOCK_TOKENS   # tokens per block of prefix_hash_ids
    source: str = "generated"
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @classmethod
    def from_arrays(cls, arrival_s, num_prompt_tokens, num_output_tokens, *, request_id=None,
                    source: str = "generated", prefix_hash_ids: list | None = None,
                    prefix_block_tokens: int = PREFIX_BLOCK_TOKENS, **optional) -> Trace:
        """Validate, sort by arrival (with a warning) and build a trace."""
        arrival = np.asarray(arrival_s, dtype=np.float64)
        prompt = np.asarray(num_prompt_tokens)
        output = np.asarray(num_output_tokens)
        n = len(arrival)
        if n == 0:
            raise InputError(f"{source}: the trace has no requests")
        for name, col in (("num_prompt_tokens", prompt), ("num_output_tokens", output)):
            _check_positive_ints(source, name, col)
        if not np.isfinite(arrival).all():
            raise InputError(f"{source}: row {_first(~np.isfinite(arrival))}: arrival_s is not a finite number")
        if (arrival < 0).any():
            raise InputError(f"{source}: row {_first(arrival < 0)}: arrival_s is negative")
        ids = np.arange(n, dtype=np.int64) if request_id is None else np.asarray(request_id, dtype=np.int64)
        if isinstance(prefix_block_tokens, bool) or not isinstance(prefix_block_tokens, (int, np.integer)) \
                or prefix_block_tokens < 1:
            raise InputError(f"{source}: prefix_block_tokens must be a positive integer, got {shown(prefix_block_tokens)}")
        if len(np.unique(ids)) != n:
            raise InputError(f"{source}: request_id values are not unique")
        trace = cls(arrival, prompt.astype(np.int64), output.astype(np.int64), ids, source=source,
                    prefix_hash_ids=None if prefix_hash_ids is None else list(prefix_hash_ids),
                    prefix_block_tokens=int(prefix_block_tokens),
                    **{k: (None if v is None else np.asarray(v)) for k, v in optional.items()})
        _check_sessions(trace)
        if (np.diff(arrival) < 0).any():
            trace = trace.take(np.argsort(arrival, kind="stable"))
            trace.warnings.append(f"{source}: arrivals were not sorted; sorted them by arrival_s")
        return trace

    def take(self, index) -> Trace:
        """The requests at `index` (an int array or a boolean mask), keeping their ids."""
        def pick(col):
            return None if col is None else col[index]
        hashes = None
        if self.prefix_hash_ids is not None:
            hashes = [self.prefix_hash_ids[i] for i in np.arange(len(self))[index]]
        return replace(self, arrival_s=self.arrival_s[index], num_prompt_tokens=self.num_prompt_tokens[index],
                       num_output_tokens=self.num_output_tokens[index], request_id=self.request_id[index],
                       prefix_hash_ids=hashes, warnings=list(self.warnings),
                       **{name: pick(getattr(self, name)) for name in OPTIONAL_COLUMNS})

    def to_frame(self):
        import pandas as pd  # lazy: loads pandas
        data = {"request_id": self.request_id, "arrival_s": self.arrival_s,
                "num_prompt_tokens": self.num_prompt_tokens, "num_output_tokens": self.num_output_tokens}
        for name in OPTIONAL_COLUMNS:
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        if self.prefix_hash_ids is not None:
            data["prefix_hash_ids"] = self.prefix_hash_ids
            # the ids' block size travels with them (a column: CSV and Parquet alike)
            data["prefix_block_tokens"] = np.full(len(self), self.prefix_block_tokens, dtype=np.int64)
        return pd.DataFrame(data)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_positive_ints(source: str, name: str, col: np.ndarray) -> None:
    if col.dtype.kind == "f":
        bad = ~np.isfinite(col) | (col != np.round(col))
        if bad.any():
            raise InputError(f"{source}: row {_first(bad)}: {name} must be a positive integer, got {shown(col[_first(bad)])}")
    elif col.dtype.kind not in "iu":
        raise InputError(f"{source}: {name} must hold integers, found {col.dtype}")
    if (col <= 0).any():
        row = _first(col <= 0)
        raise InputError(f"{source}: row {row}: {name} must be a positive integer, got {shown(col[row])}")


def _check_sessions(trace: Trace) -> None:
    """turn and think_time_s need session_id; a (session, turn) pair names one request; a closed-loop
    turn (think_time_s given) follows an earlier turn of its session; times are non-negative."""
    src = trace.source
    for name in ("turn", "think_time_s"):
        if getattr(trace, name) is not None and trace.session_id is None:
            raise InputError(f"{src}: column {name} needs a session_id column")
    for name, positive in (("think_time_s", False), ("timeout_s", True)):
        col = getattr(trace, name)
        if col is None:
            continue
        col = col.astype(np.float64)
        bad = np.isinf(col) | ((col <= 0) if positive else (col < 0))   # NaN (absent) passes
        if bad.any():
            row = _first(bad)
            kind = "positive" if positive else "non-negative"
            raise InputError(f"{src}: row {row}: {name} must be {kind} seconds (or empty), got {shown(col[row])}")
    if trace.turn is not None and (trace.turn < 0).any():
        raise InputError(f"{src}: row {_first(trace.turn < 0)}: turn must not be negative")
    if trace.session_id is None:
        return
    order = session_order(trace)
    if trace.turn is not None:
        keys = np.stack([trace.session_id[order], trace.turn[order]], axis=1)
        same = (np.diff(keys, axis=0) == 0).all(axis=1)
        if same.any():
            row = int(order[_first(same) + 1])
            raise InputError(f"{src}: row {row}: session {int(trace.session_id[row])} has turn "
                             f"{int(trace.turn[row])} twice")
    if trace.think_time_s is not None:
        first = np.ones(len(trace), dtype=bool)
        first[order[1:]] = trace.session_id[order[1:]] != trace.session_id[order[:-1]]
        closed = np.isfinite(trace.think_time_s.astype(np.float64))
        if (closed & first).any():
            row = _first(closed & first)
            raise InputError(f"{src}: row {row}: think_time_s is given for the first turn of session "
                             f"{int(trace.session_id[row])}: a closed-loop turn follows an earlier one")


def session_order(trace: Trace) -> np.ndarray:
    """Row indices sorted by session, then by turn (or arrival order where there is no turn column)."""
    turn = trace.turn if trace.turn is not None else np.arange(len(trace))
    return np.lexsort((np.arange(len(trace)), turn, trace.session_id))


def session_pairs(trace: Trace) -> list[tuple[int, int]]:
    """(row, next row) of every two consecutive turns of a session, by session_order; [] without sessions."""
    if trace.session_id is None:
        return []
    order = session_order(trace).tolist()
    session = trace.session_id.tolist()
    return [(a, b) for a, b in pairwise(order) if session[a] == session[b]]


def continued_turns(trace: Trace) -> list[tuple[int, int]]:
    """The session_pairs whose next turn's prompt goes on from this turn's: its prefix ids begin
    with this turn's full blocks (a consistent trace; [] without ids). A turn's answer is then the
    stretch of the next prompt after its own."""
    if trace.prefix_hash_ids is None:
        return []
    ids, block = trace.prefix_hash_ids, trace.prefix_block_tokens
    prompt = trace.num_prompt_tokens.tolist()
    return [(a, b) for a, b in session_pairs(trace) if ids[a][:prompt[a] // block] == ids[b][:prompt[a] // block]]
