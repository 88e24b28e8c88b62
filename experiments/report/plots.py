"""The report's figures, as PNG bytes. matplotlib loads inside each function (Agg, no pyplot state)."""
from __future__ import annotations

import io

import numpy as np

from stepcal.core.batch import StepBatch

LATENCY_METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E latency"))
HEATMAP_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
HEATMAP_KV_LENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
WIDE_RANGE = 50.0     # log axes when max / min of the positive values exceeds this
COLORS = {"measured": "#1f77b4", "simulated": "#d62728"}


def _figure(width_in: float, height_in: float):
    # The object API on an Agg canvas: no pyplot, no global backend state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: loads matplotlib
    from matplotlib.figure import Figure  # lazy: loads matplotlib
    fig = Figure(figsize=(width_in, height_in), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _finite(values) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values[np.isfinite(values)]


def _wide(*arrays) -> bool:
    positive = np.concatenate([a[a > 0] for a in arrays]) if arrays else np.zeros(0)
    return len(positive) > 0 and positive.max() / positive.min() > WIDE_RANGE


def latency_cdfs(runs: dict, title: str, bands: dict | None = None) -> bytes:
    """latency_cdf_figure as PNG bytes."""
    return _png(latency_cdf_figure(runs, title, bands))


def latency_cdf_figure(runs: dict, title: str, bands: dict | None = None):
    """One panel per metric (TTFT, TPOT, E2E): the empirical CDF of each run in `runs`
    ({"measured": requests DataFrame, "simulated": ...}; a None run is left out), and where `bands`
    (experiments.report.ranges.cdf_bands) has the metric, the replications' 90% band and median curve."""
    fig = _figure(13, 3.9)
    axes = fig.subplots(1, len(LATENCY_METRICS))
    for ax, (column, label) in zip(axes, LATENCY_METRICS):
        samples = {name: _finite(frame[column]) for name, frame in runs.items()
                   if frame is not None and column in frame}
        band = (bands or {}).get(column)
        if band is not None:
            _plot_band(ax, band)
        for name, values in samples.items():
            if len(values):
                n = len(values)
                x = np.sort(values)   # the curve starts at 0 just left of the smallest sample
                x, y = np.concatenate([x[:1], x]), np.arange(n + 1) / n
                ax.step(x, y, where="post", color=COLORS.get(name), label=f"{name} (n={n})")
        extent = [band.low_ms, band.high_ms] if band is not None else []
        if _wide(*samples.values(), *extent):
            ax.set_xscale("log")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{label} CDF")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title)
    return fig


def _plot_band(ax, band) -> None:
    """The envelope of the replications' CDFs (at each share, the 5th to 95th percentile of their
    latency) and their median curve."""
    color = COLORS["simulated"]
    ax.fill_betweenx(band.quantiles, band.low_ms, band.high_ms, color=color, alpha=0.18, linewidth=0,
                     label=f"simulated, 90% band of {band.num_replications} replications")
    ax.plot(band.median_ms, band.quantiles, color=color, linestyle="--", linewidth=1,
            label="simulated, median of the replications")


def step_scatter(measured_ms, predicted_ms, title: str) -> bytes:
    """Predicted vs measured time of each measured step, with the y = x line."""
    measured_ms, predicted_ms = np.asarray(measured_ms, float), np.asarray(predicted_ms, float)
    fig = _figure(5.6, 5.2)
    ax = fig.subplots()
    ax.scatter(measured_ms, predicted_ms, s=8, alpha=0.5, color=COLORS["simulated"], label="measured step")
    both = np.concatenate([measured_ms, predicted_ms])
    both = both[np.isfinite(both)]
    lo, hi = (both.min(), both.max()) if len(both) else (0.0, 1.0)
    if _wide(both):
        ax.set_xscale("log")
        ax.set_yscale("log")
        lo, hi = both[both > 0].min() / 1.2, hi * 1.2
    else:
        pad = 0.05 * (hi - lo or 1.0)
        lo, hi = max(0.0, lo - pad), hi + pad
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x (perfect prediction)")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return _png(fig)


def decode_grid_ms(model, batch_sizes=HEATMAP_BATCH_SIZES, kv_lens=HEATMAP_KV_LENS) -> np.ndarray:
    """T_step in ms of pure-decode batches: row j is kv_lens[j] tokens cached per sequence, column i
    is batch_sizes[i] sequences. NaN where the model cannot answer (outside a table's range)."""
    grid = np.full((len(kv_lens), len(batch_sizes)), np.nan)
    for j, kv in enumerate(kv_lens):
        for i, b in enumerate(batch_sizes):
            batch = StepBatch.of(range(b), np.ones(b, dtype=np.int64), np.full(b, kv, dtype=np.int64))
            try:
                grid[j, i] = float(model.step_ms(batch))
            except Exception:   # a table may refuse points outside its grid; leave the cell blank
                continue
    return grid


def decode_heatmap(grid_ms: np.ndarray, title: str, batch_sizes=HEATMAP_BATCH_SIZES,
                   kv_lens=HEATMAP_KV_LENS) -> bytes:
    """The decode_grid_ms grid as a heatmap with each cell's value written in it."""
    from matplotlib.colors import LogNorm, Normalize  # lazy: loads matplotlib
    fig = _figure(7.6, 5.4)
    ax = fig.subplots()
    finite = grid_ms[np.isfinite(grid_ms)]
    norm = (LogNorm(finite.min(), finite.max()) if len(finite) and finite.min() > 0 and _wide(finite)
            else Normalize(*(finite.min(), finite.max()) if len(finite) else (0, 1)))
    image = ax.imshow(np.ma.masked_invalid(grid_ms), origin="lower", aspect="auto", cmap="viridis", norm=norm)
    for j in range(grid_ms.shape[0]):
        for i in range(grid_ms.shape[1]):
            value = grid_ms[j, i]
            if np.isfinite(value):
                light = norm(value) < 0.6
                ax.text(i, j, f"{value:.3g}" if value < 1000 else f"{value:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if light else "black")
    ax.set_xticks(range(len(batch_sizes)), [str(b) for b in batch_sizes])
    ax.set_yticks(range(len(kv_lens)), [str(s) for s in kv_lens])
    ax.set_xlabel("batch size (decode sequences)")
    ax.set_ylabel("KV length per sequence (tokens)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label="T_step (ms)")
    return _png(fig)
