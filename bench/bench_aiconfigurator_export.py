"""Runs AIConfigurator on stepcal's exports (issue 55): `stepcal tables export --format aiconfigurator`
of three fits, each estimated by AIConfigurator itself for one fixed deployment, beside stepcal's own
simulation of it.

  (a) AIConfigurator's shared H100 tables, fitted (Llama-3.1-8B) and exported twice: as exported
      (the profile's time at its measured shapes) and with --aic-predict-all (every time from the
      fit): a round trip, compared with AIConfigurator's estimate on its own database (the shared
      tables under its packaged h100_sxm.yaml). Target: TTFT and TPOT within 3%.
  (b) Vidur's A100 Llama-3-8B mlp.csv plus AIConfigurator's A100 attention tables, fitted and exported.
  (c) LLMServingSim's RTX PRO 6000 Llama-3.1-8B bundle, fitted and exported.

The deployment: Llama-3.1-8B, TP 1, vLLM, ISL 1024, OSL 128, batch 16, in AIConfigurator's static
mode (one batch, prefilled together, then decoded: stepcal simulates the same with its static
scheduler), its aggregated mode, and disaggregated (1 prefill worker of batch 1, 1 decode worker of
batch 16). AIConfigurator runs from its own virtualenv (--aic-venv), made here when absent:
pip `aisimulate==0.13.0`, else `aiconfigurator==0.12.0`; it is no dependency of stepcal.

Usage: .venv/bin/python bench/bench_aiconfigurator_export.py [--aic-venv DIR] [--work DIR] [--cases a b c]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
AIC = SHARED / "profiles" / "aiconfigurator"
# Our preset of Llama-3(.1)-8B's shape; AIConfigurator reads the model from its packaged HF config.
MODEL_SPEC = "llama-3-8b"
AIC_MODEL_CONFIG = "meta-llama--Meta-Llama-3.1-8B_config.json"
LSS_BUNDLE = SHARED / "profiles" / "llmservingsim" / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16"
VIDUR_MLP = SHARED / "profiles" / "vidur" / "a100" / "meta-llama" / "Meta-Llama-3-8B" / "mlp.csv"
ISL, OSL, BATCH, TP = 1024, 128, 16, 1
PACKAGES = ("aisimulate==0.13.0", "aiconfigurator==0.12.0")
MODES = {"static": ["--estimate-mode", "static", "--batch-size", str(BATCH), "--tp-size", str(TP)],
         "agg": ["--estimate-mode", "agg", "--batch-size", str(BATCH), "--tp-size", str(TP)],
         "disagg": ["--estimate-mode", "disagg", "--prefill-batch-size", "1", "--decode-batch-size", str(BATCH),
                    "--prefill-tp-size", str(TP), "--decode-tp-size", str(TP), "--prefill-num-workers", "1",
                    "--decode-num-workers", "1"]}


def aic_venv(venv: Path) -> tuple[Path, str]:
    """AIConfigurator's command in its own virtualenv, and the package that provided it."""
    marker = venv / "stepcal-installed.txt"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        for package in PACKAGES:
            done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", package], capture_output=True)
            if done.returncode == 0:
                marker.write_text(package)
                break
            print(f"pip install {package} failed: {done.stderr.decode()[-300:].strip()}")
        else:
            raise SystemExit("could not install AIConfigurator (neither " + " nor ".join(PACKAGES) + ")")
    return venv / "bin" / "aiconfigurator", marker.read_text()


