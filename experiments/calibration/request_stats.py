"""Statistics that calibration reads from per-request logs, and how uncertain they are.

The front end's distribution shows in TTFT request by request: its spread among requests at light
load (sigma) and how TTFT grows with the streams active when a request arrives beyond what queueing
explains (per stream). So the front-end fit compares, for the same requests of the measured and the
simulated log, TTFT quantiles within two groups: requests that arrived with at most the median
number of other streams active (light load), and the others. P99 stays out: it is validated.

The uncertainty of each statistic comes from a block bootstrap over the measured requests in arrival
order (neighbours share a queue, so blocks of n^(1/3) consecutive requests are resampled together).

A run of several repeats serves the same requests several times, each time in its own queue: each
repeat's requests are grouped by the streams active in that repeat, each statistic is taken within
each repeat and averaged over the repeats (as the summary statistics of a measured run are), and the
bootstrap resamples every repeat apart. With one repeat every figure is that repeat's, to the bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_QUANTILES = (10, 50, 90)
GROUPS = ("light", "heavy")
# (metric, statistic) pairs of the front-end fit, in the keys the calibration record uses
# TTFT's least-squares slope on the streams active at each request's arrival (ms per stream; beside the
# prompt's tokens where they vary): the queue's growth and the front end's work per stream. A simulation
# of the same requests has the queue, so what it misses of the slope is the per-stream term, which the
# group quantiles only show as a shift between two groups (calibration's shape search matches it).
STREAM_SLOPE_KEY = ("ttft_ms", "per_active_stream")
FRONT_OBJECTIVE = (*(("ttft_ms", f"{group}_load.p{q}") for group in GROUPS for q in GROUP_QUANTILES),
                   STREAM_SLOPE_KEY)
# TTFT's least-squares slope on the prompt's tokens among the light-load arrivals (ms per token): their
# prefill is most of their TTFT, so it is what a prompt token costs, which TTFT quantiles mix with the
# per-request time and the queue (calibration's step search matches it: calibration.search).
SLOPE_KEY = ("ttft_ms", "light_load.per_prompt_token")
# TPOT's least-squares slope on the mean number of other requests decoding alongside each one (ms per
# stream): what one more sequence adds to a step, which TPOT's quantiles mix with the per-step time at a
# light load (decoding_alongside).
TPOT_SLOPE_KEY = ("tpot_ms", "per_stream_decoding")
# TPOT's least-squares coefficient on the prompt tokens that other requests prefilled during each one's
# decode, per decode step (ms per token), in a fit on those and on the requests decoding alongside: what
# a prefill token adds to the steps it rides in. It tells a step's token cost from the request path where
# TTFT cannot (prompts of one length: SLOPE_KEY undefined), for the request path holds up no step.
PREFILL_SLOPE_KEY = ("tpot_ms", "per_prefill_token_alongside")
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


def decoding_alongside(first_token_s: np.ndarray, finish_s: np.ndarray) -> np.ndarray:
    """For each request, the mean number of other requests between their first token and their finish
    over its own such interval (NaN where it has none): the integral of the decoding count, read off
    its running sum at the interval's ends."""
    start = np.asarray(first_token_s, dtype=np.float64)
    end = np.asarray(finish_s, dtype=np.float64)
    ok = np.isfinite(start) & np.isfinite(end) & (end > start)
    times = np.concatenate([start[ok], end[ok]])
    order = np.argsort(times, kind="stable")
    times = times[order]
    count = np.cumsum(np.concatenate([np.ones(ok.sum()), -np.ones(ok.sum())])[order])   # decoding after each time
    area = np.concatenate([[0.0], np.cumsum(count[:-1] * np.diff(times))])               # integral up to each time

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(times, t, side="right") - 1, 0, max(len(times) - 1, 0))
        return area[i] + count[i] * (t - times[i]) if len(times) else np.zeros(len(t))
    out = np.full(len(start), np.nan)
    out[ok] = (integral(end[ok]) - integral(start[ok])) / (end[ok] - start[ok]) - 1.0   # less itself
    return out


def prefill_tokens_alongside(first_token_s: np.ndarray, finish_s: np.ndarray, num_prompt_tokens: np.ndarray,
                             num_output_tokens: np.ndarray) -> np.ndarray:
    """For each request, the prompt tokens of the other requests whose first token came after its own and
    by its finish, per step of its decode (num_output_tokens - 1; NaN where it has none): the prefill
    work its decode steps carried. A prefill ends with the request's first token, so a chunked one is
    counted whole at its last chunk."""
    first = np.asarray(first_token_s, dtype=np.float64)
    finish = np.asarray(finish_s, dtype=np.float64)
    prompt = np.asarray(num_prompt_tokens, dtype=np.float64)
    steps = np.asarray(num_output_tokens, dtype=np.float64) - 1.0
    known = np.isfinite(first)
    order = np.argsort(first[known], kind="stable")
    times = first[known][order]
    tokens = np.concatenate([[0.0], np.cumsum(prompt[known][order])])   # prompt tokens of first tokens before
    lo = np.searchsorted(times, np.where(known, first, np.inf), side="right")
    hi = np.searchsorted(times, np.where(np.isfinite(finish), finish, -np.inf), side="right")
    ok = known & np.isfinite(finish) & (steps > 0)
    out = np.full(len(first), np.nan)
    out[ok] = (tokens[np.maximum(hi, lo)[ok]] - tokens[lo[ok]]) / steps[ok]
    return out


