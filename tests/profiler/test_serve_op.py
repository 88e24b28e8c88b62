"""The `serve` op: whole steps timed while the engine serves closed-loop workloads, as profile rows
(op step and host, name served) that the profiled tables' fit takes beside the held points."""
import pandas as pd
import pytest

from stepcal.core.errors import InputError
from stepcal.core.model_spec import PRESETS
from stepcal.costmodel.fitting import select_records, whole_steps
from stepcal.costmodel.importers import load_profiles
from stepcal.experiments.cli import main
from stepcal.profiler.builtin_grids import QUICK
from stepcal.profiler.grid import expand_grid
from stepcal.profiler.grid_sections import serve_workloads
from stepcal.profiler.merge import merge_profiles
from stepcal.profiler.serve import SERVED, Workload
from stepcal.profiler.sweep import SweepConfig, run_sweep

TINY = PRESETS["tiny"]
SERVE = {"schedulers": ["continuous", "sarathi:32"], "concurrency": [1, 3], "min_requests": 4,
         "prompt": [16, 96], "output": [2, 12]}
GRID = {"timing": {"max_point_s": 0.02, "min_repeats": 3, "warmup": 1, "rounds": 2},
        "host": {"num_seqs": [2], "s": [32]}, "serve": SERVE}


def sweep(out, source=GRID, ops=("host", "serve"), shard=(0, 1)):
    grid = expand_grid("served", source, TINY).for_ops(ops)
    return run_sweep(SweepConfig(spec=TINY, device="cpu", dtype="float32", ops=ops, grid=grid, shard=shard), out,
                     progress=False)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("served")
    result = sweep(out)
    return out, result, pd.read_parquet(out / "profile.parquet")


def test_a_workload_is_named_by_its_shape_and_draws_the_same_lengths_every_time():
    w = Workload("sarathi", 64, 16, 32, (16, 1024), (4, 128))
    assert w.name == "sarathi64/c16/n32/p16-1024/o4-128" and Workload.parse(w.name) == w
    prompts, outputs = w.lengths(seed=0)
    again, _ = w.lengths(seed=0)
    assert list(prompts) == list(again) and len(prompts) == 32
    assert prompts.min() >= 16 and prompts.max() <= 1024 and outputs.min() >= 4 and outputs.max() <= 128
    assert list(w.lengths(seed=1)[0]) != list(prompts)
    with pytest.raises(ValueError, match="not a served workload"):
        Workload.parse("fifo/c1/n8/p1-2/o1-2")


def test_the_serve_section_expands_every_scheduler_at_every_concurrency():
    workloads = serve_workloads(SERVE, "grid: [serve]")
    assert [(w.scheduler, w.chunk_size, w.concurrency, w.num_requests) for w in workloads] == [
        ("continuous", 0, 1, 4), ("continuous", 0, 3, 6), ("sarathi", 32, 1, 4), ("sarathi", 32, 3, 6)]
    points = expand_grid("g", GRID, TINY).for_ops(["serve"]).points
    assert [(p.op, p.name, p.m) for p in points] == [("serve", w.name, w.concurrency) for w in workloads]
    quick = expand_grid("quick", QUICK, TINY).for_ops(["serve"]).points
    # 3 schedulers x 7 concurrencies, two continuous prompt families x 3, short prompts at 128 and 256 in flight
    assert len(quick) == 29
    assert sum(p.name.startswith("continuous/") and "/p16-256/" in p.name for p in quick) == 5
    assert max(p.m for p in quick) == 256


def test_a_list_of_serve_sections_serves_each_family_with_its_own_rounds():
    short = {"schedulers": ["continuous"], "concurrency": [2], "prompt": [16, 32], "rounds": 2}
    grid = expand_grid("g", {"timing": {"rounds": 3}, "serve": [SERVE, short]}, TINY)
    names = [p.name for p in grid.points]
    assert names == [w.name for w in serve_workloads(SERVE, "s")] + ["continuous/c2/n8/p16-32/o4-128"]
    rounds = {p.name: grid.rounds_of(p, 3) for p in grid.points}
    assert rounds["continuous/c2/n8/p16-32/o4-128"] == 2 and rounds[names[0]] == 1


@pytest.mark.parametrize("serve, message", [
    ([], r"\[serve\] is an empty list"),
    ([SERVE, {"concurrency": [0]}], r"\[serve\] #2: concurrency must hold integers >= 1, got 0"),
    ([SERVE, {"concurrency": [2], "arrivals": "poisson"}], r"\[serve\] #2: unknown keys \['arrivals'\]"),
])
def test_a_bad_family_of_a_serve_list_is_named_by_its_place(serve, message):
    with pytest.raises(InputError, match=message):
        expand_grid("g", {"serve": serve}, TINY)


