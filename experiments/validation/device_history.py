"""The device's history: run-to-run speed pairs kept across campaigns, so that each new campaign's
run_cv pools every earlier campaign's pairs on the same machine without naming them.

A campaign alone has three pairs of repeats, which put run_cv anywhere from a third of its value to
1.6 times it (experiments.validation.scatter). The speed spread is the machine's, not the
campaign's: a ledger keeps, per measured run of two or more repeats, its device (the fingerprint
fields that make two runs the same device), its pairs' log ratios, where it was and when. The runs
themselves may be deleted or overwritten later; their pairs stay.

One JSON object per line. The file is rewritten whole (under a lock, through a temporary file), so
an interrupted campaign leaves it as it was. Lines this version cannot read are skipped and counted.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from stepcal.core.io import atomic_write_bytes
from stepcal.core.measured_run import repeat_dirs
from stepcal.core.run_meta import RunMeta
from stepcal.experiments.validation.scatter import DEVICE_FIELDS, RunPairs, differing_field, run_pairs

ENV = "STEPCAL_HISTORY"      # the ledger's path, or "off"
MAX_ENTRIES = 2000           # the oldest are dropped past this: a machine's noise changes over months


def history_file(given: str | None = None) -> Path | None:
    """The ledger: `given` (quickstart's --history; "off": none), else $STEPCAL_HISTORY ("off" or
    empty: none), else $XDG_CACHE_HOME/stepcal/device_history.jsonl, else
    ~/.cache/stepcal/device_history.jsonl."""
    if given is not None:
        return None if given.strip().lower() == "off" else Path(given)
    given = os.environ.get(ENV)
    if given is not None:
        return None if given.strip().lower() in ("", "off") else Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "stepcal" / "device_history.jsonl"


@dataclass(frozen=True)
class HistoryEntry:
    """One measured run's pairs: log(T_1 / T_0), log(T_3 / T_2), ... of its repeats' total step time."""
    run: str              # the run's directory when it was recorded (it may be gone since)
    campaign: str         # what recorded it (a quickstart's --out)
    recorded_at: str      # ISO time
    device: dict          # the fingerprint's DEVICE_FIELDS
    ratios: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"run": self.run, "campaign": self.campaign, "recorded_at": self.recorded_at,
                "device": self.device, "log_ratios": list(self.ratios)}

    @classmethod
    def from_dict(cls, data: dict) -> HistoryEntry:
        ratios = tuple(float(r) for r in data["log_ratios"])
        if not ratios or not all(abs(r) < 5 for r in ratios) or not isinstance(data["device"], dict):
            raise ValueError("no pairs, a ratio out of range or no device")
        return cls(str(data["run"]), str(data["campaign"]), str(data["recorded_at"]), data["device"], ratios)

    def pairs(self) -> RunPairs:
        """As measured_scatter takes the runs of --scatter-runs."""
        return RunPairs(Path(self.run), RunMeta(fingerprint=self.device), self.ratios)


@dataclass(frozen=True)
class History:
    entries: tuple[HistoryEntry, ...]
    num_unreadable: int = 0     # lines skipped

    def matching(self, fingerprint: dict | None, exclude_under: Sequence[str | Path] = ()) -> list[HistoryEntry]:
        """The entries of the device `fingerprint`, leaving out runs under any of `exclude_under`: the
        campaign writing there now replaces what an earlier one left, and runs given by name
        (--scatter-runs) count once."""
        skip = [Path(p).resolve() for p in exclude_under]
        return [e for e in self.entries if same_device(fingerprint, e.device)
                and not any(Path(e.run).resolve().is_relative_to(p) for p in skip)]


def same_device(fingerprint: dict | None, device: dict) -> bool:
    """Whether every DEVICE_FIELDS both name agree (a missing fingerprint matches nothing)."""
    return isinstance(fingerprint, dict) and differing_field(fingerprint, device) is None


def read_history(path: str | Path) -> History:
    """The ledger at `path` (empty when there is none)."""
    path = Path(path)
    if not path.exists():
        return History(())
    entries, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            entries.append(HistoryEntry.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            bad += 1
    return History(tuple(entries), bad)


def device_fields(fingerprint: dict | None) -> dict:
    return {f: fingerprint[f] for f in DEVICE_FIELDS if isinstance(fingerprint, dict) and f in fingerprint}


def record_runs(path: str | Path, runs: Iterable[str | Path], campaign: str | Path) -> list[HistoryEntry]:
    """Add the pairs of `runs` (measured runs of two or more repeats; others are passed over) to the
    ledger at `path`, replacing earlier entries of the same run directories. -> the entries added."""

    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    added = []
    for run in runs:
        if len(repeat_dirs(run)) < 2:
            continue
        pairs = run_pairs(run)
        added.append(HistoryEntry(str(Path(run).resolve()), str(Path(campaign).resolve()), now,
                                  device_fields(pairs.meta.fingerprint), pairs.ratios))
    if added:
        _rewrite(Path(path), added)
    return added


def _rewrite(path: Path, added: Sequence[HistoryEntry]) -> None:
    """Under an exclusive lock: the ledger's entries minus those of the added runs, plus them."""

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # two campaigns ending together both keep their runs
        replaced = {e.run for e in added}
        kept = [e for e in read_history(path).entries if e.run not in replaced]
        entries = [*kept, *added][-MAX_ENTRIES:]
        atomic_write_bytes(path, "".join(json.dumps(e.to_dict()) + "\n" for e in entries).encode())


def describe(entries: Sequence[HistoryEntry]) -> str:
    """E.g. '9 pairs of 9 runs from 1 earlier campaign'."""
    campaigns = {e.campaign for e in entries}
    pairs = sum(len(e.ratios) for e in entries)
    return (f"{pairs} pair(s) of {len(entries)} run(s) from {len(campaigns)} earlier "
            f"campaign{'s' if len(campaigns) != 1 else ''}")
