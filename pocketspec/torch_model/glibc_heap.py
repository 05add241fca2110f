"""glibc's heap under torch on a CPU: what it keeps of freed tensors, and giving it back.

glibc serves an allocation of at least its mmap threshold with a mapping of its own, which free
returns to the OS at once. The threshold starts at 128 KiB, but the first time such a mapping is
freed glibc raises it to that mapping's size (up to 32 MiB): from then on buffers of that size come
from the heap, which keeps what is freed in it. Forwards of changing widths (verify widths, the last
chunks of prompts, a prompt chunk's attention scores) leave holes there that later, larger buffers do
not fit, so the heap grows width after width. Fixing the threshold (mallopt's M_MMAP_THRESHOLD) turns
the raising off.

Measured on SmolLM2-135M (torch 2.13 CPU, 2 threads, Zen 4 EPYC, 2026-12-07):
- benchmarks/heap_threshold_memory.py, resident growth from the loading to after a 512-token prefill
  and one forward of every width 1-128 (the touched KV pages included), glibc's own threshold against
  512 KiB: int8 35 against 17 MiB, fp32 25 against 16.5, int4 18 against 15.7, bf16 66 against 61
  (oneDNN's kernels, onednn_caches.py). Verify forwards took alike; a 512-token prefill in chunks of 128,
  whose larger buffers are now mapped and faulted in each time, took a few percent longer (medians of
  three rounds: int4 1.05 against 1.10 s, fp32 1.13 against 1.20 s).
- Forwards of widths 1-128 from an empty cache, int8: 49-55 MiB of growth with glibc's own threshold
  (malloc_trim gave 48 of it back), 8 MiB at 512 KiB; 2-3 MiB at 128 KiB, 25 at 2 MiB, 46 at 8 MiB.
  At 128 KiB every prompt chunk maps and faults in hundreds of buffers, and prefill ran up to 2x slower.
- generate, int8, self-sparse, a 1,624-token prompt, 150 tokens, --memory-budget 760MiB (planned
  711.69 MiB), three alternating pairs of runs: peaks 748-756 MiB with glibc's own threshold (781 in an
  earlier run on a loaded machine) against 715-718 at 512 KiB; prefill 4.0-4.7 s against 4.7-7.5 and
  decode 43-50 tok/s against 35-53.

A threshold the user gave (MALLOC_MMAP_THRESHOLD_, or glibc.malloc.mmap_threshold in GLIBC_TUNABLES)
is kept. Not glibc: nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 512 * 1024
USERS_THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"
THRESHOLD_TUNABLE = "glibc.malloc.mmap_threshold"


@functools.cache
def _libc_function(name: str):
    library = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(library), name, None) if library else None


def map_large_buffers() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES, unless the user set one; whether it was set."""
    users_tunables = os.environ.get("GLIBC_TUNABLES", "")
    if USERS_THRESHOLD_VARIABLE in os.environ or THRESHOLD_TUNABLE in users_tunables:
        return False
    mallopt = _libc_function("mallopt")
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def release_freed_memory() -> None:
    """Give what the heap keeps freed back to the OS: the float32 staging of the tensor just loaded.

    Before the threshold was fixed, loading SmolLM2 as int8 kept 360 MiB of freed float32 in RSS
    (measured 2026-11-23); the staging chunks are over the threshold now, and this returns what smaller
    buffers left. Not glibc: nothing to do.
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