@pytest.mark.parametrize("section, message", [
    ({"concurrency": [2], "schedulers": ["fifo"]}, r"\[serve\]: schedulers: unknown scheduler 'fifo'"),
    ({"concurrency": [2], "schedulers": ["continuous:64"]}, "only sarathi takes a chunk size"),
    ({"concurrency": [2], "schedulers": ["sarathi:x"]}, "sarathi's chunk must be a positive integer"),
    ({"concurrency": [0]}, r"\[serve\]: concurrency must hold integers >= 1, got 0"),
    ({"schedulers": ["vllm"]}, r"\[serve\]: missing 'concurrency'"),
    ({"concurrency": [2], "prompt": [64, 16]}, r"prompt: expected \[low, high\] with 1 <= low <= high"),
    ({"concurrency": [2], "requests_per_seq": 0}, "requests_per_seq must be a positive number"),
    ({"concurrency": [2], "arrivals": "poisson"}, r"unknown keys \['arrivals'\]"),
])
def test_bad_serve_sections_are_named_in_one_line(section, message):
    with pytest.raises(InputError, match=message):
        expand_grid("g", {"serve": section}, TINY)


def test_each_served_step_gives_a_step_row_and_a_host_row(served):
    out, result, frame = served
    assert result.complete and result.num_failed == 0
    workloads = frame[frame["op"] == "serve"]
    assert len(workloads) == 4 and (workloads["status"] == "ok").all()
    # serve's own rounds (1 by default) cap the grid's 2; the held host point has both
    assert list(workloads["rounds"]) == [1] * 4
    assert frame.loc[frame["op"] == "host", "rounds"].max() == 2
    rows = frame[frame["name"] == SERVED]
    steps, hosts = rows[rows["op"] == "step"], rows[rows["op"] == "host"]
    assert len(steps) == len(hosts) > 4 * 4 and rows["point_key"].is_unique
    assert (rows["time_ms"] > 0).all()
    # the same batches under both parts of a step, and their features from the batch
    assert [tuple(q) for q in steps["q_lens"]] == [tuple(q) for q in hosts["q_lens"]]
    assert (steps["num_tokens"] == [sum(q) for q in steps["q_lens"]]).all()
    # continuous batching never mixes prompts and decodes; 32-token chunks beside decodes do
    continuous = steps[steps["point_key"].str.startswith("serve/continuous")]
    assert not ((continuous["prefill_tokens"] > 0) & (continuous["num_decode"] > 0)).any()
    sarathi = steps[steps["point_key"].str.startswith("serve/sarathi32")]
    assert ((sarathi["prefill_tokens"] > 0) & (sarathi["num_decode"] > 0)).any()
    assert sarathi["prefill_tokens"].max() <= 32


def test_a_finished_sweep_serves_nothing_again_and_more_rounds_pool_per_step(served, tmp_path):
    out, _, frame = served
    again = sweep(out)
    assert again.num_measured == 0 and again.complete
    two = {**GRID, "serve": {**SERVE, "rounds": 2}}
    sweep(tmp_path, two)
    pooled = pd.read_parquet(tmp_path / "profile.parquet")
    rows = pooled[pooled["name"] == SERVED]
    # a workload forms the same batches every round: every step row holds two samples
    assert len(rows) == len(frame[frame["name"] == SERVED])
    assert (rows["rounds"] == 2).all() and all(len(s) == 2 for s in rows["samples_ms"])


def test_the_fit_reads_served_rows_as_step_and_host_rows_and_skips_the_workload_rows(served):
    out, _, frame = served
    records = load_profiles([str(out)])
    assert "serve" not in set(records["op"])
    assert (records["op"] == "step").sum() == (frame["op"] == "step").sum()
    assert (records["op"] == "host").sum() == (frame["op"] == "host").sum()


def test_step_logs_train_whole_steps_without_the_profilers_device_only_step_rows():
    records = pd.DataFrame({"op": ["step", "step", "host", "gemm"], "name": ["served", "step_log", "served", "o"],
                            "time_ms": [1.0, 2.0, 0.5, 0.1]})
    assert list(whole_steps(records)["name"]) == ["step_log", "served", "o"]
    without_logs = records[records["name"] != "step_log"]
    assert whole_steps(without_logs).equals(without_logs)


def test_profiled_tables_fit_on_served_steps(served, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    out, _, frame = served
    tables = tmp_path / "tables"
    assert main(["fit", "--profile", str(out), "--model-spec", "tiny", "--ops", "step,host", "--trials", "1",
                 "--no-mlflow", "--out", str(tables)]) == 0
    meta = pd.read_json(tables / "meta.json", typ="series")
    assert meta["t_step_terms"] == ["step", "host"]
    assert meta["targets"]["step"]["rows"] == (frame["op"] == "step").sum()
    records = select_records(load_profiles([str(out)]), ops="step,host")
    assert set(records["name"]) == {SERVED, "decode"}


def test_shards_with_served_workloads_merge_counting_grid_points_alone(tmp_path):
    grid = expand_grid("served", GRID, TINY).for_ops(("host", "serve"))
    dirs = [tmp_path / f"shard{i}" for i in range(2)]
    for i, out in enumerate(dirs):
        sweep(out, shard=(i, 2))
    merged = merge_profiles(dirs, tmp_path / "merged")
    frame = pd.read_parquet(tmp_path / "merged" / "profile.parquet")
    assert merged.num_missing == 0 and {p.key for p in grid.points} <= set(frame["point_key"])
    assert (frame["name"] == SERVED).sum() > 0
    partial = merge_profiles(dirs[:1], tmp_path / "partial")
    assert partial.num_missing == len(grid.shard(1, 2)) > 0

