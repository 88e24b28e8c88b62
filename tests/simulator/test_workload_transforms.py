"""rescale_rate, cut, trace_stats and load_workload."""
from pathlib import Path

import numpy as np
import pytest

from stepcal.core.errors import InputError
from stepcal.core.trace import Trace
from stepcal.core.workload import cut, load_workload, mean_rate_rps, rescale_rate, trace_stats

FIXTURES = Path(__file__).resolve().parents[1] / "data"


def trace_at(*arrival_s, prompt=None, output=None) -> Trace:
    n = len(arrival_s)
    return Trace.from_arrays(list(arrival_s), prompt or [10] * n, output or [5] * n, source="test")


# ---- rescale ----

def test_rescale_hits_the_target_rate_and_keeps_the_shape():
    trace = trace_at(2.0, 3.0, 3.5, 7.0)
    faster = rescale_rate(trace, 3.0)
    assert mean_rate_rps(trace) == pytest.approx(0.6)
    assert mean_rate_rps(faster) == pytest.approx(3.0)
    np.testing.assert_allclose(faster.arrival_s, [2.0, 2.2, 2.3, 3.0])   # gaps scaled by 0.2
    np.testing.assert_array_equal(faster.request_id, trace.request_id)
    np.testing.assert_array_equal(trace.arrival_s, [2.0, 3.0, 3.5, 7.0])  # the input is untouched


def test_rescale_errors():
    with pytest.raises(InputError, match="--rate must be a positive number"):
        rescale_rate(trace_at(0.0, 1.0), 0.0)
    with pytest.raises(InputError, match="test: cannot rescale"):
        rescale_rate(trace_at(1.0, 1.0), 2.0)


# ---- cut ----

def test_cut_by_count_duration_and_both():
    trace = trace_at(0.0, 1.0, 2.0, 3.0, 4.0)
    assert cut(trace, num_requests=2).arrival_s.tolist() == [0.0, 1.0]
    assert cut(trace, duration_s=2.5).arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert cut(trace, duration_s=2.0).arrival_s.tolist() == [0.0, 1.0]     # [first, first + d)
    assert cut(trace, num_requests=4, duration_s=1.5).arrival_s.tolist() == [0.0, 1.0]
    assert cut(trace, num_requests=99) is trace
    assert cut(trace_at(10.0, 11.0, 13.0), duration_s=2.0).arrival_s.tolist() == [10.0, 11.0]


def test_cut_errors():
    with pytest.raises(InputError, match="--num-requests must be a positive integer"):
        cut(trace_at(0.0), num_requests=0)
    with pytest.raises(InputError, match="--duration must be a positive number"):
        cut(trace_at(0.0), duration_s=-1.0)


# ---- stats ----

def test_stats_figures():
    trace = trace_at(0.0, 1.0, 2.0, 4.0, prompt=[1, 2, 3, 100], output=[7, 7, 7, 7])
    stats = trace_stats(trace)
    assert stats["num_requests"] == 4
    assert stats["duration_s"] == 4.0
    assert stats["rate_rps"] == pytest.approx(0.75)
    # gaps 1, 1, 2: mean 4/3, population std sqrt(2)/3
    assert stats["burstiness_cv"] == pytest.approx(np.sqrt(2) / 4)
    assert stats["num_prompt_tokens_mean"] == pytest.approx(26.5)
    assert stats["num_prompt_tokens_p50"] == pytest.approx(2.5)
    assert stats["num_prompt_tokens_p90"] == pytest.approx(70.9)
    assert stats["num_prompt_tokens_max"] == 100.0
    assert stats["num_output_tokens_p99"] == 7.0


def test_stats_of_a_single_instant_are_undefined_not_minus_one():
    stats = trace_stats(trace_at(3.0, 3.0))
    assert stats["rate_rps"] is None and stats["burstiness_cv"] is None


# ---- load_workload ----

def test_load_a_file_then_cut_and_rescale():
    trace = load_workload(str(FIXTURES / "vidur_tiny.csv"), rate_rps=1.0, num_requests=2)
    # arrivals 0, 0.75, 2.5: the first two, then rescaled so their one gap runs at 1 req/s
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.0])


def test_load_a_forced_format(tmp_path):
    path = tmp_path / "trace.dat"
    path.write_text((FIXTURES / "vidur_tiny.csv").read_text())
    assert len(load_workload(str(path), trace_format="vidur")) == 3


def test_load_a_spec_sized_and_seeded_by_the_flags():
    spec = "poisson:rate=2,prompt=fixed:3,output=fixed:2"
    a = load_workload(spec, num_requests=40, seed=1)
    assert len(a) == 40 and a.source == spec
    np.testing.assert_array_equal(a.arrival_s, load_workload(spec, num_requests=40, seed=1).arrival_s)
    assert not np.array_equal(a.arrival_s, load_workload(spec, num_requests=40, seed=2).arrival_s)
    # --rate regenerates at the new rate with the same draws: the same shape, scaled
    b = load_workload(spec, num_requests=40, seed=1, rate_rps=4.0)
    np.testing.assert_allclose(b.arrival_s, a.arrival_s / 2, rtol=1e-12)


def test_load_a_spec_cut_by_the_flags():
    trace = load_workload("poisson:rate=10,n=500,prompt=fixed:3,output=fixed:2", duration_s=5.0)
    assert 0 < len(trace) < 500 and (trace.arrival_s < 5.0).all()


def test_load_errors_name_the_flag(tmp_path):
    with pytest.raises(InputError, match=r"^--trace: 'missing\.csv' is neither an existing file nor"):
        load_workload("missing.csv")
    with pytest.raises(InputError, match=r"^--trace: .* is a directory"):
        load_workload(str(tmp_path))
    with pytest.raises(InputError, match=r"^--trace 'poisson:rate=1,prompt=fixed:1,output=fixed:1': "
                                         r"give its size"):
        load_workload("poisson:rate=1,prompt=fixed:1,output=fixed:1")
