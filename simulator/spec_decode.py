"""Speculative decoding as vLLM V1 schedules it: the method, the drafts per step and how many pass.

A decoding request schedules 1 + d query tokens in one step (its last token and d drafts, verified
in the target's forward pass), charged to the token budget; d is k, trimmed when the budget or the KV
cache runs short and never more than the request still has to emit, less one. Draft-model, EAGLE and
MTP drafters write the KV of the next step's drafts, so k lookahead slots are reserved besides; the
n-gram lookup writes none. Verification accepts the longest agreeing prefix of a drafts; the step
emits a + 1 tokens (the accepted drafts and a recovered token, or the bonus token when all pass), and
the rejected d - a tokens roll back the computed tokens (their KV slots are kept and overwritten).

The acceptance is drawn from an AcceptanceModel. Draws are a pure function of (seed, request id, the
request's draft round), so a request's acceptances do not depend on what it was batched with.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from stepcal.core.errors import InputError
from stepcal.simulator.spec_decode_fit import fitted_rates, read_counters
from stepcal.simulator.spec_decode_trace import AcceptanceTrace

METHODS = ("draft-model", "eagle", "mtp", "ngram")
# vLLM's rejection sampler verifies at most this many drafts per request and step (MAX_SPEC_LEN).
MAX_DRAFT_TOKENS = {"draft-model": 128, "eagle": 128, "mtp": 128, "ngram": 128}
RESERVES_LOOKAHEAD = {"draft-model": True, "eagle": True, "mtp": True, "ngram": False}
_MASK64 = (1 << 64) - 1
_TWO_POW_53_INV = 1.0 / float(1 << 53)


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-position conditional acceptance rates: rates[j] is the chance that draft j + 1 passes once
    drafts 1..j have passed; positions past the list take its last rate. `survival[j]` is the chance
    that at least j + 1 drafts pass."""
    rates: tuple[float, ...]
    source: str = "rates"

    def __post_init__(self) -> None:
        if not self.rates:
            raise InputError("--acceptance: give at least one rate")
        for j, rate in enumerate(self.rates):
            if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
                raise InputError(f"--acceptance: rate {j + 1} must be in [0, 1], got {rate!r}")
            if j and rate > self.rates[j - 1]:
                raise InputError(f"--acceptance: rates must not rise with position: rate {j + 1} ({rate:g}) "
                                 f"> rate {j} ({self.rates[j - 1]:g})")

    def survival(self, num_drafts: int) -> list[float]:
        """P(at least j + 1 drafts pass) for j < num_drafts, non-increasing."""
        out, p = [], 1.0
        for j in range(num_drafts):
            p *= self.rates[min(j, len(self.rates) - 1)]
            out.append(p)
        return out

    def mean_acceptance_length(self, num_drafts: int) -> float:
        """Expected tokens a step emits with num_drafts drafts: 1 + the expected accepted drafts."""
        return 1.0 + sum(self.survival(num_drafts))

    def check_requests(self, request_ids) -> None:
        """Rates hold for every request."""


