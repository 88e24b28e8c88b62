"""What tensor parallelism adds to a request and to a step, for Llama-2-70B and Mixtral-8x7B at TP 2, 4
and 8 on H100: the host terms `--host-defaults vllm` adds at --tp > 1 (experiments/data/serving_defaults.json,
`tensor_parallel`), and the collective terms the shared profiles give that a composed T_step prices, or
does not, for vLLM V1's CUDA-graph modes.

Printed, per model and TP:
  host      per step and per request (at the Azure conversation trace's median and 95th-percentile
            prompt) what the `tensor_parallel` terms add, and the published figure each comes from;
  all-reduce  per step at a step's token count: the step's all-reduces (costmodel.compose_comm) priced
            from AIConfigurator's custom_allreduce_perf (vLLM 0.14.0, H100) as replayed in a CUDA graph
            and launched eagerly (what vLLM runs for a step of more tokens than its largest captured
            graph, 512 by default: min(2 x max_num_seqs, 512) in vLLM's `_set_cudagraph_sizes`; the
            composed tables take the eager price there, costmodel.compose_comm.GRAPH_MAX_TOKENS), their
            difference, and Vidur's NCCL all_reduce.csv beside them;
  all-gather  per decode step the logits' all-gather every worker runs before sampling (vLLM PR #9856),
            bounded above by an all-reduce of the gathered logits (an all-reduce is a reduce-scatter
            and an all-gather): no table of all-gathers is in the shared data.

Nothing here is fitted: each figure is a published or profiled measurement, or arithmetic on one.

Usage: .venv/bin/python bench/bench_tp_host.py [--tp 2 4 8]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from stepcal.core.model_spec import PRESETS, Parallelism
from stepcal.costmodel.compose_comm import GRAPH_MAX_TOKENS, all_reduces_per_step
from stepcal.experiments.host_defaults import host_defaults, read_serving_defaults

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
AIC_ALL_REDUCE = SHARED / "profiles/aiconfigurator/h100_sxm/comm/vllm/0.14.0/custom_allreduce_perf.parquet"
VIDUR_ALL_REDUCE = SHARED / "profiles/vidur/network/h100_dgx/all_reduce.csv"
AZURE_CONV = SHARED / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
STEP_TOKENS = (1, 64, 512, 1024, 2048, 8192)
DECODE_SEQS = (1, 64, 256)
BYTES_PER_ELEMENT = 2           # bf16 activations and logits


def all_reduce_curves() -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """(backend, GPUs) -> (message elements, ms): AIConfigurator's graph and eager custom all-reduce,
    and Vidur's NCCL (its `size` in bytes read as bf16 elements, its rank 0's median)."""
    aic = pd.read_parquet(AIC_ALL_REDUCE)
    curves = {}
    for (backend, gpus), rows in aic.groupby(["backend", "num_gpus"]):
        rows = rows.sort_values("message_size")
        curves[(backend, int(gpus))] = (rows["message_size"].to_numpy(float), rows["latency"].to_numpy(float))
    vidur = pd.read_csv(VIDUR_ALL_REDUCE)
    vidur = vidur[vidur["rank"] == 0]
    for gpus, rows in vidur.groupby("num_workers"):
        rows = rows.groupby("size")["time_stats.all_reduce.median"].median()
        curves[("vidur_nccl", int(gpus))] = (rows.index.to_numpy(float) / BYTES_PER_ELEMENT, rows.to_numpy(float))
    return curves


def price_ms(curves, backend: str, gpus: int, elements: float) -> float:
    """One all-reduce of `elements`, interpolated in log message size (held at the ends)."""
    sizes, times = curves[(backend, gpus)]
    return float(np.interp(np.log(elements), np.log(sizes), times))


def prompt_quantiles() -> dict[str, int]:
    prompts = pd.read_csv(AZURE_CONV)["ContextTokens"]
    return {"median": int(prompts.median()), "p95": int(prompts.quantile(0.95))}


def host_lines(tp: int, prompts: dict[str, int]) -> list[str]:
    one, many = host_defaults("vllm"), host_defaults("vllm", tp=tp)
    per_step = many.per_step_ms - one.per_step_ms
    per_token = many.per_prompt_token_ms - one.per_prompt_token_ms
    terms = read_serving_defaults()["engines"]["vllm"]["tensor_parallel"]["terms"]
    cited = {name: ", ".join(terms[name]["sources"]) for name in ("per_step_ms", "per_prompt_token_ms")}
    lines = [f"  host: +{per_step:.3f} ms per step ({cited['per_step_ms']}: 0.05 ms shared-memory round trip)"]
    for name, tokens in prompts.items():
        lines.append(f"  host: +{per_token * tokens:.4f} ms per request at the {name} prompt ({tokens} tokens; "
                     f"{cited['per_prompt_token_ms']}: 1.21 ms / 40k tokens)")
    return lines


def all_reduce_lines(curves, model: str, parallelism: Parallelism) -> list[str]:
    spec = PRESETS[model]
    count = all_reduces_per_step(spec, parallelism)
    lines = [f"  all-reduce: {count} per step of num_tokens x {spec.hidden_size} over {parallelism.tp} GPUs"
             f"  (ms per step: graph / eager / eager-graph / vidur nccl)"]
    for tokens in STEP_TOKENS:
        elements = tokens * spec.hidden_size
        graph, eager, nccl = (count * price_ms(curves, b, parallelism.tp, elements)
                              for b in ("vllm_graph", "vllm_eager", "vidur_nccl"))
        mode = "graph" if tokens <= GRAPH_MAX_TOKENS else "eager in vLLM"
        lines.append(f"    {tokens:>5} tokens ({mode:>13}): {graph:7.3f} / {eager:7.3f} / {eager - graph:+7.3f}"
                     f" / {nccl:7.3f}")
    return lines


def all_gather_lines(curves, model: str, tp: int) -> list[str]:
    spec = PRESETS[model]
    lines = ["  logits all-gather per decode step, at most (an all-reduce of the gathered logits, graph):"]
    for seqs in DECODE_SEQS:
        bound = price_ms(curves, "vllm_graph", tp, seqs * spec.vocab_size)
        lines.append(f"    {seqs:>3} sequences x {spec.vocab_size} vocabulary: <= {bound:.3f} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    curves, prompts = all_reduce_curves(), prompt_quantiles()
    setups = [("llama-2-70b", 1), ("mixtral-8x7b", 1), ("mixtral-8x7b", None)]   # None: --ep = --tp
    for tp in args.tp:
        print(f"TP {tp}")
        print("\n".join(host_lines(tp, prompts)))
        for model, ep in setups:
            parallelism = Parallelism(tp, tp if ep is None else ep)
            print(f" {model} (tp {parallelism.tp}, ep {parallelism.ep})")
            print("\n".join(all_reduce_lines(curves, model, parallelism)))
            if ep is not None:
                print("\n".join(all_gather_lines(curves, model, tp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
