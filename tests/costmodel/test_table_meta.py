"""TableMeta owns a table directory's meta.json: what it writes it reads back equal, keys it does not
know are kept, older files get defaults, and a newer schema is refused in one line."""
import dataclasses
import json
import shutil

import pytest

from stepcal.core.batch import FEATURE_NAMES
from stepcal.core.errors import InputError
from stepcal.core.schemas import SCHEMA_VERSION, TOOL_VERSION
from stepcal.costmodel.table_meta import TABLE_KIND, TableMeta
from stepcal.costmodel.tables import load_step_model
from stepcal.experiments.cli import main


def _copy(fitted_tables, tmp_path, name="t"):
    return shutil.copytree(fitted_tables, tmp_path / name)


def _edit(directory, change) -> None:
    meta = json.loads((directory / "meta.json").read_text())
    change(meta)
    (directory / "meta.json").write_text(json.dumps(meta))


def test_a_fitted_directory_reads_back_what_it_wrote(fitted_tables, tmp_path):
    meta = TableMeta.read(fitted_tables)
    assert meta.mode == "composed" and meta.t_step_terms and meta.model_spec["name"] == "tiny"
    assert meta.host_terms is None and meta.units == {"time": "ms"} and meta.features == list(FEATURE_NAMES)
    # Every key fit writes is a field or kept in extra; the dict is the file's content.
    assert meta.to_dict() == json.loads((fitted_tables / "meta.json").read_text())
    written = meta.write(tmp_path)
    assert written == meta
    assert TableMeta.read(tmp_path) == meta
    assert json.loads((tmp_path / "meta.json").read_text()) == json.loads((fitted_tables / "meta.json").read_text())


def test_keys_it_does_not_know_are_written_back_unchanged(fitted_tables, tmp_path):
    source = _copy(fitted_tables, tmp_path)
    _edit(source, lambda m: m.update(a_later_key={"nested": [1, 2]}, another="x"))
    meta = TableMeta.read(source)
    assert meta.extra["a_later_key"] == {"nested": [1, 2]} and meta.extra["another"] == "x"
    changed = dataclasses.replace(meta, host_terms={"per_step_ms": 0.5})
    (tmp_path / "out").mkdir()
    changed.write(tmp_path / "out")
    again = TableMeta.read(tmp_path / "out")
    assert again == changed
    on_disk = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert on_disk["a_later_key"] == {"nested": [1, 2]} and on_disk["another"] == "x"
    assert on_disk["host_terms"] == {"per_step_ms": 0.5}
    assert (on_disk["kind"], on_disk["schema_version"], on_disk["tool_version"]) == (TABLE_KIND, SCHEMA_VERSION,
                                                                                     TOOL_VERSION)


def test_fields_written_only_when_set_stay_out_until_they_are():
    meta = TableMeta(t_step_terms=["step"], terms={"step": {"file": "step.parquet", "axes": []}})
    body = meta.to_dict()
    for key in ("scatter", "slowed_servings", "mlflow_tracking_uri", "calibration"):
        assert key not in body
    assert body["mlflow_run_id"] is None and body["host_terms"] is None   # always written, null until set
    with_run = dataclasses.replace(meta, mlflow_tracking_uri="sqlite:///x.db", scatter={"cv": 0.1})
    assert with_run.to_dict()["mlflow_tracking_uri"] == "sqlite:///x.db" and with_run.to_dict()["scatter"] == {
        "cv": 0.1}


def test_an_older_file_without_a_schema_version_or_optional_keys_gets_the_defaults(fitted_tables, tmp_path):
    old = _copy(fitted_tables, tmp_path)
    full = json.loads((old / "meta.json").read_text())
    minimal = {"kind": TABLE_KIND, "t_step_terms": full["t_step_terms"], "terms": full["terms"]}
    (old / "meta.json").write_text(json.dumps(minimal))
    meta = TableMeta.read(old)
    assert meta == TableMeta(t_step_terms=full["t_step_terms"], terms=full["terms"])
    assert meta.mode is None and meta.notes == [] and meta.missing_terms == [] and meta.targets == {}
    assert meta.host_terms is None and meta.scatter is None and meta.tp is None and meta.extra == {}
    assert meta.units == {"time": "ms"} and meta.features == list(FEATURE_NAMES)
    model = load_step_model(old)
    assert [t.name for t in model.terms] == full["t_step_terms"] and model.meta == meta


def test_the_terms_are_still_checked(fitted_tables, tmp_path):
    bad = _copy(fitted_tables, tmp_path)
    _edit(bad, lambda m: m.update(terms=[]))
    with pytest.raises(InputError, match="t_step_terms must be a list and terms an object"):
        TableMeta.read(bad)
    _edit(bad, lambda m: m.pop("t_step_terms"))
    with pytest.raises(InputError, match="missing key 't_step_terms'"):
        TableMeta.read(bad)
    entry = _copy(fitted_tables, tmp_path, "entry")
    name = TableMeta.read(entry).t_step_terms[0]
    _edit(entry, lambda m: m["terms"][name].pop("axes"))
    with pytest.raises(InputError, match=f"missing key 'axes' \\(the entry of term '{name}'"):
        load_step_model(entry)


def test_simulate_refuses_tables_of_a_newer_schema_in_one_line(fitted_tables, tmp_path, capsys):
    newer = _copy(fitted_tables, tmp_path)
    _edit(newer, lambda m: m.update(schema_version=SCHEMA_VERSION + 1))
    capsys.readouterr()
    assert main(["simulate", "--trace", "poisson:rate=5,n=5,prompt=fixed:8,output=fixed:2",
                 "--step-model", str(newer), "--out", str(tmp_path / "sim")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"schema_version {SCHEMA_VERSION + 1} is newer than this stepcal" in err and str(newer) in err
    assert not (tmp_path / "sim").exists()


def test_a_calibrated_builtin_model_keeps_its_own_meta(tmp_path):
    from stepcal.experiments.step_model_meta import BuiltinMeta, read_step_model_meta
    written = {"kind": "builtin", "step_model": "const:5", "host_terms": {"per_step_ms": 1.0},
               "calibration": {"loss_after": 0.1}, "later": [1]}
    (tmp_path / "meta.json").write_text(json.dumps(written))
    meta = read_step_model_meta(tmp_path)
    assert isinstance(meta, BuiltinMeta) and meta.extra == {"later": [1]} and meta.to_dict() == written
    assert "scatter" not in meta.to_dict()
