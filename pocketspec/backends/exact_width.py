"""How wide a verify batch may be while its logits stay bit-identical to one-token decoding.

llama.cpp's CPU kernels switch algorithms with the batch width (llama-cpp-python
0.3.36 here: repacked Q4_K weights use a gemm path from 4 rows on; without
repacking, another path from 8 rows on) and those round differently. A verify
wider than the exact width could change a greedy token, so the engine caps
γ + 1 at it. The probe runs once per model and settings and is cached on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from pocketspec.catalog import pocketspec_home

PROBE_FIRST_TOKEN = 1000


def _cache_file() -> Path:
    return pocketspec_home() / "exact_verify_width.json"


def _cache_key(backend, max_width: int) -> str:
    stat = os.stat(backend.model_path)
    import llama_cpp

    parts = [str(backend.model_path.resolve()), str(stat.st_size), str(stat.st_mtime_ns), llama_cpp.__version__,
             llama_cpp.llama_print_system_info().decode(), repr(backend.settings.repack_weights),
             str(backend.settings.gpu_layers), str(backend.settings.kv_type), str(max_width)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def probe_exact_width(backend, max_width: int) -> int:
    """Largest w <= max_width such that every batch of width <= w matches one-token logits exactly."""
    backend.rollback(0)
    probe_tokens = [(PROBE_FIRST_TOKEN + index) % backend.vocab_size for index in range(max_width)]
    single_rows = [backend.forward([token], [0])[0].copy() for token in probe_tokens]
    exact_width = 1
    for width in range(2, max_width + 1):
        backend.rollback(0)
        batched = backend.forward(probe_tokens[:width], range(width))
        if not np.array_equal(batched, np.stack(single_rows[:width])):
            break
        exact_width = width
    backend.rollback(0)
    return exact_width


def exact_width(backend, max_width: int) -> int:
    """The cached probe result for this model, build and settings; probes on a miss."""
    key = _cache_key(backend, max_width)
    cache_file = _cache_file()
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return int(cache[key])
    width = probe_exact_width(backend, max_width)
    cache[key] = width
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(cache, indent=1))
        os.replace(temporary, cache_file)
    except OSError:
        pass  # a read-only home only costs a probe next time
    return width
