"""experiments.budget.op_model: a target counts as unknown until it has the rows a fit needs."""
import numpy as np
import pandas as pd

from stepcal.costmodel.fitting import MIN_ROWS
from stepcal.costmodel.importers.native import import_profile
from stepcal.experiments.budget.op_model import UNKNOWN_REL_SPREAD, OpModel

M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]


def _candidates() -> pd.DataFrame:
    rows = [{"op": "gemm", "name": "any", "m": m, "n": 1024, "k": 1024, "time_ms": 1.0, "status": "ok",
             "dtype": "float32"} for m in M]
    return import_profile(pd.DataFrame(rows), "grid")


def _time_ms(m) -> np.ndarray:
    return 0.01 + 2e-5 * np.asarray(m, dtype=float)


def test_a_target_with_fewer_rows_than_a_fit_needs_is_unknown():
    model = OpModel(_candidates())
    measured = np.arange(MIN_ROWS - 1)
    time_ms, spread = model.predict(measured, _time_ms(np.array(M)[measured]))
    assert np.isnan(time_ms).all() and (spread == UNKNOWN_REL_SPREAD).all()


def test_a_target_with_the_rows_a_fit_needs_is_predicted():
    model = OpModel(_candidates())
    measured = np.arange(MIN_ROWS)
    time_ms, spread = model.predict(measured, _time_ms(np.array(M)[measured]))
    assert np.isfinite(time_ms).all() and (spread < UNKNOWN_REL_SPREAD).all()
