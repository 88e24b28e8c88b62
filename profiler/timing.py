"""Timing a kernel: warm-up, adaptive repeats, median and spread.

A kernel is `run(i)`, where i counts calls so that the kernel can rotate through several input
buffers (the cache then cannot flatter small shapes). A timer turns calls into samples in
milliseconds per call: `CpuTimer` with perf_counter, `CudaTimer` with CUDA events (one sync per
batch of samples), `HostTimer` with perf_counter around host-side work on any device.

Repeats adapt: samples are taken in batches until the median is known to a target relative
precision, or the point's time cap is hit (at least MIN_SAMPLES are always taken so that the
p10/p90 mean something).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Run = Callable[[int], None]
MIN_SAMPLES = 3


@contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """torch's intra-op thread count fixed for a measurement and restored after it (the count is
    process-wide: a sweep run inside a longer process must not leave it changed)."""
    import torch  # lazy: loads torch
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class TimingPolicy:
    warmup: int = 3                      # calls before timing, never recorded
    min_repeats: int = 5                 # samples before the precision test may stop
    max_repeats: int = 200
    target_rel_precision: float = 0.02   # standard error of the median / median
    max_point_s: float = 1.0             # time cap of one point (timed part)
    min_sample_ms: float = 0.05          # below this, a sample repeats the call `inner` times
    max_inner: int = 256
    batch_size: int = 5                  # samples per timer batch (one device sync per batch)
    cuda_graphs: bool = True             # replay tiny graph-safe kernels from a CUDA graph
    cuda_graph_below_ms: float = 0.05
    rounds: int = 1                      # passes over the grid; a point's samples are pooled

    def for_round(self) -> TimingPolicy:
        """One pass's share of the point's budget: samples from passes minutes apart are pooled,
        so the reported spread also holds the drift of a busy machine, not one burst's jitter."""
        if self.rounds <= 1:
            return self
        return self.updated(max_point_s=self.max_point_s / self.rounds,
                            min_repeats=max(MIN_SAMPLES, math.ceil(self.min_repeats / self.rounds)),
                            max_repeats=max(MIN_SAMPLES, self.max_repeats // self.rounds))

    def updated(self, **changes) -> TimingPolicy:
        known = set(self.__dataclass_fields__)
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown timing settings {sorted(unknown)}; known: {sorted(known)}")
        for name, value in changes.items():
            default = getattr(self, name)
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            else:
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            if not ok:
                kind = "true or false" if isinstance(default, bool) else (
                    "an integer >= 1" if isinstance(default, int) else "a number >= 0")
                raise ValueError(f"{name} must be {kind}, got {value!r}")
        return TimingPolicy(**{**self.__dict__, **changes})


@dataclass(frozen=True)
class Measurement:
    time_ms: float            # median per call
    time_ms_p10: float
    time_ms_p90: float
    repeats: int              # samples taken (each of `inner_repeats` calls)
    inner_repeats: int
    rel_precision: float      # estimated standard error of the median / median
    stopped_by: str           # "precision", "time_cap" or "max_repeats"
    samples_ms: tuple[float, ...] = ()   # every sample, ms per call


def summarize(samples_ms, inner_repeats: int, stopped_by: str) -> Measurement:
    """Median, p10, p90 and precision of samples (of one pass, or pooled over passes)."""
    values = np.asarray(samples_ms, dtype=np.float64)
    p10, p50, p90 = np.percentile(values, [10, 50, 90])
    return Measurement(time_ms=float(p50), time_ms_p10=float(p10), time_ms_p90=float(p90),
                       repeats=len(values), inner_repeats=inner_repeats,
                       rel_precision=float(median_rel_precision(values)), stopped_by=stopped_by,
                       samples_ms=tuple(float(v) for v in values))


class Timer(Protocol):
    def samples(self, run: Run, num_samples: int, inner: int, first_call: int) -> list[float]:
        """Time num_samples samples of `inner` calls each; milliseconds per call."""


class CpuTimer:
    """perf_counter around the calls (the host waits for CPU work, so no sync is needed)."""

    def samples(self, run: Run, num_samples: int, inner: int, first_call: int) -> list[float]:
        out, call = [], first_call
        for _ in range(num_samples):
            start = time.perf_counter()
            for _ in range(inner):
                run(call)
                call += 1
            out.append((time.perf_counter() - start) * 1e3 / inner)
        return out


class HostTimer(CpuTimer):
    """Host-side work on a device: perf_counter, device idle at the start of every sample."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync

    def samples(self, run: Run, num_samples: int, inner: int, first_call: int) -> list[float]:
        out = []
        for i in range(num_samples):
            self.sync()
            out.extend(super().samples(run, 1, inner, first_call + i * inner))
        return out


class SelfTimer:
    """For kernels that time themselves: each call returns its own milliseconds (the host part of
    an engine iteration, whose forward is not to be counted). A sample is the mean of `inner` calls."""

    def samples(self, run: Run, num_samples: int, inner: int, first_call: int) -> list[float]:
        out, call = [], first_call
        for _ in range(num_samples):
            total_ms = 0.0
            for _ in range(inner):
                total_ms += run(call)
                call += 1
            out.append(total_ms / inner)
        return out


class CudaTimer:
    """CUDA events around each sample; one synchronisation per batch."""

    def samples(self, run: Run, num_samples: int, inner: int, first_call: int) -> list[float]:
        import torch  # lazy: loads torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(num_samples)]
        call = first_call
        for start, end in events:
            start.record()
            for _ in range(inner):
                run(call)
                call += 1
            end.record()
        events[-1][1].synchronize()
        return [start.elapsed_time(end) / inner for start, end in events]


def cuda_graph_run(run: Run, num_calls: int) -> Run:
    """Capture num_calls calls (rotating buffers) into one CUDA graph; returns a run that replays it."""
    import torch  # lazy: loads torch
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):       # warm the kernels up outside the capture, as torch asks
        for i in range(num_calls):
            run(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(num_calls):
            run(i)
    return lambda _call: graph.replay()


def median_rel_precision(samples: np.ndarray) -> float:
    """Standard error of the median / median, from a robust spread (IQR / 1.349 estimates sigma)."""
    median = float(np.median(samples))
    if len(samples) < 2 or median <= 0:
        return math.inf
    q25, q75 = np.percentile(samples, [25, 75])
    sigma = (q75 - q25) / 1.349
    return 1.2533 * sigma / math.sqrt(len(samples)) / median


def choose_inner(per_call_ms: float, policy: TimingPolicy) -> int:
    """Calls per sample so that one sample lasts at least min_sample_ms."""
    if per_call_ms <= 0:
        return policy.max_inner
    return int(min(policy.max_inner, max(1, math.ceil(policy.min_sample_ms / per_call_ms))))


def measure(run: Run, timer: Timer, policy: TimingPolicy, *,
            clock: Callable[[], float] = time.perf_counter,
            graph: Callable[[Run, int], Run] | None = None) -> Measurement:
    """Warm up, pick the calls per sample, then sample until precise enough or out of time.

    graph: when given (a graph-safe kernel on CUDA) and a call is shorter than
    cuda_graph_below_ms, `inner` calls are captured into one graph and replayed per sample.
    """
    warm = _warm_up(run, timer, policy)
    per_call_ms = float(np.median(warm[1:] if len(warm) > 1 else warm))
    inner = choose_inner(per_call_ms, policy)
    call = len(warm)
    # With a graph, one replay is `inner` calls: the timer sees one call per sample, we divide.
    sample_run, sample_inner, per_replay = run, inner, 1
    if graph is not None and policy.cuda_graphs and per_call_ms < policy.cuda_graph_below_ms:
        sample_run, sample_inner, per_replay = graph(run, inner), 1, inner
    samples: list[float] = []
    start = clock()
    stopped_by = "max_repeats"
    while len(samples) < policy.max_repeats:
        remaining_s = policy.max_point_s - (clock() - start)
        batch = _batch_size(policy, len(samples), remaining_s, per_call_ms * inner)
        samples.extend(t / per_replay for t in timer.samples(sample_run, batch, sample_inner, call))
        call += batch * sample_inner
        rel = median_rel_precision(np.asarray(samples))
        if len(samples) >= policy.min_repeats and rel <= policy.target_rel_precision:
            stopped_by = "precision"
            break
        if len(samples) >= MIN_SAMPLES and clock() - start >= policy.max_point_s:
            stopped_by = "time_cap"
            break
    return summarize(samples, inner, stopped_by)


def _warm_up(run: Run, timer: Timer, policy: TimingPolicy) -> list[float]:
    """policy.warmup calls (at least 1), cut short for slow kernels: warm-up costs at most
    about half the point's time cap once two calls are done."""
    warm: list[float] = []
    while len(warm) < max(policy.warmup, 1):
        warm.extend(timer.samples(run, 1, 1, len(warm)))
        if len(warm) >= 2 and sum(warm) >= 500.0 * policy.max_point_s:
            break
    return warm


def _batch_size(policy: TimingPolicy, taken: int, remaining_s: float, sample_ms: float) -> int:
    """Enough samples to reach min_repeats soon, few enough not to overshoot the time cap much."""
    wanted = max(policy.batch_size, policy.min_repeats - taken) if taken < policy.min_repeats \
        else policy.batch_size
    if sample_ms > 0 and remaining_s > 0:
        wanted = min(wanted, max(1, int(remaining_s * 1e3 / sample_ms)))
    elif remaining_s <= 0:
        wanted = 1
    wanted = max(wanted, MIN_SAMPLES - taken)
    return int(min(wanted, policy.max_repeats - taken))
