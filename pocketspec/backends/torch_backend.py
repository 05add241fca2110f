"""The PyTorch backend: the compact model of pocketspec/torch_model with a static KV cache.

Rollback moves a position; nothing is reallocated during generation. A self-draft
view (`self_draft`) shares the target's weight modules and owns only a small KV
cache of its own: sinks or the target's most attended keys, plus a recent window
(self-sparse), optionally int8, or the first layers only (self-skip). The tokenizer is
llama.cpp's, read vocab-only from the GGUF.
With several `devices` (split_mode layer) the blocks are spread over them
(torch_model/layer_split.py) and every KV cache puts each layer's buffers with its layer.
With the static decode step (torch_model/static_step.py; on GPUs by default), forwards up to the
verify width run through it, and tokens are chosen and verified on the device; longer ones
(prompt chunks) run the dynamic forward into the same cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from memplanner.torch_sizes import resolve_weights_format as resolve_format_for
from pocketspec.backends.base import CachedTokens
from pocketspec.backends.gguf_tokenizer import load_tokenizer
from pocketspec.errors import UserError
from pocketspec.progress import progress_bar
from pocketspec.settings import ModelSettings, SamplingSettings
from pocketspec.speculation.draws import SeededDraws
from pocketspec.torch_model import attended_keys
from pocketspec.torch_model.compile_cache import use_compile_cache
from pocketspec.torch_model.device import gpu_float_format, resolve_device
from pocketspec.torch_model.kv_cache import KV_DTYPES, StaticKVCache
from pocketspec.torch_model.layer_split import LayerSplit, install_layer_split, tensor_bytes_by_device
from pocketspec.torch_model.load import load_model
from pocketspec.torch_model.model import Transformer
from pocketspec.torch_model.static_step import StaticDecodeStep
from pocketspec.speculation.verify import Verdict

DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def resolve_weights_format(weights: str, device: torch.device) -> str:
    """What `weights` loads as on this device: memplanner.torch_sizes.resolve_weights_format, with the
    GPU's own 2-byte float (bf16, or fp16 where bf16 is emulated) for `auto` on a GPU."""
    if weights != "auto" or device.type == "cpu":
        return resolve_format_for(weights, on_gpu=device.type != "cpu")
    return gpu_float_format(device)


def resolve_kv_dtype(kv_dtype: str, model: Transformer) -> str:
    """`auto` stores keys and values in the model's compute dtype."""
    if kv_dtype == "auto":
        return DTYPE_NAMES[model.tok_embeddings.weight.dtype]
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"unknown torch KV dtype {kv_dtype!r}: use auto or one of {', '.join(KV_DTYPES)}")
    return kv_dtype


def _layer_split(model_path: Path, settings: ModelSettings) -> LayerSplit | None:
    """The split of a layer-split load over several devices; None on one device."""
    if len(settings.devices) < 2:
        return None
    from memplanner.shapes import shape_from_gguf

    num_layers = shape_from_gguf(model_path).num_layers
    return LayerSplit.of(settings.devices, settings.layers_per_device, num_layers)


