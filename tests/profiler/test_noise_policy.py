"""The noise policy: the CPU's is every mechanism as it always ran; CUDA's leaves out exactly the
shared-CPU ones (and the CPU allocator); each command builds it from the device and its flags and
hands it to the sweep, the measured run, the fit or the campaign."""
import json
from dataclasses import fields, replace
from types import SimpleNamespace

import pytest

from stepcal.core.model_spec import PRESETS
from stepcal.experiments.cli import main
from stepcal.profiler import speed_guard
from stepcal.profiler.engine import slowdown
from stepcal.profiler.grid import expand_grid
from stepcal.profiler.noise_policy import NoisePolicy
from stepcal.profiler.sweep import SweepConfig, run_sweep

SHARED_CPU_ONLY = {"mark_slowed_windows", "retry_slowed_repeats", "drop_slowed_servings"}
CPU_DEVICE_ONLY = {"cpu_allocator"}


def test_the_cpu_policy_is_what_the_code_always_did():
    # written out from the code before the policy: speed_guard.py's constants, measure's probe,
    # the campaign's retry_slowed = 2, fit's slowed servings, the allocator on cpu
    assert {f.name: getattr(NoisePolicy.for_device("cpu"), f.name) for f in fields(NoisePolicy)} == {
        "speed_probe_steps": 200, "speed_guard": True, "guard_probe_steps": 20, "guard_slow_factor": 1.5,
        "guard_probe_share": 0.03, "guard_min_every_s": 5.0, "guard_wait_step_s": 3.0, "guard_wait_max_s": 30.0,
        "mark_slowed_windows": True, "retry_slowed_repeats": 2, "drop_slowed_servings": True, "cpu_allocator": True}
    assert NoisePolicy.for_device("cpu") == NoisePolicy()
    # the guard's spacing: 3% of the sweep's time, 5 s at least (20 steps, a fifth more for warm-up)
    assert NoisePolicy().guard_every_s(1.0) == 5.0 and NoisePolicy().guard_every_s(30.0) == pytest.approx(24.0)
    assert (speed_guard.GUARD_STEPS, speed_guard.SLOW_FACTOR, speed_guard.WAIT_STEP_S, speed_guard.WAIT_MAX_S) == (
        20, 1.5, 3.0, 30.0)
    assert (slowdown.SLOWED_RATIO, slowdown.SLOWED_ALONE_RATIO, slowdown.WINDOW_STEPS) == (1.25, 1.4, 32)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_the_cuda_policy_turns_off_exactly_the_shared_cpu_parts(device):
    cpu, cuda = NoisePolicy.for_device("cpu"), NoisePolicy.for_device(device)
    changed = {f.name for f in fields(NoisePolicy) if getattr(cpu, f.name) != getattr(cuda, f.name)}
    assert changed == SHARED_CPU_ONLY | CPU_DEVICE_ONLY
    assert not (cuda.mark_slowed_windows or cuda.retry_slowed_repeats or cuda.drop_slowed_servings or cuda.cpu_allocator)
    assert cuda.speed_guard and cuda.speed_probe_steps == 200     # any device: on
    said = field_docstrings()
    assert set(said) == {f.name for f in fields(NoisePolicy)}      # each field says which noise it is for
    assert {n for n, text in said.items() if not text.startswith("Any device.")} == SHARED_CPU_ONLY | CPU_DEVICE_ONLY
    assert all(said[n].startswith("Shared CPU only.") for n in SHARED_CPU_ONLY)
    assert all(said[n].startswith("CPU device") for n in CPU_DEVICE_ONLY)


