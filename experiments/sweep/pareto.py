"""Pareto front of throughput against P99 latency, the best point per SLO, and their plot."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from stepcal.experiments.capacity.plot import plain_log_ticks

SLO_COLORS = ("tab:red", "tab:purple", "tab:green", "tab:brown", "tab:pink")


def pareto_mask(latency_ms: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """True for points no other point beats: lower-or-equal latency and higher-or-equal throughput, one strictly."""
    latency_ms, throughput = np.asarray(latency_ms, float), np.asarray(throughput, float)
    ok = np.isfinite(latency_ms) & np.isfinite(throughput)
    mask = np.zeros(len(latency_ms), dtype=bool)
    for i in np.flatnonzero(ok):
        no_worse = ok & (latency_ms <= latency_ms[i]) & (throughput >= throughput[i])
        better = (latency_ms < latency_ms[i]) | (throughput > throughput[i])
        mask[i] = not (no_worse & better).any()
    return mask


def best_per_slo(frame, slos) -> dict:
    """For each SLO, the point with the highest goodput among those meeting its attainment target
    (ties: the first in grid order); None when no point meets it."""
    best = {}
    for slo in slos:
        attainment = frame[f"slo_{slo.name}_attainment"].to_numpy(dtype=float)
        goodput = frame[f"slo_{slo.name}_goodput_rps"].to_numpy(dtype=float)
        ok = np.flatnonzero(attainment >= slo.attainment)
        if len(ok) == 0:
            best[slo.name] = None
            continue
        i = int(ok[np.argmax(goodput[ok])])   # argmax takes the first of equal maxima
        best[slo.name] = int(frame["index"].iloc[i])
    return best


def point_label(row) -> str:
    import pandas as pd  # lazy: loads pandas
    settings = [f"{k}={int(row[k])}" for k in ("max_num_seqs", "max_batched_tokens", "chunk_size") if pd.notna(row[k])]
    engine = row.get("host_defaults")
    host = f" +{engine}" if isinstance(engine, str) else ""   # absent, None or NaN: no engine's terms
    return (f"{row['scheduler']} {' '.join(settings)} ×{row['num_replicas']}{host} @{row['rate_rps']:.3g} req/s"
            .replace("  ", " "))


def plot_error_bars(ax, frame, latency: str) -> None:
    """Each point's 90% interval over its replications (sweep `ranges = N`), on both axes, drawn around the
    replications' median (the plain run, marked by the dot, may lie outside its interval: the scatter
    lengthens queues)."""
    def interval(column: str):
        median, low, high = (frame[f"{column}.{k}"].to_numpy(dtype=float) for k in ("median", "low", "high"))
        return median, np.vstack([median - low, high - median])
    x, xerr = interval(f"{latency}_p99")
    y, yerr = interval("throughput_rps")
    ok = np.isfinite(x) & np.isfinite(y)
    ax.errorbar(x[ok], y[ok], xerr=xerr[:, ok], yerr=yerr[:, ok], fmt="none", ecolor="gray", alpha=0.6,
                elinewidth=1, capsize=2, label="90% interval over the replications (around their median)")


def plot_pareto(frame, latency: str, slos, best: dict, path: str | Path) -> None:
    import matplotlib  # lazy: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib

    x = frame[f"{latency}_p99"].to_numpy(dtype=float)
    y = frame["throughput_rps"].to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(9, 6), constrained_layout=True)
    for scheduler in dict.fromkeys(frame["scheduler"]):
        sel = (frame["scheduler"] == scheduler).to_numpy()
        ax.scatter(x[sel], y[sel], s=22, alpha=0.7, label=scheduler)
    if f"{latency}_p99.low" in frame:
        plot_error_bars(ax, frame, latency)
    front = pareto_mask(x, y)
    order = np.argsort(x[front])
    ax.step(x[front][order], y[front][order], where="post", color="black", linewidth=1.2, label="Pareto front")
    by_index = {int(i): n for n, i in enumerate(frame["index"])}
    for k, slo in enumerate(slos):
        limit = getattr(slo, latency, None)
        color = SLO_COLORS[k % len(SLO_COLORS)]
        if limit is not None:
            ax.axvline(limit, color=color, linestyle="--", linewidth=1, label=f"{slo.name}: {latency.removesuffix('_ms').upper()} SLO {limit:g} ms")
        if best.get(slo.name) is not None:
            n = by_index[best[slo.name]]
            # stars shrink with k, so that a point best for several SLOs shows every star
            ax.scatter([x[n]], [y[n]], marker="*", s=max(320 - 90 * k, 80), color=color, edgecolor="black", zorder=5,
                       label=f"best for {slo.name}: {point_label(frame.iloc[n])}")
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel(f"P99 {latency.removesuffix('_ms').upper()} (ms, log scale)")
    ax.set_ylabel("throughput (finished requests/s)")
    ax.set_title(f"Sweep: {len(frame)} simulations, throughput against P99 {latency.removesuffix('_ms').upper()}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.savefig(path, dpi=120)
    plt.close(fig)
