"""The shared meta.json header: kind and schema version checked on read, one line for each fault."""

import pytest

from stepcal import __version__
from stepcal.core.artifact import ArtifactKind, artifact_header, names_kind, read_artifact_meta, split_known
from stepcal.core.errors import InputError
from tests.core.meta_files import write_meta_json

KIND = ArtifactKind("stepcal.example", 2, "an example directory", "`stepcal example`", aliases=("old_example", None))



def test_header_round_trips(tmp_path):
    meta = {**artifact_header(KIND), "x": 1}
    assert meta["tool_version"] == __version__
    assert read_artifact_meta(write_meta_json(tmp_path, meta), KIND, ("x",)) == meta


def test_older_files_read_as_first_version_and_aliases_accepted(tmp_path):
    assert read_artifact_meta(write_meta_json(tmp_path, {"kind": "old_example"}), KIND) == {"kind": "old_example"}
    assert read_artifact_meta(write_meta_json(tmp_path, {"y": 2}), KIND) == {"y": 2}     # None: a file with no kind


@pytest.mark.parametrize("meta, words", [
    ({"kind": "stepcal.example", "schema_version": 3}, "schema_version 3 is newer"),
    ({"kind": "stepcal.example", "schema_version": "2"}, "must be a positive integer"),
    ({"kind": "stepcal.example", "schema_version": True}, "must be a positive integer"),
    ({"kind": "stepcal.tables"}, "kind is 'stepcal.tables'"),
    ({"kind": "stepcal.example"}, "missing key 'x'"),
])
def test_refused_in_one_line_naming_the_file(tmp_path, meta, words):
    with pytest.raises(InputError) as info:
        read_artifact_meta(write_meta_json(tmp_path, meta), KIND, ("x",))
    message = str(info.value)
    assert words in message and str(tmp_path / "meta.json") in message and "\n" not in message


def test_missing_file_names_the_writer(tmp_path):
    with pytest.raises(InputError, match="no meta.json; expected the output of `stepcal example`"):
        read_artifact_meta(tmp_path, KIND)


def test_split_known_keeps_the_rest():
    fields, extra = split_known({"kind": "k", "schema_version": 1, "a": 1, "b": 2}, ("a",))
    assert fields == {"a": 1} and extra == {"b": 2}


def test_names_kind_passes_over_anything_else(tmp_path):
    for name, text in (("ours", '{"kind": "stepcal.example"}'), ("old", '{"kind": "old_example"}'),
                       ("none", "{}"), ("other", '{"kind": "measured_run"}'), ("list", "[1]"), ("broken", "{")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(text)
    (tmp_path / "empty").mkdir()
    found = sorted(d.name for d in tmp_path.iterdir() if names_kind(d, KIND))
    assert found == ["none", "old", "ours"]
