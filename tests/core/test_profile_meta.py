"""core.profile_meta.ProfileMeta: a profile directory's meta.json as fields, read and written back unchanged."""
import json

import pytest

from stepcal import __version__
from stepcal.core.errors import InputError
from stepcal.core.profile_meta import PROFILE_KIND, ProfileMeta, is_profile_dir
from tests.core.meta_files import write_meta_json

IDENTITY = {"model_spec": {"name": "tiny"}, "device": "cpu", "dtype": "float32", "ops": ["gemm", "step"],
            "grid_fingerprint": "abc", "num_threads": 1, "seed": 0}
# What `stepcal profile` wrote before ProfileMeta (no schema_version, its own kind), plus a key it does not model.
SWEEP = {"kind": "stepcal profile", "identity": IDENTITY, "shard": {"index": 0, "count": 1}, "grid": "quick",
         "grid_source": {"gemm": {"m": [1]}}, "grid_num_points": 4, "created_at": "2026-01-01T00:00:00+00:00",
         "hardware": {"cpu_model": "x"}, "fingerprint_id": "f00d", "allocator": None, "status": "complete",
         "started_at": "2026-01-01T00:00:01+00:00", "speed_probe_ms": [2.0, 2.1], "speed_guard": [{"probes": 3}],
         "finished_at": "2026-01-01T00:01:00+00:00", "num_points": 4, "num_done": 4, "num_failed": 0,
         "points_done": 4}
MERGE = {"kind": "stepcal profile merge", "identity": IDENTITY, "grid": "quick", "grid_source": {"gemm": {}},
         "grid_num_points": 4, "merged_from": [{"path": "a", "shard": None, "status": "complete",
                                                "fingerprint_id": "f00d", "hardware": {}}],
         "num_points": 4, "num_missing": 0, "num_failed": 0, "status": "complete"}
HEADER = {"kind": "stepcal.profile", "schema_version": PROFILE_KIND.schema_version, "tool_version": __version__}



@pytest.mark.parametrize("written", [SWEEP, MERGE], ids=["sweep", "merge"])
def test_round_trip_keeps_every_key_and_only_the_header_changes(tmp_path, written):
    meta = ProfileMeta.read(write_meta_json(tmp_path, written))
    assert meta.to_dict() == {**written, **HEADER}
    meta.write(tmp_path)
    assert ProfileMeta.read(tmp_path) == meta and json.loads((tmp_path / "meta.json").read_text())["kind"] == HEADER["kind"]


def test_an_older_file_with_no_kind_reads_with_defaults(tmp_path):
    meta = ProfileMeta.read(write_meta_json(tmp_path, {"grid": "quick", "points_done": 96}))
    assert meta.grid == "quick" and meta.extra == {"points_done": 96} and meta.identity == {}
    assert meta.speed_probe_ms == [] and meta.probes_ms() == [] and meta.model_spec is None and meta.ops == []
    assert meta.to_dict() == {**HEADER, "identity": {}, "grid": "quick", "points_done": 96}


def test_a_sweep_updates_it_by_methods():
    new = ProfileMeta(identity=IDENTITY, shard={"index": 0, "count": 1}, grid="quick", created_at="t0")
    running = new.started(hardware={"cpu_model": "x"}, fingerprint_id="f00d", allocator=None, started_at="t1")
    assert running.status == "running" and running.to_dict()["allocator"] is None   # recorded from the start
    assert "allocator" not in new.to_dict() and "speed_probe_ms" not in running.to_dict()
    resumed = running.with_speed([2.0, 2.2], {"probes": 1}).with_speed([2.4, 2.6], None).with_speed([], None)
    assert resumed.speed_probe_ms == [2.0, 2.2, 2.4, 2.6] and resumed.speed_guard == [{"probes": 1}]
    done = resumed.finished(complete=False, finished_at="t2", num_points=4, num_done=3, num_failed=1)
    assert (done.status, done.num_done, done.num_failed, done.started_at) == ("incomplete", 3, 1, "t1")


def test_probes_are_the_positive_numbers():
    assert ProfileMeta(speed_probe_ms=[2.0, 0, -1, True, "x", 3]).probes_ms() == [2.0, 3.0]
    assert ProfileMeta(speed_probe_ms="fast").probes_ms() == []


def test_a_newer_schema_and_another_kind_are_refused_in_one_line(tmp_path):
    with pytest.raises(InputError) as newer:
        ProfileMeta.read(write_meta_json(tmp_path, {**SWEEP, "kind": "stepcal.profile", "schema_version": 2}))
    assert "schema_version 2 is newer" in str(newer.value) and "\n" not in str(newer.value)
    with pytest.raises(InputError, match="kind is 'measured_run'"):
        ProfileMeta.read(write_meta_json(tmp_path, {"kind": "measured_run"}))


def test_is_profile_dir_is_a_probe(tmp_path):
    for name, text in (("old", "{}"), ("new", json.dumps(HEADER)), ("run", '{"kind": "measured_run"}'),
                       ("broken", "{")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(text)
    assert [is_profile_dir(tmp_path / n) for n in ("old", "new", "run", "broken", "none")] == [
        True, True, False, False, False]
