"""Runs AIConfigurator on stepcal's exports: `stepcal tables export --format aiconfigurator`
of four fits, each estimated by AIConfigurator itself for one fixed deployment, beside stepcal's own
simulation of it.

  (a) AIConfigurator's shared H100 tables, fitted (Llama-3.1-8B) and exported twice: as exported
      (the profile's time at its measured shapes) and with --aic-predict-all (every time from the
      fit): a round trip, compared with AIConfigurator's estimate on its own database (the shared
      tables under its packaged h100_sxm.yaml). Target: TTFT and TPOT within 3%.
  (b) Vidur's A100 Llama-3-8B mlp.csv plus AIConfigurator's A100 attention tables, fitted and exported.
      AIConfigurator on its own A100 tables is printed beside it (a reference, not a target).
  (c) LLMServingSim's RTX PRO 6000 Llama-3.1-8B bundle, fitted and exported.
  (moe) AIConfigurator's shared H100 tables fitted for Qwen3-30B-A3B (128 experts, top 8) with its
      moe_perf table: the round trip of (a) for a mixture of experts (experts on one GPU).

The deployment: Llama-3.1-8B (Qwen3-30B-A3B for moe), TP 1, vLLM, ISL 1024, OSL 128, batch 16, in AIConfigurator's static
mode (one batch, prefilled together, then decoded: stepcal simulates the same with its static
scheduler), its aggregated mode, and disaggregated (1 prefill worker of batch 1, 1 decode worker of
batch 16). AIConfigurator runs from its own virtualenv (--aic-venv), made here when absent:
pip `aisimulate==0.13.0`, else `aiconfigurator==0.12.0`; it is no dependency of stepcal.

Usage: .venv/bin/python bench/bench_aiconfigurator_export.py [--aic-venv DIR] [--work DIR] [--cases a b c moe]
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
from dataclasses import dataclass
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


def estimate(aic: Path, systems: Path, system: str, model_dir: Path, mode: str, extra=()) -> dict:
    """AIConfigurator's TTFT and TPOT (ms) for the deployment, or the error it stopped with."""
    done = subprocess.run([str(aic), "cli", "estimate", "--systems-paths", str(systems), "--system", system,
                           "--backend", "vllm", "--perf-db-version", "0.14.0", "--model-path", str(model_dir),
                           "--isl", str(ISL), "--osl", str(OSL), *MODES[mode], *_moe(mode, extra)],
                          capture_output=True, text=True)
    out = done.stdout + done.stderr
    found = {k: re.search(rf"{k}:\s+([0-9.,]+) ms", out) for k in ("TTFT", "TPOT")}
    if not all(found.values()):
        errors = [line for line in out.splitlines() if "rror" in line]
        return {"error": (errors[-1] if errors else out[-200:]).strip()}
    return {k.lower() + "_ms": float(m.group(1).replace(",", "")) for k, m in found.items()}


def _moe(mode: str, extra) -> list[str]:
    """A MoE model's expert-parallel flags, per worker in disaggregated mode."""
    if mode != "disagg" or not extra:
        return list(extra)
    return [f"--{side}-{flag[2:]}" if flag.startswith("--") else flag for side in ("prefill", "decode")
            for flag in extra]


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


def fit(name: str, work: Path, spec: str, *argv: str) -> Path:
    out = work / f"fit_{name}"
    if not (out / "meta.json").exists():
        stepcal("fit", *argv, "--model-spec", spec, "--no-mlflow", "--out", str(out))
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


def own_database(aic: Path, work: Path, system: str) -> Path:
    """AIConfigurator's packaged <system>.yaml over the shared tables of that system: 'its own database'."""
    systems = work / f"aic_own_{system}"
    if not systems.exists():
        (systems / "data").mkdir(parents=True)
        shutil.copy(packaged(aic) / "systems" / f"{system}.yaml", systems / f"{system}.yaml")
        (systems / "data" / system).symlink_to(AIC / system)
    return systems


@dataclass(frozen=True)
class Case:
    label: str
    fit_args: tuple[str, ...]
    own: str | None = None                # AIConfigurator's system whose shared tables are the reference
    spec: str = MODEL_SPEC
    aic_config: str = AIC_MODEL_CONFIG
    extra: tuple[str, ...] = ()           # more estimate flags (a MoE model's expert parallelism)
    round_trip: bool = False              # also export with --aic-predict-all; the reference is a target


