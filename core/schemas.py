"""Column sets of the files that pass between stages (docs/design.md, data contracts).

Kept here, in the bottom layer, so that every package can name the same columns without
importing torch or scikit-learn.
"""
from stepcal import __version__
from stepcal.core.batch import FEATURE_NAMES

SCHEMA_VERSION = 1
TOOL_VERSION = __version__   # written into every file's provenance

# 1. Profile table (profiler -> costmodel): one row per measured point.
PROFILE_SHAPE_COLUMNS = ("m", "n", "k", "q_lens", "kv_lens") + FEATURE_NAMES
PROFILE_TIMING_COLUMNS = ("time_ms", "time_ms_p10", "time_ms_p90", "repeats")
PROFILE_COLUMNS = (
    ("point_key", "op", "name")            # name: sub-operation, e.g. "qkv_proj" for op "gemm"
    + PROFILE_SHAPE_COLUMNS
    + ("num_heads", "num_kv_heads", "head_dim")  # attention geometry, for featurising
    # mixture-of-experts geometry of op "moe" (width: hidden size; tp, ep: the layer's split)
    + ("width", "expert_ffn_size", "num_experts", "experts_per_token", "tp", "ep")
    + PROFILE_TIMING_COLUMNS
    + ("status", "error")                  # status "ok" or "failed"; error: the reason
    + ("device", "device_name", "dtype", "model_spec", "num_threads", "torch_version",
       "tool_version", "schema_version", "measured_at")
)

# 4. Request log (simulator and engine).
REQUEST_LOG_COLUMNS = ("request_id", "replica", "arrival_s", "first_token_s", "finish_s",
                       "num_prompt_tokens", "num_output_tokens", "ttft_ms", "tpot_ms", "e2e_ms",
                       "num_preemptions")

# 5. Step log (simulator and engine); the engine adds host_ms and device_ms.
STEP_LOG_COLUMNS = (("replica", "step", "start_s", "duration_ms") + FEATURE_NAMES
                    + ("request_ids", "q_lens", "kv_lens"))
