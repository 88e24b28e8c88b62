"""Prefix caching on real reuse (issue 15): the Mooncake conversation trace (12,031 requests, ~12k
prompt tokens each, 512-token hash ids) simulated with Llama-3-8B T_step tables composed from
AIConfigurator's H100 kernels, 80 GB of HBM, the vllm scheduler, caching on and off.

Reports TTFT P50/P99, throughput, the hit rate beside what the trace's own statistics allow
(unbounded cache; LRU cache of the same size, requests one at a time), and the simulator's wall
time. Then the speed checks: the Azure conv trace without ids, this tree vs a reference commit
(caching off must keep its speed, within 10%), interleaved; and Mooncake with caching on (< 10 s).

Usage: .venv/bin/python bench/bench_prefix_caching.py [--work DIR] [--reference COMMIT] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
MOONCAKE = SHARED / "traces" / "mooncake" / "conversation_trace.jsonl"
AZURE = SHARED / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
STEPCAL = [sys.executable, "-m", "stepcal.experiments.cli"]
ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}

# One simulation, timed inside the process (the trace read and the table load are not timed).
TIMED_RUN = """
import json, sys, time
from stepcal.experiments.step_models import resolve_step_model
from stepcal.simulator.simulation import SimConfig, Simulation
from stepcal.core.workload import load_workload
trace_path, table, rate, caching, kv_blocks = sys.argv[1:6]
trace = load_workload(trace_path, rate_rps=float(rate) if rate != "-" else None)
model = resolve_step_model(table)
caching_field = {"prefix_caching": caching == "on"} if "prefix_caching" in SimConfig.__dataclass_fields__ else {}
config = SimConfig(kv_blocks=int(kv_blocks), **caching_field)   # the reference commit has no such field
sim = Simulation(trace, model, config)
t0 = time.process_time()
result = sim.run()
s = result.summary
print(json.dumps({"cpu_s": time.process_time() - t0, "hit_rate": s.get("prefix_hit_rate"),
                  "ttft_p50": s["ttft_ms"]["p50"], "ttft_p99": s["ttft_ms"]["p99"],
                  "throughput_rps": s["throughput_rps"], "tokens_per_s": s["output_tokens_per_s"],
                  "evictions": s.get("num_prefix_evictions"), "preemptions": s["num_preemptions"],
                  "steps": s["num_steps"]}))
"""


def fit_table(work: Path) -> Path:
    out = work / "llama3_8b_h100"
    if not (out / "meta.json").exists():
        subprocess.run(STEPCAL + ["fit", "--profile", str(SHARED / "profiles" / "aiconfigurator" / "h100_sxm"),
                                  "--model-spec", "llama-3-8b", "--regressor", "rf", "--no-mlflow",
                                  "--out", str(out)], check=True, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL)
    return out


def kv_blocks_80gb() -> int:
    sys.path.insert(0, str(REPO))
    from stepcal.core.model_files import load_model_spec
    from stepcal.simulator.kv_cache import kv_blocks_from_memory
    return kv_blocks_from_memory(load_model_spec("llama-3-8b"), 16, 80.0)


def timed(code_root: Path, trace: Path, table: Path, rate: str, caching: str, kv_blocks: int) -> dict:
    env = {**ENV, "PYTHONPATH": str(code_root)}
    out = subprocess.run([sys.executable, "-c", TIMED_RUN, str(trace), str(table), rate, caching, str(kv_blocks)],
                         check=True, env=env, cwd=code_root, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def trace_bounds(kv_blocks: int) -> dict:
    out = subprocess.run(STEPCAL + ["trace", "stats", str(MOONCAKE), "--json", "--cache-tokens", str(kv_blocks * 16)],
                         check=True, env=ENV, cwd=REPO, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--reference", default="266f880", help="commit before prefix caching (speed reference)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rates", default="0.4,3.4", help="Mooncake arrival rates (req/s); the trace's own is 3.4")
    parser.add_argument("--speed-only", action="store_true", help="only the speed checks")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_prefix_"))
    table, kv_blocks = fit_table(work), kv_blocks_80gb()
    if args.speed_only:
        speed_checks(work, table, kv_blocks, args.reference, args.rounds)
        return
    bounds = trace_bounds(kv_blocks)
    print(f"Mooncake conversation: {bounds['num_requests']} requests; hit share an unbounded cache allows "
          f"{100 * bounds['prefix_hit_share']:.1f}%, an LRU cache of {kv_blocks} x 16 tokens "
          f"{100 * bounds['prefix_hit_share_lru']:.1f}% (requests one at a time)")
    print(f"{'rate':>5} {'caching':>7} {'hit %':>6} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'req/s':>7} "
          f"{'evictions':>10} {'preempt':>8} {'sim cpu s':>9}")
    for rate in args.rates.split(","):
        for caching in ("off", "on"):
            r = timed(REPO, MOONCAKE, table, rate, caching, kv_blocks)
            hit = "-" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f}"
            print(f"{rate:>5} {caching:>7} {hit:>6} {r['ttft_p50']:>12.1f} {r['ttft_p99']:>12.1f} "
                  f"{r['throughput_rps']:>7.3f} {r['evictions']:>10} {r['preemptions']:>8} {r['cpu_s']:>9.2f}")
    speed_checks(work, table, kv_blocks, args.reference, args.rounds)


def speed_checks(work: Path, table: Path, kv_blocks: int, reference: str, rounds: int) -> None:
    old = work / f"ref_{reference}"
    if not old.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(old), reference], check=True, cwd=REPO,
                       capture_output=True)
    try:
        cpu = {"azure reference": [], "azure this tree": [], "mooncake on": []}
        runs = {"azure reference": (old, AZURE, "off"), "azure this tree": (REPO, AZURE, "off"),
                "mooncake on": (REPO, MOONCAKE, "on")}
        for k in range(rounds):   # interleaved, the order turned each round: the machine's speed drifts
            names = list(runs) if k % 2 == 0 else list(reversed(runs))
            for name in names:
                root, trace, caching = runs[name]
                cpu[name].append(timed(root, trace, table, "-", caching, kv_blocks)["cpu_s"])
        for name, values in cpu.items():
            print(f"{name:<16} median {statistics.median(values):.2f} s CPU, min {min(values):.2f}  "
                  f"({', '.join(f'{v:.2f}' for v in values)})")
        ratio = statistics.median(cpu["azure this tree"]) / statistics.median(cpu["azure reference"])
        print(f"azure conv, caching off: this tree / reference = {ratio:.3f}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, capture_output=True)


if __name__ == "__main__":
    main()
