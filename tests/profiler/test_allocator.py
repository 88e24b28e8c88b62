"""The CPU profiler's and engine's allocator setting: glibc's own by default, applied in fact when
asked for (a big block is no longer mapped on its own), and refused for an unknown choice."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepcal.core.errors import InputError
from stepcal.profiler import allocator

ROOT = Path(__file__).resolve().parents[2]
glibc_only = pytest.mark.skipif(not (hasattr(os, "confstr") and os.confstr("CS_GNU_LIBC_VERSION")),
                                reason="mallopt's thresholds are glibc's")

# In a fresh process: apply the setting, malloc 4 MiB and read glibc's chunk header, whose size
# word (just before the pointer) has bit 1 set when the chunk was mapped on its own (IS_MMAPPED).
PROBE = """
import ctypes, json
from stepcal.profiler.allocator import configure_allocator
record = configure_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
block = libc.malloc(4 * 2**20)
size_word = ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value
libc.free(block)
print(json.dumps({"record": record, "mmapped": bool(size_word & 2)}))
"""


def probe(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in (allocator.ENV, *allocator.GLIBC_ENV)}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@glibc_only
def test_the_warm_allocator_keeps_a_big_block_in_the_heap():
    warm = probe(STEPCAL_ALLOCATOR="warm")
    assert warm["record"] == {"allocator": "warm", "mmap_threshold_bytes": 32 * 2**20,
                              "trim_threshold_bytes": 2**30}
    assert not warm["mmapped"]


@glibc_only
@pytest.mark.parametrize("choice", [None, "system", "System "])
def test_by_default_glibc_maps_big_blocks_on_their_own(choice):
    plain = probe() if choice is None else probe(STEPCAL_ALLOCATOR=choice)
    assert plain["record"] == {"allocator": "system", "reason": "default"}
    assert plain["mmapped"]


@glibc_only
def test_a_users_own_glibc_thresholds_are_left_alone():
    own = probe(STEPCAL_ALLOCATOR="warm", MALLOC_TRIM_THRESHOLD_="12345")
    assert own["record"]["allocator"] == "system" and own["record"]["MALLOC_TRIM_THRESHOLD_"] == "12345"
    assert own["mmapped"]                    # the mmap threshold is still glibc's own


def test_an_unknown_choice_is_an_input_error(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "tcmalloc")
    with pytest.raises(InputError, match="STEPCAL_ALLOCATOR must be one of system, warm, got 'tcmalloc'"):
        allocator.configure_allocator()