def rates_for_mean_length(mean_length: float, num_drafts: int) -> AcceptanceModel:
    """One rate p for every position, with 1 + p + p^2 + ... + p^k = mean_length at k drafts."""
    if not (math.isfinite(mean_length) and 1.0 <= mean_length <= num_drafts + 1):
        raise InputError(f"--acceptance mean:{mean_length:g}: a mean acceptance length must be in "
                         f"[1, k + 1] = [1, {num_drafts + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):   # bisection: the mean length grows with p
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if AcceptanceModel((mid,)).mean_acceptance_length(num_drafts) < mean_length else (lo, mid)
    return AcceptanceModel(((lo + hi) / 2.0,), source=f"mean:{mean_length:g}")


def parse_acceptance(text: str, num_drafts: int) -> AcceptanceModel | AcceptanceTrace:
    """`rates:P1,P2,...` (conditional per-position rates), `mean:AL` (a mean acceptance length),
    `trace:FILE` (each request's accepted counts, simulator.spec_decode_trace) or `counters:FILE` (rates
    fitted to a measured run's counters, simulator.spec_decode_fit)."""
    kind, _, values = text.partition(":")
    if kind == "trace" and values:
        return AcceptanceTrace(values, num_drafts)
    if kind == "counters" and values:
        return AcceptanceModel(fitted_rates(*read_counters(Path(values))), source=text)
    try:
        numbers = [float(v) for v in values.split(",")] if values else []
    except ValueError:
        raise InputError(f"--acceptance {text!r}: values must be numbers") from None
    if kind == "rates" and numbers:
        return AcceptanceModel(tuple(numbers), source=text)
    if kind == "mean" and len(numbers) == 1:
        return rates_for_mean_length(numbers[0], num_drafts)
    raise InputError(f"--acceptance {text!r}: expected rates:P1,P2,..., mean:AL, trace:FILE or counters:FILE")


@dataclass(frozen=True)
class SpecDecodeConfig:
    """`--spec-decode METHOD:k` with its acceptance model and the seed of the draws."""
    method: str
    num_draft_tokens: int
    acceptance: AcceptanceModel | AcceptanceTrace
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"--spec-decode: unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        limit = MAX_DRAFT_TOKENS[self.method]
        if not 1 <= self.num_draft_tokens <= limit:
            raise InputError(f"--spec-decode {self.method}:{self.num_draft_tokens}: k must be in 1..{limit} "
                             f"for {self.method}")

    @property
    def num_lookahead_tokens(self) -> int:
        return self.num_draft_tokens if RESERVES_LOOKAHEAD[self.method] else 0

    def describe(self) -> dict:
        k = self.num_draft_tokens
        return {"method": self.method, "k": k, "acceptance": self.acceptance.source,
                "acceptance_rates": list(self.acceptance.rates), "seed": self.seed,
                "expected_acceptance_length": self.acceptance.mean_acceptance_length(k)}


def parse_spec_decode(text: str, acceptance: str | None, seed: int = 0) -> SpecDecodeConfig:
    """SpecDecodeConfig from `METHOD:k` and an --acceptance spec (required)."""
    method, _, k_text = text.partition(":")
    try:
        k = int(k_text)
    except ValueError:
        raise InputError(f"--spec-decode {text!r}: expected METHOD:k with k an integer, "
                         f"METHOD one of {', '.join(METHODS)}") from None
    if acceptance is None:
        raise InputError("--spec-decode needs --acceptance (rates:P1,P2,... or mean:AL)")
    SpecDecodeConfig(method, k, AcceptanceModel((1.0,)))   # method and k checked before the acceptance
    return SpecDecodeConfig(method, k, parse_acceptance(acceptance, k), seed)


class Verifier:
    """Draws how many of a request's drafts pass, and counts drafts and acceptances per position."""

    def __init__(self, config: SpecDecodeConfig) -> None:
        self.config = config
        k = config.num_draft_tokens
        acceptance = config.acceptance
        self._trace = acceptance if isinstance(acceptance, AcceptanceTrace) else None
        # bisect_right over the negated survival curve: the accepted count for one uniform draw
        self._neg_survival = [] if self._trace is not None else [-p for p in acceptance.survival(k)]
        self._seed = (config.seed * 0x9E3779B97F4A7C15) & _MASK64
        self.num_drafts = 0                       # verify rounds with at least one draft
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.rounds_by_accepted = [0] * (k + 1)   # verify rounds by their accepted count

    def accept(self, request_id: int, round_index: int, num_drafts: int) -> int:
        """Accepted drafts (0..num_drafts) of a request's round_index-th verification.

        Written for speed: this runs once per decoding request per step."""
        if self._trace is not None:
            return self._count(min(self._trace.accepted(request_id, round_index), num_drafts), num_drafts)
        # splitmix64's finaliser over (seed, request, round): a uniform in [0, 1) that every bit mixes into
        x = (self._seed ^ ((request_id * 0xBF58476D1CE4E5B9 + round_index) & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        u = ((x ^ (x >> 31)) >> 11) * _TWO_POW_53_INV
        accepted = bisect_right(self._neg_survival, -u)
        if accepted > num_drafts:
            accepted = num_drafts
        self.num_drafts += 1   # _count(), inlined
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += accepted
        self.rounds_by_accepted[accepted] += 1
        return accepted

    def _count(self, accepted: int, num_drafts: int) -> int:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += accepted
        self.rounds_by_accepted[accepted] += 1
        return accepted

    @property
    def accepted_per_position(self) -> list[int]:
        """Verify rounds whose draft at each position passed (vLLM's num_accepted_tokens_per_pos)."""
        out, running = [], 0
        for count in reversed(self.rounds_by_accepted[1:]):
            running += count
            out.append(running)
        return out[::-1]

    def summary(self) -> dict:
        """vLLM's spec-decode counters and the mean acceptance length (1 + accepted per draft round)."""
        rounds = self.num_drafts
        return {**self.config.describe(), "num_drafts": rounds, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.accepted_per_position),
                "acceptance_length": 1.0 + self.num_accepted_tokens / rounds if rounds else None,
                "draft_acceptance_rate": self.num_accepted_tokens / self.num_draft_tokens
                if self.num_draft_tokens else None}


def verify_feature_row(q_lens, kv_lens, draft_lens) -> tuple:
    """core.batch.feature_row() of a step whose requests verify draft_lens drafts: a request of
    1 + d tokens over a cache counts as a decode (its attention a decode's over s + d keys, what
    FlashAttention does for a few query tokens: see costmodel.spec_decode), its 1 + d tokens in
    num_tokens (the GEMMs run on every token of the step)."""
    num_decode = decode_kv_sum = decode_kv_max = prefill_tokens = pair_sum = tri_sum = 0
    q_list, s_list = q_lens.tolist(), kv_lens.tolist()
    for q, s, d in zip(q_list, s_list, draft_lens.tolist()):
        if q - d == 1 and s > 0:
            num_decode += 1
            decode_kv_sum += s + d
            decode_kv_max = max(decode_kv_max, s + d)
        else:
            prefill_tokens += q
            pair_sum += q * s
            tri_sum += q * (q + 1)
    return (len(q_list), sum(q_list), num_decode, decode_kv_sum, decode_kv_max, prefill_tokens,
            pair_sum + tri_sum / 2.0, sum(s_list))


def merge_summaries(summaries: list[dict]) -> dict | None:
    """One spec-decode summary over replicas' verifiers (None when spec decode is off)."""
    if not summaries:
        return None
    out = dict(summaries[0])
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        out[key] = sum(s[key] for s in summaries)
    out["num_accepted_tokens_per_pos"] = [sum(v) for v in zip(*(s["num_accepted_tokens_per_pos"] for s in summaries))]
    rounds, drafted = out["num_drafts"], out["num_draft_tokens"]
    out["acceptance_length"] = 1.0 + out["num_accepted_tokens"] / rounds if rounds else None
    out["draft_acceptance_rate"] = out["num_accepted_tokens"] / drafted if drafted else None
    return out
