"""The tables keep the speed probes of the profiles they were fitted on (costmodel.profile_speed)."""
import json

import pandas as pd

from stepcal.costmodel.profile_speed import profile_speed_probes


def test_probes_are_read_from_the_meta_beside_each_fitted_profile_of_ours(tmp_path):
    for name, meta in (("early", {"speed_probe_ms": [2.0, 2.2]}), ("late", {"speed_probe_ms": [2.4, 2.6]}),
                       ("old", {"status": "complete"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "vidur").mkdir()
    (tmp_path / "vidur" / "meta.json").write_text(json.dumps({"speed_probe_ms": [9.0]}))
    records = pd.DataFrame({
        "source": ["profile", "profile", "profile", "profile", "vidur", "profile"],
        "file": [str(tmp_path / d / "profile.parquet") for d in ("late", "early", "early", "old")]
        + [str(tmp_path / "vidur" / "mlp.csv"), str(tmp_path / "gone" / "profile.parquet")]})
    # each profile once, in file order; an imported profile's and a missing meta's are not ours to read
    assert profile_speed_probes(records) == [2.0, 2.2, 2.4, 2.6]
    assert profile_speed_probes(records[records["source"] == "vidur"]) == []
    assert profile_speed_probes(pd.DataFrame({"op": ["gemm"]})) == []
