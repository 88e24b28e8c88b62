"""Exports Vidur runs unchanged (issue 19): fit T_step tables from the shared Vidur A100 mlp.csv plus
AIConfigurator's A100 attention tables, export them with `stepcal tables export --format vidur
--vidur-model NAME`, and check them against what Vidur reads (costmodel.vidur_models: its row
filters, required columns, its num_tokens sweep).

Without --vidur this runs the contract checks only and prints them, with how far the export's
per-layer time is from Vidur's own profile at its num_tokens. With --vidur PATH (a checkout of
microsoft/vidur, its Python given by --vidur-python) it also runs Vidur's simulator on the Azure conv
trace at half its rate with Sarathi chunks of 512, once with our export placed where Vidur reads its
profiles (data/profiling/compute/a100/<model>/ under a working directory whose other data/ entries
link to the checkout's) and once with Vidur's own profile, and prints TPOT P50 of both.

Usage: .venv/bin/python bench/bench_vidur_export.py [--vidur PATH] [--vidur-python PY]
           [--models NAME ...] [--num-requests N] [--regressor rf|tuned] [--work DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "data"
PROFILES = SHARED / "profiles"
ATTENTION = {"a100": PROFILES / "aiconfigurator/a100_sxm/attention/vllm/0.14.0",
             "h100": PROFILES / "aiconfigurator/h100_sxm/attention/vllm/0.14.0"}
# Device memory bandwidth of the KV-cache-save estimate (--hbm-gbps): A100-SXM4-80GB, H100-SXM5.
HBM_GBPS = {"a100": 2039, "h100": 3350}
CONV_TRACE = SHARED / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
CHUNK = 512
MAX_TOKENS = 4096      # Vidur's trace generator clips prompt + output to this (its default)


@dataclass(frozen=True)
class Case:
    vidur_name: str       # Vidur's model name (costmodel.vidur_models.VIDUR_MODELS)
    spec: str             # our --model-spec: a preset, or a JSON file the bench writes
    tp: int


CASES = {
    "llama-2-7b": Case("meta-llama/Llama-2-7b-hf", "llama-2-7b", 1),
    "llama-3-8b": Case("meta-llama/Meta-Llama-3-8B", "llama-3-8b", 1),
    "codellama-34b": Case("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b", 2),
}
# CodeLlama-34B as Hugging Face describes it (vocabulary 32000; Vidur's config pads it to 32768).
CODELLAMA_34B = {"name": "codellama-34b", "num_layers": 48, "hidden_size": 8192, "num_heads": 64,
                 "num_kv_heads": 8, "head_dim": 128, "ffn_size": 22016, "vocab_size": 32000}


def mlp_source(case: Case, vidur: Path | None) -> tuple[Path, str]:
    """Vidur's A100 mlp.csv of the model: the shared copy, else the checkout's; without either (no
    A100 CodeLlama-34B is shared) the shared H100 copy, for the contract checks only."""
    shared = PROFILES / "vidur/a100" / case.vidur_name / "mlp.csv"
    if shared.exists():
        return shared, "a100"
    if vidur is not None and (vidur / "data/profiling/compute/a100" / case.vidur_name / "mlp.csv").exists():
        return vidur / "data/profiling/compute/a100" / case.vidur_name / "mlp.csv", "a100"
    h100 = PROFILES / "vidur/h100" / case.vidur_name / "mlp.csv"
    if h100.exists():
        return h100, "h100"
    raise SystemExit(f"no mlp.csv of {case.vidur_name}: not in {PROFILES / 'vidur'} (nor under --vidur)")


def cli(*argv: str) -> str:
    """Run a stepcal command in this process; its printed output (exit status 0 required)."""
    from stepcal.experiments.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"stepcal {' '.join(argv)}: exit {code}")
    return out.getvalue()


def fit_and_export(key: str, case: Case, vidur: Path | None, work: Path, regressor: str) -> dict:
    mlp, device = mlp_source(case, vidur)
    spec = case.spec
    if key == "codellama-34b":
        spec = str(work / "codellama-34b.json")
        Path(spec).write_text(json.dumps(CODELLAMA_34B))
    tables, export = work / "tables" / key, work / "export" / key
    started = time.perf_counter()
    cli("fit", "--profile", str(mlp), str(ATTENTION[device]), "--model-spec", spec, "--tp", str(case.tp),
        "--regressor", regressor, "--no-mlflow", "--out", str(tables))
    fit_s = time.perf_counter() - started
    line = cli("tables", "export", str(tables), "--format", "vidur", "--vidur-model", case.vidur_name,
               "--hbm-gbps", str(HBM_GBPS[device]), "--out", str(export)).strip()
    return {"mlp": mlp, "device": device, "tables": tables, "export": export, "line": line, "fit_s": fit_s}


def contract(case: Case, done: dict) -> list[str]:
    """What would stop Vidur on the export, and how the export's layer compares with Vidur's profile."""
    from stepcal.costmodel.vidur_models import (
        MLP_OPS,
        VIDUR_MODELS,
        contract_problems,
        mlp_rows,
        num_tokens_sweep,
    )
    model = VIDUR_MODELS[case.vidur_name]
    mlp = pd.read_csv(done["export"] / "mlp.csv")
    attention = pd.read_csv(done["export"] / "attention.csv")
    problems = contract_problems(mlp, attention, model, case.tp)
    rows = mlp_rows(mlp, model, case.tp)
    sweep_ok = rows["num_tokens"].tolist() == num_tokens_sweep(int(rows["num_tokens"].max())).tolist()
    lines = [f"  export: {len(mlp)} mlp.csv rows ({len(rows)} pass Vidur's filter at TP {case.tp}), "
             f"{len(attention)} attention.csv rows; num_tokens {'is' if sweep_ok else 'is NOT'} Vidur's sweep",
             f"  contract: {'ok' if not problems else '; '.join(problems)}"]
    layer = [f"time_stats.{op}.median" for op in MLP_OPS]
    # Vidur's profile may time a num_tokens more than once: its median over them, per operator.
    theirs = mlp_rows(pd.read_csv(done["mlp"]), model, case.tp).groupby("num_tokens")[layer].median()
    ours = rows.set_index("num_tokens").reindex(theirs.index)
    err = 100 * (ours[layer].sum(axis=1) / theirs[layer].sum(axis=1) - 1)
    err = err.dropna()
    if len(err):
        worst = err.abs().idxmax()
        lines.append(f"  per-layer time (Vidur's {len(layer)} ops) vs Vidur's {done['device'].upper()} profile at its "
                     f"{len(err)} num_tokens: |error| P50 {np.percentile(err.abs(), 50):.2f}%, "
                     f"P99 {np.percentile(err.abs(), 99):.2f}%, worst {err[worst]:+.1f}% at {worst}")
        for t in (256, 512, 1024, 2048, 4096):
            if t in err.index:
                lines[-1] += f"; {t}: {err[t]:+.1f}%"
    return lines


# The trace CSV Vidur's trace_replay request generator reads: arrival in seconds from the start, prompt and
# output tokens. Checked against microsoft/vidur: vidur/config/config.py @8afeaf05 (TraceRequestGeneratorConfig,
# type TRACE_REPLAY: default trace_file data/processed_traces/splitwise_conv.csv, whose header is these three
# columns with arrived_at in s: it is the Azure conv trace itself, its first rows 0.0 s 374/44 and 4.314579 s
# 396/109 tokens as read_trace gives them; prefill, decode and time scale factors 1.0; max_tokens 4096) and
# vidur/request_generator/request_generator_registry.py @82f0840. Older Vidur (config.py and
# trace_replay_request_generator.py @01f216f, @14db47b) read Date, Time, PromptTokenCount and
# CompletionTokenCount instead, with scale factors 0.3 (prefill) and 0.04 (time) by default.
TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
TRACE_READER = "vidur/request_generator/trace_replay_request_generator.py"


def vidur_trace(work: Path, num_requests: int | None) -> Path:
    """The Azure conv trace at half its rate in Vidur's trace CSV (TRACE_COLUMNS)."""
    from stepcal.core.workload import read_trace
    trace = read_trace(CONV_TRACE)
    n = len(trace) if num_requests is None else min(num_requests, len(trace))
    frame = pd.DataFrame(dict(zip(TRACE_COLUMNS, (2.0 * trace.arrival_s[:n], trace.num_prompt_tokens[:n],
                                                  trace.num_output_tokens[:n]))))
    path = work / "azure_conv_half_rate.csv"
    frame.to_csv(path, index=False)
    return path


