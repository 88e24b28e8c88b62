"""`stepcal import`: turn another tool's measurements into a stepcal measured run."""
from __future__ import annotations

import argparse
import sys

from stepcal.core.errors import print_warnings
from stepcal.core.model_files import load_model_spec
from stepcal.experiments.commands.flags import (
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


def register(subparsers) -> None:
    p = subparsers.add_parser("import", help="import measurements from other tools (vllm bench)",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    sources = p.add_subparsers(dest="source", metavar="SOURCE")
    v = add_command(sources, "vllm-bench", "a `vllm bench serve --save-result --save-detailed` JSON",
                    VLLM_BENCH_HELP, run_vllm_bench)
    v.add_argument("file", metavar="FILE", help="the JSON written by `vllm bench serve --save-result --save-detailed`")
    v.add_argument("--model-spec", required=True, help="the served model: preset, ModelSpec file or Hugging Face config.json")
    add_scheduler_flags(v, prefix_caching=False)
    v.add_argument("--quiet", action="store_true", help="print nothing but errors")
    v.add_argument("--out", required=True, help="output directory")
    p.set_defaults(func=_usage(p))


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
