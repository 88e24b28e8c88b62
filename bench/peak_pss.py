"""Wall time and peak memory of a command's whole process tree (issue 17: replications within 2x one run).

    python bench/peak_pss.py [--interval-s 0.2] [--out FILE.json] -- COMMAND [ARGS...]

Every --interval-s seconds it walks the process tree under the command (by parent pid, from /proc) and
sums each process's PSS from /proc/<pid>/smaps_rollup: a page shared by n processes (fork's
copy-on-write pages, shared libraries) counts 1/n in each, so the sum counts it once. Summed RSS is
printed beside it for comparison with earlier notes (RSS counts a shared page in every process).
Prints one line: exit status, wall time, CPU time of the tree (user + system of every process that was
waited for: a figure that does not grow when other work shares the cores), peak PSS and RSS (MB) and
the number of processes at the peak. Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

KB_PER_MB = 1024.0


def children_by_parent() -> dict[int, list[int]]:
    """{ppid: [pid, ...]} over every process visible now."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:          # the process ended while we looked
            continue
        # the command name in parentheses may hold spaces: the fields after its closing one are fixed
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(root: int) -> list[int]:
    tree, found, todo = children_by_parent(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, ()))
    return found


def memory_kb(pid: int) -> tuple[int, int]:
    """(Pss, Rss) of one process in kB; (0, 0) once it has ended."""
    pss = rss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pss, rss


def measure(command: list[str], interval_s: float) -> dict:
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    process = subprocess.Popen(command)
    peak = {"pss_mb": 0.0, "rss_mb": 0.0, "num_processes": 0}
    while process.poll() is None:
        pids = descendants(process.pid)
        sizes = [memory_kb(pid) for pid in pids]
        pss_mb = sum(p for p, _ in sizes) / KB_PER_MB
        if pss_mb > peak["pss_mb"]:
            peak = {"pss_mb": pss_mb, "rss_mb": sum(r for _, r in sizes) / KB_PER_MB,
                    "num_processes": sum(1 for p, _ in sizes if p)}
        time.sleep(interval_s)
    wall_s = time.perf_counter() - wall0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (usage.ru_utime - usage0.ru_utime) + (usage.ru_stime - usage0.ru_stime)
    return {"command": command, "returncode": process.returncode, "wall_s": wall_s, "cpu_s": cpu_s,
            "interval_s": interval_s, "peak_pss_mb": peak["pss_mb"], "rss_mb_at_peak": peak["rss_mb"],
            "num_processes_at_peak": peak["num_processes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval-s", type=float, default=0.2, help="sampling period (default 0.2 s)")
    parser.add_argument("--out", default=None, help="also write the figures to this JSON file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    result = measure(command, args.interval_s)
    print(f"rc {result['returncode']}  wall {result['wall_s']:.1f} s  CPU {result['cpu_s']:.1f} s  peak PSS {result['peak_pss_mb']:.0f} MB "
          f"(summed RSS then {result['rss_mb_at_peak']:.0f} MB, {result['num_processes_at_peak']} processes)",
          file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result["returncode"]


if __name__ == "__main__":
    sys.exit(main())
