"""How wide a verify batch may be while its logits stay bit-identical to one-token decoding.

Stock llama.cpp's CPU kernels switch algorithms with the batch width (llama-cpp-python 0.3.36:
repacked Q4_K weights use a gemm from 4 rows on; unrepacked K-quants the tiled kernel from 8 rows)
and, past 256 cached tokens, one-token attention over an f16 cache splits the cache over the threads,
rounding differently from any batch (docs/exactness.md has the table per operator). PocketSpec's
build of llama.cpp carries native/patches/row-exact-verify.patch, whose kernels compute batches of
up to 32 rows row for row as one-token decoding does; the probe then finds every width exact.
With --exact-verify the engine caps γ + 1 at the width probed exact at the start and deep into the
context. The probe runs once per model, build and settings and is cached in
POCKETSPEC_HOME/exact_widths/ (pocketspec/measured_cache.py).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from pocketspec.measured_cache import exact_widths_dir, measuring_alone, read_json, write_json

PROBE_FIRST_TOKEN = 1000
# llama.cpp's CPU attention for one token over an f16 cache changes algorithm past 256 cached
# tokens (0.3.36: from 512 cache cells, padded by 256); probing past that catches it.
LONG_CONTEXT_PROBE = 320
# They renumber the GPUs: cuda:0 may be another card from one run to the next
VISIBLE_DEVICES_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def exact_width_cache_key(backend) -> str:
    """The model file, the build and every setting that changes which kernels run where: the devices,
    the split over them and which physical GPUs those ordinals are (not the widest width asked for: one probe
    answers every narrower one)."""
    stat = os.stat(backend.model_path)
    import llama_cpp

    from pocketspec.backends.ggml_ops import cpu_library_identity, row_exact_max_rows

    settings = backend.settings
    parts = [str(backend.model_path.resolve()), str(stat.st_size), str(stat.st_mtime_ns), llama_cpp.__version__,
             llama_cpp.llama_print_system_info().decode(), f"row-exact={row_exact_max_rows()}",
             f"cpu-kernels={cpu_library_identity()}",
             repr(settings.repack_weights),
             str(settings.gpu_layers), str(settings.kv_type), str(LONG_CONTEXT_PROBE),
             ",".join(settings.devices), settings.split_mode, repr(settings.layers_per_device),
             *(f"{name}={os.environ.get(name, '')}" for name in VISIBLE_DEVICES_VARIABLES)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def _row_digest(row) -> bytes:
    """A logits row's bits, as a digest: the probe compares bits, and holding max_width vocabulary-wide rows
    (and a stack of them) would take up to 39 MB beyond what the memory plan holds (qwen 1.5B, 32 rows)."""
    return hashlib.blake2b(np.ascontiguousarray(row), digest_size=16).digest()


def _exact_width_after(backend, num_cached: int, max_width: int) -> int:
    """Largest w <= max_width whose batches, appended after num_cached tokens, match one-token logits."""
    tokens = [(PROBE_FIRST_TOKEN + index) % backend.vocab_size for index in range(num_cached + max_width)]
    backend.rollback(0)
    if num_cached:
        backend.prefill(tokens[:num_cached])
    single_rows = [_row_digest(backend.forward([token], [0])[0]) for token in tokens[num_cached:]]
    exact_width = 1
    for width in range(2, max_width + 1):
        backend.rollback(num_cached)
        batched = backend.forward(tokens[num_cached:num_cached + width], range(width))
        if any(_row_digest(row) != single for row, single in zip(batched, single_rows)):
            break
        exact_width = width
    return exact_width


def _probes_deep(backend, max_width: int) -> bool:
    return backend.max_context > LONG_CONTEXT_PROBE + max_width


def probe_exact_width(backend, max_width: int) -> int:
    """Widest batch that matches one-token logits both at the start and deep into the context."""
    exact_width = _exact_width_after(backend, 0, max_width)
    if exact_width > 1 and _probes_deep(backend, max_width):
        exact_width = min(exact_width, _exact_width_after(backend, LONG_CONTEXT_PROBE, max_width))
    backend.rollback(0)
    return exact_width


def probe_record(backend, max_width: int, exact_width: int) -> dict:
    """What a probe found, as cached: the widest width it tried, and whether it holds deep into the context
    (probed there, or already one row at the start)."""
    return {"max_width": max_width, "exact_width": exact_width,
            "holds_deep": exact_width == 1 or _probes_deep(backend, max_width)}


def width_from_record(record, backend, max_width: int) -> int | None:
    """The exact width up to max_width that a cached probe tells, or None where it tried less: narrower
    widths, or not deep into a context this backend reaches. The probe stops at the first width that
    rounds apart, so a wider probe answers every narrower max_width."""
    if not isinstance(record, dict) or not isinstance(record.get("max_width"), int) or \
            not isinstance(record.get("exact_width"), int) or not 1 <= record["exact_width"] <= record["max_width"]:
        return None  # not a probe's record: probe again
    if record["max_width"] < max_width or (_probes_deep(backend, max_width) and record.get("holds_deep") is not True):
        return None
    return min(record["exact_width"], max_width)


def exact_width(backend, max_width: int, on_measure=None) -> int:
    """The cached probe result for this model, build and settings; probes on a miss (one process at a time),
    after telling on_measure(line)."""
    cache_file = exact_widths_dir() / f"{exact_width_cache_key(backend)}.json"
    width = width_from_record(read_json(cache_file), backend, max_width)
    if width is not None:
        return width
    with measuring_alone():
        # another process may have probed it while this one waited
        width = width_from_record(read_json(cache_file), backend, max_width)
        if width is not None:
            return width
        if on_measure is not None:
            on_measure(f"probing which verify widths (up to {max_width} rows) round like one-token decoding: once "
                       "per model and settings, seconds to a minute")
        width = probe_exact_width(backend, max_width)
        if not write_json(cache_file, probe_record(backend, max_width, width)) and on_measure is not None:
            on_measure(f"could not save the probed verify widths to {cache_file} (is POCKETSPEC_HOME writable?); "
                       "this run uses them, the next one probes again")
    return width


# Stock llama.cpp 0.3.36 computes repacked Q4_K CPU weights with another kernel from this many rows;
# unrepacked ones with the one-token kernel up to 7 rows (docs/exactness.md)
REPACKED_KERNEL_SWITCH_ROWS = 4


def wider_exact_advice(settings, exact_width: int, row_exact_rows: int | None = None) -> str | None:
    """What would widen --exact-verify's batches on llama.cpp's CPU backend, or None. A build without
    the row-exact kernels (row_exact_rows 0; None reads this build's) is pointed at PocketSpec's own,
    then at the stock kernels' levers: a bf16 KV cache where one-token attention parts from batches
    (past 256 cached tokens with f16), unrepacked weights where a repacked kernel caps the width (with
    the row-exact kernels, still the case for repacked Q2_K weights)."""
    if settings.backend != "llama.cpp":
        return None
    from pocketspec.backends.llama_split import is_cpu_planned

    if not is_cpu_planned(settings):
        return None
    if row_exact_rows is None:
        from pocketspec.backends.ggml_ops import row_exact_max_rows

        row_exact_rows = row_exact_max_rows()
    changes = []
    if row_exact_rows == 0:
        changes.append("PocketSpec's build of llama.cpp (native/build_llama_cpp.sh, which applies "
                       "native/patches/row-exact-verify.patch) keeps batches of up to 32 rows exact")
        if exact_width == 1 and settings.kv_type == "f16":
            changes.append("--kv-type bf16 keeps batches exact past 256 cached tokens")
    if settings.repack_weights and exact_width < REPACKED_KERNEL_SWITCH_ROWS:
        changes.append(f"--no-repack lets batches of more than {REPACKED_KERNEL_SWITCH_ROWS - 1} rows stay exact (the "
                       f"kernel for repacked weights changes at {REPACKED_KERNEL_SWITCH_ROWS})")
    return "on llama.cpp's CPU backend " + "; ".join(changes) if changes else None
