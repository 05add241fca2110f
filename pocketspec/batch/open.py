"""Opening a batch engine on the torch backend from model files and settings (llama.cpp: open_llama.py).

The target is wrapped in the batch-invariant linears when the settings ask for them.
Drafters: n-gram (per sequence), `self-skip` (the target's first layers, with a KV
cache of their own), `self-sparse` (the whole target over a KV cache of --self-draft-window
positions per row: attention sinks and recent tokens, each row sliding its own window, as
MagicDec and StreamingLLM draft) or a same-vocabulary draft GGUF. A draft needs no batch
invariance: verification keeps the output exact whatever it proposes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from pocketspec.backends.gguf_tokenizer import load_tokenizer
from pocketspec.backends.torch_backend import resolve_kv_dtype, resolve_weights_format
from pocketspec.backends.torch_open import check_self_draft, self_skip_layers, self_sparse_window
from pocketspec.batch.batched_model import BatchedModel
from pocketspec.batch.drafting import BatchModelDrafter
from pocketspec.batch.engine import BatchEngine
from pocketspec.batch.opened import OpenedBatch
from pocketspec.batch.step_costs import batch_models, batch_step_costs
from pocketspec.loader import ModelChoice
from pocketspec.settings import BatchSettings, ModelSettings, SamplingSettings, SpeculationSettings
from pocketspec.torch_model.device import resolve_device
from pocketspec.torch_model.invariant import TileShape, make_batch_invariant
from pocketspec.torch_model.load import load_model


def open_batch_engine(choice: ModelChoice, *, target_settings: ModelSettings, speculation: SpeculationSettings,
                      sampling: SamplingSettings, batch: BatchSettings) -> OpenedBatch:
    device = resolve_device(target_settings.device)
    if device.type == "cpu" and target_settings.num_threads:
        torch.set_num_threads(target_settings.num_threads)
    vocab_model, tokenizer = load_tokenizer(choice.target_path)
    weights = resolve_weights_format(target_settings.weights, device)
    model = load_model(choice.target_path, weights, device)
    batch = replace(batch, is_batch_invariant=batch.batch_invariance_on(device.type))
    tiles = TileShape(batch.row_tile) if batch.is_batch_invariant else None
    if tiles is not None:
        make_batch_invariant(model, tiles)
    kv_dtype = resolve_kv_dtype(target_settings.torch_kv_type, model)
    num_rows = batch.num_rows or batch.max_batch
    # the batch plan sizes every row's verify for --max-gamma drafts (batch_speculation)
    rows = dict(num_rows=num_rows, max_context=target_settings.max_context, kv_dtype=kv_dtype,
                n_batch=target_settings.n_batch, max_logits_rows=speculation.max_gamma + 1)
    target = BatchedModel(model, settings=batch, tiles=tiles, **rows)
    draft_settings = replace(batch, is_batch_invariant=False)
    draft = None
    if choice.drafter == "self-skip" and speculation.drafter in ("auto", "model"):
        num_layers = self_skip_layers(model.config.num_layers, speculation)
        draft = BatchedModel(model, settings=draft_settings, tiles=tiles, num_layers=num_layers, **rows)
    elif choice.drafter == "self-sparse" and speculation.drafter in ("auto", "model"):
        check_self_draft(choice.drafter, target_settings, speculation)
        window = self_sparse_window(target_settings, speculation)
        draft = BatchedModel(model, settings=draft_settings, tiles=tiles, **dict(
            rows, max_context=window, n_batch=min(target_settings.n_batch, window),
            kv_dtype=resolve_kv_dtype(speculation.self_draft_kv_type, model)))
    elif choice.draft_path is not None and speculation.drafter in ("auto", "model"):
        draft_model = load_model(choice.draft_path, weights, device)
        draft = BatchedModel(draft_model, settings=draft_settings, **rows)
    if speculation.drafter == "auto" and choice.drafter in ("ngram", "none"):
        speculation = replace(speculation, drafter=choice.drafter)
    keeps_attended = choice.drafter == "self-sparse" and speculation.self_draft_keys == "attended"
    drafter = None if draft is None else BatchModelDrafter(draft, attended_source=target if keeps_attended else None)
    priced_target, *priced_draft = batch_models(choice, target_settings, speculation, batch)
    engine = BatchEngine(target, is_end=tokenizer.is_end_of_generation, draft=drafter, sampling=sampling,
                         speculation=speculation, batch=batch,
                         target_costs=batch_step_costs(priced_target, target_settings),
                         draft_costs=batch_step_costs(priced_draft[0], target_settings) if priced_draft else None)
    return OpenedBatch(engine, tokenizer, [vocab_model] if vocab_model is not None else [])

