"""Bound oneDNN's caches of matmul kernels, which torch's bf16 linears fill on a CPU.

Each distinct input shape of a bf16 linear (its row count: every verify width and prompt chunk
length a run meets) builds a oneDNN primitive with its own JIT-compiled kernel, about 1 MiB, kept in
two caches of 1024 entries each (ideep's LRU_CACHE_CAPACITY, oneDNN's ONEDNN_PRIMITIVE_CACHE_CAPACITY).
SmolLM2-135M in bf16 grew 350 MiB over 128 forward widths (torch 2.13 CPU, Zen 4 EPYC, 2026-12-07),
past any --memory-budget. Both are read when the first primitive is made, so setting them before the
first forward bounds them; memplanner.torch_peak counts what the bound holds, so a larger value the
environment gave is replaced. ideep's cache is per thread: a process whose forwards run on two threads
(a server's engine thread after a calibration on the main one) can hold the bound twice. benchmarks/onednn_cache_memory.py measures both bounds: 48 MiB of growth
against 349 MiB, and where every forward is a width not met for 48 kernels, each rebuilds its kernels.
"""

from __future__ import annotations

import os

from memplanner.torch_peak import ONEDNN_CACHED_PRIMITIVES

CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_onednn_caches() -> None:
    for name in CACHE_VARIABLES:
        given = os.environ.get(name, "")
        os.environ[name] = given if given.isdigit() and int(given) < ONEDNN_CACHED_PRIMITIVES \
            else str(ONEDNN_CACHED_PRIMITIVES)
