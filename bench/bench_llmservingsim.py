"""LLMServingSim's own benchmark, side by side: its two published RTX PRO 6000 runs (vLLM 0.19.0,
300 ShareGPT requests at ~10 req/s) replayed by stepcal from LLMServingSim's own per-layer profiles,
uncalibrated, against the measured run and against LLMServingSim's errors from its summary.txt.

    .venv/bin/python bench/bench_llmservingsim.py [--ranges 20] [--work DIR] [--regressor rf]

Every setting passed (printed before each table):
- the model: the Hugging Face config.json of each model (tests/data/hf_configs);
- the KV cache: derived as vLLM sizes it (`import llmservingsim --device-memory-gb 95.6 --kv-sizing vllm`):
  95.6 GiB is what CUDA reports of the card's 96 GB (97,887 MiB), gpu_memory_utilization 0.9 (vLLM's
  default; the runs set none), the engine limits from the run's meta.json;
- the profile: the bundle's tp<N> folder for the run's tensor_parallel_size, with its skew.csv term
  (decode_attn_skew) unless --no-skew;
- tensor parallelism's all-reduce: the bundle measures none, so each is a ring over the link that the
  run's LLMServingSim cluster config.json states (link_bw GB/s, link_latency ns): the deployment's
  description both simulators are given, not a figure fitted to the run;
- host terms: vLLM's published host defaults by the run's executor. vLLM 0.19.0 turns async scheduling
  on by default where the executor supports it (SchedulerConfig.async_scheduling None = auto): the
  multiprocess executor of TP > 1 does, so the TP2 run gets `vllm-async`; the one-process executor of
  TP1 did not in that release line (its supports_async_scheduling came later), so the TP1 run gets `vllm`.
Nothing here is fitted to the runs' measured latencies.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
RUNS = SHARED / "runs" / "llmservingsim" / "RTXPRO6000"
PROFILES = SHARED / "profiles" / "llmservingsim" / "RTXPRO6000"
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
DEVICE_MEMORY_GIB = "95.6"
CASES = (  # run folder, profile bundle, model config, host defaults by the run's executor (see above)
    ("Llama-3.1-8B", "meta-llama/Llama-3.1-8B/bf16", "llama-3.1-8b-instruct.json", "vllm"),
    ("Qwen3-32B", "Qwen/Qwen3-32B/bf16", "qwen3-32b.json", "vllm-async"),
)
METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "Latency"))
STATS = (("mean", "Mean"), ("p50", "Median"), ("p90", "P90"), ("p99", "P99"))


def stepcal(*args: str) -> float:
    """Run one stepcal command; its wall time in seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "stepcal", *args], capture_output=True, text=True,
                          env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    if done.returncode != 0:
        sys.exit(f"stepcal {' '.join(args)} failed:\n{done.stderr}")
    return time.perf_counter() - started


def lss_errors(summary_txt: Path) -> dict[tuple[str, str], float]:
    """LLMServingSim's own error of each (metric, statistic) from its summary.txt, as a fraction."""
    errors = {}
    for line in summary_txt.read_text().splitlines():
        match = re.match(r"(TTFT|TPOT|Latency) (Mean|Median|P\d+)\s+\S+\s+\S+\s+([+-]?[\d.]+)%", line)
        if match:
            errors[match.group(1), match.group(2)] = float(match.group(3)) / 100
    return errors


def link_flags(run_dir: Path, tp: int) -> list[str]:
    """--tp-link-gbps / --tp-latency-us from the run's cluster config (link_latency is in ns)."""
    if tp == 1:
        return []
    config = json.loads((run_dir / "config.json").read_text())
    return ["--tp-link-gbps", str(config["link_bw"]), "--tp-latency-us", str(config["link_latency"] / 1000)]


