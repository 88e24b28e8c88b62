"""core.measured_run: the one writer and reader of a measured run's directory layout."""
import json

import numpy as np
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.core.measured_run import (
    METRICS,
    STATS,
    MetricStats,
    Repeat,
    RunStats,
    has_request_log,
    noise_floor,
    read_measured_run,
    repeat_dirs,
    write_measured_run,
)
from stepcal.core.run_meta import RunMeta
from stepcal.core.trace import Trace


def summary(ttft_p50: float, throughput: float) -> dict:
    return {"num_requests": 3, "num_preemptions": 1, "throughput_rps": throughput,
            "ttft_ms": {"mean": 2 * ttft_p50, "p50": ttft_p50, "p90": None, "p95": 3.0, "p99": 4.0}}


def repeat(k: int) -> Repeat:
    requests = pd.DataFrame({"request_id": [0, 1, 2], "ttft_ms": [1.0 + k, 2.0, 3.0]})
    steps = pd.DataFrame({"step": [0, 1], "duration_ms": [0.5, 0.25 * (k + 1)]})
    return Repeat(requests, steps, summary(10.0 + k, 2.0 * (k + 1)))


@pytest.fixture
def trace():
    return Trace.from_arrays(np.array([0.0, 0.5, 1.0]), np.array([8, 16, 4]), np.array([2, 3, 1]),
                             request_id=np.arange(3))


def test_the_layout_and_what_it_reads_back(tmp_path, trace):
    repeats = [repeat(0), repeat(1)]
    written = write_measured_run(tmp_path / "run", trace, repeats, RunMeta(scheduler="vllm", extra={"ratio": float("nan")}))
    files = sorted(str(p.relative_to(tmp_path / "run")) for p in (tmp_path / "run").rglob("*") if p.is_file())
    assert files == ["meta.json", "repeat_0/requests.parquet", "repeat_0/steps.parquet", "repeat_0/summary.json",
                     "repeat_1/requests.parquet", "repeat_1/steps.parquet", "repeat_1/summary.json", "summary.json",
                     "trace.parquet"]
    # summary.json is repeat 0's, with the noise floor of the two: |11 - 10| / 10, |4 - 2| / 2
    assert written == {**summary(10.0, 2.0), "noise_floor": noise_floor([summary(10.0, 2.0), summary(11.0, 4.0)])}
    assert written["noise_floor"]["ttft_ms"]["p50"] == pytest.approx(0.1)
    assert written["noise_floor"]["throughput_rps"] == pytest.approx(1.0)
    assert written["noise_floor"]["ttft_ms"]["p90"] is None and written["noise_floor"]["e2e_ms"]["p50"] is None
    run = read_measured_run(tmp_path / "run")
    assert run.meta == RunMeta(scheduler="vllm", extra={"ratio": None})          # NaN is written as null
    assert run.summary == written == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert run.trace.to_frame().equals(trace.to_frame())
    for got, sent in zip(run.repeats, repeats):
        assert got.requests.equals(sent.requests) and got.steps.equals(sent.steps) and got.summary == sent.summary
    assert repeat_dirs(tmp_path / "run") == [tmp_path / "run" / "repeat_0", tmp_path / "run" / "repeat_1"]
    assert has_request_log(tmp_path / "run") and not has_request_log(tmp_path)


def test_one_repeat_has_no_noise_floor(tmp_path, trace):
    written = write_measured_run(tmp_path / "run", trace, [repeat(0)], RunMeta())
    assert written == summary(10.0, 2.0)
    assert len(read_measured_run(tmp_path / "run").repeats) == 1


def test_a_missing_file_names_the_argument_and_the_file(tmp_path, trace):
    write_measured_run(tmp_path / "run", trace, [repeat(0)], RunMeta())
    (tmp_path / "run" / "repeat_0" / "steps.parquet").unlink()
    with pytest.raises(InputError) as missing:
        read_measured_run(tmp_path / "run", arg_name="--measured")
    assert str(missing.value) == (f"--measured {tmp_path / 'run'}: missing repeat_0/steps.parquet (expected the "
                                  f"output of `stepcal measure` or `stepcal import vllm-bench`)")


def test_statistics_are_read_in_one_place():
    stats = RunStats.from_summary(summary(10.0, 2.0))
    assert stats.stat("ttft_ms", "p50") == 10.0 and stats.stat("ttft_ms", "mean") == 20.0
    assert stats.stat("ttft_ms", "p90") is None                     # null in the file
    assert stats.metrics["tpot_ms"] == MetricStats()                # absent from the file
    assert (stats.throughput_rps, stats.num_preemptions) == (2.0, 1)
    assert list(stats.metrics) == list(METRICS) and list(MetricStats().to_dict()) == list(STATS)
    assert MetricStats.of({"e2e_ms": None}, "e2e_ms") == MetricStats()   # a run that finished nothing
