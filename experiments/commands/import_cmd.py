"""`stepcal import`: turn another tool's measurements into a stepcal measured run."""
from __future__ import annotations

import argparse
import sys

from stepcal.core.errors import print_warnings
from stepcal.core.model_files import load_model_spec
from stepcal.experiments.commands import argtypes
from stepcal.experiments.commands.flags import (
    DEFAULT_BLOCK_SIZE,
    KV_SIZINGS,
    add_command,
    add_scheduler_flags,
    kv_blocks_from_args,
    scheduler_config_from_args,
)
from stepcal.experiments.commands.output import format_summary
from stepcal.experiments.output_paths import check_output

HELP = """Turn measurements from another tool into a measured-run directory laid out like the
output of `stepcal measure`, so that `stepcal validate` and `stepcal calibrate` can replay them."""

VLLM_BENCH_HELP = """Import a `vllm bench serve --save-result --save-detailed` JSON (per-request `ttfts` and
`itls` in seconds, `input_lens`, `output_lens`, `errors`, and `start_times` where the vLLM version
records them; without --save-detailed vLLM keeps only the run's averages, which cannot be
replayed). Give the deployment's settings (model, scheduler, token budget, KV capacity) so that
validate replays the same server. Arrivals come from `start_times`; without them they are evenly
spaced at the bench's `request_rate`, or all at 0 for an unlimited rate (meta.json says which).
Failed requests (non-empty error) are kept, unfinished. A bench has no step log, so validate
reports no step-level error for an imported run.

Writes OUT/meta.json (source "vllm-bench"), OUT/trace.parquet, OUT/repeat_0/{requests,steps}.parquet
and summary.json, and OUT/summary.json.

example:
  stepcal import vllm-bench bench.json --model-spec llama-3-8b --scheduler vllm \\
      --max-num-seqs 256 --max-batched-tokens 8192 --device-memory-gb 80 --out runs/vllm_rate8
  stepcal validate --measured runs/vllm_rate8 --step-model tables/h100 --out runs/vllm_rate8/validation"""

LLMSERVINGSIM_HELP = """Import a real vLLM run recorded by LLMServingSim's bench: RUN_DIR/vllm/requests.jsonl (one
request a line: input_toks, output_toks, arrival_time on the client's epoch clock, and vLLM's stamps
queued_ts, scheduled_ts, first_token_ts, last_token_ts on the engine's monotonic clock),
RUN_DIR/vllm/meta.json (engine_kwargs: max_num_seqs, max_num_batched_tokens, tensor_parallel_size,
dtype, seed; vllm_version), RUN_DIR/vllm/timeseries.csv and RUN_DIR/config.json (LLMServingSim's
cluster config). A RUN_DIR holding requests.jsonl and meta.json itself is read as well.

Latencies are measured from the engine's receipt of each request, on the stamps' own clock, as
LLMServingSim's validation does (its summary.txt's vLLM column is reproduced exactly):
  arrival_s = queued_ts - the first request's queued_ts   (first_token_s, finish_s likewise)
  TTFT = first_token_ts - queued_ts      E2E = last_token_ts - queued_ts
  TPOT = (last_token_ts - first_token_ts) / (output_toks - 1)
The replay's trace has the same arrivals and lengths. meta.json records these definitions, the
epoch-to-monotonic offset (the smallest that queues no request before its send) with the send-to-
receipt delay it implies, and the engine: scheduler vllm with the run's max_num_seqs and
max_num_batched_tokens, tensor parallelism, dtype, seed, vLLM version. The bench does not record
the KV capacity: --device-memory-gb derives it as vLLM sizes its cache for that engine (--kv-sizing
vllm), --kv-blocks gives it; without either the replay has no KV limit. It records no steps and no
inter-token gaps: the step log is empty and itl_ms has no statistics.

Writes OUT/meta.json (source "llmservingsim"), OUT/trace.parquet, OUT/repeat_0/{requests,steps}.parquet
and summary.json, OUT/summary.json, and OUT/timeseries.csv as the bench wrote it.

example:
  stepcal import llmservingsim runs/llmservingsim/RTXPRO6000/Llama-3.1-8B --out runs/lss_llama8b \
      --model-spec llama-3-8b --device-memory-gb 95.6
  stepcal validate --measured runs/lss_llama8b --step-model tables/rtxpro6000 --out runs/lss_llama8b/validation"""


