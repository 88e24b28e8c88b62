"""One source for a model's GEMM shapes: the Vidur importer's shapes from its own columns are
ModelSpec.gemm_shapes under a Parallelism."""
import pandas as pd

from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel.importers import load_profiles
from tests.costmodel.conftest import PROFILES, require_shared

LLAMA3 = PRESETS["llama-3-8b"]     # 32 heads, 8 KV heads of 128, hidden 4096, FFN 14336


def test_vidur_gemm_shapes_are_the_model_specs():
    path = require_shared(PROFILES / "vidur/a100/meta-llama/Meta-Llama-3-8B/mlp.csv")
    records = load_profiles([path])
    gemm = records[records["op"] == "gemm"]
    shapes = gemm.groupby(["tp", "name"])[["n", "k"]].agg(pd.unique)
    assert len(shapes) == 4 * 4           # four projections at tp 1, 2, 4 and 8
    for (tp, name), row in shapes.iterrows():
        n, k = LLAMA3.gemm_shapes(Parallelism(int(tp)))[name]
        assert (row["n"].tolist(), row["k"].tolist()) == ([n], [k]), (tp, name)   # one shape each
