"""experiments.budget.adaptive: a weighting steers the picks, but never starves a target that has
too few measured points to fit."""
import numpy as np
import pandas as pd

from stepcal.core.model_files import load_model_spec
from stepcal.costmodel.fitting import MIN_ROWS
from stepcal.experiments.budget.adaptive import AdaptiveDesign, CostCurve
from stepcal.experiments.budget.campaign import candidate_records
from stepcal.profiler.grid import load_grid
from stepcal.profiler.sweep import SweepConfig
from stepcal.profiler.timing import TimingPolicy


def _candidates() -> pd.DataFrame:
    spec = load_model_spec("tiny")
    grid = load_grid("quick", spec).for_ops(["gemm", "attn_decode"])
    return candidate_records(SweepConfig(spec=spec, device="cpu", dtype="float32", ops=["gemm", "attn_decode"],
                                         grid=grid))


def _time_ms(candidates: pd.DataFrame) -> np.ndarray:
    work = candidates["m"].fillna(0) * 2e-5 + candidates["decode_kv_sum"].fillna(0) * 1e-6
    return (0.01 + work).to_numpy()


def _next(weights) -> pd.DataFrame:
    candidates = _candidates()
    design = AdaptiveDesign(candidates, CostCurve.for_policy(TimingPolicy()), weights=weights)
    times = _time_ms(design.model.candidates)
    gemm = np.flatnonzero(design.model.candidates["op"] == "gemm")
    decode = np.flatnonzero(design.model.candidates["op"] == "attn_decode")
    measured = {int(i): float(times[i]) for i in [*gemm[::2], *decode[:MIN_ROWS - 2]]}
    batch = design.next_batch(measured, 0.0, 1e6)
    return design.model.candidates.iloc[batch]


def test_a_target_too_thin_to_fit_is_picked_even_at_a_tiny_weight():
    candidates = _candidates()
    weights = np.where(candidates["op"] == "attn_decode", 1e-6, 1.0)
    assert (_next(weights)["op"] == "attn_decode").any()
