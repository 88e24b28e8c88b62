"""The adaptive timing loop, driven by a fake timer and a fake clock."""
import itertools

import numpy as np
import pytest

from stepcal.profiler.timing import CpuTimer, TimingPolicy, choose_inner, measure, median_rel_precision


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class FakeTimer:
    """Calls run like a real timer; each call 'takes' the next value of `per_call_ms`."""

    def __init__(self, per_call_ms, clock: FakeClock) -> None:
        self.values = iter(per_call_ms)
        self.clock = clock
        self.calls: list[int] = []

    def samples(self, run, num_samples, inner, first_call):
        out, call = [], first_call
        for _ in range(num_samples):
            total = 0.0
            for _ in range(inner):
                run(call)
                self.calls.append(call)
                call += 1
                total += next(self.values)
            self.clock.now_s += total / 1e3
            out.append(total / inner)
        return out


def run_fake(values, policy, graph=None):
    clock = FakeClock()
    timer = FakeTimer(values, clock)
    seen = []
    result = measure(seen.append, timer, policy, clock=clock, graph=graph)
    return result, timer, seen


def test_steady_kernel_stops_on_precision_after_min_repeats():
    policy = TimingPolicy(warmup=3, min_repeats=5, batch_size=5, min_sample_ms=0.0)
    result, timer, seen = run_fake(itertools.repeat(2.0), policy)
    assert result.stopped_by == "precision"
    assert result.repeats == 5 and result.inner_repeats == 1
    assert result.time_ms == result.time_ms_p10 == result.time_ms_p90 == 2.0
    # Warm-up calls come first and are not in the samples; call indices count up for rotation.
    assert seen == list(range(8)) == timer.calls


def test_warm_up_is_excluded_from_the_statistics():
    policy = TimingPolicy(warmup=3, min_repeats=5, min_sample_ms=0.0, max_point_s=10.0)
    result, _, _ = run_fake(itertools.chain([500.0, 400.0, 300.0], itertools.repeat(1.0)), policy)
    assert result.time_ms == 1.0 and result.time_ms_p90 == 1.0


def test_noisy_kernel_stops_at_the_time_cap():
    rng = np.random.default_rng(0)
    values = iter(rng.lognormal(mean=0.0, sigma=1.0, size=100_000))
    policy = TimingPolicy(warmup=2, min_repeats=5, max_point_s=0.05, target_rel_precision=0.001,
                          min_sample_ms=0.0)
    result, _, _ = run_fake(values, policy)
    assert result.stopped_by == "time_cap"
    # About 50 ms of 1.6 ms (lognormal mean) samples, overshoot bounded by one small batch.
    assert 15 <= result.repeats <= 60
    assert result.time_ms_p10 <= result.time_ms <= result.time_ms_p90
    assert result.rel_precision > 0.001


def test_max_repeats_bounds_the_samples():
    values = itertools.cycle([1.0, 3.0])
    policy = TimingPolicy(warmup=1, min_repeats=5, max_repeats=12, max_point_s=1e9,
                          target_rel_precision=0.0, min_sample_ms=0.0)
    result, _, _ = run_fake(values, policy)
    assert result.stopped_by == "max_repeats" and result.repeats == 12


def test_slow_kernel_takes_at_least_three_samples_and_short_warm_up():
    policy = TimingPolicy(warmup=5, min_repeats=5, max_point_s=0.1, target_rel_precision=0.0)
    values = itertools.cycle([400.0, 420.0, 380.0])   # each call is 4x the point's cap
    result, timer, _ = run_fake(values, policy)
    assert result.repeats == 3 and result.stopped_by == "time_cap"
    assert len(timer.calls) == 2 + 3                   # warm-up cut to two calls


def test_tiny_kernel_repeats_calls_inside_a_sample():
    policy = TimingPolicy(warmup=2, min_repeats=5, min_sample_ms=0.05, max_inner=256)
    result, timer, _ = run_fake(itertools.repeat(0.001), policy)
    assert result.inner_repeats == 50
    assert result.time_ms == pytest.approx(0.001)
    assert len(timer.calls) == 2 + 50 * result.repeats


def test_graph_replay_is_divided_by_the_calls_it_holds():
    captured = {}

    def graph(run, num_calls):
        captured["num_calls"] = num_calls
        return run          # the fake 'replay' is one call that the fake timer says takes 0.04 ms

    policy = TimingPolicy(warmup=2, min_sample_ms=0.2, cuda_graph_below_ms=0.05)
    result, _, _ = run_fake(itertools.repeat(0.04), policy, graph=graph)
    assert captured["num_calls"] == result.inner_repeats == 5
    assert result.time_ms == pytest.approx(0.04 / 5)


def test_choose_inner_and_precision_helpers():
    policy = TimingPolicy(min_sample_ms=1.0, max_inner=64)
    assert choose_inner(2.0, policy) == 1
    assert choose_inner(0.1, policy) == 10
    assert choose_inner(0.0, policy) == 64
    assert median_rel_precision(np.full(10, 3.0)) == 0.0
    assert median_rel_precision(np.array([1.0])) == float("inf")


def test_cpu_timer_measures_a_real_function():
    data = np.arange(1000.0)
    result = measure(lambda i: data.sum(), CpuTimer(), TimingPolicy(max_point_s=0.05))
    assert result.time_ms > 0
    assert result.time_ms_p10 <= result.time_ms <= result.time_ms_p90
    assert result.inner_repeats >= 1 and result.repeats >= 3


def test_policy_update_rejects_unknown_settings():
    assert TimingPolicy().updated(max_point_s=2.0).max_point_s == 2.0
    with pytest.raises(ValueError, match="unknown timing settings"):
        TimingPolicy().updated(max_points=2.0)
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        TimingPolicy().updated(rounds=0)
    with pytest.raises(ValueError, match="max_point_s must be a number >= 0"):
        TimingPolicy().updated(max_point_s="1")
    assert TimingPolicy().updated(rounds=3).for_round().max_point_s == pytest.approx(1.0 / 3)
