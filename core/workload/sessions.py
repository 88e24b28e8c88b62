"""Generated workloads with reuse: shared system prompts and multi-turn sessions, with the prefix
hash ids that say what they share.

Each arrival of the arrival process starts a session of one or more turns. Turn k's prompt is the
session's system prompt (one of `num_systems`, picked uniformly), then every earlier turn's user
part and answer, then its own user part. Ids name 16-token blocks of that token stream: a block
wholly inside a system prompt gets that prompt's id, a block wholly inside a session's stream the
session's id for that position, and a prompt's last partial block an id of its own (its content
differs from the longer prompts that later cover the same block).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepcal.core.bounds import MAX_ARRIVAL_S, MAX_PREFIX_IDS, MAX_REQUESTS, MAX_TOKENS_PER_REQUEST
from stepcal.core.errors import InputError
from stepcal.core.trace import PREFIX_BLOCK_TOKENS, Trace


@dataclass(frozen=True)
class SharedSystem:
    """A system prompt of num_tokens in front of every prompt, one of num_systems."""
    num_tokens: int
    num_systems: int = 1


@dataclass(frozen=True)
class SessionShape:
    """Turns per session (a length distribution's samples), exponential think times of mean think_s;
    closed: a turn is sent think time after the previous answer finished (the simulator releases
    it), else at the previous turn's arrival plus the think time."""
    turns: object
    think_s: float = 0.0
    closed: bool = True


@dataclass
class _Ids:
    """Hands out fresh ids."""
    next_id: int = 0

    def take(self, count: int) -> np.ndarray:
        ids = np.arange(self.next_id, self.next_id + count, dtype=np.int64)
        self.next_id += count
        return ids


def session_trace(arrival_s: np.ndarray, user_tokens, output_tokens, rng: np.random.Generator, *,
                  system: SharedSystem | None, sessions: SessionShape | None, source: str) -> Trace:
    """The trace of sessions starting at arrival_s. user_tokens(size) and output_tokens(size) sample
    lengths; with sessions None every session has one turn."""
    num_sessions = len(arrival_s)
    label = f"generator spec {source!r}"
    turns = np.ones(num_sessions, dtype=np.int64) if sessions is None else sessions.turns.sample(rng, num_sessions)
    total = int(turns.sum())
    if total > MAX_REQUESTS:
        raise InputError(f"{label}: {num_sessions:,} sessions of turns= make {total:,} requests; at most "
                         f"{MAX_REQUESTS:,} (MAX_REQUESTS, core.bounds): fewer sessions or turns")
    user, output = user_tokens(total), output_tokens(total)
    think = rng.exponential(sessions.think_s, total) if sessions is not None and sessions.think_s > 0 \
        else np.zeros(total)
    _check_sizes(label, arrival_s, turns, user, output, think, system.num_tokens if system is not None else 0)
    which_system = rng.integers(0, system.num_systems, num_sessions) if system is not None else None
    ids = _Ids()
    system_ids = [ids.take(system.num_tokens // PREFIX_BLOCK_TOKENS) for _ in range(system.num_systems)] \
        if system is not None else []
    rows = {"arrival_s": [], "prompt": [], "session": [], "turn": [], "think": [], "hashes": []}
    start = 0
    for s in range(num_sessions):
        system_tokens = system.num_tokens if system is not None else 0
        shared = system_ids[which_system[s]] if system is not None else np.zeros(0, np.int64)
        _add_session(rows, ids, s, float(arrival_s[s]), system_tokens, shared, user[start:start + turns[s]],
                     output[start:start + turns[s]], think[start:start + turns[s]], sessions)
        start += turns[s]
    order = np.argsort(np.asarray(rows["arrival_s"]), kind="stable")
    columns = {}
    if sessions is not None:
        columns["session_id"] = np.asarray(rows["session"], dtype=np.int64)[order]
        columns["turn"] = np.asarray(rows["turn"], dtype=np.int64)[order]
        if sessions.closed:
            columns["think_time_s"] = np.asarray(rows["think"], dtype=np.float64)[order]
    return Trace.from_arrays(np.asarray(rows["arrival_s"])[order], np.asarray(rows["prompt"])[order],
                             output[order], source=source,
                             prefix_hash_ids=[rows["hashes"][i] for i in order.tolist()], **columns)


def _check_sizes(label: str, arrival_s, turns, user, output, think, system_tokens: int) -> None:
    """Refuse, before any id list is built, a turn whose prompt (system prompt, earlier turns and
    its own user part) passes MAX_TOKENS_PER_REQUEST, ids past MAX_PREFIX_IDS in all, or a turn
    whose arrival (open loop) or earliest send (closed loop: the think times alone) passes a year."""
    first = np.concatenate(([0], np.cumsum(turns)[:-1]))        # each session's first row
    def within(values):   # running sum of values within each session, row by row
        running = np.cumsum(values)
        return running - np.repeat(running[first] - values[first], turns)
    prompt = system_tokens + within(user) + within(output) - output
    if prompt.max() > MAX_TOKENS_PER_REQUEST:
        row = int(np.argmax(prompt > MAX_TOKENS_PER_REQUEST))
        turn = row - int(first[np.searchsorted(first, row, side="right") - 1])
        raise InputError(f"{label}: turn {turn} of a session has a {int(prompt[row]):,}-token prompt (system= "
                         f"plus every earlier turn's prompt= part and output=), past {MAX_TOKENS_PER_REQUEST:,} "
                         f"(MAX_TOKENS_PER_REQUEST, core.bounds): fewer turns= or shorter prompt=/output=")
    num_ids = int((-(-prompt // PREFIX_BLOCK_TOKENS)).sum())
    if num_ids > MAX_PREFIX_IDS:
        raise InputError(f"{label}: its prompts hold {num_ids:,} prefix blocks of {PREFIX_BLOCK_TOKENS} tokens "
                         f"(turn k repeats turns 0..k-1), past {MAX_PREFIX_IDS:,} ids (MAX_PREFIX_IDS, core.bounds): "
                         f"fewer sessions or turns=, or shorter prompt=/output=")
    think = think.copy()
    think[first] = 0.0
    latest = np.repeat(arrival_s, turns) + within(think)
    if not latest.max() <= MAX_ARRIVAL_S:
        raise InputError(f"{label}: think= times put a turn at {latest.max():.3g} s or later, past a year "
                         f"(MAX_ARRIVAL_S, core.bounds): a shorter think= or fewer turns=")


def _add_session(rows: dict, ids: _Ids, session: int, start_s: float, system_tokens: int, system_ids,
                 user, output, think, shape: SessionShape | None) -> None:
    """Append one session's turns: prompts, ids, arrival times and think times."""
    num_turns = len(user)
    # the session's token stream: system prompt, then user part k and answer k for each turn
    prompt_tokens = system_tokens + np.cumsum(user) + np.concatenate(([0], np.cumsum(output)[:-1]))
    full_blocks = int(prompt_tokens[-1]) // PREFIX_BLOCK_TOKENS
    stream_ids = ids.take(max(0, full_blocks - len(system_ids)))
    arrival = start_s
    for k in range(num_turns):
        tokens = int(prompt_tokens[k])
        num_full = tokens // PREFIX_BLOCK_TOKENS
        chain = np.concatenate((system_ids[:num_full], stream_ids[:max(0, num_full - len(system_ids))]))
        if tokens % PREFIX_BLOCK_TOKENS:
            chain = np.concatenate((chain, ids.take(1)))   # the partial last block: this prompt's own
        if k > 0:
            arrival += float(think[k])   # open loop; a closed loop's is a placeholder, replaced when run
        rows["arrival_s"].append(arrival)
        rows["prompt"].append(tokens)
        rows["session"].append(session)
        rows["turn"].append(k)
        rows["think"].append(float(think[k]) if k > 0 else np.nan)
        rows["hashes"].append(chain.tolist())
