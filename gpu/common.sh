# Sourced by the gpu/*.sh scripts; not run on its own. From the repository root of a checkout in
# which stepcal is installed (see docs/gpu.md):
#
#   python3 -m venv .venv
#   .venv/bin/pip install torch                 # a CUDA build that matches the driver
#   .venv/bin/pip install -e '.[all]'           # or '.[torch]' where only the measure side runs
#
# Sets PY: $PYTHON if set, else .venv/bin/python, else python3; and stops with one line when that
# interpreter cannot import stepcal.
export PYTHONUNBUFFERED=1
INSTALL_HINT="python3 -m venv .venv && .venv/bin/pip install -e '.[all]' (or '.[torch]' to measure only), or set PYTHON to an interpreter that has stepcal"

if [ ! -f pyproject.toml ] || [ ! -d gpu ]; then
    echo "error: run $0 from the repository root of a stepcal checkout" >&2
    exit 2
fi
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY=python3
fi
if ! "$PY" -c "import stepcal.experiments.cli" > /dev/null 2>&1; then
    echo "error: $PY cannot import stepcal; install it from the repository root: $INSTALL_HINT" >&2
    exit 2
fi

# require_device DEVICE: torch imports, and a cuda device is one torch can use.
require_device() {
    "$PY" - "$1" <<'EOF' || exit 2
import sys

try:
    import torch
except ImportError:
    sys.exit("error: torch is not installed: pip install -e '.[torch]' with a CUDA build of torch")
device = sys.argv[1]
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit(f"error: torch {torch.__version__} sees no CUDA device (a CPU build, or no GPU); "
             "install a CUDA build of torch, or dry-run with DEVICE=cpu DTYPE=float32")
EOF
}

# require_modules MODULE...: the ML extras the model side needs.
require_modules() {
    "$PY" - "$@" <<'EOF' || exit 2
import importlib.util
import sys

missing = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"error: {', '.join(missing)} not installed: pip install -e '.[all]' "
             "(or measure on this machine with gpu/gpu_campaign.py and model on one that has them)")
EOF
}

# gpu_record FILE: nvidia-smi's view of the machine into FILE, or a note where there is none.
gpu_record() {
    if command -v nvidia-smi > /dev/null 2>&1; then
        nvidia-smi > "$1" 2>&1 || echo "note: nvidia-smi failed (see $1)"
    else
        echo "note: nvidia-smi not found; no GPU record in $1" | tee "$1"
    fi
}
