"""The built-in sweep grids, `quick` and `full`, in the grid file's shape (profiler.grid)."""

# Six passes over the quick grid, pooled: on a shared VM the machine's speed drifts over tens of
# seconds, and two passes left a third of the points' medians outside the other run's [p10, p90];
# six (about 40 s for `tiny` on one CPU core) put 88% inside and every |difference| within the
# p10-p90 width (experiments/profile_noise.py, 2026-11-30).
QUICK = {
    "timing": {"max_point_s": 0.4, "target_rel_precision": 0.02, "min_repeats": 12, "rounds": 6},
    "limits": {"max_tokens": 4096, "max_kv_tokens": 262144},
    "gemm": {"m": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]},
    "attn_prefill": {"num_seqs": [1, 4], "q": [16, 128, 512], "s": [0, 512, 2048],
                     "patterns": ["uniform", "ragged"]},
    "attn_decode": {"num_seqs": [1, 8, 32, 128], "s": [128, 1024, 4096],
                    "patterns": ["uniform", "log_uniform", "one_long"]},
    # Whole steps from one sequence up: the profiled tables ("profiled": step + host) fit T_step on
    # these alone, so small batches at short contexts, where most serving steps are, have points.
    "step": {"batches": [
        {"num_decode": 1, "decode_s": 64},
        {"num_decode": 1, "decode_s": 512},
        {"num_decode": 2, "decode_s": 128},
        {"num_decode": 4, "decode_s": 256},
        {"num_decode": 8, "decode_s": 512},
        {"num_decode": 16, "decode_s": 256},
        {"num_decode": 64, "decode_s": 512},
        {"num_prefill": 1, "q": 16, "s": 0},
        {"num_prefill": 1, "q": 64, "s": 0},
        {"num_prefill": 1, "q": 64, "s": 256},
        {"num_prefill": 1, "q": 64, "s": 0, "num_decode": 4, "decode_s": 128},
        {"num_decode": 32, "decode_s": 1024},
        {"num_decode": 32, "decode_s": 1024, "decode_pattern": "log_uniform"},
        {"num_prefill": 1, "q": 128, "s": 0},
        {"num_prefill": 1, "q": 512, "s": 0},
        {"num_prefill": 1, "q": 256, "s": 512, "num_decode": 16, "decode_s": 1024},
        {"num_prefill": 2, "q": 128, "s": 0, "num_decode": 32, "decode_s": 512},
        {"num_prefill": 1, "q": 64, "s": 1024, "num_decode": 64, "decode_s": 256,
         "decode_pattern": "one_long"},
    ]},
    # Input building alone (the host op's inputs part; fit takes host where both are there).
    "overhead": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256], "s": [512]},
    # Decodes, fresh prefills, and mixed steps of both: host time by sequences and tokens. Short
    # contexts: host time barely depends on them, and each round prefills every decode first.
    "host": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128], "s": [64], "prefill_q": [16, 64, 256, 512],
             "cases": [{"name": "mixed", "q_lens": [256] + [1] * 16, "kv_lens": [0] + [64] * 16},
                       {"name": "mixed", "q_lens": [64, 64] + [1] * 4, "kv_lens": [0, 0] + [64] * 4}]},
    # Mixture-of-experts specs only. AIConfigurator's vLLM tables hold balanced, power_law_1.01
    # and power_law_1.2 (full takes all three), and every num_tokens of full's list.
    "moe": {"num_tokens": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
            "distributions": ["balanced", "power_law_1.01"]},
    # The step's work besides GEMMs and attention (norms, RoPE, activation, residual adds,
    # embedding; final norm and sampling, KV stores): on the CPU, with a small model, about half
    # of a decode step, which kernel tables without it miss.
    # Nine sizes each: fit needs eight rows per operator; dense where serving steps are.
    "elementwise": {"num_tokens": [1, 4, 16, 32, 64, 128, 256, 1024, 4096],
                    "num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256]},
    # Whole steps as serving forms them (profiler.serve): the profiled tables' step and host fits take
    # them beside the held points above, which alone priced the quickstart's runs 6-9% low.
    "serve": [{"schedulers": ["continuous", "sarathi:64", "vllm"], "concurrency": [1, 2, 4, 8, 16, 32, 64],
               "requests_per_seq": 2, "min_requests": 8, "prompt": [16, 1024], "output": [4, 128], "rounds": 1},
              # Continuous batching's big prefill steps hold a burst's prompts: ~250 tokens each from
              # the family above, 100-190 in the default trace's bursts, 200-560 in a prefill-heavy
              # one. Families of short and of long prompts give steps of many short prompts and of
              # few long ones, so the fit need not read one prompt mix off a step's size: profiled
              # cells 263 -> 279 of 360 over ten quickstarts (qs30-33, none fewer), 7 s a pass.
              {"schedulers": ["continuous"], "concurrency": [16, 32, 64], "prompt": [16, 256], "output": [4, 128]},
              {"schedulers": ["continuous"], "concurrency": [16, 32, 64], "prompt": [256, 1024], "output": [4, 128]},
              # Bursts at 90% load keep 65-256 decodes in flight, beyond every family above. Fitted
              # without them (the slope at 64 extrapolated), those steps' measured/predicted time
              # fell 2-10 points below that of the same runs' 33-64-decode steps; with them, within
              # 1 point (two bursty quickstarts refitted both ways; with a Poisson one, profiled cells
              # 24, 32, 22 -> 25, 31, 25 of 36). Short prompts keep the pass at about 10 s.
              {"schedulers": ["continuous"], "concurrency": [128, 256], "prompt": [16, 256], "output": [4, 128]}],
}

