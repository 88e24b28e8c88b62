"""core.run_meta.RunMeta: a measured run's meta.json as fields, read and written back unchanged."""
import json

import pytest

from stepcal import __version__
from stepcal.core.errors import InputError
from stepcal.core.run_meta import RUN_KIND, RunMeta, is_measured_run
from tests.core.meta_files import write_meta_json

# What `stepcal measure` wrote before RunMeta (profiler.engine.measure.engine_meta), plus a key it does not model.
ENGINE = {"kind": "measured_run", "schema_version": 1, "tool_version": "0.0.1", "model_spec": {"name": "tiny"},
          "device": "cpu", "dtype": "float32", "num_threads": 1, "fingerprint": {"cpu_model": "x"},
          "trace": "poisson", "repeats": 2, "scheduler": "vllm", "scheduler_config": {"max_num_seqs": 8},
          "block_size": 16, "kv_blocks": None, "clock": "wall", "seed": 0, "prefix_caching": True,
          "timeout_s": None, "allocator": None, "note": {"kept": [1, 2]}}
# What `stepcal import vllm-bench` wrote.
BENCH = {"kind": "measured_run", "source": "vllm-bench", "schema_version": 1, "tool_version": "0.0.1",
         "bench_file": "b.json", "model_spec": {"name": "tiny"}, "scheduler": "continuous",
         "scheduler_config": {"max_num_seqs": 8}, "block_size": 16, "kv_blocks": 64, "repeats": 1,
         "arrival_source": "start_times", "num_requests": 5, "num_failed": 1, "bench_totals": {"completed": 4},
         "warnings": []}



@pytest.mark.parametrize("written", [ENGINE, BENCH], ids=["engine", "vllm-bench"])
def test_round_trip_keeps_every_key_and_only_the_header_changes(tmp_path, written):
    meta = RunMeta.read(write_meta_json(tmp_path, written))
    again = meta.to_dict()
    assert again == {**written, "tool_version": __version__}     # the header is this stepcal's
    assert RunMeta.from_dict(again) == meta


def test_fields_are_the_keys_readers_use():
    engine, bench = RunMeta.from_dict(ENGINE), RunMeta.from_dict(BENCH)
    assert engine.trace_source == "poisson" and engine.extra == {"note": {"kept": [1, 2]}}
    assert engine.served_by_engine and engine.prefix_caching_on and engine.kv_blocks is None
    assert not bench.served_by_engine and bench.source == "vllm-bench" and bench.kv_blocks == 64
    assert bench.bench_totals == {"completed": 4} and bench.device is None and bench.extra == {}


def test_an_older_run_reads_with_defaults(tmp_path):
    """Written before schema_version, prefix caching, the timeout and the allocator were recorded."""
    old = {key: value for key, value in ENGINE.items()
           if key not in ("schema_version", "tool_version", "prefix_caching", "timeout_s", "allocator")}
    meta = RunMeta.read(write_meta_json(tmp_path, old))
    assert meta.prefix_caching is None and not meta.prefix_caching_on and meta.timeout_s is None
    assert meta.scheduler == "vllm" and meta.to_dict()["schema_version"] == RUN_KIND.schema_version


def test_a_newer_schema_and_another_kind_are_refused_in_one_line(tmp_path):
    with pytest.raises(InputError) as newer:
        RunMeta.read(write_meta_json(tmp_path, {**ENGINE, "schema_version": RUN_KIND.schema_version + 1}))
    assert "is newer than this stepcal" in str(newer.value) and "\n" not in str(newer.value)
    with pytest.raises(InputError, match="kind is 'stepcal.profile', expected 'measured_run'"):
        RunMeta.read(write_meta_json(tmp_path, {**ENGINE, "kind": "stepcal.profile"}))
    with pytest.raises(InputError, match="missing key 'scheduler'"):
        RunMeta.read(write_meta_json(tmp_path, {"kind": "measured_run"}), ("scheduler",))


def test_is_measured_run_is_a_probe(tmp_path):
    for name, text in (("run", json.dumps(ENGINE)), ("profile", "{}"), ("broken", "[1")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(text)
    assert [is_measured_run(tmp_path / n) for n in ("run", "profile", "broken", "none")] == [True, False, False, False]
