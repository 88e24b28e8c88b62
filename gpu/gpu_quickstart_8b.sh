#!/usr/bin/env bash
# The quickstart's validation campaign on one GPU with an 8B-class model in bf16: profile whole
# steps, measure capacity and 30/60/90% loads (two interleaved repeats, continuous and sarathi),
# fit, calibrate, validate, report. It tests the 5% targets where a step is 10-100 ms of device
# time instead of ~2 ms of CPU.
#
# Run from the repository root of a checkout on a CUDA machine where stepcal is installed with its
# ML extras (MLflow, Optuna, scikit-learn):
#   python3 -m venv .venv
#   .venv/bin/pip install torch               # a CUDA build that matches the driver
#   .venv/bin/pip install -e '.[all]'
#   bash gpu/gpu_quickstart_8b.sh
# Where the GPU machine cannot have the ML extras, gpu/gpu_campaign.py measures on it and models
# on another machine.
#
# The results folder ($OUT, default runs/gpu-quickstart-8b) gets headline.json, quickstart.log
# (the headline table is its tail), report/report.md and nvidia-smi.txt; the whole campaign
# (tables, measured runs, validations) is in $WORK, which is deleted first. Its wall time on a GPU
# is an estimate (the engine loops over sequences in Python for attention: ~20-40 ms per 8B decode
# step), so the defaults are small: 60 requests per run under a 520 s limit; raise NUM_REQUESTS
# and LIMIT_S once a first run has shown the time.
#
# Environment: OUT (results folder), WORK (default $TMPDIR/stepcal-gpu-quickstart), NUM_REQUESTS
# (60), PROMPT (lognormal:512:0.8), OUTPUT (lognormal:64:0.8), CHUNK (512), LIMIT_S (520),
# MODEL_SPEC (llama-3-8b), DEVICE (cuda), PYTHON (default .venv/bin/python, else python3).
# Dry run on a machine without a GPU:
#   DEVICE=cpu MODEL_SPEC=tiny PROMPT=lognormal:128:0.8 OUTPUT=lognormal:32:0.8 CHUNK=64 \
#   NUM_REQUESTS=40 bash gpu/gpu_quickstart_8b.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export MLFLOW_DISABLE_TELEMETRY=true
DEVICE="${DEVICE:-cuda}"
MODEL_SPEC="${MODEL_SPEC:-llama-3-8b}"
NUM_REQUESTS="${NUM_REQUESTS:-60}"     # kept small so that a first run fits
PROMPT="${PROMPT:-lognormal:512:0.8}"
OUTPUT="${OUTPUT:-lognormal:64:0.8}"
CHUNK="${CHUNK:-512}"
LIMIT_S="${LIMIT_S:-520}"
RESULTS="${OUT:-runs/gpu-quickstart-8b}"
WORK="${WORK:-${TMPDIR:-/tmp}/stepcal-gpu-quickstart}"   # the whole campaign; its summary is copied to RESULTS
require_device "$DEVICE"
require_modules sklearn optuna mlflow matplotlib
mkdir -p "$RESULTS"
rm -rf "$WORK"

gpu_record "$RESULTS/nvidia-smi.txt"
start=$(date +%s)
# Whole-step profile points only: the tables are whole-step tables fitted on them and on the step
# logs of the calibration load; the per-operator sweep would spend the time on 8B GEMMs.
timeout "$LIMIT_S" "$PY" -m stepcal quickstart --device "$DEVICE" --model-spec "$MODEL_SPEC" \
    --num-requests "$NUM_REQUESTS" --prompt "$PROMPT" --output "$OUTPUT" --chunk-size "$CHUNK" \
    --profile-ops step,overhead --out "$WORK" > "$RESULTS/quickstart.log" 2>&1
status=$?
echo "quickstart: exit $status after $(( $(date +%s) - start )) s"
for f in headline.json report/report.md; do
    [ -f "$WORK/$f" ] && mkdir -p "$RESULTS/$(dirname "$f")" && cp "$WORK/$f" "$RESULTS/$f"
done
grep -A 40 "^capacity" "$RESULTS/quickstart.log" || tail -n 20 "$RESULTS/quickstart.log"
echo "results in $RESULTS (the whole campaign in $WORK)"
exit $status
