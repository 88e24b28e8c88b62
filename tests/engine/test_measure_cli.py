import json

import pandas as pd

from stepcal.core.measured_run import noise_floor
from stepcal.experiments.cli import main
from stepcal.profiler.allocator import configure_allocator


def test_measure_writes_repeats_meta_and_noise(tmp_path, capsys):
    import torch

    from stepcal.profiler.timing import torch_threads
    out = tmp_path / "m"
    with torch_threads(2):     # measure runs with its --threads (1) and leaves the caller's count as it was
        code = main(["measure", "--model-spec", "tiny", "--trace",
                     "poisson:rate=50,n=12,prompt=uniform:4:40,output=uniform:1:8",
                     "--scheduler", "continuous", "--repeats", "2", "--quiet", "--out", str(out)])
        assert torch.get_num_threads() == 2
    assert code == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["scheduler"] == "continuous" and meta["num_threads"] == 1 and meta["model_spec"]["name"] == "tiny"
    assert meta["fingerprint"]["torch_version"]
    assert meta["allocator"] == configure_allocator()      # the CPU run's allocator setting, recorded
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 12 and "noise_floor" in summary
    repeats = [json.loads((out / f"repeat_{k}" / "summary.json").read_text()) for k in (0, 1)]
    assert summary["noise_floor"] == noise_floor(repeats)
    trace = pd.read_parquet(out / "trace.parquet")
    for k in (0, 1):
        req = pd.read_parquet(out / f"repeat_{k}" / "requests.parquet")
        steps = pd.read_parquet(out / f"repeat_{k}" / "steps.parquet")
        assert req["request_id"].tolist() == trace["request_id"].tolist()
        assert {"host_ms", "device_ms", "q_lens", "kv_lens", "duration_ms"} <= set(steps.columns)


def test_measure_serves_a_mixture_of_experts_model(tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["measure", "--model-spec", "tiny-moe", "--trace",
                 "poisson:rate=50,n=10,prompt=uniform:4:40,output=uniform:1:8",
                 "--scheduler", "sarathi", "--quiet", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["model_spec"]["name"] == "tiny-moe" and meta["model_spec"]["num_experts"] == 8
    requests = pd.read_parquet(out / "repeat_0" / "requests.parquet")
    assert len(requests) == 10 and requests["finish_s"].notna().all()
    assert json.loads((out / "summary.json").read_text())["num_finished"] == 10


def test_measure_bad_input_exits_2_without_output(tmp_path, capsys):
    import torch
    out = tmp_path / "m"
    if not torch.cuda.is_available():
        assert main(["measure", "--trace", "poisson:rate=5,n=3,prompt=fixed:8,output=fixed:2", "--device", "cuda", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--device cuda" in err and err.count("\n") == 1 and not out.exists()
    assert main(["measure", "--trace", "poisson:rate=5,n=3,prompt=fixed:8,output=fixed:2", "--repeats", "0", "--out", str(out)]) == 2
    assert main(["measure", "--trace", "poisson:rate=5,n=3,prompt=fixed:100,output=fixed:100", "--kv-blocks", "4",
                 "--out", str(out)]) == 2
    assert "--skip-oversize" in capsys.readouterr().err and not out.exists()


def test_noise_floor_is_the_relative_difference():
    a = {"ttft_ms": {"mean": 10.0, "p50": 10.0, "p90": 20.0, "p95": 20.0, "p99": 40.0}, "throughput_rps": 2.0}
    b = {"ttft_ms": {"mean": 11.0, "p50": 9.0, "p90": 20.0, "p95": 22.0, "p99": 50.0}, "throughput_rps": 2.2}
    floor = noise_floor([a, b])
    assert floor["ttft_ms"]["p50"] == 0.1 and floor["ttft_ms"]["p99"] == 0.25 and floor["ttft_ms"]["p90"] == 0.0
    assert abs(floor["throughput_rps"] - 0.1) < 1e-12 and floor["tpot_ms"]["p50"] is None


def test_single_repeat_runs_combine_into_one_run_with_its_noise_floor(tmp_path, capsys, monkeypatch):
    import pytest

    from stepcal.core.errors import InputError
    from stepcal.core.measured_run import SAME_PLACE
    from stepcal.profiler.engine import slowdown
    from stepcal.profiler.engine.measure import combine_repeats
    trace = "poisson:rate=50,n=8,prompt=uniform:4:40,output=uniform:1:8"
    for name, seed in (("a", "0"), ("b", "0"), ("other", "1")):
        assert main(["measure", "--trace", trace, "--scheduler", "continuous", "--seed", seed, "--quiet",
                     "--out", str(tmp_path / name)]) == 0
    summary = combine_repeats([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")
    meta = json.loads((tmp_path / "ab" / "meta.json").read_text())
    assert meta["repeats"] == 2 and summary["num_finished"] == 8
    for k, part in enumerate("ab"):    # each part's repeat, in order, unchanged
        combined = pd.read_parquet(tmp_path / "ab" / f"repeat_{k}" / "steps.parquet")
        assert combined.equals(pd.read_parquet(tmp_path / part / "repeat_0" / "steps.parquet"))
    first = json.loads((tmp_path / "a" / "repeat_0" / "summary.json").read_text())
    second = json.loads((tmp_path / "b" / "repeat_0" / "summary.json").read_text())
    assert summary["noise_floor"] == noise_floor([first, second])
    assert first["speed_probe_ms"] > 0
    with pytest.raises(InputError, match="other: not a repeat of"):      # another seed: another trace
        combine_repeats([tmp_path / "a", tmp_path / "other"], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    assert SAME_PLACE not in first
    # the campaign's repeats kept as the engine's own are flagged, where the combined run still finds them slowed
    windows = [slowdown.SlowestWindow(1.0, 0.0, 0.1, 1.0), slowdown.SlowestWindow(1.6, 0.0, 0.1, 1.0)]
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: windows)
    combine_repeats([tmp_path / "a", tmp_path / "b"], tmp_path / "kept", kept_same_place=(0, 1))
    flags = [json.loads((tmp_path / "kept" / f"repeat_{k}" / "summary.json").read_text()).get(SAME_PLACE) for k in (0, 1)]
    assert flags == [None, True]
