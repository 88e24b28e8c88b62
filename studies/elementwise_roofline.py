"""How well a memory roofline predicts element-wise kernels on a device it was not fitted on.

    .venv/bin/python studies/elementwise_roofline.py [--vidur DIR] [--write]

Reads Vidur's measured per-layer operators (../shared/data/profiles/vidur/{a100,h100}/*/*/mlp.csv:
embedding, two RMSNorms, RoPE, SiLU-and-multiply, residual add; every model and TP degree there),
fits costmodel.roofline's constants (efficiency, launch_us per class of kernel) on the A100 files
and predicts the H100 files with the H100's datasheet bandwidth, then the reverse. Prints the MAPE
per operator and overall, split into launch-bound (<= 64 tokens) and larger calls; then one pair
of constants for every kernel, for comparison; then the constants fitted on both devices, which
--write stores in costmodel/data/devices.json (what composition ships; a test refits them).

Vidur's "a100" is the A100 80GB SXM (its device config: 80 GB, 312 TFLOPS), its "h100" the H100 SXM.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
VIDUR = REPO_ROOT.parent / "shared" / "data" / "profiles" / "vidur"
SMALL_TOKENS = 64            # at or below: the kernel's floor, not its bytes, sets its time
DEVICE_DIRS = ("a100", "h100")


def vidur_rows(root: Path = VIDUR) -> pd.DataFrame:
    """Fitting rows (costmodel.roofline.measured_rows) of every mlp.csv under root/{a100,h100}."""
    from stepcal.costmodel.devices import device_spec
    from stepcal.costmodel.importers.vidur import import_mlp
    from stepcal.costmodel.roofline import measured_rows
    parts = []
    for directory in DEVICE_DIRS:
        device = device_spec(directory)
        for path in sorted((root / directory).glob("*/*/mlp.csv")):
            records = import_mlp(pd.read_csv(path), str(path.relative_to(root)))
            parts.append(measured_rows(records, device).assign(file=str(path.relative_to(root))))
    if not parts:
        raise SystemExit(f"no mlp.csv under {root}/{{{','.join(DEVICE_DIRS)}}}")
    return pd.concat(parts, ignore_index=True)


def mape(rows: pd.DataFrame) -> float:
    return float((np.abs(rows["predicted_us"] / rows["time_us"] - 1.0)).mean() * 100)


def bias(rows: pd.DataFrame) -> float:
    """Mean signed relative error in %: above zero, the roofline predicts too much."""
    return float((rows["predicted_us"] / rows["time_us"] - 1.0).mean() * 100)


def report(held: pd.DataFrame, title: str) -> None:
    """MAPE per operator and overall, all calls and split at SMALL_TOKENS; bias (mean signed
    error) the same way."""
    print(title)
    print(f"  {'op':<26}{'MAPE %':>8}{'<=64 tok':>10}{'>64 tok':>9}{'bias %':>8}{'<=64':>7}{'>64':>7}{'rows':>7}")
    held = held.reset_index(drop=True)
    small = (held["num_tokens"] <= SMALL_TOKENS).to_numpy()
    for op, index in [*held.groupby("op", sort=True).indices.items(), ("all", np.arange(len(held)))]:
        part, s = held.iloc[index], small[index]
        print(f"  {op:<26}{mape(part):8.1f}{mape(part[s]):10.1f}{mape(part[~s]):9.1f}"
              f"{bias(part):8.1f}{bias(part[s]):7.1f}{bias(part[~s]):7.1f}{len(part):7d}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vidur", type=Path, default=VIDUR, help="Vidur profiles root [../shared/data/profiles/vidur]")
    parser.add_argument("--write", action="store_true", help="store the fitted constants in costmodel/data/devices.json")
    args = parser.parse_args()
    from stepcal.costmodel.roofline import (
        cross_device_predictions,
        fit_class,
        fit_constants,
        fit_shipped_constants,
        predict_us,
    )

    rows = vidur_rows(args.vidur)
    print(f"{len(rows)} element-wise calls from {rows['file'].nunique()} mlp.csv files "
          f"({', '.join(f'{d}: {n}' for d, n in rows.groupby('device').size().items())})\n")
    held = cross_device_predictions(rows)
    for device in sorted(held["device"].unique()):
        others = sorted(set(rows["device"]) - {device})
        fitted = fit_constants(rows[rows["device"] != device])
        print(f"fitted on {', '.join(others)}: " + "; ".join(
            f"{c} eff {k.efficiency:.3f} launch {k.launch_us:.2f} us" for c, k in fitted.items()))
        report(held[held["device"] == device], f"held out: {device}")
        print()
    report(held, "held out, both directions")
    # One pair of constants for every kernel, held out the same way: why the constants are per class.
    single = rows.assign(cls="all")
    parts = [part.assign(predicted_us=predict_us(part, {"all": fit_class(single[single["device"] != device])}))
             for device, part in single.groupby("device")]
    print(f"\none pair for all kernels, held out both directions: MAPE {mape(pd.concat(parts)):.1f}%")

    shipped = fit_shipped_constants(rows)
    print("\nfitted on both devices (what devices.json ships):")
    for cls, k in shipped.items():
        print(f"  {cls:<5} efficiency {k.efficiency:.4f}  launch_us {k.launch_us:.3f}  relative_sd {k.relative_sd:.3f}")
    if args.write:
        write_constants(shipped, sorted(rows["file"].unique()))
    return 0


def write_constants(constants: dict, files: list[str]) -> None:
    path = REPO_ROOT / "costmodel" / "data" / "devices.json"
    document = json.loads(path.read_text())
    document["elementwise_roofline"] = {
        "note": "Per class of element-wise kernel: time = launch_us + bytes / (bandwidth x efficiency), "
                "bytes as costmodel.roofline.bytes_moved counts them; relative_sd is the RMS relative error "
                "predicting one device with constants fitted on the other. Fitted (not tuned) by "
                "`python studies/elementwise_roofline.py --write` on Vidur's median operator times "
                "(microsoft/vidur @7d47513, ../shared/data/profiles/vidur), A100 80GB SXM and H100 SXM "
                "bandwidths from this file.",
        "fitted_on": files,
        "constants": {cls: {"efficiency": round(k.efficiency, 6), "launch_us": round(k.launch_us, 6),
                            "relative_sd": round(k.relative_sd, 6)} for cls, k in constants.items()},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
