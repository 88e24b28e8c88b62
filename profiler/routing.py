"""Routing distributions of a mixture-of-experts layer: how many tokens each expert receives.

"balanced" spreads the slots as evenly as integers allow; "power_law_<alpha>" draws skewed loads as
AIConfigurator's MoE tables do. Draws are seeded by the point, so every host times the same loads.
"""
from __future__ import annotations

import numpy as np

from stepcal.core.errors import InputError
from stepcal.profiler.point import point_rng

POWER_LAW = "power_law_"            # a routing distribution "power_law_<alpha>"


def power_law_alpha(distribution, where: str = "moe") -> float | None:
    """None for "balanced", alpha for "power_law_<alpha>" (alpha > 0); else an InputError."""
    if distribution == "balanced":
        return None
    if isinstance(distribution, str) and distribution.startswith(POWER_LAW):
        try:
            alpha = float(distribution[len(POWER_LAW):])
        except ValueError:
            alpha = None
        if alpha is not None and np.isfinite(alpha) and alpha > 0:
            return alpha
    raise InputError(f"{where}: unknown distribution {distribution!r}; known: balanced, "
                     f"{POWER_LAW}<alpha> with alpha > 0 (e.g. power_law_1.01)")


def expert_loads(distribution: str, num_tokens: int, num_experts: int, top_k: int) -> np.ndarray:
    """Token slots each expert receives when num_tokens tokens pick top_k experts each: int64
    [num_experts], summing to num_tokens * top_k, none above num_tokens (a token picks an expert
    at most once).

    balanced: as equal as integers allow. power_law_<alpha>: loads drawn from a power law of
    exponent alpha, scaled to the slot count, as AIConfigurator's MoE tables are: on
    [1, 0.8 num_tokens] when there are more slots than experts, else on [0.01, 2]. Seeded by the
    point (distribution and shape), so every host times the same loads."""
    slots = num_tokens * top_k
    alpha = power_law_alpha(distribution)
    if alpha is None:
        loads = np.full(num_experts, slots // num_experts, dtype=np.int64)
        loads[:slots % num_experts] += 1
        return loads
    low, high = (1.0, 0.8 * num_tokens) if slots > num_experts else (0.01, 2.0)
    rng = point_rng("moe", distribution, num_tokens, num_experts, top_k)
    draws = _power_law_draws(rng, num_experts, alpha, low, high)
    return _cap_loads(_round_to_total(draws / draws.sum() * slots, slots), num_tokens)


def routed_expert_ids(distribution: str, num_tokens: int, num_experts: int, top_k: int) -> np.ndarray:
    """The experts of each token, [num_tokens, top_k], with expert_loads' loads.

    Slots are dealt expert by expert (most loaded first) down the columns: token t takes slots
    t, t + T, t + 2T, ... An expert's run of at most T consecutive slots then falls on distinct
    tokens, so no token gets an expert twice."""
    loads = expert_loads(distribution, num_tokens, num_experts, top_k)
    order = np.argsort(-loads, kind="stable")
    slots = np.repeat(order, loads[order])
    return slots.reshape(top_k, num_tokens).T.copy()


def _power_law_draws(rng: np.random.Generator, size: int, alpha: float, low: float, high: float) -> np.ndarray:
    """Inverse-CDF draws of a power law x^-alpha truncated to [low, high]."""
    u = rng.uniform(size=size)
    if abs(alpha - 1.0) < 1e-9:                        # the density 1/x: log-uniform
        return low * (high / low) ** u
    a = 1.0 - alpha
    return (low ** a + u * (high ** a - low ** a)) ** (1.0 / a)


def _round_to_total(values: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to total, each the floor or ceiling of its value (largest remainders up)."""
    floors = np.floor(values).astype(np.int64)
    short = total - int(floors.sum())
    floors[np.argsort(-(values - floors), kind="stable")[:short]] += 1
    return floors


def _cap_loads(loads: np.ndarray, cap: int) -> np.ndarray:
    """No load above cap: the excess goes to the most loaded experts still below it (the skew
    stays where it was)."""
    excess = int(np.maximum(loads - cap, 0).sum())
    loads = np.minimum(loads, cap)
    for expert in np.argsort(-loads, kind="stable"):
        if excess == 0:
            break
        extra = min(cap - int(loads[expert]), excess)
        loads[expert] += extra
        excess -= extra
    return loads
