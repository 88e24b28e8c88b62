"""Statistics that calibration reads from per-request logs, and how uncertain they are.

The front end's distribution shows in TTFT request by request: its spread among requests at light
load (sigma) and how TTFT grows with the streams active when a request arrives beyond what queueing
explains (per stream). So the front-end fit compares, for the same requests of the measured and the
simulated log, TTFT quantiles within two groups: requests that arrived with at most the median
number of other streams active (light load), and the others. P99 stays out: it is validated.

The uncertainty of each statistic comes from a block bootstrap over the measured requests in arrival
order (neighbours share a queue, so blocks of n^(1/3) consecutive requests are resampled together).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_QUANTILES = (10, 50, 90)
GROUPS = ("light", "heavy")
# (metric, statistic) pairs of the front-end fit, in the keys the calibration record uses
FRONT_OBJECTIVE = tuple(("ttft_ms", f"{group}_load.p{q}") for group in GROUPS for q in GROUP_QUANTILES)
SUMMARY_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
BOOTSTRAP_RESAMPLES = 200


def active_at_arrival(arrival_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """For each request, the other requests sent before it and not done when it arrives (a request
    never done, e.g. failed without a finish time, counts as active to the end)."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    end_s = np.where(np.isfinite(end_s), end_s, np.inf)
    sent_before = np.searchsorted(np.sort(arrival_s), arrival_s, side="left")
    done_before = np.searchsorted(np.sort(end_s), arrival_s, side="left")
    return sent_before - done_before


@dataclass(frozen=True)
class LoadGroups:
    """The measured requests' ids and their load group (0 light, 1 heavy), sorted by id."""
    request_ids: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, requests) -> LoadGroups:
        active = active_at_arrival(requests["arrival_s"].to_numpy(), requests["finish_s"].to_numpy())
        group = (active > np.median(active)).astype(np.int8)
        ids = requests["request_id"].to_numpy(dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], group[order])

    def of_ids(self, request_ids: np.ndarray) -> np.ndarray:
        """The group of each id (-1 for an id the measured log does not have)."""
        pos = np.clip(np.searchsorted(self.request_ids, request_ids), 0, len(self.request_ids) - 1)
        found = self.request_ids[pos] == request_ids
        return np.where(found, self.group[pos], -1)


def group_stats(requests, groups: LoadGroups) -> dict:
    """{(metric, "light_load.p10"): value, ...} over FRONT_OBJECTIVE (None for an empty group)."""
    ttft = requests["ttft_ms"].to_numpy(dtype=np.float64)
    label = groups.of_ids(requests["request_id"].to_numpy(dtype=np.int64))
    return _group_stats(ttft, label)


def _group_stats(ttft: np.ndarray, label: np.ndarray) -> dict:
    out = {}
    for g, name in enumerate(GROUPS):
        values = ttft[(label == g) & np.isfinite(ttft)]
        qs = np.percentile(values, GROUP_QUANTILES) if len(values) else [None] * len(GROUP_QUANTILES)
        for q, value in zip(GROUP_QUANTILES, qs):
            out[("ttft_ms", f"{name}_load.p{q}")] = None if value is None else float(value)
    return out


def summary_stats(requests) -> dict:
    """{(metric, stat): value} for mean and percentiles of a request log (as simulator.metrics does)."""
    out = {}
    for metric in SUMMARY_METRICS:
        values = requests[metric].to_numpy(dtype=np.float64)
        out.update(_summary_of(metric, values[np.isfinite(values)]))
    return out


def _summary_of(metric: str, values: np.ndarray) -> dict:
    if not len(values):
        return {}
    p = np.percentile(values, (50, 90, 95, 99))
    return {(metric, "mean"): float(values.mean()), (metric, "p50"): float(p[0]), (metric, "p90"): float(p[1]),
            (metric, "p95"): float(p[2]), (metric, "p99"): float(p[3])}


def bootstrap_log_covariance(requests, groups: LoadGroups, keys: list, seed: int = 0,
                             num_resamples: int = BOOTSTRAP_RESAMPLES) -> np.ndarray:
    """Covariance of ln(statistic) over block-bootstrap resamples of the measured requests, for the
    (metric, stat) `keys` (summary statistics and FRONT_OBJECTIVE ones)."""
    order = np.argsort(requests["arrival_s"].to_numpy(), kind="stable")
    frame = requests.iloc[order]
    columns = {m: frame[m].to_numpy(dtype=np.float64) for m in SUMMARY_METRICS}
    label = groups.of_ids(frame["request_id"].to_numpy(dtype=np.int64))
    n = len(frame)
    block = max(1, round(n ** (1.0 / 3.0)))
    num_blocks = -(-n // block)
    rng = np.random.default_rng([seed, 0x626F6F74])
    rows = np.empty((num_resamples, len(keys)))
    for b in range(num_resamples):
        starts = rng.integers(0, max(1, n - block + 1), size=num_blocks)
        index = (starts[:, None] + np.arange(block)[None, :]).ravel()[:n]
        stats = _group_stats(columns["ttft_ms"][index], label[index])
        for metric in SUMMARY_METRICS:
            values = columns[metric][index]
            stats.update(_summary_of(metric, values[np.isfinite(values)]))
        rows[b] = [np.log(stats[k]) if stats.get(k) and stats[k] > 0 else np.nan for k in keys]
    ok = np.all(np.isfinite(rows), axis=1)
    if ok.sum() < 2:
        return np.full((len(keys), len(keys)), np.nan)
    return np.atleast_2d(np.cov(rows[ok], rowvar=False))
