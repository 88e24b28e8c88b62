"""The predicted-vs-measured plot of held-out rows (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stepcal.costmodel.fitting import FitResult


def plot_held_out(result: FitResult, path: Path, split: str = "random") -> Path | None:
    import matplotlib  # lazy: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib
    pairs = {t: f.held_out[split] for t, f in result.targets.items() if split in f.held_out}
    if not pairs:
        return None
    fig, ax = plt.subplots(figsize=(6, 6))
    lo, hi = np.inf, 0.0
    for target, (measured, predicted) in pairs.items():
        ax.scatter(measured, predicted, s=6, alpha=0.6, label=target)
        lo, hi = min(lo, measured.min(), predicted.min()), max(hi, measured.max(), predicted.max())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(f"held-out rows, {split} split")
    ax.legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
