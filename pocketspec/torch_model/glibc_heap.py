"""glibc's heap under torch on a CPU: what it keeps of freed tensors, and giving it back.

glibc serves an allocation of at least its mmap threshold with a mapping of its own, which free
returns to the OS at once. The threshold starts at 128 KiB, but whenever a freed mapping is larger
than it, glibc raises it to that mapping's size (up to 32 MiB): from then on buffers of that size come
from the heap, which keeps what is freed in it. Forwards of changing widths (verify widths, the last
chunks of prompts, a prompt chunk's attention scores) leave holes there that later, larger buffers do
not fit, so the heap grows width after width. Fixing the threshold (mallopt's M_MMAP_THRESHOLD) turns
the raising off.

Measured on SmolLM2-135M (torch 2.13 CPU, 2 threads, Zen 4 EPYC, 2026-12-07):
- benchmarks/heap_threshold_memory.py, resident growth from the loading to after a 512-token prefill
  and one forward of every width 1-128 (the touched KV pages included), glibc's own threshold against
  512 KiB: int8 35 against 17 MiB, fp32 25 against 16.5, int4 18 against 15.7, bf16 66 against 61
  (oneDNN's kernels, onednn_caches.py). Verify forwards took alike. A 512-token prefill in chunks of 128,
  whose larger buffers are now mapped and faulted in each time, took longer for int4 and fp32: medians
  0.98 against 1.15 s and 1.20 against 1.33 s there, 1.05 against 1.10 and 1.13 against 1.20 in a second
  run of three rounds (int8 and bf16 alike).
- Forwards of widths 1-128 from an empty cache, int8: 47-55 MiB of growth with glibc's own threshold
  (malloc_trim gave 48 of it back), 8 MiB at 512 KiB; 2-3 MiB at 128 KiB, 25 at 2 MiB, 46 at 8 MiB.
  At 128 KiB every prompt chunk maps and faults in hundreds of buffers, and prefill ran up to 2x slower.
- generate, int8, self-sparse, a 1,624-token prompt, 150 tokens, --memory-budget 760MiB (planned
  711.69 MiB), three alternating pairs of runs: peaks 748-756 MiB with glibc's own threshold (781 in an
  earlier run on a loaded machine) against 715-718 at 512 KiB; prefill 4.0-4.7 s against 4.7-7.5 and
  decode 43-50 tok/s against 35-53.

A user who tunes glibc's malloc (MALLOC_MMAP_THRESHOLD_ and its kin, or their glibc.malloc tunables in
GLIBC_TUNABLES; each of them turns the raising off too) keeps their settings. Not glibc: nothing to do.
"""

from __future__ import annotations

import ctypes
import functools
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 512 * 1024
# glibc's settings that fix the threshold, as environment variables and as tunables
USERS_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
USERS_MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.top_pad",
                         "glibc.malloc.mmap_max")


@functools.cache
def _libc_function(name: str):
    """The C library's function of this process (None where it has none: not glibc)."""
    try:
        return getattr(ctypes.CDLL(None), name, None)
    except OSError:
        return None


def tunes_malloc(environ) -> bool:
    """Whether the user set one of glibc's malloc settings that fix the threshold."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in USERS_MALLOC_VARIABLES) or any(name in tunables
                                                                          for name in USERS_MALLOC_TUNABLES)


def fix_mmap_threshold() -> None:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES, unless the user tunes malloc."""
    mallopt = _libc_function("mallopt")
    if mallopt is not None and not tunes_malloc(os.environ):
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_freed_memory() -> None:
    """Give what the heap keeps freed back to the OS: the float32 staging of the tensor just loaded.

    Before the threshold was fixed, loading SmolLM2 as int8 kept 360 MiB of freed float32 in RSS
    (measured 2026-11-23); the staging chunks are over the threshold now, and this returns what smaller
    buffers left. Not glibc: nothing to do.
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)