class TorchBackend(CachedTokens):
    def __init__(self, model: Transformer, settings: ModelSettings, *, tokenizer, model_path: Path,
                 num_layers: int | None = None, kv_dtype: str | None = None, owns_model: bool = True,
                 vocab_model=None, notify=None):
        """notify(line): a watching terminal's progress lines (compiling the static step draws a bar); None: quiet."""
        super().__init__()
        self._notify = notify
        self.model = model
        self.settings = settings
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.device = model.tok_embeddings.weight.device
        self.vocab_size = model.config.vocab_size
        self.num_layers = num_layers or model.config.num_layers
        self.kv_dtype = resolve_kv_dtype(kv_dtype or settings.torch_kv_type, model)
        self.n_batch = min(settings.n_batch, settings.max_context)
        layer_devices = [block.attention_norm.weight.device for block in model.layers[:self.num_layers]]
        self.rows_device = layer_devices[-1]  # where the last block leaves the hidden state, indexed by rows
        self.cache = StaticKVCache(num_layers=self.num_layers, num_kv_heads=model.config.num_kv_heads,
                                   head_dim=model.config.head_dim, max_context=settings.max_context,
                                   kv_dtype=self.kv_dtype, device=self.device, layer_devices=layer_devices)
        self._owns_model = owns_model
        self.attended_source: TorchBackend | None = None  # a self-draft's target, when it keeps attended keys
        self._vocab_model = vocab_model
        self.static_step: StaticDecodeStep | None = None
        if settings.uses_static_step:
            self.static_step = self._warmed_static_step(settings.compiles)

    def _warmed_static_step(self, compiles: bool) -> StaticDecodeStep:
        """The static step with every bucket compiled and captured before anything is timed; where
        compiling fails, the same step eager, with a note naming the cause."""
        if compiles:
            use_compile_cache()
        step = StaticDecodeStep(self.model, self.cache, num_layers=self.num_layers,
                                max_width=self.settings.max_logits_rows, compile=compiles)
        if not (compiles or step.captures):
            return step
        try:
            self._warm_up(step, compiles)
        except Exception as error:  # noqa: BLE001 - any compiler failure leaves eager decoding, which works
            if not compiles:
                raise
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            self.notes.append(f"torch.compile failed ({type(error).__name__}: {reason[:200]}); decoding eagerly")
            step = StaticDecodeStep(self.model, self.cache, num_layers=self.num_layers,
                                    max_width=self.settings.max_logits_rows, compile=False)
            self._warm_up(step, compiles=False)
        return step

    def _warm_up(self, step: StaticDecodeStep, compiles: bool) -> None:
        """Compile and capture every width of `step`; a bar for a watching terminal while it compiles."""
        shown = compiles and self._notify is not None
        what = "target's" if self._owns_model else "draft's"
        with progress_bar(shown, len(step.widths), f"compiling the {what} decode step, {len(step.widths)} widths "
                                                   "(cached for later runs)") as update:
            step.warm_up(on_width=update)

    @classmethod
    def open(cls, model_path: Path | str, settings: ModelSettings = ModelSettings(), *, shard=None,
             with_tokenizer: bool = True, notify=None) -> "TorchBackend":
        """shard: this rank's tensor_parallel.TensorShard in a row split; followers need no tokenizer;
        notify(line): a watching terminal's progress lines."""
        device = resolve_device(settings.all_devices[0])
        if device.type == "cpu" and settings.num_threads:
            torch.set_num_threads(settings.num_threads)
        model_path = Path(model_path)
        vocab_model, tokenizer = load_tokenizer(model_path) if with_tokenizer else (None, None)
        split = _layer_split(model_path, settings)
        try:
            model = load_model(model_path, resolve_weights_format(settings.weights, device), device,
                               split.device_for if split is not None else None, shard=shard)
        except BaseException:
            if vocab_model is not None:
                vocab_model.close()
            raise
        if split is not None:
            install_layer_split(model, split)
        if settings.compiles and not settings.uses_static_step:
            use_compile_cache()
            model.forward = torch.compile(model.forward, dynamic=True)
        return cls(model, settings, tokenizer=tokenizer, model_path=model_path, vocab_model=vocab_model,
                   notify=notify)

    def self_draft(self, settings: ModelSettings, *, num_layers: int | None = None,
                   kv_dtype: str | None = None, keeps_attended: bool = False) -> "TorchBackend":
        """A draft that is this model itself, with its own KV cache sized by `settings.max_context`;
        keeps_attended: its window holds the keys this backend attended to most (hold_attended_view)."""
        draft = TorchBackend(self.model, settings, tokenizer=self.tokenizer, model_path=self.model_path,
                             num_layers=num_layers, kv_dtype=kv_dtype, owns_model=False, notify=self._notify)
        if keeps_attended:
            draft.attended_source = self
        return draft

    @torch.inference_mode()
    def hold_attended_view(self, selection: Sequence[int], num_observed: int, recent_start: int,
                           recent_end: int) -> None:
        """Fill this self-draft's cache from its source's (the target's): per layer and KV head, the
        len(selection) positions before recent_start that the source's last num_observed cached tokens
        attended to most, then positions recent_start .. recent_end - 1 (torch_model/attended_keys.py).
        The cache then holds `selection` (stand-ins for the chosen keys, which differ by head) and the
        recent tokens."""
        source = self.attended_source
        observed = source.cached_tokens[recent_end - num_observed:recent_end]
        attended_keys.hold_attended_view(self.model, source.cache, self.cache, observed, num_selected=len(selection),
                                         recent_start=recent_start, recent_end=recent_end, num_layers=self.num_layers)
        self._cached = list(selection) + source.cached_tokens[recent_start:recent_end]

    @property
    def max_context(self) -> int:
        return self.cache.max_context

    def _uses_static_step(self, num_tokens: int) -> bool:
        return self.static_step is not None and num_tokens <= self.static_step.widths[-1]

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Logits [len(logits_rows), vocab] as float32."""
        self.check_forward(tokens, logits_rows)
        start = len(self._cached)
        rows = torch.tensor(list(logits_rows), dtype=torch.long, device=self.rows_device)
        if self._uses_static_step(len(tokens)):
            logits = self.static_step.logits(tokens, start)[rows]
            logits = self.static_step.to_host(logits) if len(rows) else np.empty((0, self.vocab_size), np.float32)
        else:
            token_tensor = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
            logits = self.model(token_tensor, start, self.cache, rows, num_layers=self.num_layers)[0].cpu().numpy()
        self._cached.extend(tokens)
        return logits

    def verify(self, tokens: Sequence[int], sampling: SamplingSettings, draws: SeededDraws) -> Verdict:
        """On the device with the static step; else from logits brought to the host."""
        if not self._uses_static_step(len(tokens)):
            return super().verify(tokens, sampling, draws)
        self.check_forward(tokens, range(len(tokens)))
        verdict = self.static_step.verify(tokens, len(self._cached), sampling, draws)
        self._cached.extend(tokens)
        return verdict

    def choose(self, tokens: Sequence[int], sampling: SamplingSettings, draws: SeededDraws) -> int:
        """With the static step, the last token runs through it and the choice is made on the device; else on
        the host."""
        if self.static_step is None:
            return super().choose(tokens, sampling, draws)
        self.prefill_all_but_last(tokens)
        self.check_forward(tokens[-1:], [0])
        choice = self.static_step.choose(tokens[-1:], len(self._cached), sampling, draws)
        self._cached.append(tokens[-1])
        return choice

    def rollback(self, num_kept: int) -> None:
        del self._cached[num_kept:]

    @torch.inference_mode()
    def shift_out(self, start: int, count: int) -> None:
        self.cache.shift(start, count, len(self._cached), self.model.inv_freq)
        del self._cached[start:start + count]

    def memory_report(self) -> dict[str, int]:
        """Bytes of every tensor this backend allocated; a self-draft view reports no weights of its own."""
        return {"weights": sum(terms.get("weights", 0) for terms in self.memory_by_device().values()),
                "kv_cache": self.cache.num_bytes}

    def memory_by_device(self) -> dict[str, dict[str, int]]:
        """Weights and KV cache bytes on each named device (cpu:0, cuda:1, ...); a tensor shared twice counts once."""
        split: LayerSplit | None = getattr(self.model, "layer_split", None)
        device_name = self.settings.all_devices[0]
        name_for = split.device_name_for if split is not None else (lambda parameter_name: device_name)
        found: dict[str, dict[str, int]] = {}
        if self._owns_model:
            for name, num_bytes in tensor_bytes_by_device(self.model, name_for).items():
                found.setdefault(name, {})["weights"] = num_bytes
        for layer in range(self.num_layers):
            terms = found.setdefault(name_for(f"layers.{layer}"), {})
            terms["kv_cache"] = terms.get("kv_cache", 0) + self.cache.layer_num_bytes(layer)
        return found

    def allocator_peaks(self) -> dict[str, int]:
        """torch.cuda.max_memory_allocated of every GPU the model sits on, by torch's name (cuda:N; none on a CPU)."""
        split: LayerSplit | None = getattr(self.model, "layer_split", None)
        names = split.device_names if split is not None else self.settings.all_devices[:1]
        devices = {str(device): device for device in map(resolve_device, names) if device.type == "cuda"}
        return {name: int(torch.cuda.max_memory_allocated(device)) for name, device in devices.items()}

    def close(self) -> None:
        self.cache = None
        self.model = None
        if self._vocab_model is not None:
            self._vocab_model.close()
            self._vocab_model = None