def field_docstrings() -> dict:
    """{field: the docstring under it} of NoisePolicy's source."""
    import ast
    import inspect
    from itertools import pairwise

    from stepcal.profiler import noise_policy
    (cls,) = [n for n in ast.parse(inspect.getsource(noise_policy)).body if isinstance(n, ast.ClassDef)]
    return {a.target.id: b.value.value for a, b in pairwise(cls.body)
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def test_retry_slowed_overrides_and_needs_marked_windows():
    cuda = NoisePolicy.for_device("cuda")
    assert cuda.with_retry_slowed(0) == cuda
    assert cuda.with_retry_slowed(2).mark_slowed_windows and cuda.with_retry_slowed(2).retry_slowed_repeats == 2
    assert NoisePolicy().with_retry_slowed(0) == replace(NoisePolicy(), retry_slowed_repeats=0)
    with pytest.raises(ValueError, match="needs mark_slowed_windows"):
        replace(cuda, retry_slowed_repeats=1)
    with pytest.raises(ValueError, match="0 or more"):
        NoisePolicy(retry_slowed_repeats=-1)


def _guarded_sweep(tmp_path, monkeypatch, noise: NoisePolicy | None):
    """A CPU sweep of two whole steps and a GEMM whose guard probes all find the machine slow."""
    import stepcal.profiler.engine.measure as measure
    monkeypatch.setattr(measure, "speed_probe_ms", lambda model, num_steps=200, **kw: 3.0 if num_steps == 20 else 1.0)
    timing = {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1, "target_rel_precision": 0.05}
    source = {"timing": timing, "gemm": {"m": [1], "names": ["o_proj"]},
              "step": {"batches": [{"num_decode": d, "decode_s": 16} for d in (1, 2)]}}
    grid = expand_grid("noise", source, PRESETS["tiny"]).for_ops(("gemm", "step"))
    config = SweepConfig(spec=PRESETS["tiny"], device="cpu", dtype="float32", ops=("gemm", "step"), grid=grid,
                         noise=noise)
    tick = iter(range(0, 10**6, 20))
    run_sweep(config, tmp_path, progress=False, clock=lambda: float(next(tick)))
    return json.loads((tmp_path / "meta.json").read_text())


def test_a_sweep_under_the_cuda_policy_keeps_the_guard_and_leaves_the_cpu_allocator_alone(tmp_path, monkeypatch):
    import stepcal.profiler.sweep as sweep
    applied = []
    monkeypatch.setattr(sweep, "configure_allocator", lambda: applied.append(1) or {"allocator": "system"})
    cpu = _guarded_sweep(tmp_path / "cpu", monkeypatch, None)
    assert applied == [1] and cpu["allocator"] == {"allocator": "system"} and cpu["speed_guard"]
    cuda = _guarded_sweep(tmp_path / "cuda", monkeypatch, NoisePolicy.for_device("cuda"))
    assert applied == [1] and cuda["allocator"] is None          # not applied again: the CPU's own
    assert cuda["speed_guard"][0]["probes_ms"][0] == 3.0          # the guard runs on any device
    off = _guarded_sweep(tmp_path / "off", monkeypatch, replace(NoisePolicy(), speed_guard=False))
    assert "speed_guard" not in off and len(off["speed_probe_ms"]) == 2   # no guard; the probes stay


def test_the_profile_command_hands_the_devices_policy_to_the_sweep(tmp_path, monkeypatch):
    import stepcal.profiler.sweep as sweep
    configs = []

    def fake_sweep(config, out, **kwargs):
        configs.append(config)
        return SimpleNamespace(out=out, complete=True, rounds=1, num_points=0, num_measured=0, num_done_before=0,
                               num_reused=0, num_failed=0, elapsed_s=0.0)
    monkeypatch.setattr(sweep, "run_sweep", fake_sweep)
    for device in ("cpu", "cuda"):
        assert main(["profile", "--model-spec", "tiny", "--device", device, "--ops", "step",
                     "--out", str(tmp_path / device)]) == 0
    assert [c.noise for c in configs] == [NoisePolicy.for_device("cpu"), NoisePolicy.for_device("cuda")]
    assert configs[1].noise_policy.speed_guard and not configs[1].noise_policy.cpu_allocator


@pytest.mark.parametrize("device, retry, marks", [("cpu", None, True), ("cuda", None, False), ("cuda", "2", True)])
def test_the_measure_command_hands_the_devices_policy_and_retry_slowed_to_the_run(tmp_path, monkeypatch, device,
                                                                                   retry, marks):
    import stepcal.profiler.engine.measure as measure
    got = []
    monkeypatch.setattr(measure, "measure_trace", lambda *args, noise=None, **kwargs: got.append(noise) or {})
    flags = [] if retry is None else ["--retry-slowed", retry]
    assert main(["measure", "--model-spec", "tiny", "--device", device, "--trace", "poisson:rate=5,n=4,prompt=uniform:4:8,output=uniform:2:4",
                 "--quiet", *flags, "--out", str(tmp_path / "m")]) == 0
    (noise,) = got
    assert noise.mark_slowed_windows == marks and noise.retry_slowed_repeats == int(retry or 0)
    assert noise.cpu_allocator == (device == "cpu") and noise.speed_guard


def test_a_measured_run_under_the_cuda_policy_marks_no_slowed_window(tmp_path, monkeypatch):
    """The engine on the CPU, with the CUDA policy: no window judged, none in summary.json, no allocator."""
    import stepcal.profiler.engine.measure as measure
    from stepcal.core.model_files import load_model_spec
    from stepcal.core.workload import load_workload
    from stepcal.profiler.engine.engine import EngineConfig
    judged = []
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: judged.append(len(logs)) or [None] * len(logs))
    trace = load_workload("poisson:rate=50,n=6,prompt=uniform:4:20,output=uniform:4:8", seed=0)
    for name, noise in (("cpu", NoisePolicy.for_device("cpu").with_retry_slowed(0)),
                        ("cuda", NoisePolicy.for_device("cuda"))):
        measure.measure_trace(trace, load_model_spec("tiny"), EngineConfig(scheduler="continuous"), tmp_path / name,
                              repeats=2, trace_source="t", noise=noise)
    assert judged == [2]           # the CPU run's two repeats, judged once; the CUDA one's never
    summaries = [json.loads((tmp_path / n / "repeat_0" / "summary.json").read_text()) for n in ("cpu", "cuda")]
    assert "slowest_window" in summaries[0] and "slowest_window" not in summaries[1]
    assert json.loads((tmp_path / "cuda" / "meta.json").read_text())["allocator"] is None


