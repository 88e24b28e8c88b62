"""Queueing closed forms for fast screening, before any simulation."""
from __future__ import annotations

from stepcal.core.errors import InputError


def _check_load(rho: float, what: str) -> None:
    if not 0 <= rho < 1:
        raise InputError(f"{what}: load must be in [0, 1) for a stable queue, got {rho:.3f}")


def mg1_mean_wait_s(arrival_rate: float, mean_service_s: float, service_cv: float) -> float:
    """M/G/1 mean wait in queue (Pollaczek-Khinchine): λ·E[S²] / (2(1-ρ)), E[S²] = (1+cv²)·E[S]²."""
    rho = arrival_rate * mean_service_s
    _check_load(rho, "M/G/1")
    second_moment = (1 + service_cv**2) * mean_service_s**2
    return arrival_rate * second_moment / (2 * (1 - rho))


def md1_mean_wait_s(arrival_rate: float, service_s: float) -> float:
    """M/D/1: deterministic service, cv = 0."""
    return mg1_mean_wait_s(arrival_rate, service_s, 0.0)


def mm1_mean_wait_s(arrival_rate: float, mean_service_s: float) -> float:
    return mg1_mean_wait_s(arrival_rate, mean_service_s, 1.0)


def erlang_c(num_servers: int, offered_load: float) -> float:
    """Probability that an arrival waits in M/M/c, with offered load a = λ/μ (Erlang C)."""
    c, a = num_servers, offered_load
    _check_load(a / c, "M/M/c")
    term, total = 1.0, 1.0   # a^k / k!, summed for k < c
    for k in range(1, c):
        term *= a / k
        total += term
    top = term * a / c / (1 - a / c)   # a^c / c! · 1/(1-ρ)
    return top / (total + top)


def mmc_mean_wait_s(arrival_rate: float, mean_service_s: float, num_servers: int) -> float:
    """M/M/c mean wait in queue: C(c, a) / (cμ - λ)."""
    if num_servers < 1:
        raise InputError(f"M/M/c needs at least one server, got {num_servers}")
    a = arrival_rate * mean_service_s
    mu = 1.0 / mean_service_s
    return erlang_c(num_servers, a) / (num_servers * mu - arrival_rate)


def mmc_mean_response_s(arrival_rate: float, mean_service_s: float, num_servers: int) -> float:
    return mmc_mean_wait_s(arrival_rate, mean_service_s, num_servers) + mean_service_s


__all__ = [
    "erlang_c",
    "md1_mean_wait_s",
    "mg1_mean_wait_s",
    "mm1_mean_wait_s",
    "mmc_mean_response_s",
    "mmc_mean_wait_s",
]