_FULL_M = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384,
           448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120,
           6144, 7168, 8192, 10240, 12288, 14336, 16384]

FULL = {
    "timing": {"max_point_s": 2.0, "target_rel_precision": 0.01, "min_repeats": 10, "rounds": 2},
    "limits": {"max_tokens": 16384, "max_kv_tokens": 2097152},
    "gemm": {"m": _FULL_M},
    "attn_prefill": {"num_seqs": [1, 2, 4, 8], "q": [16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                     "s": [0, 256, 1024, 4096, 16384], "patterns": ["uniform", "ragged"]},
    "attn_decode": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
                    "s": [64, 256, 1024, 4096, 16384, 32768],
                    "patterns": ["uniform", "log_uniform", "one_long"]},
    "step": {"batches": [
        *({"num_decode": b, "decode_s": s} for b in (1, 4, 16, 64, 256) for s in (256, 2048, 8192)),
        *({"num_decode": b, "decode_s": 4096, "decode_pattern": p}
          for b in (16, 64, 256) for p in ("log_uniform", "one_long")),
        *({"num_prefill": 1, "q": q, "s": s} for q in (64, 256, 1024, 4096) for s in (0, 2048)),
        *({"num_prefill": p, "q": q, "s": 0, "num_decode": d, "decode_s": 2048}
          for p in (1, 2) for q in (256, 1024) for d in (16, 64, 128)),
    ]},
    "overhead": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "s": [512, 4096]},
    "host": {"num_seqs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "s": [512, 4096],
             "prefill_q": [16, 64, 256, 1024, 4096],
             "cases": [{"name": "mixed", "q_lens": [q] + [1] * d, "kv_lens": [0] + [2048] * d}
                       for q in (256, 1024) for d in (16, 64, 128)]},
    "moe": {"num_tokens": _FULL_M, "distributions": ["balanced", "power_law_1.01", "power_law_1.2"]},
    "elementwise": {"num_tokens": [2 ** i for i in range(15)], "num_seqs": [2 ** i for i in range(10)]},
    "serve": {"schedulers": ["continuous", "sarathi:512", "vllm"], "concurrency": [1, 2, 4, 8, 16, 32, 64, 128, 256],
              "requests_per_seq": 2, "min_requests": 8, "prompt": [16, 4096], "output": [4, 512], "rounds": 2},
}

BUILT_IN = {"quick": QUICK, "full": FULL}
