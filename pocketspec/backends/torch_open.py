"""Opening torch backends for the loader: the target, and a self-draft that reuses its weights.

`--draft self-sparse`: the target attends only to its attention sinks plus a recent window
(ModelDrafter slides it with shift_out once the draft context is full), or with
`--self-draft-keys attended` to the keys it attended to most plus a recent window
(pocketspec/drafters/attended_window.py), optionally with an int8 KV cache. `--draft self-skip`:
the target's first layers plus its head.
Neither copies a weight.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from memplanner.defaults import ATTENTION_SINK_TOKENS, SLIDE_SLACK_TOKENS
from pocketspec.errors import UserError
from pocketspec.settings import ModelSettings, SpeculationSettings


def open_backend(path: Path, settings: ModelSettings, notify=None):
    """The backend `settings.backend` names, loaded from `path`; notify(line): told of a first-time export (onnx)
    or of compiling (torch's static step)."""
    if settings.backend == "torch" and settings.is_row_split:
        from pocketspec.backends.row_split import open_row_split

        return open_row_split(path, settings)
    if settings.backend == "torch":
        from pocketspec.backends.torch_backend import TorchBackend

        return TorchBackend.open(path, settings, notify=notify)
    if settings.backend == "onnx":
        from pocketspec.backends.onnx_backend import OnnxBackend

        return OnnxBackend.open(path, settings, notify=notify)
    if settings.backend != "llama.cpp":
        raise UserError(f"unknown backend {settings.backend!r}: use llama.cpp, torch or onnx")
    from pocketspec.backends.llama_cpp_backend import LlamaCppBackend

    return LlamaCppBackend(path, settings)


def min_self_draft_window(max_gamma: int) -> int:
    """The smallest window ModelDrafter can slide: sinks, its slack and one verify's worth of tokens."""
    return ATTENTION_SINK_TOKENS + SLIDE_SLACK_TOKENS + max_gamma + 2


def check_self_draft(kind: str, target_settings: ModelSettings, speculation: SpeculationSettings) -> None:
    """Refuse a self-draft the settings cannot give, before any model loads."""
    if target_settings.backend != "torch":
        raise UserError(f"--draft {kind} drafts with the target's own weights and needs --backend torch")
    if target_settings.is_row_split:
        raise UserError(f"--draft {kind} runs the target's own layers, which --split-mode row spreads over every "
                        "device; use --split-mode layer, --draft ngram or a draft model")
    window = speculation.self_draft_window
    if kind == "self-sparse" and window < min_self_draft_window(speculation.max_gamma):
        raise UserError(f"the self-sparse window {window} is too small: give at least "
                        f"{min_self_draft_window(speculation.max_gamma)} positions")


def self_sparse_window(target_settings: ModelSettings, speculation: SpeculationSettings) -> int:
    """A self-sparse draft's positions per sequence: --self-draft-window, within the target's context."""
    return min(speculation.self_draft_window, target_settings.max_context)


def open_self_draft(target, kind: str, target_settings: ModelSettings, speculation: SpeculationSettings):
    """A draft backend that is `target` itself, with only its own small KV cache."""
    check_self_draft(kind, target_settings, speculation)
    if kind == "self-sparse":
        settings = replace(target_settings, max_context=self_sparse_window(target_settings, speculation),
                           max_logits_rows=1)
        return target.self_draft(settings, kv_dtype=speculation.self_draft_kv_type,
                                 keeps_attended=speculation.self_draft_keys == "attended")
    num_kept = self_skip_layers(target.model.config.num_layers, speculation)
    return target.self_draft(replace(target_settings, max_logits_rows=1), num_layers=num_kept)


def self_skip_layers(num_layers: int, speculation: SpeculationSettings) -> int:
    """The layers a self-skip draft runs; UserError when that is not a strict part of the target."""
    num_kept = speculation.skip_layers_kept(num_layers)
    if not 1 <= num_kept < num_layers:
        raise UserError(f"--draft self-skip keeps 1 to {num_layers - 1} of the target's {num_layers} layers, "
                        f"got {num_kept}")
    return num_kept
