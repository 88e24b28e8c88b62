"""Small measured profiles for the replay device's tests, with times known in closed form."""
import itertools
from pathlib import Path

import pandas as pd

GEMM_M = (1, 4, 16, 64, 256, 1024)
GEMM_N = (256, 2048)
GEMM_K = (256, 688)
REL_SCATTER = 0.01


def gemm_ms(m, n, k) -> float:
    """Log-linear in log(1 + size): the interpolation reproduces it exactly."""
    return 0.002 * (1 + m) ** 0.6 * (1 + n) ** 0.3 * (1 + k) ** 0.2


def write_gemm_profile(path: Path, dtype: str = "float32") -> Path:
    """A profile table of GEMMs over GEMM_M x GEMM_N x GEMM_K, with a p10-p90 spread of REL_SCATTER."""
    rows = []
    for m, n, k in itertools.product(GEMM_M, GEMM_N, GEMM_K):
        t = gemm_ms(m, n, k)
        rows.append({"op": "gemm", "name": "any", "m": m, "n": n, "k": k, "dtype": dtype, "device": "test-gpu",
                     "time_ms": t, "time_ms_p10": t * (1 - 1.2816 * REL_SCATTER),
                     "time_ms_p90": t * (1 + 1.2816 * REL_SCATTER), "status": "ok"})
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def gemm_replay_campaign(tmp_path: Path, m_values):
    """run(out, *flags): `stepcal profile` of the tiny model's GEMMs at these m on the replay device, answered
    from write_gemm_profile's table, into tmp_path/out; returns its exit status."""
    import json

    from stepcal.experiments.cli import main
    source = write_gemm_profile(tmp_path / "measured.csv")
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"timing": {"min_repeats": 5, "max_point_s": 0.5}, "gemm": {"m": list(m_values)}}))

    def run(out: str, *extra: str) -> int:
        return main(["profile", "--model-spec", "tiny", "--device", f"replay:{source}", "--ops", "gemm",
                     "--grid", str(grid), "--dtype", "float32", "--no-progress", "--out", str(tmp_path / out), *extra])
    return run
