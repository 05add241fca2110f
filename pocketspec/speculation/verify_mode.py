"""Which verify mode one sequence runs when the user names none (--exact-verify / --fast-verify):
exact where it costs no speed, fast elsewhere, and how the chat banner and the notes name it.

Exact is free where every verify width the drafts use rounds like one-token decoding anyway:
llama.cpp on the CPU with PocketSpec's row-exact kernels (native/patches/row-exact-verify.patch,
up to 32 rows). Elsewhere (a stock llama.cpp build, a GPU, torch, ONNX Runtime) exact caps the
drafts at the widths probed exact (pocketspec/backends/exact_width.py), which costs speed, so fast
stays the default there and --exact-verify the opt-in. Batches (--batch, the server's concurrent
sequences) on llama.cpp's CPU backend keep each decode of several rows within the same kernels'
width (`exact_batch_width`), so that every row rounds as it does alone.
"""

from __future__ import annotations

from dataclasses import replace

from pocketspec.settings import ModelSettings, SpeculationSettings


def exact_batch_width(target_settings: ModelSettings) -> int:
    """The most rows of one pass that this backend computes each as one-token decoding does: the
    row-exact kernels' width for llama.cpp on the CPU; 0 elsewhere."""
    if target_settings.backend != "llama.cpp":
        return 0
    from pocketspec.backends.ggml_ops import row_exact_max_rows
    from pocketspec.backends.llama_split import is_cpu_planned

    return row_exact_max_rows() if is_cpu_planned(target_settings) else 0


def exact_verify_is_free(target_settings: ModelSettings) -> bool:
    """Whether this backend computes every verify batch row for row as one-token decoding does."""
    return exact_batch_width(target_settings) > 0


def resolve_verify_mode(speculation: SpeculationSettings, target_settings: ModelSettings) -> SpeculationSettings:
    """The user's --exact-verify / --fast-verify, else exact where it is free and fast elsewhere."""
    if speculation.exact_verify is not None:
        return speculation
    return replace(speculation, exact_verify=exact_verify_is_free(target_settings))


def verify_label(exact: bool) -> str:
    """The verify mode as the chat banner names it."""
    return "exact" if exact else "fast"


def capped_exact_line(exact_width: int, max_width: int) -> str:
    """The note of an exact verify that caps the drafts below the width they asked for."""
    return (f"verify: exact: verify batches of up to {exact_width} of {max_width} rows round like one-token "
            "decoding here, so drafts are capped there; --fast-verify drafts wider")
