"""The issue's uncalibrated vLLM prediction: Qwen3-14B on the H100 tables composed from AIConfigurator's
kernels (../shared/data/profiles/aiconfigurator/h100_sxm), the vllm scheduler with an 8,192-token
budget, Poisson arrivals at 2 / 4 / 6 / 8 req/s for 600 s, 1,024 prompt and 128 output tokens. Each load
is simulated with the kernel tables alone (`--host-defaults none`) and with `--host-defaults vllm` (the
published host and front-end terms of experiments/data/serving_defaults.json, which the vllm scheduler
adds to kernel tables by default); no term is fitted to any run.

Printed per load: TPOT P50/P90, TTFT P50/P90 and E2E P50 of both. With `--bench RATE=FILE` (a real
`vllm bench serve --save-result --save-detailed` JSON at that rate, repeatable), that run is imported
and `stepcal validate` gives the errors of both predictions against it instead: the issue's target is
TPOT within 8% and TTFT P50 within 15%.

Usage: .venv/bin/python bench/bench_vllm_uncalibrated.py [--work DIR] [--bench 2=run2.json ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_calibration import DURATION_S, RATES, SETTINGS, cli, errors, tables

METRICS = (("tpot_ms", "p50"), ("tpot_ms", "p90"), ("ttft_ms", "p50"), ("ttft_ms", "p90"), ("e2e_ms", "p50"))
# each arm names its terms: the default (auto) would give the kernel arm vLLM's terms too
ARMS = {"kernels": ["--host-defaults", "none"], "vllm defaults": ["--host-defaults", "vllm"]}


def predicted(base_dir: Path, rate: float, out: Path, extra: list[str]) -> dict:
    trace = (f"poisson:rate={rate:g},n={int(rate * DURATION_S)},prompt=uniform:1024:1024,"
             f"output=uniform:128:128,seed={int(rate)}")
    if not (out / "summary.json").exists():
        cli("simulate", "--trace", trace, "--step-model", str(base_dir), *SETTINGS, *extra, "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    return {key: summary[key[0]][key[1]] for key in METRICS}


def validated(base_dir: Path, bench: Path, work: Path, extra: list[str]) -> dict:
    run = work / "run"
    if not run.exists():
        cli("import", "vllm-bench", str(bench), "--model-spec", "qwen3-14b", *SETTINGS, "--out", str(run))
    return errors(run, base_dir, work / ("validate_defaults" if extra else "validate_kernels"), *extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None, help="keep the tables and simulations here")
    parser.add_argument("--bench", action="append", default=[], metavar="RATE=FILE",
                        help="a real vllm bench JSON at RATE req/s, to validate against (repeatable)")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if any("=" not in item for item in args.bench):
        parser.error("--bench takes RATE=FILE, e.g. --bench 2=run_2rps.json")
    loads = [(float(r), Path(f)) for r, f in (item.split("=", 1) for item in args.bench)]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_vllm_uncal_"))
    base_dir = tables(work)
    header = " | ".join(f"{m.split('_')[0].upper()} {s}" for m, s in METRICS)
    print(f"tables {base_dir}\n\n| load | arm | {header} |\n" + "|---" * (len(METRICS) + 2) + "|")
    for rate, bench in loads or [(rate, None) for rate in RATES]:
        for arm, extra in ARMS.items():
            if bench is not None:
                cells = validated(base_dir, bench, work / f"real_{rate:g}", extra)
                shown = [f"{100 * cells[key]:+.1f}%" for key in METRICS]
            else:
                cells = predicted(base_dir, rate, work / f"{arm.split()[0]}_{rate:g}", extra)
                shown = [f"{cells[key]:.2f} ms" for key in METRICS]
            print(f"| {rate:g} req/s | {arm} | " + " | ".join(shown) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
