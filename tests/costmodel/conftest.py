"""Fixtures of the cost-model tests: small synthetic profiles with known physics, and one
MLflow store per session (a new SQLite store spends seconds on migrations)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stepcal.core.batch import batch_row
from stepcal.core.model_spec import PRESETS
from stepcal.core.schemas import PROFILE_COLUMNS

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PROFILES = SHARED_DATA / "profiles"
SPEC = PRESETS["tiny"]

# The synthetic device: a GEMM costs launch + FLOPs / peak; attention costs launch + bytes / bw.
LAUNCH_MS = 0.004
PEAK_FLOPS_PER_MS = 2e9
BYTES_PER_MS = 4e7


def gemm_ms(m, n, k):
    return LAUNCH_MS + 2.0 * m * n * k / PEAK_FLOPS_PER_MS


def decode_ms(kv_sum):
    return LAUNCH_MS + 2.0 * kv_sum * SPEC.kv_size * 4 / BYTES_PER_MS


def prefill_ms(work):
    return LAUNCH_MS + 4.0 * work * SPEC.q_size / PEAK_FLOPS_PER_MS


def step_ms(row):
    return (0.05 + 0.002 * row["num_tokens"] + 1e-5 * row["decode_kv_sum"]
            + 2e-7 * row["prefill_attn_work"] + 0.003 * row["num_seqs"])


def _row(op, name, time_ms, **shape):
    row = dict.fromkeys(PROFILE_COLUMNS)
    row.update(point_key=f"{op}/{name}/{len(shape)}", op=op, name=name, time_ms=time_ms,
               time_ms_p10=0.97 * time_ms, time_ms_p90=1.03 * time_ms, repeats=5, status="ok",
               device="cpu", device_name="Test CPU", dtype="float32", model_spec="tiny",
               num_heads=SPEC.num_heads, num_kv_heads=SPEC.num_kv_heads, head_dim=SPEC.head_dim)
    row.update(shape)
    return row


def make_profile(seed: int = 0, noise: float = 0.01) -> pd.DataFrame:
    """A profile table in the profiler's schema: GEMMs, attention, overhead, one failed point."""
    rng = np.random.default_rng(seed)
    rows = []
    jitter = lambda: float(np.exp(rng.normal(0, noise)))  # noqa: E731
    for name, (n, k) in SPEC.gemm_shapes().items():
        for m in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048):
            rows.append(_row("gemm", name, gemm_ms(m, n, k) * jitter(), m=m, n=n, k=k))
    for b in (1, 2, 4, 8, 16, 32):
        for s in (16, 64, 256, 1024, 2048):
            q, kv = [1] * b, [s] * b
            f = batch_row(q, kv)
            rows.append(_row("attn_decode", "uniform", decode_ms(f["decode_kv_sum"]) * jitter(),
                             q_lens=q, kv_lens=kv, **f))
    for b in (1, 2, 4):
        for q in (16, 64, 128, 256, 512, 1024):
            for s in (0, 256):
                ql, kv = [q] * b, [s] * b
                f = batch_row(ql, kv)
                rows.append(_row("attn_prefill", "uniform",
                                 prefill_ms(f["prefill_attn_work"]) * jitter(),
                                 q_lens=ql, kv_lens=kv, **f))
    for b in (1, 2, 4, 8, 16, 32, 64):
        q, kv = [1] * b, [100] * b
        rows.append(_row("overhead", "decode", (0.02 + 0.001 * b) * jitter(), q_lens=q, kv_lens=kv,
                         **batch_row(q, kv)))
    failed = _row("gemm", "qkv_proj", 1.0, m=4096, n=768, k=256)
    failed.update(status="failed", error="out of memory", time_ms=None, time_ms_p10=None,
                  time_ms_p90=None)
    rows.append(failed)
    return pd.DataFrame(rows, columns=list(PROFILE_COLUMNS))


def make_step_log(num_steps: int = 300, seed: int = 1, noise: float = 0.01) -> pd.DataFrame:
    """A measured step log: mixed batches with durations from a known additive law."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_steps):
        b = int(rng.integers(1, 24))
        q = [1] * b
        kv = [int(x) for x in rng.integers(1, 2048, b)]
        if rng.random() < 0.4:
            q.append(int(rng.integers(16, 512)))
            kv.append(int(rng.integers(0, 256)))
        f = batch_row(q, kv)
        rows.append({"replica": 0, "step": i, "start_s": i * 0.01,
                     "duration_ms": step_ms(f) * float(np.exp(rng.normal(0, noise))), **f,
                     "request_ids": list(range(len(q))), "q_lens": q, "kv_lens": kv})
    return pd.DataFrame(rows)


@pytest.fixture
def profile_file(tmp_path) -> Path:
    path = tmp_path / "profile.parquet"
    make_profile().to_parquet(path, index=False)
    return path


@pytest.fixture
def step_log_file(tmp_path) -> Path:
    path = tmp_path / "steps.parquet"
    make_step_log().to_parquet(path, index=False)
    return path


@pytest.fixture(scope="session")
def tracking_uri(tmp_path_factory) -> str:
    """One SQLite MLflow store for the whole session."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="session")
def fitted_tables(tmp_path_factory) -> Path:
    """The synthetic profile fitted (rf, no MLflow) into a table directory, once per session."""
    from stepcal.experiments.cli import main
    base = tmp_path_factory.mktemp("tables")
    profile = base / "profile.parquet"
    make_profile().to_parquet(profile, index=False)
    out = base / "tables"
    assert main(["fit", "--profile", str(profile), "--model-spec", "tiny", "--regressor", "rf",
                 "--no-mlflow", "--out", str(out)]) == 0
    return out


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not present: {path}")
    return path