MOE_FLAGS = ("--moe-tp-size", "1", "--moe-ep-size", "1")
CASES = {
    "a": Case("a: AIConfigurator H100 tables, Llama-3.1-8B", ("--profile", str(AIC / "h100_sxm")), "h100_sxm",
              round_trip=True),
    "b": Case("b: Vidur A100 Llama-3-8B", ("--profile", str(VIDUR_MLP), str(AIC / "a100_sxm" / "attention")),
              "a100_sxm"),
    "c": Case("c: LLMServingSim RTX PRO 6000 Llama-3.1-8B",
              ("--format", "llmservingsim", "--profile", str(LSS_BUNDLE))),
    "moe": Case("moe: AIConfigurator H100 tables, Qwen3-30B-A3B", ("--profile", str(AIC / "h100_sxm")), "h100_sxm",
                spec="qwen3-30b-a3b", aic_config="Qwen--Qwen3-30B-A3B_config.json", extra=MOE_FLAGS,
                round_trip=True),
}


def run_case(name: str, aic: Path, work: Path) -> list[tuple]:
    case = CASES[name]
    model_dir = work / f"model_{name}"
    model_dir.mkdir(exist_ok=True)
    shutil.copy(packaged(aic) / "model_configs" / case.aic_config, model_dir / "config.json")
    tables = fit(name, work, case.spec, *case.fit_args)
    exports = {f"{name}: as exported": export(tables, work / f"exp_{name}")}
    if case.round_trip:
        exports[f"{name}: --aic-predict-all"] = export(tables, work / f"exp_{name}_all", "--aic-predict-all")
    rows = []
    if case.own:
        own = own_database(aic, work, case.own)
        rows.append((f"{name}: AIConfigurator's own", None,
                     {m: estimate(aic, own, case.own, model_dir, m, case.extra) for m in MODES}))
    for label, ex in exports.items():
        results = ({"refused": ex["refused"]} if "refused" in ex else
                   {m: estimate(aic, ex["dir"], ex["system"], model_dir, m, case.extra) for m in MODES})
        rows.append((label, ex, results))
    rows.append((f"{name}: stepcal simulate", None, {"static": simulate(tables, work)}))
    print(case.label + (" (target: as exported and --aic-predict-all within 3% of AIConfigurator's own)"
                        if case.round_trip else ""))
    return rows


def report(rows: list[tuple], target: bool) -> None:
    for label, ex, results in rows:
        if ex and "refused" not in ex:
            print(f"{label}: export {ex['bytes'] / 1e6:.2f} MB in {ex['seconds']:.1f} s ({ex['line']})")
        for mode, r in results.items():
            if mode == "refused":
                print(f"  {label}: refused: {r}")
            elif "error" in r:
                print(f"  {label:34s} {mode:7s} error: {r['error'][:160]}")
            else:
                print(f"  {label:34s} {mode:7s} TTFT {r['ttft_ms']:9.3f} ms   TPOT {r['tpot_ms']:7.3f} ms")
    own = next((r for label, _, r in rows if "own" in label), None)
    for label, _, results in rows:
        if own is None or "own" in label or "refused" in results:
            continue
        for mode, r in results.items():
            if "error" not in r and "error" not in own.get(mode, {"error": 1}):
                diffs = [100 * (r[k] - own[mode][k]) / own[mode][k] for k in ("ttft_ms", "tpot_ms")]
                within = "within 3%" if max(map(abs, diffs)) <= 3 else "OUTSIDE 3%"
                verdict = f"  ({within})" if target and "stepcal" not in label else ""
                print(f"  {label} vs AIConfigurator's own, {mode}: TTFT {diffs[0]:+.2f}%  TPOT {diffs[1]:+.2f}%{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aic-venv", type=Path, default=Path(tempfile.gettempdir()) / "stepcal-aisim")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "stepcal-aic-bench")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    aic, package = aic_venv(args.aic_venv)
    print(f"AIConfigurator from pip {package}")
    args.work.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        report(run_case(case, aic, args.work), CASES[case].round_trip)


if __name__ == "__main__":
    main()
