"""Uncalibrated H100 tables against a real whole-model measurement: Llama-2-70B on DGX H100 at tensor
parallelism 2, 4 and 8, Splitwise's perf_model.csv (../shared/data/profiles/splitwise), which times
whole prefills (`prompt_time`: batch_size prompts of prompt_size tokens) and decode iterations
(`token_time`: the mean of token_size iterations of the batch after its prompts).

Tables are composed the way a user without a run composes them (`stepcal fit`), from kernels measured
by others, in two ways:
  aic        AIConfigurator's H100 GEMMs, attention and all-reduce (vLLM 0.14.0); the element-wise work
             from the memory roofline (no data for it),
  vidur+aic  Vidur's H100 mlp.csv of Llama-2-70B (its projections' GEMMs and the measured element-wise
             operators, at each TP degree), AIConfigurator's attention and all-reduce.
Each is printed alone, with `--host-defaults vllm` (experiments/data/serving_defaults.json), and with a
per-step constant taken from one measurement (the median gap of the batch-1 decode rows), as a
calibration on one light load would add: how much of the error one constant explains.

Printed per TP and kind (decode at batch 1, decode at batch 2-64, prefill): the median ratio predicted / measured over Splitwise's rows,
with its range, and the step split of the median decode row (which term holds the time).

What this does not say: which engine, dtype and CUDA-graph setting Splitwise measured with (its
repository does not state them beside the file), so a constant ratio is as much the setup as the model.

Usage: .venv/bin/python bench/bench_splitwise_h100.py [--tp 2 4 8] [--regressor tuned|rf] [--work DIR]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "profiles"
SPLITWISE = SHARED / "splitwise" / "perf_model_llama2-70b.csv"
AIC = SHARED / "aiconfigurator" / "h100_sxm"
AIC_ATTENTION = [AIC / "attention/vllm/0.14.0" / f for f in ("context_attention_perf.parquet",
                                                             "generation_attention_perf.parquet")]
AIC_COMM = AIC / "comm/vllm/0.14.0/custom_allreduce_perf.parquet"
VIDUR_MLP = SHARED / "vidur/h100/meta-llama/Llama-2-70b-hf/mlp.csv"
SOURCES = {"aic": ([AIC], "gemm,attn_prefill,attn_decode,all_reduce"),
           "vidur+aic": ([VIDUR_MLP, *AIC_ATTENTION, AIC_COMM], "gemm,elementwise,attn_prefill,attn_decode,all_reduce")}


def fit(kind: str, tp: int, regressor: str, work: Path) -> Path:
    out = work / f"{kind}_tp{tp}"
    if (out / "meta.json").exists():
        return out
    profiles, ops = SOURCES[kind]
    cmd = [sys.executable, "-m", "stepcal.experiments.cli", "fit", "--profile", *map(str, profiles), "--model-spec",
           "llama-2-70b", "--tp", str(tp), "--ops", ops, "--regressor", regressor, "--trials", "4",
           "--no-mlflow", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
                   stdout=subprocess.DEVNULL)
    return out


def predictions(model, rows) -> tuple[np.ndarray, np.ndarray]:
    """(prefill ms, mean decode-iteration ms) of every Splitwise row."""
    from stepcal.core.batch import StepBatch
    prefill, decode = [], []
    for b, p, t in zip(rows["batch_size"], rows["prompt_size"], rows["token_size"]):
        ids = list(range(int(b)))
        prefill.append(model.step_ms(StepBatch.of(ids, [int(p)] * int(b), [0] * int(b))))
        decode.append(float(np.mean(model.decode_run_ms(np.full(int(b), int(p)), int(t)))))
    return np.array(prefill), np.array(decode)


def summary(ratio: np.ndarray) -> str:
    return f"{np.median(ratio):.3f} ({ratio.min():.2f}-{ratio.max():.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--regressor", default="tuned", choices=["tuned", "rf"])
    ap.add_argument("--work", default=None, help="where the fitted tables go (kept; default: a temporary directory)")
    args = ap.parse_args()
    import pandas as pd

    from stepcal.core.batch import StepBatch
    from stepcal.costmodel.tables import load_step_model
    from stepcal.experiments.host_defaults import host_defaults
    from stepcal.simulator.step_model import HostTerms, HostTermsModel
    measured = pd.read_csv(SPLITWISE)
    measured = measured[measured["hardware"] == "h100-80gb"]
    work = Path(args.work or tempfile.mkdtemp(prefix="splitwise_h100_"))
    vllm = host_defaults("vllm")
    print(f"Splitwise H100 Llama-2-70B, {len(measured)} rows; tables in {work}; ratio = predicted / measured, "
          "median (min-max)")
    print(f"{'TP':>3} {'tables':<10} {'host':<6} {'decode, batch 1':<20} {'decode, batch 2-64':<20} "
          f"{'prefill':<20}  (host: none, vLLM defaults, or +X: a per-step constant of X ms from the batch-1 "
          "decode rows)")
    for tp in args.tp:
        rows = measured[measured["tensor_parallel"] == tp]
        for kind in SOURCES:
            tables = load_step_model(fit(kind, tp, args.regressor, work))
            _, light = predictions(tables, rows[rows["batch_size"] == 1])
            gap_ms = float(np.median(rows.loc[rows["batch_size"] == 1, "token_time"].to_numpy() - light))
            models = (("none", tables), ("vllm", HostTermsModel(tables, vllm)),
                      (f"+{gap_ms:.1f}", HostTermsModel(tables, HostTerms(per_step_ms=max(gap_ms, 0.0)))))
            for host, model in models:
                prefill, decode = predictions(model, rows)
                ratio = decode / rows["token_time"].to_numpy()
                single = (rows["batch_size"] == 1).to_numpy()   # the rows the per-step constant came from
                print(f"{tp:>3} {kind:<10} {host:<6} {summary(ratio[single]):<20} {summary(ratio[~single]):<20} "
                      f"{summary(prefill / rows['prompt_time'].to_numpy()):<20}")
            b, kv = 16, 512 + 64   # a mid decode row: 16 sequences, prompts of 512, 128 tokens out
            parts = tables.term_ms(StepBatch.of(list(range(b)), [1] * b, [kv] * b).features())
            total = sum(float(v[0]) for v in parts.values())
            print("      split of decode 16 x 576: " + ", ".join(f"{k} {float(v[0]) / total:.0%}" for k, v in parts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
