"""Per-position acceptance rates fitted from a measured run's spec-decode counters.

vLLM counts verify rounds (`num_drafts`) and, per draft position j, the rounds whose draft j passed
(`num_accepted_tokens_per_pos`); a simulate summary.json's `spec_decode` block has the same keys.
Draft j can pass only when drafts 1..j-1 did, so the conditional rate at j is
per_pos[j] / per_pos[j - 1] (per_pos[0] / num_drafts at the first). Measured rates can rise with
position where few rounds reached it; the fit pools adjacent positions that rise (weighted by the
rounds that reached them), the least-squares non-increasing rates.
"""
from __future__ import annotations

import json
from pathlib import Path

from stepcal.core.errors import InputError


def read_counters(path: Path) -> tuple[int, list[int]]:
    """(num_drafts, num_accepted_tokens_per_pos) from a JSON file: vLLM's counters at the top level or
    under `spec_decode` (a simulate summary.json)."""
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise InputError(f"{path}: cannot read the counters ({error.strerror})") from None
    except ValueError:
        raise InputError(f"{path}: not valid JSON") from None
    block = data.get("spec_decode", data) if isinstance(data, dict) else None
    if not isinstance(block, dict) or "num_drafts" not in block or "num_accepted_tokens_per_pos" not in block:
        raise InputError(f"{path}: needs num_drafts and num_accepted_tokens_per_pos (vLLM's spec-decode counters)")
    num_drafts, per_pos = block["num_drafts"], block["num_accepted_tokens_per_pos"]
    if not (isinstance(num_drafts, int) and num_drafts > 0 and isinstance(per_pos, list) and per_pos
            and all(isinstance(c, int) and c >= 0 for c in per_pos)):
        raise InputError(f"{path}: num_drafts must be a positive integer and num_accepted_tokens_per_pos "
                         f"a list of counts")
    reached = [num_drafts, *per_pos]
    for j in range(1, len(reached)):
        if reached[j] > reached[j - 1]:
            raise InputError(f"{path}: num_accepted_tokens_per_pos[{j - 1}] = {reached[j]} exceeds the rounds "
                             f"that reached position {j} ({reached[j - 1]})")
    return num_drafts, per_pos


def fitted_rates(num_drafts: int, per_pos: list[int]) -> tuple[float, ...]:
    """Non-increasing conditional rates, pooled where the measured ones rise (pool adjacent violators);
    positions no round reached take the last reached position's rate."""
    reached = [num_drafts, *per_pos]
    blocks: list[list[float]] = []   # [passed, reached, positions] per pooled block
    for j, passed in enumerate(per_pos):
        if reached[j] == 0:
            break
        blocks.append([float(passed), float(reached[j]), 1])
        while len(blocks) > 1 and blocks[-1][0] / blocks[-1][1] > blocks[-2][0] / blocks[-2][1]:
            passed_last, reached_last, count_last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + passed_last, blocks[-1][1] + reached_last, blocks[-1][2] + count_last]
    rates = [p / r for p, r, count in blocks for _ in range(int(count))]
    rates += [rates[-1] if rates else 0.0] * (len(per_pos) - len(rates))
    return tuple(rates)
