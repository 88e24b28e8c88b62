"""validation.json heads itself with kind, schema_version and tool_version; read_record checks them and
reads older files (no header) as they are."""
import json

import pytest

from stepcal import __version__
from stepcal.core.errors import InputError
from stepcal.experiments.validation.compare import VALIDATION_KIND, read_record

CELL = {"measured": 10.0, "simulated": 11.0, "error": 0.1, "noise_floor": None}
# A validation.json as `stepcal validate` wrote it before the header.
OLD = {"measured_run": "runs/m", "num_requests": 3, "num_repeats": 1, "num_finished_both": 3,
       "metrics": {"ttft_ms": {"p50": CELL}}, "throughput_rps": CELL, "num_preemptions": {"measured": 0, "simulated": 0},
       "step_level": {"num_steps": 4, "total_error": 0.05}, "step_model": "const:2"}


def _write(tmp_path, data: dict):
    path = tmp_path / "validation.json"
    path.write_text(json.dumps(data))
    return path


def test_an_older_record_reads_and_is_written_with_the_header(tmp_path):
    record = read_record(_write(tmp_path, OLD))
    assert record.measured_run == "runs/m" and record.cell("ttft_ms", "p50").error == 0.1
    written = record.to_dict()
    assert list(written)[:4] == ["kind", "schema_version", "tool_version", "measured_run"]
    assert (written["kind"], written["schema_version"], written["tool_version"]) == (
        "stepcal.validation", VALIDATION_KIND.schema_version, __version__)
    again = read_record(_write(tmp_path, written))
    assert again == record and again.to_dict() == written


def test_a_newer_schema_or_another_kind_is_refused_in_one_line(tmp_path):
    path = _write(tmp_path, {**OLD, "kind": "stepcal.validation", "schema_version": VALIDATION_KIND.schema_version + 1})
    with pytest.raises(InputError) as newer:
        read_record(path)
    assert str(path) in str(newer.value) and "is newer than this stepcal" in str(newer.value)
    assert "\n" not in str(newer.value)
    with pytest.raises(InputError, match="kind is 'measured_run', expected 'stepcal.validation'"):
        read_record(_write(tmp_path, {**OLD, "kind": "measured_run"}))
    with pytest.raises(InputError, match="missing key 'metrics'"):
        read_record(_write(tmp_path, {k: v for k, v in OLD.items() if k != "metrics"}))
