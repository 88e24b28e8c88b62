"""The request path before the scheduler sees a request: a serving engine's front end (HTTP, chat
template, tokenisation, hand-over to the engine), which kernel profiles never see and which delays
TTFT and E2E only.

Each request's delay, in ms:

    median_ms · exp(sigma · z)  +  per_prompt_token_ms · prompt tokens  +  per_stream_ms · active streams

- The first part is the fixed work of a request, log-normal: a CPU path made of many small steps
  (parsing, allocation, a garbage-collector pause, a context switch) varies multiplicatively and has
  a long right tail; a log-normal is positive, is read directly as a median and a spread (sigma is
  the standard deviation of the log), and with sigma = 0 is today's constant delay. z is a standard
  normal drawn from the request id and the seed alone, so a draw does not depend on the order of
  events, on which other requests the trace holds, or on the replica.
- The second is work proportional to the prompt (tokenisation).
- The third is the load-dependent part: the front end shares its process (one event loop in vLLM's
  API server) with the output of every request still streaming, so a new request waits behind that
  work. `active streams` counts the other requests in the system when this one arrives: sent by
  their client and neither finished nor given up on (a closed-loop turn counts from its release).

With per_stream_ms = 0 every delay is known before the run and the simulation shifts the entries
once; otherwise a request's delay is computed at its arrival from the count at that moment.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepcal.core.errors import InputError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAM_KEY = 0x66726F6E74   # keeps these draws apart from other seeded draws of the same seed


@dataclass(frozen=True)
class FrontEnd:
    median_ms: float = 0.0             # per-request fixed part: the median of a log-normal
    sigma: float = 0.0                 # log-normal shape (standard deviation of ln delay); 0: constant
    per_prompt_token_ms: float = 0.0   # per prompt token (tokenisation)
    per_stream_ms: float = 0.0         # per other active stream at the request's arrival

    def __post_init__(self) -> None:
        for name in ("median_ms", "sigma", "per_prompt_token_ms", "per_stream_ms"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise InputError(f"front end: {name} must be a finite number >= 0, got {value!r}")

    @property
    def is_zero(self) -> bool:
        return self.median_ms == 0 and self.per_prompt_token_ms == 0 and self.per_stream_ms == 0

    @property
    def reads_load(self) -> bool:
        """Whether a delay depends on the simulation's state (the active streams at arrival)."""
        return self.per_stream_ms > 0

    def base_delays_s(self, request_ids: np.ndarray, num_prompt_tokens: np.ndarray, seed: int) -> np.ndarray:
        """Each request's delay in seconds without the load-dependent part. The constant case is
        computed as the simulator always did (median_ms / 1000 added to the arrival), to the bit."""
        n = len(request_ids)
        if self.sigma > 0 and self.median_ms > 0:
            delays_ms = self.median_ms * np.exp(self.sigma * standard_normals(request_ids, seed))
        else:
            delays_ms = np.full(n, float(self.median_ms))
        if self.per_prompt_token_ms > 0:
            delays_ms = delays_ms + self.per_prompt_token_ms * np.asarray(num_prompt_tokens, dtype=np.float64)
        return delays_ms / 1000.0

    def paths_s(self, requests, seed: int) -> dict[int, float] | float:
        """Each request's path without the load part, in seconds, by request id; one float when every
        request's is the same (no spread and no prompt-length part), as the simulators use it."""
        if self.sigma == 0 and self.per_prompt_token_ms == 0:
            return self.median_ms / 1000.0
        ids = np.array([r.request_id for r in requests], dtype=np.int64)
        prompts = np.array([r.num_prompt_tokens for r in requests], dtype=np.int64)
        return dict(zip(ids.tolist(), self.base_delays_s(ids, prompts, seed).tolist()))

    def describe(self) -> str:
        parts = [f"{self.median_ms:g} ms" + (f" x lognormal(sigma {self.sigma:g})" if self.sigma else "")]
        if self.per_prompt_token_ms:
            parts.append(f"{self.per_prompt_token_ms:g} ms per prompt token")
        if self.per_stream_ms:
            parts.append(f"{self.per_stream_ms:g} ms per active stream")
        return " + ".join(parts)


def standard_normals(request_ids: np.ndarray, seed: int) -> np.ndarray:
    """One standard normal per request id, a pure function of (id, seed): a counter-based generator
    (splitmix64 hashes of the id, Box-Muller), so that no draw depends on the order of the others."""
    key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF, _STREAM_KEY], dtype=np.uint64))
    h1 = _splitmix64(np.asarray(request_ids, dtype=np.int64).view(np.uint64) ^ key[0])
    h2 = _splitmix64(h1 ^ key[1])
    u1, u2 = _unit(h1), _unit(h2)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _unit(h: np.ndarray) -> np.ndarray:
    """Uniform in (0, 1) from the top 53 bits of a hash (never 0: log(u) stays finite)."""
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / 9007199254740992.0


def _splitmix64(x: np.ndarray) -> np.ndarray:
    # unsigned arithmetic on arrays wraps modulo 2**64, which the mixing relies on
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def path_of(paths_s: dict[int, float] | float, request) -> float:
    """A request's path in seconds from FrontEnd.paths_s (one float: every request's)."""
    return paths_s if isinstance(paths_s, float) else paths_s[request.request_id]


def entry_order(requests, paths_s: dict[int, float] | float) -> tuple[list, list[float]]:
    """The requests in the order they reach the engine (arrival plus path) and when; requests that
    reach it together keep their order."""
    arrival_s = np.array([r.arrival_s for r in requests], dtype=np.float64)
    if isinstance(paths_s, float):
        return list(requests), (arrival_s + paths_s if paths_s else arrival_s).tolist()
    entry_s = arrival_s + np.array([paths_s[r.request_id] for r in requests], dtype=np.float64)
    order = np.argsort(entry_s, kind="stable")
    return [requests[i] for i in order.tolist()], entry_s[order].tolist()
