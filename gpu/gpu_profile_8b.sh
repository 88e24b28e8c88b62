#!/usr/bin/env bash
# Profile an 8B-class model (llama-3-8b shapes, bf16) on the quick grid on one GPU, then return
# the profile. Prepared for the device tool of a session that has a GPU:
#
#   run(command="bash gpu/gpu_profile_8b.sh", timeout_s=570)
#
# It runs the GPU unit tests first (at most 2 minutes), then the sweep, well inside 8 minutes
# (--max-minutes 6 stops cleanly, `timeout` 30 s later is the backstop): all within 570 s.
# What comes back under $OUT:
#   profile.parquet, meta.json   the profile (merged from parts if the sweep was cut short)
#   profile.log, gpu-tests.log, nvidia-smi.txt
# Then, here (the shared AIConfigurator table does not travel to the device machine):
#   .venv/bin/python studies/compare_aiconfigurator_gemm.py <files_at>/profile.parquet
#
# Environment knobs: MODEL_SPEC (default llama-3-8b), GRID (quick), MAX_MINUTES (6),
# SKIP_TESTS=1, PYTHON (python3, the interpreter that holds torch there); DEVICE=cpu and
# DTYPE=float32 dry-run the script on a machine without a GPU.
set -uo pipefail
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
MODEL_SPEC="${MODEL_SPEC:-llama-3-8b}"
GRID="${GRID:-quick}"
MAX_MINUTES="${MAX_MINUTES:-6}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bfloat16}"
RESULTS="${OUT:-runs/gpu-8b}"
WORK="${WORK:-${TMPDIR:-/tmp}/stepcal-gpu-profile}"   # parts files stay here; only the joined table goes back
mkdir -p "$RESULTS"

nvidia-smi > "$RESULTS/nvidia-smi.txt" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" | tee -a "$RESULTS/nvidia-smi.txt"

if [ "${SKIP_TESTS:-0}" != "1" ]; then
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/profiler/test_profiler_gpu.py \
        > "$RESULTS/gpu-tests.log" 2>&1
    echo "gpu tests: exit $? ($(tail -n 1 "$RESULTS/gpu-tests.log"))"
fi

start=$(date +%s)
timeout $(( MAX_MINUTES * 60 + 30 )) "$PY" -m stepcal.experiments.cli profile \
    --model-spec "$MODEL_SPEC" --device "$DEVICE" --dtype "$DTYPE" --grid "$GRID" \
    --max-minutes "$MAX_MINUTES" --no-progress --out "$WORK" > "$RESULTS/profile.log" 2>&1
status=$?
echo "profile: exit $status after $(( $(date +%s) - start )) s"
tail -n 3 "$RESULTS/profile.log"

if [ -f "$WORK/profile.parquet" ] && [ -z "$(ls "$WORK/parts" 2>/dev/null)" ]; then
    cp "$WORK/profile.parquet" "$WORK/meta.json" "$RESULTS/"
else
    # Cut short by the backstop: join what the parts hold (merge reads parts too).
    "$PY" -m stepcal.experiments.cli profile merge "$WORK" --out "$RESULTS" >> "$RESULTS/profile.log" 2>&1
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
exit $status