def stepcal(*argv: str) -> str:
    done = subprocess.run([str(REPO / ".venv" / "bin" / "stepcal"), *argv], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    if done.returncode != 0:
        raise RuntimeError(f"stepcal {' '.join(argv[:3])}: {done.stderr.strip()[-400:]}")
    return done.stdout


def estimate(aic: Path, systems: Path, system: str, model_dir: Path, mode: str) -> dict:
    """AIConfigurator's TTFT and TPOT (ms) for the deployment, or the error it stopped with."""
    done = subprocess.run([str(aic), "cli", "estimate", "--systems-paths", str(systems), "--system", system,
                           "--backend", "vllm", "--perf-db-version", "0.14.0", "--model-path", str(model_dir),
                           "--isl", str(ISL), "--osl", str(OSL), *MODES[mode]], capture_output=True, text=True)
    out = done.stdout + done.stderr
    found = {k: re.search(rf"{k}:\s+([0-9.,]+) ms", out) for k in ("TTFT", "TPOT")}
    if not all(found.values()):
        errors = [line for line in out.splitlines() if "rror" in line]
        return {"error": (errors[-1] if errors else out[-200:]).strip()}
    return {k.lower() + "_ms": float(m.group(1).replace(",", "")) for k, m in found.items()}


def simulate(tables: Path, work: Path) -> dict:
    """stepcal's simulation of the static deployment: BATCH requests at t=0, one batch."""
    trace = work / "static_trace.csv"
    trace.write_text("arrival_s,num_prompt_tokens,num_output_tokens\n" + f"0.0,{ISL},{OSL}\n" * BATCH)
    out = work / f"sim_{tables.name}"
    shutil.rmtree(out, ignore_errors=True)
    stepcal("simulate", "--trace", str(trace), "--step-model", str(tables), "--scheduler", "static",
            "--max-num-seqs", str(BATCH), "--max-batched-tokens", str(ISL * BATCH), "--quiet", "--out", str(out))
    summary = json.loads((out / "summary.json").read_text())
    return {"ttft_ms": _mean(summary, "ttft"), "tpot_ms": _mean(summary, "tpot")}


def _mean(summary: dict, metric: str) -> float:
    for key in (f"{metric}_ms", metric):
        block = summary.get(key)
        if isinstance(block, dict):
            return float(block.get("mean", block.get("p50")))
    raise KeyError(f"summary.json has no {metric}: {sorted(summary)}")


def fit(name: str, work: Path, *argv: str) -> Path:
    out = work / f"fit_{name}"
    if not (out / "meta.json").exists():
        stepcal("fit", *argv, "--model-spec", MODEL_SPEC, "--no-mlflow", "--out", str(out))
    return out


def export(tables: Path, out: Path, *extra: str) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    try:
        line = stepcal("tables", "export", str(tables), "--format", "aiconfigurator", "--out", str(out), *extra)
    except RuntimeError as exc:
        return {"refused": str(exc)}
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    system = next(out.glob("*.yaml")).stem
    return {"dir": out, "system": system, "seconds": seconds, "bytes": size,
            "line": line.split("; ", 1)[1].strip() if "; " in line else line.strip()}


def packaged(aic: Path) -> Path:
    """The directory of AIConfigurator's core package (its systems/ and model_configs/)."""
    return Path(subprocess.run([str(aic.parent / "python"), "-c", "import aiconfigurator_core, os; "
                                "print(os.path.dirname(aiconfigurator_core.__file__))"],
                               capture_output=True, text=True, check=True).stdout.strip())


def own_database(aic: Path, work: Path) -> Path:
    """AIConfigurator's packaged h100_sxm.yaml over the shared H100 tables: 'its own database'."""
    systems = work / "aic_own"
    if not systems.exists():
        (systems / "data").mkdir(parents=True)
        shutil.copy(packaged(aic) / "systems" / "h100_sxm.yaml", systems / "h100_sxm.yaml")
        (systems / "data" / "h100_sxm").symlink_to(AIC / "h100_sxm")
    return systems


def run_case(case: str, aic: Path, work: Path, model_dir: Path) -> list[tuple]:
    if case == "a":
        tables = fit("aic_h100", work, "--profile", str(AIC / "h100_sxm"))
        exports = {"a: as exported": export(tables, work / "exp_a"),
                   "a: --aic-predict-all": export(tables, work / "exp_a_all", "--aic-predict-all")}
        own = own_database(aic, work)
        rows = [("a: AIConfigurator's own", None, {m: estimate(aic, own, "h100_sxm", model_dir, m) for m in MODES})]
    elif case == "b":
        tables = fit("vidur_a100", work, "--profile", str(VIDUR_MLP), str(AIC / "a100_sxm" / "attention"))
        exports, rows = {"b: Vidur A100 fit": export(tables, work / "exp_b")}, []
    else:
        tables = fit("lss_rtx", work, "--format", "llmservingsim", "--profile", str(LSS_BUNDLE))  # TP 1
        exports, rows = {"c: LLMServingSim RTX PRO 6000 fit": export(tables, work / "exp_c")}, []
    sim = simulate(tables, work)
    for label, ex in exports.items():
        if "refused" in ex:
            rows.append((label, ex, {"refused": ex["refused"]}))
            continue
        rows.append((label, ex, {m: estimate(aic, ex["dir"], ex["system"], model_dir, m) for m in MODES}))
    rows.append((f"{case}: stepcal simulate (static)", None, {"static": sim}))
    return rows


def report(rows: list[tuple]) -> None:
    for label, ex, results in rows:
        if ex and "refused" not in ex:
            print(f"{label}: export {ex['bytes'] / 1e6:.2f} MB in {ex['seconds']:.1f} s ({ex['line']})")
        for mode, r in results.items():
            if mode == "refused":
                print(f"  {label}: refused: {r}")
            elif "error" in r:
                print(f"  {label:42s} {mode:7s} error: {r['error'][:160]}")
            else:
                print(f"  {label:42s} {mode:7s} TTFT {r['ttft_ms']:9.3f} ms   TPOT {r['tpot_ms']:7.3f} ms")
    own = next((r for label, _, r in rows if "own" in label), None)
    for label, _, results in rows:
        if own is None or "own" in label or "refused" in results or not label.startswith("a:"):
            continue
        for mode, r in results.items():
            if "error" not in r and "error" not in own.get(mode, {"error": 1}):
                diffs = [100 * (r[k] - own[mode][k]) / own[mode][k] for k in ("ttft_ms", "tpot_ms")]
                ok = "within" if max(map(abs, diffs)) <= 3 else "OUTSIDE"
                print(f"  {label} vs own, {mode}: TTFT {diffs[0]:+.2f}%  TPOT {diffs[1]:+.2f}%  ({ok} 3%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aic-venv", type=Path, default=Path(tempfile.gettempdir()) / "stepcal-aisim")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "stepcal-aic-bench")
    parser.add_argument("--cases", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    args = parser.parse_args()
    aic, package = aic_venv(args.aic_venv)
    print(f"AIConfigurator from pip {package}")
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = args.work / "llama-3.1-8b"
    model_dir.mkdir(exist_ok=True)
    shutil.copy(packaged(aic) / "model_configs" / AIC_MODEL_CONFIG, model_dir / "config.json")
    for case in args.cases:
        report(run_case(case, aic, args.work, model_dir))


if __name__ == "__main__":
    main()