def register(subparsers) -> None:
    p = subparsers.add_parser("import", help="import measurements from other tools (vllm bench, LLMServingSim)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sources = p.add_subparsers(dest="source", metavar="SOURCE")
    v = add_command(sources, "vllm-bench", "a `vllm bench serve --save-result --save-detailed` JSON",
                    VLLM_BENCH_HELP, run_vllm_bench)
    v.add_argument("file", metavar="FILE", help="the JSON written by `vllm bench serve --save-result --save-detailed`")
    v.add_argument("--model-spec", required=True, help="the served model: preset, ModelSpec file or Hugging Face config.json")
    add_scheduler_flags(v, prefix_caching=False)
    v.add_argument("--quiet", action="store_true", help="print nothing but errors")
    v.add_argument("--out", required=True, help="output directory")
    _register_llmservingsim(sources)
    p.set_defaults(func=_usage(p))


def _register_llmservingsim(sources) -> None:
    s = add_command(sources, "llmservingsim", "a real vLLM run recorded by LLMServingSim's bench",
                    LLMSERVINGSIM_HELP, run_llmservingsim)
    s.add_argument("run_dir", metavar="RUN_DIR", help="the bench's run directory (holding vllm/requests.jsonl)")
    s.add_argument("--model-spec", default=None, help="the served model, recorded in meta.json: preset, ModelSpec "
                   "file or Hugging Face config.json (default: none recorded)")
    s.add_argument("--block-size", type=argtypes.count(1, 65_536), default=DEFAULT_BLOCK_SIZE,
                   help=f"tokens per KV block of the replay (default {DEFAULT_BLOCK_SIZE}, vLLM's)")
    s.add_argument("--kv-blocks", type=argtypes.count(1, 2**40), default=None,
                   help="KV cache capacity of the replay in blocks (default: derived from --device-memory-gb, "
                        "else unlimited)")
    s.add_argument("--device-memory-gb", type=argtypes.positive, default=None,
                   help="derive --kv-blocks as the run's engine sized its cache: this GPU memory (GiB, as CUDA "
                        "reports it), --model-spec, the run's tensor_parallel_size, max_num_batched_tokens and "
                        "max_num_seqs")
    s.add_argument("--gpu-memory-utilization", type=argtypes.fraction, default=0.9,
                   help="vLLM's gpu_memory_utilization of the run (default 0.9, vLLM's default)")
    s.add_argument("--kv-sizing", choices=KV_SIZINGS, default="vllm",
                   help="how --device-memory-gb becomes --kv-blocks (as in `stepcal simulate`; default vllm: "
                        "the run's engine is vLLM, which also takes off its start-up profile run's activations)")
    s.add_argument("--quiet", action="store_true", help="print nothing but errors")
    s.add_argument("--out", required=True, help="output directory")


def _usage(parser):
    def run(args) -> int:
        parser.print_help(sys.stderr)
        return 2
    return run


def run_vllm_bench(args) -> int:
    check_output(args.out)
    from stepcal.experiments.validation.vllm_bench import read_vllm_bench, write_vllm_bench_run  # lazy: loads numpy
    spec = load_model_spec(args.model_spec)
    config = scheduler_config_from_args(args)
    kv_blocks = kv_blocks_from_args(args)
    bench = read_vllm_bench(args.file)
    print_warnings(bench.warnings)
    summary = write_vllm_bench_run(bench, args.out, model_spec=spec, scheduler=args.scheduler,
                                   scheduler_config=config, block_size=args.block_size, kv_blocks=kv_blocks)
    if not args.quiet:
        print(format_summary(summary))
        failed = int(bench.failed.sum())
        print(f"imported {len(bench)} requests ({failed} failed, kept unfinished); arrivals from "
              f"{bench.arrival_source}; wrote {args.out}")
    return 0


def run_llmservingsim(args) -> int:
    check_output(args.out)
    from stepcal.experiments.validation.llmservingsim_run import (  # lazy: loads numpy
        import_warnings,
        read_llmservingsim_run,
        write_llmservingsim_run,
    )
    spec = load_model_spec(args.model_spec) if args.model_spec else None
    run = read_llmservingsim_run(args.run_dir)
    kv_blocks = args.kv_blocks if args.kv_blocks is not None else _run_kv_blocks(run, args)
    summary = write_llmservingsim_run(run, args.out, model_spec=spec, block_size=args.block_size,
                                      kv_blocks=kv_blocks)
    print_warnings(import_warnings(run, kv_blocks))
    if not args.quiet:
        print(format_summary(summary))
        print(f"imported {len(run)} requests from {run.requests_path}; wrote {args.out}")
    return 0


def _run_kv_blocks(run, args) -> int | None:
    """The KV blocks the run's engine had, derived from --device-memory-gb with the engine's own limits
    and tensor parallelism (None without --device-memory-gb)."""
    from stepcal.simulator.kv_cache import KvCacheSizing  # lazy: loads numpy
    engine = run.engine
    sizing = KvCacheSizing(block_size=args.block_size, device_memory_gb=args.device_memory_gb,
                           gpu_memory_utilization=args.gpu_memory_utilization,
                           tp=engine.get("tensor_parallel_size") or 1, sizing=args.kv_sizing,
                           max_num_batched_tokens=engine.get("max_num_batched_tokens"),
                           max_num_seqs=engine["max_num_seqs"])
    return sizing.num_blocks(args.model_spec)