def check_trace_reader(vidur: Path) -> None:
    """Stop before any run when the checkout's trace reader does not name TRACE_COLUMNS (an older
    Vidur, whose reader takes another layout): its runs would fail, or read other columns."""
    reader = vidur / TRACE_READER
    text = reader.read_text() if reader.is_file() else ""
    missing = [c for c in TRACE_COLUMNS if f'"{c}"' not in text and f"'{c}'" not in text]
    if missing:
        raise SystemExit(f"{reader}: does not read {', '.join(missing)}: this Vidur's trace_replay reads another "
                         f"trace layout than {', '.join(TRACE_COLUMNS)}; use a checkout of its current main")


def place(vidur: Path, run_dir: Path, case: Case, export: Path | None) -> Path:
    """A working directory for one Vidur run: data/ as the checkout's, except, with `export`, the
    model's A100 profile directory, which holds our mlp.csv and attention.csv."""
    data = vidur / "data"
    run_dir.mkdir(parents=True)
    if export is None:
        (run_dir / "data").symlink_to(data, target_is_directory=True)
        return run_dir
    for entry in data.iterdir():
        if entry.name != "profiling":
            (run_dir / "data" / entry.name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / "data" / entry.name).symlink_to(entry)
    for entry in (data / "profiling").iterdir():
        if entry.name != "compute":
            (run_dir / "data/profiling" / entry.name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / "data/profiling" / entry.name).symlink_to(entry)
    target = run_dir / "data/profiling/compute/a100" / case.vidur_name
    target.mkdir(parents=True)
    for name in ("mlp.csv", "attention.csv"):
        (target / name).symlink_to((export / name).resolve())
    return run_dir


