"""gpu/gpu_campaign.py: the device's side sizes its load runs to the time left and stops in time."""
import importlib.util
import json
import tarfile
from pathlib import Path

import pytest

from stepcal.experiments.campaign import Campaign, CampaignConfig

SCRIPT = Path(__file__).resolve().parents[2] / "gpu" / "gpu_campaign.py"


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("gpu_campaign", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def served_runs(script, monkeypatch, tmp_path, pilot_s: float, run_s: float, deadline_s: float = 300.0):
    """measure_loads with a clock that each served run advances by its requests' time: `pilot_s` a
    request in the pilot run, `run_s` in the load runs."""
    import stepcal.profiler.engine.measure as measure
    clock, served = FakeClock(), []
    monkeypatch.setattr(script, "time", clock)

    def serve(self, scheduler, workload, out):
        n = int(workload.split(",n=")[1].split(",")[0])
        clock.now += (pilot_s if Path(out).name == "pilot" else run_s) * n
        Path(out).mkdir(parents=True)
        served.append((Path(out).relative_to(tmp_path).as_posix(), n))
    monkeypatch.setattr(Campaign, "measure", serve)
    monkeypatch.setattr(measure, "combine_repeats", lambda parts, out, kept, noise=None: None)
    campaign = Campaign(CampaignConfig(out=tmp_path, schedulers=("sarathi",), num_requests=200, repeats=2))
    kept = script.measure_loads(campaign, {"sarathi": 4.0}, deadline_s)
    return campaign, served, kept


def test_the_pilot_run_sizes_every_load_run_to_the_time_left(script, monkeypatch, tmp_path):
    campaign, served, kept = served_runs(script, monkeypatch, tmp_path, pilot_s=2.0, run_s=2.0)
    # pilot: 8 requests in 16 s, padded to 2.5 s a request; 284 s left over six runs: 18 requests each
    assert served[0] == ("pilot", 8) and campaign.c.num_requests == 18
    assert served[1:] == [(f"measured/.repeats/sarathi/{load}/{k}", 18)
                          for k, loads in ((0, ("load_30", "load_60", "load_90")), (1, ("load_60", "load_90", "load_30")))
                          for load in loads]
    assert kept == {"sarathi/load_30": [0, 1], "sarathi/load_60": [0, 1], "sarathi/load_90": [0, 1]}
    assert not (tmp_path / "pilot").exists() and not (tmp_path / "measured" / ".repeats").exists()


def test_a_repeat_that_would_end_past_the_deadline_is_not_started(script, monkeypatch, tmp_path, capsys):
    # the load runs cost 4 s a request, not the pilot's 2.5: after the first, each is known to take 72 s
    campaign, served, kept = served_runs(script, monkeypatch, tmp_path, pilot_s=2.0, run_s=4.0)
    assert [name.rsplit("/", 2)[-2:] for name, _ in served[1:]] == [["load_30", "0"], ["load_60", "0"], ["load_90", "0"]]
    assert kept == {"sarathi/load_30": [0], "sarathi/load_60": [0], "sarathi/load_90": [0]}   # 232 s + 72 > 300
    assert "out of time: sarathi at 60% repeat 2 and later not served" in capsys.readouterr().err


def test_pack_leaves_out_the_sweeps_parts_and_locks(script, tmp_path):
    work = tmp_path / "work"
    for name in ("capacity.json", "profile/profile.parquet", "profile/parts/p0.parquet", "profile/.lock"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(json.dumps({}))
    script.pack(work, tmp_path / "out" / "campaign.tar.gz")
    with tarfile.open(tmp_path / "out" / "campaign.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["capacity.json", "profile/profile.parquet"]


def test_model_takes_the_device_and_its_noise_policy_from_what_measure_recorded(script, monkeypatch, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    record = {"model_spec": "tiny", "device": "cpu", "schedulers": ["sarathi"], "profiled": [], "timings_s": {},
              "capacity_rps": {"sarathi": 4.0}, "runs": {"sarathi/load_30": [0]}, "num_requests": 12}
    (work / "capacity.json").write_text(json.dumps(record))
    seen = {}

    def model(self, capacity_rps):
        seen.update(device=self.c.device, drop=self.c.noise.drop_slowed_servings, capacity=capacity_rps)
        return {}
    monkeypatch.setattr(Campaign, "model", model)
    import stepcal.experiments.campaign as campaign_module
    monkeypatch.setattr(campaign_module, "format_headline", lambda headline: "")
    args = script.argparse.Namespace(work=str(work), archive=None, device="cuda", model_spec="llama-3-8b",
                                     schedulers="continuous", prompt="lognormal:512:0.8", output="lognormal:64:0.8",
                                     chunk_size=512, num_requests=200, trials=1, seed=0)
    script.model(args)   # --device left at its default, cuda
    assert seen == {"device": "cpu", "drop": True, "capacity": {"sarathi": 4.0}}
