#!/usr/bin/env bash
# Serve a 500-request Poisson trace of an 8B-class model (llama-3-8b, bf16) under sarathi on one GPU
# with stepcal's engine, and print throughput, TPOT and TTFT percentiles and the device's share of
# step time (3-5 minutes on an H200).
#
# Run from the repository root of a checkout on a CUDA machine where stepcal is installed:
#   python3 -m venv .venv
#   .venv/bin/pip install torch               # a CUDA build that matches the driver
#   .venv/bin/pip install -e '.[torch]'       # or '.[all]'
#   bash gpu/gpu_engine_8b.sh
#
# The results folder ($OUT, default runs/gpu-engine-8b) gets sarathi/ (the measured run),
# measure.log and nvidia_smi.csv.
#
# The KV cache is sized for the GPU's memory: DEVICE_MEMORY_GB if set, else the first GPU's total
# memory from nvidia-smi (else from torch), in GiB (what stepcal's --device-memory-gb counts);
# without either the flag is left out and the KV cache is unlimited.
# Environment: OUT (results folder), DEVICE_MEMORY_GB, MODEL_SPEC (llama-3-8b), DEVICE (cuda),
# DTYPE (bfloat16), TRACE (the trace spec below), LIMIT_S (420, a time limit on the run),
# PYTHON (default .venv/bin/python, else python3).
# Dry run on a machine without a GPU:
#   DEVICE=cpu DTYPE=float32 MODEL_SPEC=tiny \
#   TRACE=poisson:rate=8,n=40,prompt=lognormal:128:0.8,output=lognormal:32:0.8,seed=0 \
#   bash gpu/gpu_engine_8b.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT="${OUT:-runs/gpu-engine-8b}"
MODEL_SPEC="${MODEL_SPEC:-llama-3-8b}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bfloat16}"
TRACE="${TRACE:-poisson:rate=8,n=500,prompt=lognormal:1024:0.8,output=lognormal:256:0.8,seed=0}"
LIMIT_S="${LIMIT_S:-420}"
require_device "$DEVICE"
mkdir -p "$OUT"

if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.csv" \
        || echo "note: nvidia-smi failed"
else
    echo "note: nvidia-smi not found; no GPU record in $OUT/nvidia_smi.csv" | tee "$OUT/nvidia_smi.csv"
fi

MEMORY_GB="${DEVICE_MEMORY_GB:-}"
if [ -z "$MEMORY_GB" ] && [[ "$DEVICE" == cuda* ]]; then
    if command -v nvidia-smi > /dev/null 2>&1; then   # MiB -> GiB, first GPU
        MEMORY_GB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1 \
                    | awk '{ printf "%d", $1 / 1024 }') || MEMORY_GB=""
    else
        MEMORY_GB=$("$PY" -c "import torch; print(torch.cuda.get_device_properties('$DEVICE').total_memory // 2**30)" 2>/dev/null) \
            || MEMORY_GB=""
    fi
    [[ "$MEMORY_GB" =~ ^[1-9][0-9]*$ ]] || MEMORY_GB=""   # e.g. [N/A]
fi
MEMORY_FLAG=()
if [ -n "$MEMORY_GB" ]; then
    MEMORY_FLAG=(--device-memory-gb "$MEMORY_GB")
    echo "KV cache sized for $MEMORY_GB GiB of device memory"
else
    echo "note: no device memory given (DEVICE_MEMORY_GB) or found; the KV cache is unlimited"
fi

timeout "$LIMIT_S" "$PY" -m stepcal measure --model-spec "$MODEL_SPEC" --device "$DEVICE" --dtype "$DTYPE" \
  --trace "$TRACE" \
  --scheduler sarathi --chunk-size 512 --max-num-seqs 128 \
  ${MEMORY_FLAG[@]+"${MEMORY_FLAG[@]}"} --gpu-memory-utilization 0.85 \
  --out "$OUT/sarathi" 2>&1 | tee "$OUT/measure.log"
"$PY" - "$OUT/sarathi" <<'PY'
import json, sys, pandas as pd
out = sys.argv[1]
s = json.load(open(f"{out}/summary.json"))
steps = pd.read_parquet(f"{out}/repeat_0/steps.parquet")
print(f"throughput {s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:.0f} tok/s; "
      f"TPOT p50 {s['tpot_ms']['p50']:.1f} ms p99 {s['tpot_ms']['p99']:.1f} ms; TTFT p50 {s['ttft_ms']['p50']:.0f} ms; "
      f"device share of step time {steps.device_ms.sum() / steps.duration_ms.sum():.2f}")
PY
echo "results in $OUT"
