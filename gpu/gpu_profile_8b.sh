#!/usr/bin/env bash
# Profile an 8B-class model (llama-3-8b shapes, bf16) on the quick grid on one GPU.
#
# Run from the repository root of a checkout on a CUDA machine where stepcal is installed:
#   python3 -m venv .venv
#   .venv/bin/pip install torch               # a CUDA build that matches the driver
#   .venv/bin/pip install -e '.[torch]'       # or '.[all]'
#   bash gpu/gpu_profile_8b.sh
#
# It runs the GPU unit tests first (at most 2 minutes), then the sweep (--max-minutes 6 stops it
# cleanly and leaves it resumable; `timeout` 30 s later is the backstop), about 8 minutes in all.
# The results folder ($OUT, default runs/gpu-profile-8b) gets:
#   profile.parquet, meta.json   the profile (merged from parts if the sweep was cut short)
#   profile.log, gpu-tests.log, nvidia-smi.txt
# The sweep itself stays in $WORK; running again with the same WORK measures only missing points.
#
# Environment: OUT (results folder), WORK (default $TMPDIR/stepcal-gpu-profile), MODEL_SPEC
# (llama-3-8b), GRID (quick; full for a campaign), MAX_MINUTES (6), DEVICE (cuda), DTYPE (bfloat16),
# SKIP_TESTS=1, PYTHON (default .venv/bin/python, else python3).
# Dry run on a machine without a GPU:
#   DEVICE=cpu DTYPE=float32 MODEL_SPEC=tiny MAX_MINUTES=1 SKIP_TESTS=1 bash gpu/gpu_profile_8b.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
MODEL_SPEC="${MODEL_SPEC:-llama-3-8b}"
GRID="${GRID:-quick}"
MAX_MINUTES="${MAX_MINUTES:-6}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bfloat16}"
RESULTS="${OUT:-runs/gpu-profile-8b}"
WORK="${WORK:-${TMPDIR:-/tmp}/stepcal-gpu-profile}"   # the resumable sweep (its parts files stay here)
require_device "$DEVICE"
mkdir -p "$RESULTS"

gpu_record "$RESULTS/nvidia-smi.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" | tee -a "$RESULTS/nvidia-smi.txt"

if [ "${SKIP_TESTS:-0}" != "1" ]; then
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/profiler/test_profiler_gpu.py \
        > "$RESULTS/gpu-tests.log" 2>&1
    echo "gpu tests: exit $? ($(tail -n 1 "$RESULTS/gpu-tests.log"))"
fi

start=$(date +%s)
timeout $(( MAX_MINUTES * 60 + 30 )) "$PY" -m stepcal profile \
    --model-spec "$MODEL_SPEC" --device "$DEVICE" --dtype "$DTYPE" --grid "$GRID" \
    --max-minutes "$MAX_MINUTES" --no-progress --out "$WORK" > "$RESULTS/profile.log" 2>&1
status=$?
echo "profile: exit $status after $(( $(date +%s) - start )) s"
tail -n 3 "$RESULTS/profile.log"

if [ -f "$WORK/profile.parquet" ] && [ -z "$(ls "$WORK/parts" 2>/dev/null)" ]; then
    cp "$WORK/profile.parquet" "$WORK/meta.json" "$RESULTS/"
else
    # Cut short by the backstop: join what the parts hold (merge reads parts too).
    "$PY" -m stepcal profile merge "$WORK" --out "$RESULTS" >> "$RESULTS/profile.log" 2>&1
fi
"$PY" - "$RESULTS/profile.parquet" <<'EOF'
import sys

import pandas as pd

frame = pd.read_parquet(sys.argv[1])
print(frame.groupby(["op", "status"]).size().to_string())
gemm = frame[(frame["op"] == "gemm") & (frame["status"] == "ok")]
for name, group in gemm.groupby("name"):
    row = group.sort_values("m").iloc[[0, -1]]
    print(name, [(int(r.m), round(float(r.time_ms), 4)) for r in row.itertuples()])
EOF
echo "results in $RESULTS"
exit $status
