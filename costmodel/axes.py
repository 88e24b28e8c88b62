"""The axes T_step terms are tabulated on, and the rule that builds them from the data.

A term's table is linear between its knots, so a knot missing where the data have one smears
what was measured there: tile quantisation makes GEMM time jump between neighbouring token
counts (Llama-3-8B on A100: +12% from 512 to 520 tokens), and a coarse log grid interpolated
across such a step was 10-18% off at 256 and 512 tokens though the regressors were within 2%.

DATA_RULE, the default of costmodel.build.build_tables, makes each axis the union of
  1. the fixed log grid (Axes.default(): it still covers the range beyond the data, where the
     regressor extrapolates);
  2. every value the data were measured at on that axis (measured_values());
  3. the powers of two up to the axis's end, so that the chunk and batch sizes users pick
     (256, 512, ..., 4096) are knots exactly;
  4. where the data are dense (neighbours at most DENSE_GAP apart), the multiples of 8 up to
     1,024, of 16 up to 2,048 and of 64 beyond;
  5. on the 1-D axes (num_tokens, num_seqs) within the data's range: where linear
     interpolation between two neighbouring knots misses the composed terms by more than
     STEP_TOLERANCE at an integer inside the gap, a knot on each side of the largest change
     there (refine_steps), so that a step in the regressor stays a step in the table.
The all-reduces of tensor parallelism are a num_tokens term too: their measured message sizes,
as the token counts that make them, are measured values of num_tokens (costmodel.compose.
measured_axes), and their steps (an NCCL protocol or algorithm switching) are refined like the GEMMs'.
The 2-D attention grids are (len x len): their axes keep the fixed grid and the powers of two,
and at most MAX_2D_KNOTS knots in all, thinning the data's values evenly by rank.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from stepcal.costmodel import grid

DENSE_GAP = 64
MAX_1D_KNOTS = 4096
MAX_2D_KNOTS = 128
STEP_TOLERANCE = 0.01
PROBES_PER_GAP = 16       # integers tried inside one gap per round of refine_steps
STEP_ROUNDS = 3           # each round narrows a wide gap's step 16-fold
# The size of the multiples added where data are dense, by where they lie (Vidur's own sweep).
MULTIPLES = ((1024, 8), (2048, 16), (np.inf, 64))

# `stepcal fit --axes` names the rule; meta.json's axes.rule starts with that name.
AXES_RULES = ("data", "fixed")
FIXED_RULE = "fixed: the log grid of Axes.default(), whatever the data"
DATA_RULE = (f"data: fixed log grid + every measured value + powers of two + multiples of 8/16/64 where the data "
             f"are at most {DENSE_GAP} apart; 1-D axes: a knot each side of every step the regressor takes "
             f"between knots (linear interpolation off by > {STEP_TOLERANCE:.0%}); 2-D axes capped at "
             f"{MAX_2D_KNOTS} knots each (costmodel.axes)")

DECODE_OPS = ("attn_decode", "mla_decode", "attn_decode_mixed")
PREFILL_OPS = ("attn_prefill", "mla_prefill")
ONE_D = ("num_tokens", "num_seqs")
TWO_D = ("num_decode", "kv_mean", "prefill_tokens", "prefill_ctx")


@dataclass(frozen=True)
class Axes:
    """The knots of every term's grid. num_decode is decode attention's batch axis (num_seqs's
    knots unless given: the 1-D num_seqs axis may hold hundreds of knots, too many for a 2-D grid)."""
    num_tokens: np.ndarray
    num_seqs: np.ndarray
    kv_mean: np.ndarray
    prefill_tokens: np.ndarray
    prefill_ctx: np.ndarray
    num_decode: np.ndarray | None = None
    rule: str = "given"

    def __post_init__(self) -> None:
        if self.num_decode is None:
            object.__setattr__(self, "num_decode", self.num_seqs)

    @classmethod
    def default(cls) -> Axes:
        """The fixed log grid: the same knots whatever the data."""
        return cls(num_tokens=grid.axis(1, 65536, 72), num_seqs=grid.axis(1, 4096, 40),
                   kv_mean=grid.axis(1, 131072, 36), prefill_tokens=grid.axis(1, 65536, 36),
                   prefill_ctx=grid.axis(1, 131072, 36), rule=FIXED_RULE)

    @classmethod
    def from_data(cls, measured: dict[str, np.ndarray]) -> Axes:
        """Steps 1-4 of DATA_RULE (refine_steps does step 5, given the regressors)."""
        fixed = cls.default()
        knots = {name: _merged(getattr(fixed, name), measured.get(name, np.empty(0)), MAX_1D_KNOTS)
                 for name in ONE_D}
        # The decode batch axis starts from the fixed num_seqs grid, not from the 1-D one.
        knots |= {name: _merged(getattr(fixed, "num_seqs" if name == "num_decode" else name),
                                measured.get(name, np.empty(0)), MAX_2D_KNOTS) for name in TWO_D}
        return cls(**knots, rule=DATA_RULE)

    def to_meta(self, measured: dict[str, np.ndarray]) -> dict:
        """meta.json's "axes": every axis's knots, the rule that built them, and the values the
        data were measured at (costmodel.resolution compares the tables there)."""
        knots = {name: getattr(self, name).tolist() for name in (*ONE_D, *TWO_D)}
        return {**knots, "rule": self.rule, "measured": {name: v.tolist() for name, v in measured.items()}}


def measured_values(records: pd.DataFrame) -> dict[str, np.ndarray]:
    """The distinct values each axis was measured at. num_tokens: the m of GEMMs and the tokens
    of per-token operators and MoE experts; num_seqs: the m of GEMMs too (the LM head is a GEMM
    at one row per sequence) and the batch sizes of host overhead; the attention axes from the
    attention records (kv_mean and prefill_ctx are per-item means, as the terms look them up)."""
    op = records["op"]
    gemm_m = records.loc[op == "gemm", "m"]
    decode = records[op.isin(DECODE_OPS)]
    prefill = records[op.isin(PREFILL_OPS)]
    return {
        "num_tokens": _distinct(gemm_m, records.loc[op.isin(["elementwise", "moe"]), "num_tokens"]),
        "num_seqs": _distinct(gemm_m, records.loc[op == "overhead", "num_seqs"]),
        "num_decode": _distinct(decode["num_decode"]),
        "kv_mean": _distinct(decode["decode_kv_sum"] / decode["num_decode"]),
        "prefill_tokens": _distinct(prefill["prefill_tokens"]),
        "prefill_ctx": _distinct(prefill["prefill_attn_work"] / prefill["prefill_tokens"]),
    }


def _distinct(*columns: pd.Series) -> np.ndarray:
    values = np.concatenate([c.to_numpy(dtype=np.float64) for c in columns])
    # Knots start at 1 like the fixed grid: a count or a mean below one is no batch.
    return np.unique(values[np.isfinite(values) & (values >= 1)])


def _merged(fixed: np.ndarray, measured: np.ndarray, cap: int) -> np.ndarray:
    """Steps 1-4 of DATA_RULE on one axis, at most `cap` knots (the fixed grid and the powers of
    two always; the data's values and multiples thinned evenly by rank where they overflow)."""
    end = max(fixed[-1], measured[-1]) if len(measured) else fixed[-1]
    kept = np.union1d(fixed, powers_of_two(end))
    extra = np.setdiff1d(np.union1d(measured, dense_multiples(measured)), kept)
    room = cap - len(kept)
    if len(extra) > room:
        extra = extra[np.unique(np.linspace(0, len(extra) - 1, max(room, 0)).round().astype(int))]
    return np.union1d(kept, extra)


def powers_of_two(end: float) -> np.ndarray:
    return 2.0 ** np.arange(int(np.floor(np.log2(max(end, 1.0)))) + 1)


def dense_multiples(measured: np.ndarray) -> np.ndarray:
    """Multiples of 8 up to 1,024, of 16 up to 2,048 and of 64 beyond, inside the gaps between
    neighbouring measured values at most DENSE_GAP apart (values users pick between dense data)."""
    if len(measured) < 2:
        return np.empty(0)
    lo, hi = measured[0], measured[-1]
    parts, start = [], 0.0
    for until, size in MULTIPLES:
        stop = min(until, hi)
        parts.append(np.arange(np.ceil(max(start, lo) / size) * size, stop + 1, size))
        start = stop
        if stop >= hi:
            break
    candidates = np.unique(np.concatenate(parts))
    right = np.clip(np.searchsorted(measured, candidates, side="right"), 1, len(measured) - 1)
    gap = measured[right] - measured[right - 1]
    return candidates[gap <= DENSE_GAP]


def refine_steps(knots: np.ndarray, measured: np.ndarray,
                 values_at: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Step 5 of DATA_RULE: `knots` plus a knot each side of every step inside the data's range.
    values_at(x) gives the terms' values at x, one row per term. Each round probes the gaps next
    to the knots the last round added (the first: every gap) and narrows wide gaps 16-fold."""
    if len(measured) < 2:
        return knots
    fresh = knots
    for _ in range(STEP_ROUNDS):
        added = _step_knots(knots, fresh, (measured[0], measured[-1]), values_at)
        if not len(added):
            break
        knots, fresh = np.union1d(knots, added), added
    return knots


def _step_knots(knots: np.ndarray, fresh: np.ndarray, data_range: tuple[float, float],
                values_at: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The pairs of knots that bracket the largest change in each gap where linear
    interpolation between the knots misses the terms by more than STEP_TOLERANCE."""
    left, right = knots[:-1], knots[1:]
    near_fresh = np.isin(left, fresh) | np.isin(right, fresh)
    gaps = np.flatnonzero(near_fresh & (left >= data_range[0]) & (right <= data_range[1]))
    probes = [_probes(left[g], right[g]) for g in gaps]
    if not sum(len(p) for p in probes):
        return np.empty(0)
    values = np.atleast_2d(values_at(np.concatenate([knots, *probes])))
    at_knots, at_probes = values[:, :len(knots)], values[:, len(knots):]
    added, start = [], 0
    for g, x in zip(gaps, probes):
        inside = at_probes[:, start:start + len(x)]
        start += len(x)
        if not len(x):
            continue
        linear = np.stack([grid.interp1(x, knots, v) for v in at_knots])
        miss = np.abs(linear - inside) / np.maximum(np.abs(inside), 1e-12)
        if miss.max() <= STEP_TOLERANCE:
            continue
        worst = int(miss.max(axis=1).argmax())
        xs = np.r_[left[g], x, right[g]]
        ys = np.r_[at_knots[worst, g], inside[worst], at_knots[worst, g + 1]]
        jump = int(np.abs(np.diff(ys)).argmax())
        added += [xs[jump], xs[jump + 1]]
    return np.setdiff1d(np.asarray(added, dtype=np.float64), knots)


def _probes(lo: float, hi: float) -> np.ndarray:
    """The integers strictly between lo and hi; PROBES_PER_GAP of them, evenly, where more."""
    first, last = np.floor(lo) + 1, np.ceil(hi) - 1
    if last < first:
        return np.empty(0)
    if last - first + 1 <= PROBES_PER_GAP:
        return np.arange(first, last + 1)
    return np.unique(np.linspace(first, last, PROBES_PER_GAP).round())