def run_vidur(vidur: Path, python: str, run_dir: Path, case: Case, trace: Path) -> float:
    """Vidur's simulation in run_dir; TPOT P50 in ms."""
    out = run_dir / "simulator_output"
    argv = [python, "-m", "vidur.main", "--replica_config_device", "a100",
            "--replica_config_model_name", case.vidur_name, "--replica_config_tensor_parallel_size", str(case.tp),
            "--cluster_config_num_replicas", "1",
            "--request_generator_config_type", "trace_replay", "--trace_request_generator_config_trace_file",
            str(trace), "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
            # the trace as written: no rescaling, whatever this checkout's defaults
            "--trace_request_generator_config_prefill_scale_factor", "1",
            "--trace_request_generator_config_decode_scale_factor", "1",
            "--trace_request_generator_config_time_scale_factor", "1",
            "--replica_scheduler_config_type", "sarathi", "--sarathi_scheduler_config_chunk_size", str(CHUNK),
            "--metrics_config_output_dir", str(out), "--no-metrics_config_store_plots"]
    env = {**os.environ, "PYTHONPATH": str(vidur), "WANDB_MODE": "disabled"}
    subprocess.run(argv, cwd=run_dir, env=env, check=True)
    metrics = sorted(out.rglob("request_metrics.csv"))
    if not metrics:
        raise SystemExit(f"Vidur wrote no request_metrics.csv under {out}")
    tpot_s = pd.read_csv(metrics[-1])["decode_time_execution_plus_preemption_normalized"]
    return float(np.median(tpot_s)) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vidur", type=Path, default=None, help="a checkout of microsoft/vidur (with its data/)")
    p.add_argument("--vidur-python", default=sys.executable, help="the Python of Vidur's environment")
    p.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--num-requests", type=int, default=None, help="the first N requests of the trace (default all)")
    p.add_argument("--regressor", choices=["rf", "tuned"], default="rf")
    p.add_argument("--work", type=Path, default=None, help="keep the tables, exports and runs here")
    args = p.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_vidur_export."))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory: {work}")
    done = {}
    for key in args.models:
        case = CASES[key]
        done[key] = fit_and_export(key, case, args.vidur, work, args.regressor)
        d = done[key]
        print(f"{case.vidur_name} (TP {case.tp}): fitted from {d['mlp']} + {ATTENTION[d['device']]} "
              f"({args.regressor}, {d['fit_s']:.0f} s)")
        print(f"  {d['line']}")
        for line in contract(case, d):
            print(line)
    if args.vidur is None:
        print("no --vidur checkout given: contract checks only (Vidur's simulator not run)")
        return 0
    check_trace_reader(args.vidur)
    trace = vidur_trace(work, args.num_requests)
    print(f"\nVidur on {CONV_TRACE.name} at half rate ({trace}), Sarathi chunk {CHUNK}, max tokens {MAX_TOKENS}")
    print(f"{'model':<38} {'TPOT P50 ours':>14} {'Vidur profile':>14} {'diff':>8}")
    for key in args.models:
        case, d = CASES[key], done[key]
        if d["device"] != "a100":
            print(f"{case.vidur_name:<38} skipped: no A100 mlp.csv of it to fit from")
            continue
        ours = run_vidur(args.vidur, args.vidur_python, place(args.vidur, work / "vidur" / key / "ours", case,
                                                               d["export"]), case, trace)
        theirs = run_vidur(args.vidur, args.vidur_python, place(args.vidur, work / "vidur" / key / "own", case, None),
                           case, trace)
        print(f"{case.vidur_name:<38} {ours:>11.2f} ms {theirs:>11.2f} ms {100 * (ours / theirs - 1):>+7.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
