"""An acceptance trace: each request's accepted drafts, verify round by verify round, replayed.

The file is CSV with columns `request_id` and `accepted` (the accepted counts of the request's rounds
in order, separated by spaces), e.g. from a measured run's per-step records. A request that verifies
more rounds than the trace gives it replays its counts again from the first; a round with fewer
drafts than its count accepts them all.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError


@dataclass(frozen=True)
class AcceptanceTrace:
    path: str
    num_draft_tokens: int            # k: no count may be above it

    def __post_init__(self) -> None:
        # the counts are not a field: the config's record (config.json) names the file, not its contents
        object.__setattr__(self, "_counts", read_acceptance_trace(Path(self.path), self.num_draft_tokens))

    @property
    def source(self) -> str:
        return f"trace:{self.path}"

    @property
    def counts(self) -> dict[int, tuple[int, ...]]:
        return self._counts

    @property
    def rates(self) -> tuple[float, ...]:
        """The trace's conditional acceptance rate at each position (0 where no round got that far)."""
        reached = [0] * (self.num_draft_tokens + 1)   # rounds whose accepted count is >= j
        for counts in self._counts.values():
            for count in counts:
                for j in range(count + 1):
                    reached[j] += 1
        return tuple(reached[j + 1] / reached[j] if reached[j] else 0.0 for j in range(self.num_draft_tokens))

    def mean_acceptance_length(self, num_drafts: int) -> float:
        rounds = [min(c, num_drafts) for counts in self._counts.values() for c in counts]
        return 1.0 + sum(rounds) / len(rounds)

    def accepted(self, request_id: int, round_index: int) -> int:
        counts = self._counts.get(request_id)
        if counts is None:
            raise InputError(f"{self.path}: no accepted counts for request {request_id}")
        return counts[round_index % len(counts)]

    def check_requests(self, request_ids) -> None:
        """Every request of the simulated trace must have its counts (an InputError naming the first without)."""
        missing = [r for r in request_ids if r not in self._counts]
        if missing:
            raise InputError(f"{self.path}: no accepted counts for request {missing[0]} of the trace "
                             f"({len(missing)} requests missing); the acceptance trace must cover the trace's requests")


def read_acceptance_trace(path: Path, num_draft_tokens: int) -> dict[int, tuple[int, ...]]:
    """request_id -> accepted counts, checked (an InputError naming the file and row)."""
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise InputError(f"{path}: cannot read the acceptance trace ({error.strerror})") from None
    if not rows or not {"request_id", "accepted"} <= set(rows[0]):
        raise InputError(f"{path}: an acceptance trace needs the columns request_id and accepted")
    out: dict[int, tuple[int, ...]] = {}
    for row_number, row in enumerate(rows, start=2):
        try:
            request_id = int(row["request_id"])
            counts = tuple(int(v) for v in (row["accepted"] or "").split())
        except (TypeError, ValueError):
            raise InputError(f"{path}: row {row_number}: request_id and accepted must be integers") from None
        if not counts:
            raise InputError(f"{path}: row {row_number}: request {request_id} has no accepted counts")
        if min(counts) < 0 or max(counts) > num_draft_tokens:
            raise InputError(f"{path}: row {row_number}: accepted counts must be in 0..{num_draft_tokens} (k), "
                             f"got {min(counts) if min(counts) < 0 else max(counts)}")
        if request_id in out:
            raise InputError(f"{path}: row {row_number}: request {request_id} appears twice")
        out[request_id] = counts
    return out
