"""Checks of a trace file's multi-turn sessions (session_id, turn, think_time_s), with errors that name
the file and the lines, as the column checks of core.workload.validate do.

How the simulator replays a session decides what is wrong: a closed-loop turn (think_time_s given)
is sent think_time_s after its previous turn finished, so its arrival_s is a placeholder; an
open-loop turn (think_time_s empty, or no such column) is sent at its own arrival_s. Its prompt
holds the previous turn's answer, so an open-loop turn that arrives before the previous turn of its
session cannot have been sent by a client: that is an error, not something to sort away.
"""
from __future__ import annotations

import numpy as np

from stepcal.core.bounds import MAX_ARRIVAL_S
from stepcal.core.errors import InputError
from stepcal.core.workload.validate import Where


def think_times(where: Where, series, values: np.ndarray) -> np.ndarray:
    """think_time_s: empty (NaN, an open-loop turn) or seconds in [0, MAX_ARRIVAL_S]."""
    where.reject(series, "think_time_s", values < 0, "must be non-negative seconds (or empty)")
    where.reject(series, "think_time_s", values > MAX_ARRIVAL_S, f"must be at most {MAX_ARRIVAL_S:g} s "
                 f"(a year, MAX_ARRIVAL_S, core.bounds): seconds expected")
    return values


def check_sessions(where: Where, labels, arrival_s: np.ndarray, session_id: np.ndarray | None,
                   turn: np.ndarray | None, think_s: np.ndarray | None) -> None:
    """A (session, turn) pair names one row; a closed-loop turn follows an earlier one; an open-loop
    turn arrives no earlier than its session's previous turn; no turn is sent past MAX_ARRIVAL_S.
    `labels` are the rows' index labels (where.row prints them)."""
    if session_id is None:
        return
    if turn is not None and (turn < 0).any():
        raise _error(where, labels, [int(np.argmax(turn < 0))], "column 'turn' must not be negative")
    # the simulator's order: by session, then by turn (else by arrival, as the trace is sorted)
    within = turn if turn is not None else arrival_s
    order = np.lexsort((np.arange(len(arrival_s)), within, session_id))
    prev, this = order[:-1], order[1:]
    same = session_id[prev] == session_id[this]
    if turn is not None and (same & (turn[prev] == turn[this])).any():
        i = int(np.argmax(same & (turn[prev] == turn[this])))
        raise _error(where, labels, [prev[i], this[i]], f"session {int(session_id[this[i]])} has turn "
                     f"{int(turn[this[i]])} twice")
    closed = np.zeros(len(arrival_s), dtype=bool) if think_s is None else np.isfinite(think_s)
    first = np.ones(len(arrival_s), dtype=bool)
    first[this] = ~same
    if (closed & first).any():
        row = int(np.argmax(closed & first))
        raise _error(where, labels, [row], f"think_time_s is given for the first turn of session "
                     f"{int(session_id[row])}: a closed-loop turn follows an earlier one")
    early = same & ~closed[this] & (arrival_s[this] < arrival_s[prev])
    if early.any():
        i = int(np.argmax(early))
        raise _error(where, labels, [prev[i], this[i]], f"session {int(session_id[this[i]])}: an open-loop "
                     f"turn (no think_time_s) arrives at {arrival_s[this[i]]:g} s, before the session's "
                     f"previous turn at {arrival_s[prev[i]]:g} s, yet its prompt holds that turn's answer")
    _check_send_times(where, labels, order, arrival_s, closed, think_s)


def _check_send_times(where: Where, labels, order, arrival_s, closed, think_s) -> None:
    """A closed-loop turn is sent no earlier than the last open-loop turn before it plus the think
    times between: past MAX_ARRIVAL_S, the simulator would run for more than a year of trace time."""
    if think_s is None:
        return
    think = np.where(closed, think_s, 0.0)[order]
    running = np.cumsum(think)
    positions = np.arange(len(order))
    last_open = np.maximum.accumulate(np.where(closed[order], 0, positions))
    earliest = arrival_s[order][last_open] + running - running[last_open]
    late = earliest > MAX_ARRIVAL_S
    if late.any():
        row = int(order[np.argmax(late)])
        raise _error(where, labels, [row], f"column 'think_time_s': this turn's think time and its session's "
                     f"earlier ones send it at "
                     f"{earliest[np.argmax(late)]:.3g} s or later, past a year (MAX_ARRIVAL_S, core.bounds)")


def _error(where: Where, labels, rows, problem: str) -> InputError:
    places = " and ".join(where.row(labels[int(r)]) for r in rows)
    return InputError(f"{where.path}: {places}: {problem}")
