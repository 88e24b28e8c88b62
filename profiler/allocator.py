"""The C allocator of a process that times the engine on the CPU.

glibc hands a freed block of 128 KiB or more back to the kernel at once, and trims the heap's
free top beyond 128 KiB (the mmap threshold then adapts upwards, but only to blocks already
freed). A step's activations on the CPU are MiB per thousand tokens, so a big step maps them
afresh and pays page faults and zeroing that a long-running server, whose heap is warm, pays
once. The same 7,609-token step served four times in one process took 974, 330, 291 and 289 ms;
with freed memory kept, 311, 268 and 241 ms. STEPCAL_ALLOCATOR=warm makes profiles and measured
runs keep freed memory in the process: the mmap threshold at glibc's 64-bit maximum (32 MiB) and
the trim threshold at 1 GiB, process-wide for the rest of the process. It is not the default: over
paired quickstarts it met more of the profiled path's cells on one 2-core VM (101 against 77 of
108) and fewer on another (112 against 120 of 144), where it raised the engine's capacity under
continuous batching by 5-13% (Sarathi's moved -5% to +5%).
The default, `system`, leaves glibc as it is; a user's own MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ are respected either way. Profile and runs should be taken with the same
setting: each meta.json records it as `allocator`.
"""
from __future__ import annotations

import ctypes
import os

from stepcal.core.errors import InputError

M_TRIM_THRESHOLD = -1                # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20    # the largest glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 2**30
ENV = "STEPCAL_ALLOCATOR"
CHOICES = ("system", "warm")
GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_applied: dict | None = None         # what this process did, once


def configure_allocator() -> dict:
    """Apply STEPCAL_ALLOCATOR to this process (once; later calls return the first call's record).
    Returns what was done, for a profile's or a run's meta.json: {"allocator": "warm", ...} or
    {"allocator": "system", "reason": ...}. Raises InputError for an unknown STEPCAL_ALLOCATOR."""
    global _applied
    choice = os.environ.get(ENV, "system").strip().lower() or "system"
    if choice not in CHOICES:
        raise InputError(f"{ENV} must be one of {', '.join(CHOICES)}, got {os.environ[ENV]!r}")
    if _applied is None:
        _applied = _apply() if choice == "warm" else {"allocator": "system", "reason": "default"}
    return dict(_applied)


def _apply() -> dict:
    own = [name for name in GLIBC_ENV if name in os.environ]
    if own:
        return {"allocator": "system", "reason": f"the user's {', '.join(own)}",
                **{name: os.environ[name] for name in own}}
    libc = _glibc()
    if libc is None:
        return {"allocator": "system", "reason": "not glibc"}
    ok = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
          and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    if not ok:
        return {"allocator": "system", "reason": "mallopt refused the thresholds"}
    return {"allocator": "warm", "mmap_threshold_bytes": MMAP_THRESHOLD_BYTES,
            "trim_threshold_bytes": TRIM_THRESHOLD_BYTES}


def _glibc():
    """glibc's handle, or None on another C library (musl, macOS: their allocators differ)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        libc = ctypes.CDLL("libc.so.6")
    except (AttributeError, ValueError, OSError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