def _tpot_slopes(alongside: np.ndarray, prefill: np.ndarray, tpot: np.ndarray) -> dict:
    ok = np.isfinite(alongside) & np.isfinite(tpot)
    out = {TPOT_SLOPE_KEY: _slope(alongside[ok], tpot[ok])}
    both = ok & np.isfinite(prefill)
    out[PREFILL_SLOPE_KEY] = _partial_slope(prefill[both], alongside[both], tpot[both])
    return out


def decoding_alongside_in(requests) -> np.ndarray:
    """decoding_alongside of a request log."""
    return decoding_alongside(requests["first_token_s"].to_numpy(), requests["finish_s"].to_numpy())


def prefilled_alongside(requests) -> np.ndarray:
    """prefill_tokens_alongside of a request log, counting the prompt tokens computed (less those a
    prefix cache served, where the log says)."""
    prompt = requests["num_prompt_tokens"].to_numpy(dtype=np.float64)
    if "num_cached_tokens" in requests:
        prompt = prompt - requests["num_cached_tokens"].fillna(0).to_numpy(dtype=np.float64)
    return prefill_tokens_alongside(requests["first_token_s"].to_numpy(), requests["finish_s"].to_numpy(), prompt,
                                    requests["num_output_tokens"].to_numpy())


def tpot_slopes(requests) -> dict:
    """TPOT_SLOPE_KEY and PREFILL_SLOPE_KEY of one request log: they depend on the log's own queue, not
    on load groups."""
    return _tpot_slopes(decoding_alongside_in(requests), prefilled_alongside(requests),
                        requests["tpot_ms"].to_numpy(dtype=np.float64))


@dataclass(frozen=True)
class LoadGroups:
    """The measured requests' ids, their load group (0 light, 1 heavy) and the streams active at their
    arrival, sorted by id."""
    request_ids: np.ndarray
    group: np.ndarray
    active: np.ndarray

    @classmethod
    def of(cls, requests) -> LoadGroups:
        active = active_at_arrival(requests["arrival_s"].to_numpy(), requests["finish_s"].to_numpy())
        group = (active > np.median(active)).astype(np.int8)
        ids = requests["request_id"].to_numpy(dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], group[order], active[order].astype(np.float64))

    def of_ids(self, request_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The group of each id (-1 for an id the measured log does not have) and its active streams
        (NaN there)."""
        pos = np.clip(np.searchsorted(self.request_ids, request_ids), 0, len(self.request_ids) - 1)
        found = self.request_ids[pos] == request_ids
        return np.where(found, self.group[pos], -1), np.where(found, self.active[pos], np.nan)


def group_stats(requests, groups: LoadGroups) -> dict:
    """{(metric, "light_load.p10"): value, ...} over FRONT_OBJECTIVE and SLOPE_KEY (None for an empty
    group)."""
    ttft = requests["ttft_ms"].to_numpy(dtype=np.float64)
    label, active = groups.of_ids(requests["request_id"].to_numpy(dtype=np.int64))
    return _group_stats(ttft, label, requests["num_prompt_tokens"].to_numpy(dtype=np.float64), active)


def _group_stats(ttft: np.ndarray, label: np.ndarray, prompt: np.ndarray, active: np.ndarray) -> dict:
    out = {}
    for g, name in enumerate(GROUPS):
        values = ttft[(label == g) & np.isfinite(ttft)]
        qs = np.percentile(values, GROUP_QUANTILES) if len(values) else [None] * len(GROUP_QUANTILES)
        for q, value in zip(GROUP_QUANTILES, qs):
            out[("ttft_ms", f"{name}_load.p{q}")] = None if value is None else float(value)
    light = (label == 0) & np.isfinite(ttft)
    out[SLOPE_KEY] = _slope(prompt[light], ttft[light])
    out[STREAM_SLOPE_KEY] = _stream_slope(active, prompt, ttft)
    return out


def _stream_slope(active: np.ndarray, prompt: np.ndarray, ttft: np.ndarray) -> float | None:
    """STREAM_SLOPE_KEY: beside the prompt's tokens where they vary (a long prompt's prefill is part of
    its TTFT whatever the company), alone where they do not."""
    known = np.isfinite(active) & np.isfinite(ttft)
    if known.sum() > 3 and np.ptp(prompt[known]) > 0:
        return _partial_slope(active[known], prompt[known], ttft[known])
    return _slope(active[known], ttft[known])


def _slope(x: np.ndarray, y: np.ndarray) -> float | None:
    """The least-squares slope of y on x; None where x does not vary or the slope is not positive (a
    log ratio needs one)."""
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    dx = x - x.mean()
    slope = float(dx @ (y - y.mean()) / (dx @ dx))
    return slope if slope > 0 else None


def _partial_slope(x: np.ndarray, z: np.ndarray, y: np.ndarray) -> float | None:
    """y's least-squares coefficient on x in a fit on x and z (with an intercept); None as _slope."""
    if len(x) < 4 or np.ptp(x) == 0:
        return None
    design = np.column_stack([np.ones(len(x)), x - x.mean(), z - z.mean()])
    coef, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    slope = float(coef[1])
    return slope if rank == 3 and slope > 0 else None


