#!/usr/bin/env bash
# Prepared device check for issue 4: an 8B-class model in bf16 serves a 500-request trace under
# sarathi on one GPU. Run on the lent machine from the repo root (≈ 3-5 min including setup):
#   bash gpu/gpu_engine_8b.sh   (writes under $OUT, or runs/gpu_engine_8b without it)
set -euo pipefail
OUT="${OUT:-runs/gpu_engine_8b}"
mkdir -p "$OUT"
if [ ! -x .venv/bin/stepcal ]; then
  python3 -m venv .venv && .venv/bin/pip install -q -e '.[torch]' 2>&1 | tail -2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia_smi.csv"
timeout 420 .venv/bin/stepcal measure --model-spec llama-3-8b --device cuda --dtype bfloat16 \
  --trace "poisson:rate=8,n=500,prompt=lognormal:1024:0.8,output=lognormal:256:0.8,seed=0" \
  --scheduler sarathi --chunk-size 512 --max-num-seqs 128 \
  --device-memory-gb 140 --gpu-memory-utilization 0.85 \
  --out "$OUT/sarathi" 2>&1 | tee "$OUT/measure.log"
.venv/bin/python - "$OUT/sarathi" <<'PY'
import json, sys, pandas as pd
out = sys.argv[1]
s = json.load(open(f"{out}/summary.json"))
steps = pd.read_parquet(f"{out}/repeat_0/steps.parquet")
print(f"throughput {s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:.0f} tok/s; "
      f"TPOT p50 {s['tpot_ms']['p50']:.1f} ms p99 {s['tpot_ms']['p99']:.1f} ms; TTFT p50 {s['ttft_ms']['p50']:.0f} ms; "
      f"device share of step time {steps.device_ms.sum() / steps.duration_ms.sum():.2f}")
PY
