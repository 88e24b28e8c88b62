"""Serving metrics, one definition for simulator, engine and imports (docs/design.md, Metrics)."""
from __future__ import annotations

import math

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs=PERCENTILES) -> list[float]:
    """Percentiles of `values` each repeated `weights` times, equal to np.percentile (linear) on the
    expanded array, without expanding it."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    total = int(cum[-1])
    out = []
    for q in qs:
        pos = q / 100.0 * (total - 1)
        lo, frac = int(math.floor(pos)), pos - math.floor(pos)
        i_lo = int(np.searchsorted(cum, lo, side="right"))
        i_hi = int(np.searchsorted(cum, min(lo + 1, total - 1), side="right"))
        out.append(_lerp(float(v[i_lo]), float(v[i_hi]), frac))
    return out


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's own interpolation formula, so results match np.percentile to the last bit."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def distribution(values_ms: np.ndarray, weights: np.ndarray | None = None) -> dict:
    """mean, p50, p90, p95, p99 of finite values (None when there are none)."""
    values_ms = np.asarray(values_ms, dtype=np.float64)
    keep = np.isfinite(values_ms)
    if weights is not None:
        weights = np.asarray(weights)[keep]
    values_ms = values_ms[keep]
    keys = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)
    if len(values_ms) == 0:
        return dict.fromkeys(keys)
    if weights is None:
        weights = np.ones(len(values_ms), dtype=np.int64)
    # Merge equal values first: the same multiset then gives the same mean to the last bit,
    # however its samples were chunked (one by one, or as decode runs).
    unique, inverse = np.unique(values_ms, return_inverse=True)
    counts = np.bincount(inverse, weights=weights).astype(np.int64)
    mean = float((unique * counts).sum() / counts.sum())
    return dict(zip(keys, [mean] + weighted_percentiles(unique, counts)))


def request_metrics(arrival_s, first_token_s, finish_s, num_output_tokens) -> dict[str, np.ndarray]:
    """TTFT, TPOT and E2E in ms per request; NaN where undefined (unfinished, or TPOT of 1 token)."""
    arrival_s, first_token_s, finish_s = (np.asarray(a, dtype=np.float64) for a in (arrival_s, first_token_s, finish_s))
    out_tokens = np.asarray(num_output_tokens, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tokens > 1, (finish_s - first_token_s) * 1000.0 / (out_tokens - 1), np.nan)
    return {"ttft_ms": (first_token_s - arrival_s) * 1000.0, "tpot_ms": tpot, "e2e_ms": (finish_s - arrival_s) * 1000.0}


def summarize(requests, itl_s: np.ndarray | None = None, itl_weights: np.ndarray | None = None,
              slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None) -> dict:
    """The summary.json of a run, from a request log (a DataFrame with the docs/design.md columns)."""
    finished = requests["finish_s"].notna().to_numpy()
    num_finished = int(finished.sum())
    start_s = float(requests["arrival_s"].min()) if len(requests) else 0.0
    end_s = float(requests.loc[finished, "finish_s"].max()) if num_finished else start_s
    duration_s = end_s - start_s
    out_tokens = int(requests.loc[finished, "num_output_tokens"].sum())
    summary = {
        "num_requests": len(requests),
        "num_finished": num_finished,
        "duration_s": duration_s,
        "throughput_rps": num_finished / duration_s if duration_s > 0 else None,
        "output_tokens_per_s": out_tokens / duration_s if duration_s > 0 else None,
        "num_preemptions": int(requests["num_preemptions"].sum()),
    }
    for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
        summary[name] = distribution(requests.loc[finished, name].to_numpy())
    if itl_s is not None:
        summary["itl_ms"] = distribution(np.asarray(itl_s) * 1000.0, itl_weights)
    if slo_ttft_ms is not None or slo_tpot_ms is not None or "slo_ttft_ms" in requests:
        summary.update(slo_summary(requests, finished, duration_s, slo_ttft_ms, slo_tpot_ms))
    return summary


def slo_summary(requests, finished, duration_s, slo_ttft_ms, slo_tpot_ms) -> dict:
    """Share of requests meeting both SLOs (per-request SLO columns override the global ones);
    unfinished requests count as misses. TPOT of a one-token request is not constrained."""
    n = len(requests)
    ttft_limit = _limit(requests, "slo_ttft_ms", slo_ttft_ms, n)
    tpot_limit = _limit(requests, "slo_tpot_ms", slo_tpot_ms, n)
    ttft = requests["ttft_ms"].to_numpy(dtype=np.float64)
    tpot = requests["tpot_ms"].to_numpy(dtype=np.float64)
    ok_ttft = finished & (ttft <= ttft_limit)
    ok_tpot = np.isnan(tpot) | (tpot <= tpot_limit)
    met = int((ok_ttft & ok_tpot & finished).sum())
    return {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms,
            "slo_attainment": met / n if n else None,
            "goodput_rps": met / duration_s if duration_s > 0 else None}


def _limit(requests, column: str, default: float | None, n: int) -> np.ndarray:
    limit = np.full(n, np.inf if default is None else float(default))
    if column in requests:
        own = requests[column].to_numpy(dtype=np.float64)
        limit = np.where(np.isnan(own), limit, own)
    return limit


def prefix_cache_summary(requests, block_managers, enabled: bool, has_ids: bool = True) -> dict:
    """Prefix caching in summary.json: whether it was on, the share of prompt tokens served from the
    cache at first admission (prefix_hit_rate; None when off or when the trace has no prefix ids),
    and the cached blocks evicted to make room."""
    prompt_tokens = int(requests["num_prompt_tokens"].sum())
    cached_tokens = int(requests["num_cached_tokens"].sum()) if "num_cached_tokens" in requests else 0
    return {"prefix_caching": enabled,
            "num_cached_tokens": cached_tokens,
            "prefix_hit_rate": cached_tokens / prompt_tokens if enabled and has_ids and prompt_tokens else None,
            "num_prefix_evictions": sum(getattr(kv, "num_evictions", 0) for kv in block_managers)}


def clean_json(obj):
    """NaN / inf become None, so summary.json is valid JSON."""
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, np.generic):
        return clean_json(obj.item())
    return obj
