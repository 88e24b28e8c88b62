"""A projection's GEMM inside the engine's decode step against the profiler's `gemm` op of the same
shape, on the CPU: why composed kernel tables price big decode batches low there, and why a host term
calibrated at a light load cannot make it up.

    .venv/bin/python studies/gemm_in_step.py [--model-spec tiny] [--batches 1 4 16 32 64] [--kv 256]
        [--steps 40]

For each batch of decodes (each sequence at --kv cached tokens, held as the engine holds it:
profiler.engine.paged.held_batch), the model's step runs --steps times, every nn.Linear timed by
forward hooks (the time between its pre- and post-hook: its F.linear alone). The same shapes are then
timed as the profiler's `gemm` op times them (profiler.ops, inputs rotated past twice a core's L2, as
`stepcal profile` does on the CPU), interleaved with the steps in one process. Printed per batch and
projection: the median µs of each and their ratio, with the K/V bytes the step reads (per layer, for
every sequence) beside it: between two uses of a weight the step streams those through the caches.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict


def hook_timers(model) -> tuple[dict, list]:
    """Forward hooks on every nn.Linear of `model`: (name -> list of µs, appended per call; the hooks'
    handles, to remove them)."""
    import torch.nn as nn
    times: dict = defaultdict(list)
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        key = name.rsplit(".", 1)[-1]   # qkv_proj, o_proj, gate_up_proj, down_proj, lm_head: layers pooled
        started = []
        handles.append(module.register_forward_pre_hook(
            lambda _m, _x, started=started: started.append(time.perf_counter())))
        handles.append(module.register_forward_hook(
            lambda m, _x, _y, key=key, started=started:
            times[(key, m.in_features, m.out_features)].append((time.perf_counter() - started.pop()) * 1e6)))
    return times, handles


def gemm_op_us(ctx, m: int, n: int, k: int, calls: int) -> float:
    """The profiler's gemm op at (m, n, k), timed in a loop: median µs per call."""
    from stepcal.profiler.ops import build_kernel
    from stepcal.profiler.point import Point
    kernel = build_kernel(Point("gemm", "study", m=m, n=n, k=k), ctx)
    samples = []
    for i in range(calls + 10):
        t = time.perf_counter()
        kernel.run(i)
        samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples[10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-spec", default="tiny")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument("--kv", type=int, default=256, help="cached tokens of each decode")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    import torch

    from stepcal.core.model_files import load_model_spec
    from stepcal.profiler.engine.measure import warm_up
    from stepcal.profiler.engine.paged import held_batch
    from stepcal.profiler.model import build_model
    from stepcal.profiler.op_context import OpContext
    from stepcal.profiler.sweep import _rotate_bytes
    torch.set_num_threads(1)
    spec = load_model_spec(args.model_spec)
    model = build_model(spec, device="cpu", dtype="float32", seed=0)
    warm_up(model)
    ctx = OpContext(spec, "cpu", "float32", rotate_bytes=_rotate_bytes("cpu"))
    generator = torch.Generator().manual_seed(0)
    kv_mb = spec.num_kv_heads * spec.head_dim * 2 * 4 / 2**20   # K and V of one token of one layer, fp32
    print(f"{args.model_spec}: decodes at {args.kv} cached tokens; gemm op inputs rotated past "
          f"{ctx.rotate_bytes / 2**20:.0f} MiB")
    print(f"{'batch':>5} {'KV/layer':>9}  {'projection':22s} {'in step':>9} {'gemm op':>9} {'ratio':>6}")
    for b in args.batches:
        inputs, copies = held_batch(model, [1] * b, [args.kv] * b, 16, generator)
        times, handles = hook_timers(model)
        with torch.inference_mode():
            for _ in range(args.steps):
                for copy in copies:
                    copy.length = args.kv   # every step decodes the same token again
                model.run_step(inputs).argmax(dim=-1).tolist()
        for (name, k, n), samples in times.items():
            m = b   # every row of a decode step goes through each projection (the LM head: the emitting rows)
            in_step = statistics.median(samples[len(samples) // 4:])   # the first quarter warms up
            op = gemm_op_us(ctx, m, n, k, 3 * args.steps)
            print(f"{b:5d} {b * args.kv * kv_mb:7.1f}MB  {name:12s}{m:3d}x{k}x{n:<5d} {in_step:8.1f}u "
                  f"{op:8.1f}u {in_step / op:6.2f}")
        for handle in handles:   # the next batch's hooks only
            handle.remove()


if __name__ == "__main__":
    main()