def run_case(case, work: Path, regressor: str, ranges: int, no_skew: bool) -> dict:
    name, bundle, config, host = case
    run_dir, out = RUNS / name, work / name
    tp = json.loads((run_dir / "vllm" / "meta.json").read_text())["engine_kwargs"]["tensor_parallel_size"]
    spec = str(CONFIGS / config)
    times = {"import_s": stepcal("import", "llmservingsim", str(run_dir), "--out", str(out / "run"), "--quiet",
                                 "--model-spec", spec, "--device-memory-gb", DEVICE_MEMORY_GIB)}
    times["fit_s"] = stepcal("fit", "--profile", str(PROFILES / bundle), "--format", "llmservingsim",
                             "--model-spec", spec, "--tp", str(tp), "--regressor", regressor, "--no-mlflow",
                             *link_flags(run_dir, tp), *(["--no-skew"] if no_skew else []),
                             "--out", str(out / "tables"))
    validate = ["validate", "--measured", str(out / "run"), "--step-model", str(out / "tables"),
                "--host-defaults", host, "--quiet"]
    times["validate_s"] = stepcal(*validate, "--out", str(out / "validation"))
    result = json.loads((out / "validation" / "validation.json").read_text())
    if ranges:
        times["ranges_s"] = stepcal(*validate, "--ranges", str(ranges), "--out", str(out / "ranges"))
        result["ranges"] = json.loads((out / "ranges" / "validation.json").read_text())["ranges"]
    meta = json.loads((out / "run" / "meta.json").read_text())
    return {"name": name, "tp": tp, "host": host, "kv_blocks": meta["kv_blocks"], "times": times,
            "result": result, "lss": lss_errors(run_dir / "validation" / "summary.txt")}


def print_case(case: dict) -> list[bool]:
    """The side-by-side table of one run; returns, per cell, whether it is inside its 90% interval."""
    result, inside = case["result"], []
    times = ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in case["times"].items())
    print(f"\n## {case['name']} (TP{case['tp']}, KV {case['kv_blocks']:,} blocks, --host-defaults {case['host']}; "
          f"{times})\n")
    ranged = result.get("ranges") is not None
    print("| metric | measured | stepcal | stepcal error | LLMServingSim error |" + (" 90% interval | inside |" if ranged else ""))
    print("|---|---|---|---|---|" + ("---|---|" if ranged else ""))
    for metric, label in METRICS:
        for stat, stat_label in STATS:
            cell = result["metrics"][metric][stat]
            lss = case["lss"].get((label, stat_label))
            row = (f"| {label} {stat_label} | {cell['measured']:.1f} | {cell['simulated']:.1f} | "
                   f"{cell['error']:+.1%} | {'-' if lss is None else f'{lss:+.1%}'} |")
            if ranged:
                low, high = interval(result["ranges"], metric, stat)
                inside.append(low <= cell["measured"] <= high)
                row += f" {low:.1f} - {high:.1f} | {'yes' if inside[-1] else 'no'} |"
            print(row)
    tput = result["throughput_rps"]
    print(f"| throughput (req/s) | {tput['measured']:.3f} | {tput['simulated']:.3f} | {tput['error']:+.1%} | - |")
    return inside


def interval(ranges: dict, metric: str, stat: str) -> tuple[float, float]:
    """The 90% interval of one figure in validation.json's ranges block."""
    cell = ranges["stats"][metric][stat]
    return cell["low"], cell["high"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranges", type=int, default=0, help="also validate with --ranges N (coverage)")
    parser.add_argument("--regressor", default="rf", choices=("rf", "tuned"))
    parser.add_argument("--no-skew", action="store_true", help="fit without the bundles' skew.csv term")
    parser.add_argument("--work", default=None, help="keep the outputs here (default: a temporary folder)")
    args = parser.parse_args()
    if not RUNS.is_dir():
        sys.exit(f"{RUNS}: the shared LLMServingSim runs are not here")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        inside = []
        for case in CASES:
            inside += print_case(run_case(case, work, args.regressor, args.ranges, args.no_skew))
        if inside:
            print(f"\ncoverage: {sum(inside)} of {len(inside)} cells inside their 90% intervals")


if __name__ == "__main__":
    main()