def test_the_quickstart_hands_the_devices_policy_to_the_campaign(tmp_path, monkeypatch):
    import torch

    import stepcal.experiments.campaign as campaign
    configs = []

    class Stop(Exception):
        pass

    def fake_campaign(config):
        configs.append(config)
        raise Stop
    monkeypatch.setattr(campaign, "Campaign", fake_campaign)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for device in ("cpu", "cuda"):
        with pytest.raises(Stop):
            main(["quickstart", "--device", device, "--history", "off", "--out", str(tmp_path / device)])
    assert [c.noise for c in configs] == [NoisePolicy.for_device("cpu"), NoisePolicy.for_device("cuda")]
    assert configs[0].noise.retry_slowed_repeats == 2 and configs[1].noise.retry_slowed_repeats == 0


def test_a_campaign_under_the_cuda_policy_serves_no_slowed_repeat_again(tmp_path, monkeypatch):
    from stepcal.experiments.campaign import Campaign, CampaignConfig
    monkeypatch.setattr("stepcal.profiler.engine.measure.slowest_windows", lambda logs: pytest.fail("no window is judged on cuda"))
    monkeypatch.setattr(Campaign, "measure", lambda *args: pytest.fail("nothing is served again on cuda"))
    config = CampaignConfig(out=tmp_path, device="cuda", schedulers=("a",), loads=(0.6,))
    assert config.noise == NoisePolicy.for_device("cuda") and config.repeats == 2
    assert Campaign(config).serve_slowed_again("a", 0.6, 10.0, tmp_path / "parts") == ()
    assert CampaignConfig(out=tmp_path).noise == NoisePolicy()


def test_fit_drops_slowed_servings_of_cpu_profiles_only(tmp_path):
    from stepcal.costmodel.importers import load_profiles
    from stepcal.experiments.fitting import without_slowed_servings
    from tests.profiler.test_slowed_servings import WORKLOADS, _write, served
    paths = {}
    for device in ("cpu", "cuda"):
        early, late = served(), served({WORKLOADS[4]: 1.6}, seed=1)
        for frame in (early, late):
            frame["device"] = device
        (tmp_path / device).mkdir()
        paths[device] = [str(_write(tmp_path / device, name, f)) for name, f in (("early", early), ("late", late))]
    cpu, cuda = (load_profiles(paths[d]) for d in ("cpu", "cuda"))
    assert [s.workload for s in without_slowed_servings(cpu)[1]] == [WORKLOADS[4]]   # the profiles' device's policy
    kept, slowed = without_slowed_servings(cuda)
    assert slowed == [] and kept is cuda
    assert without_slowed_servings(cuda, NoisePolicy.for_device("cpu"))[1] != []       # told otherwise
    assert without_slowed_servings(cpu, NoisePolicy.for_device("cuda"))[1] == []
