"""The capacity plot: SLO attainment (top) and P99 TTFT / TPOT (bottom) against request rate."""
from __future__ import annotations

from pathlib import Path

from stepcal.experiments.capacity.ranges import rate_text

COLORS = {"aggregated": "tab:blue", "disaggregated": "tab:orange"}


def plot_capacity(records: dict[str, dict], slo_ttft_ms: float | None, slo_tpot_ms: float | None,
                  path: str | Path) -> None:
    """`records` maps a deployment label to its capacity record (report.capacity_record)."""
    import matplotlib  # lazy: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True, constrained_layout=True)
    target = next(iter(records.values()))["target_attainment"]
    for label, record in records.items():
        color = COLORS.get(label, None)
        probes = record["probes"]
        rates = [p["rate_rps"] for p in probes]
        top.plot(rates, [p["slo_attainment"] for p in probes], "o-", color=color, label=f"{label}: attainment")
        bottom.plot(rates, [p["ttft_p99_ms"] for p in probes], "o-", color=color, label=f"{label}: P99 TTFT")
        bottom.plot(rates, [p["tpot_p99_ms"] for p in probes], "s--", color=color, label=f"{label}: P99 TPOT")
        if record["max_rate_rps"] is not None:
            top.axvline(record["max_rate_rps"], color=color, linestyle=":", linewidth=1.5,
                        label=f"{label}: max rate {record['max_rate_rps']:.3g} req/s")
            bottom.axvline(record["max_rate_rps"], color=color, linestyle=":", linewidth=1.5)
        if record.get("ranges"):
            plot_attainment_band(top, record["ranges"], color)
            plot_latency_bands(bottom, record["ranges"], color)
        check = record.get("check_above")
        if check is not None:
            top.plot([check["rate_rps"]], [check["slo_attainment"]], "X", color=color, markersize=10,
                     markeredgecolor="black", label=f"{label}: check +{check['above_by']:.0%}")
    top.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    top.set_ylabel("SLO attainment (share of requests)")
    top.set_ylim(-0.02, 1.05)
    top.set_title(_title(slo_ttft_ms, slo_tpot_ms))
    top.legend(loc="lower left", fontsize=8)
    for value, name in ((slo_ttft_ms, "TTFT SLO"), (slo_tpot_ms, "TPOT SLO")):
        if value is not None:
            bottom.axhline(value, color="gray", linestyle="-." if name == "TTFT SLO" else ":", linewidth=1,
                           label=f"{name} {value:g} ms")
    bottom.set_yscale("log")
    bottom.set_ylabel("P99 latency (ms, log scale)")
    bottom.set_xlabel("request rate (requests/s; the trace's arrivals rescaled)")
    bottom.legend(loc="upper left", fontsize=8)
    for ax in (top, bottom):
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
        ax.grid(True, which="both", alpha=0.3)
    plain_log_ticks(bottom.yaxis)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attainment_band(ax, ranges: dict, color) -> None:
    """The replications' attainment: 90% band and median over the rates they were probed at, and the
    capacity's interval as a shaded span (to the searched limit where a bound lies beyond it)."""
    probes = [p for p in ranges["probes"] if p.get("slo_attainment")]
    rates = [p["rate_rps"] for p in probes]
    n = ranges["num_replications"]
    ax.fill_between(rates, [p["slo_attainment"]["low"] for p in probes],
                    [p["slo_attainment"]["high"] for p in probes], color=color, alpha=0.2, step=None,
                    label=f"attainment, 90% band of {n} replications")
    ax.plot(rates, [p["slo_attainment"]["median"] for p in probes], ".--", color=color, linewidth=1,
            label="attainment, median of the replications")
    curves = ranges["curves"]
    low, high = (curves[k]["max_rate_rps"] or curves[k]["limit_rps"] for k in ("low", "high"))
    if low is not None and high is not None:
        ax.axvspan(low, high, color=color, alpha=0.08,
                   label=f"capacity, 90% interval {rate_text(curves['low'])} to {rate_text(curves['high'])}")


def plot_latency_bands(ax, ranges: dict, color) -> None:
    """The 90% band of P99 TTFT and TPOT over the replications, at the rates they were probed at."""
    for key in ("ttft_p99_ms", "tpot_p99_ms"):
        probes = [p for p in ranges["probes"] if p.get(key)]
        ax.fill_between([p["rate_rps"] for p in probes], [p[key]["low"] for p in probes],
                        [p[key]["high"] for p in probes], color=color, alpha=0.15)


def _title(slo_ttft_ms, slo_tpot_ms) -> str:
    parts = [f"TTFT ≤ {slo_ttft_ms:g} ms" if slo_ttft_ms is not None else None,
             f"TPOT ≤ {slo_tpot_ms:g} ms" if slo_tpot_ms is not None else None]
    return "Capacity search: " + " and ".join(p for p in parts if p)


def plain_log_ticks(axis) -> None:
    """Ticks at 1, 2, 5 × 10^k written as plain numbers (6, 20, 500), not 6×10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # lazy: loads matplotlib
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())
