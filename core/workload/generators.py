"""Synthetic workloads: an arrival process and two length distributions, sampled with a seed.

Arrival processes draw inter-arrival gaps; the first request arrives at 0 s. A workload is
sized by a number of requests, a duration, or both (whichever ends it first).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stepcal.core.bounds import MAX_ARRIVAL_S, MAX_TOKENS_PER_REQUEST
from stepcal.core.errors import InputError
from stepcal.core.trace import Trace
from stepcal.core.workload.readers import read_trace
from stepcal.core.workload.sessions import session_trace

# ---- arrival processes ----

@dataclass(frozen=True)
class Poisson:
    """Exponential gaps with mean 1 / rate_rps."""
    rate_rps: float

    def gaps_s(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate_rps, size)

    def warp_s(self, busy_s: np.ndarray) -> np.ndarray:
        return busy_s


@dataclass(frozen=True)
class Gamma:
    """Gamma gaps with mean 1 / rate_rps and coefficient of variation cv (1 = Poisson, >1 bursty)."""
    rate_rps: float
    cv: float

    def gaps_s(self, rng: np.random.Generator, size: int) -> np.ndarray:
        shape = 1.0 / self.cv**2   # CV of a gamma variable is 1 / sqrt(shape)
        return rng.gamma(shape, 1.0 / (self.rate_rps * shape), size)

    def warp_s(self, busy_s: np.ndarray) -> np.ndarray:
        return busy_s


@dataclass(frozen=True)
class OnOff:
    """Poisson at rate_rps during on periods of on_s seconds, separated by off_s of silence."""
    rate_rps: float
    on_s: float
    off_s: float

    def gaps_s(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate_rps, size)

    def warp_s(self, busy_s: np.ndarray) -> np.ndarray:
        # Arrivals are drawn on a clock that runs only while "on"; each completed on
        # period pushes the later ones back by one off period.
        return busy_s + np.floor(busy_s / self.on_s) * self.off_s


ArrivalProcess = Poisson | Gamma | OnOff


def arrivals_s(process: ArrivalProcess, rng: np.random.Generator, *,
               num_requests: int | None = None, duration_s: float | None = None) -> np.ndarray:
    """Sorted arrival times starting at 0, `num_requests` of them and/or within [0, duration_s)."""
    if num_requests is None and duration_s is None:
        raise InputError("a generated workload needs a size: n= (requests) or duration= (seconds)")
    if duration_s is None:
        return process.warp_s(_cumulative(process.gaps_s(rng, num_requests - 1)))
    # Unknown count: draw gaps in chunks until the clock passes duration_s.
    times = np.zeros(1)
    chunk = int(process.rate_rps * duration_s * 1.1) + 16
    if num_requests is not None:    # n= ends it first: no need to draw the whole duration's gaps
        chunk = min(chunk, num_requests + 16)
    while process.warp_s(times[-1:])[0] < duration_s and (num_requests is None or len(times) < num_requests):
        times = np.concatenate([times, times[-1] + np.cumsum(process.gaps_s(rng, chunk))])
    real = process.warp_s(times)
    real = real[real < duration_s]
    return real if num_requests is None else real[:num_requests]


def _cumulative(gaps: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(gaps)])


# ---- length distributions (token counts, int64 >= 1) ----

@dataclass(frozen=True)
class Fixed:
    num_tokens: int

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, self.num_tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [lo, hi], both included."""
    lo: int
    hi: int

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.lo, self.hi, size, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal with the given mean (tokens) and sigma of the underlying normal.

    Rounded to integers and clamped to [1, max_tokens]; the clamp shifts the mean a little
    when it bites.
    """
    mean: float
    sigma: float
    max_tokens: int | None = None

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        mu = np.log(self.mean) - self.sigma**2 / 2   # E[exp(N(mu, s^2))] = exp(mu + s^2/2)
        values = np.rint(rng.lognormal(mu, self.sigma, size))
        upper = np.inf if self.max_tokens is None else self.max_tokens
        return np.clip(values, 1, upper).astype(np.int64)


@dataclass(frozen=True)
class Empirical:
    """Resampled with replacement from a trace file's prompt or output lengths."""
    path: str
    trace_format: str | None = None

    def load(self) -> Trace:
        return read_trace(self.path, self.trace_format)