def _summary_of(metric: str, values: np.ndarray) -> dict:
    if not len(values):
        return {}
    p = np.percentile(values, (50, 90, 95, 99))
    return {(metric, "mean"): float(values.mean()), (metric, "p50"): float(p[0]), (metric, "p90"): float(p[1]),
            (metric, "p95"): float(p[2]), (metric, "p99"): float(p[3])}


def repeat_groups(request_logs) -> list[LoadGroups]:
    """Each repeat's load groups, from the streams active in that repeat."""
    return [LoadGroups.of(requests) for requests in request_logs]


def mean_stats(per_repeat: list[dict]) -> dict:
    """Each statistic averaged over the repeats (None where a repeat lacks it); one repeat's as it is."""
    if len(per_repeat) == 1:
        return per_repeat[0]
    keys = dict.fromkeys(k for stats in per_repeat for k in stats)
    return {k: (float(np.mean([stats[k] for stats in per_repeat]))
                if all(stats.get(k) is not None for stats in per_repeat) else None) for k in keys}


def pooled_group_stats(requests, groups: list[LoadGroups]) -> dict:
    """group_stats of one request log under each repeat's load groups, averaged over the repeats: a
    simulated log (one serving of the workload) compared with every measured repeat; and its
    TPOT slopes (tpot_slopes), taken once."""
    return mean_stats([group_stats(requests, g) for g in groups]) | tpot_slopes(requests)


def measured_group_stats(request_logs, groups: list[LoadGroups]) -> dict:
    """group_stats of each measured repeat under its own groups, averaged over the repeats."""
    return mean_stats([group_stats(requests, g) | tpot_slopes(requests)
                       for requests, g in zip(request_logs, groups)])


@dataclass(frozen=True)
class _Resampled:
    """One repeat's requests in arrival order, as the bootstrap resamples them."""
    columns: dict
    label: np.ndarray
    block: int

    @classmethod
    def of(cls, requests, groups: LoadGroups) -> _Resampled:
        order = np.argsort(requests["arrival_s"].to_numpy(), kind="stable")
        frame = requests.iloc[order]
        columns = {m: frame[m].to_numpy(dtype=np.float64) for m in (*SUMMARY_METRICS, "num_prompt_tokens")}
        # each request's company, from the whole repeat: a resample redraws requests, not their queue
        columns["alongside"] = decoding_alongside_in(frame)
        columns["prefill"] = prefilled_alongside(frame)
        label, columns["active"] = groups.of_ids(frame["request_id"].to_numpy(dtype=np.int64))
        return cls(columns, label, max(1, round(len(frame) ** (1.0 / 3.0))))

    def draw(self, rng: np.random.Generator) -> dict:
        """The statistics of one block-bootstrap resample (the same draws, in the same order, as a run
        of this one repeat alone would make)."""
        n, block = len(self.label), self.block
        starts = rng.integers(0, max(1, n - block + 1), size=-(-n // block))
        index = (starts[:, None] + np.arange(block)[None, :]).ravel()[:n]
        stats = _group_stats(self.columns["ttft_ms"][index], self.label[index],
                             self.columns["num_prompt_tokens"][index], self.columns["active"][index])
        stats.update(_tpot_slopes(self.columns["alongside"][index], self.columns["prefill"][index],
                                  self.columns["tpot_ms"][index]))
        for metric in SUMMARY_METRICS:
            values = self.columns[metric][index]
            stats.update(_summary_of(metric, values[np.isfinite(values)]))
        return stats


def pooled_bootstrap_log_covariance(request_logs, groups: list[LoadGroups], keys: list, seed: int = 0,
                                    num_resamples: int = BOOTSTRAP_RESAMPLES) -> np.ndarray:
    """Covariance of ln(statistic) over block-bootstrap resamples of the measured requests, for the
    (metric, stat) `keys` (summary statistics and FRONT_OBJECTIVE ones). Each resample draws every
    repeat's blocks apart and averages each statistic over the repeats, as the measured statistics are."""
    repeats = [_Resampled.of(requests, g) for requests, g in zip(request_logs, groups)]
    rng = np.random.default_rng([seed, 0x626F6F74])
    rows = np.empty((num_resamples, len(keys)))
    for b in range(num_resamples):
        stats = mean_stats([repeat.draw(rng) for repeat in repeats])
        rows[b] = [np.log(stats[k]) if stats.get(k) and stats[k] > 0 else np.nan for k in keys]
    ok = np.all(np.isfinite(rows), axis=1)
    if ok.sum() < 2:
        return np.full((len(keys), len(keys)), np.nan)
    return np.atleast_2d(np.cov(rows[ok], rowvar=False))