LengthDistribution = Fixed | Uniform | LogNormal | Empirical


# ---- a whole workload ----

@dataclass(frozen=True)
class WorkloadSpec:
    process: ArrivalProcess
    prompt: LengthDistribution
    output: LengthDistribution
    num_requests: int | None = None
    duration_s: float | None = None
    seed: int = 0
    text: str = field(default="generated", compare=False)   # the spec as written, for messages
    system: object = None      # core.workload.sessions.SharedSystem: a shared system prompt
    sessions: object = None    # core.workload.sessions.SessionShape: multi-turn sessions


def generate(spec: WorkloadSpec) -> Trace:
    """Sample the workload: arrivals first, then lengths, all from one seeded Generator. With a
    shared system prompt or sessions, the arrivals start sessions (core.workload.sessions)."""
    rng = np.random.default_rng(spec.seed)
    label = f"generator spec {spec.text!r}"
    with np.errstate(over="ignore"):   # an overflowing clock is reported below, by parameter
        arrival = arrivals_s(spec.process, rng, num_requests=spec.num_requests, duration_s=spec.duration_s)
    _check_arrivals(label, spec.process, arrival)
    if spec.system is not None or spec.sessions is not None:
        return session_trace(arrival, lambda n: _sample(spec.prompt, "prompt", rng, n, label),
                             lambda n: _sample(spec.output, "output", rng, n, label), rng,
                             system=spec.system, sessions=spec.sessions, source=spec.text)
    prompt, output = _lengths(spec.prompt, spec.output, rng, len(arrival), label)
    return Trace.from_arrays(arrival, prompt, output, source=spec.text)


def _check_arrivals(label: str, process: ArrivalProcess, arrival: np.ndarray) -> None:
    """Arrivals past MAX_ARRIVAL_S (or overflowed) come from the process's parameters: name them."""
    late = ~(arrival <= MAX_ARRIVAL_S)    # NaN and inf too
    if late.any():
        row = int(np.flatnonzero(late)[0])
        knobs = {Poisson: "rate=", Gamma: "rate= and cv=", OnOff: "rate=, on= and off="}[type(process)]
        raise InputError(f"{label}: arrival {row + 1} falls at {arrival[row]:.3g} s, past a year "
                         f"(MAX_ARRIVAL_S, core.bounds): {knobs} spread n= requests over more than a "
                         f"year; raise rate= or give fewer requests")


def _lengths(prompt_dist, output_dist, rng, size, label: str):
    if isinstance(prompt_dist, Empirical) and prompt_dist == output_dist:
        # One source for both: resample (prompt, output) pairs, keeping their correlation.
        source = prompt_dist.load()
        index = rng.integers(0, len(source), size)
        return source.num_prompt_tokens[index], source.num_output_tokens[index]
    return (_sample(prompt_dist, "prompt", rng, size, label),
            _sample(output_dist, "output", rng, size, label))


def _sample(dist, key: str, rng, size, label: str):
    """`size` lengths of the prompt= or output= distribution (`key`), each within MAX_TOKENS_PER_REQUEST."""
    if isinstance(dist, Empirical):
        values = getattr(dist.load(), f"num_{key}_tokens")    # the reader bounds them
        return values[rng.integers(0, len(values), size)]
    values = dist.sample(rng, size)
    if len(values) and values.max() > MAX_TOKENS_PER_REQUEST:
        raise InputError(f"{label}: {key}= drew a {int(values.max()):,}-token length, past "
                         f"{MAX_TOKENS_PER_REQUEST:,} (MAX_TOKENS_PER_REQUEST, core.bounds): give lognormal "
                         f"its MAX (lognormal:MEAN:SIGMA:MAX) or a smaller MEAN or SIGMA")
    return values
