"""The ONNX Runtime backend: the exported step (pocketspec/onnx_model/) on one of ORT's execution providers.

The KV cache is one fixed-capacity, position-major buffer per layer and direction, made once on the
provider's device. Each step binds, by address (I/O binding), the cached block of every buffer as
the graph's `past_*` input and the block right after it as its `new_*` output, so the graph writes
the step's keys and values in place and nothing of the cache passes through the host. Rollback
moves the backend's length, as in the torch backend. A sliding window (shift_out) is the one
operation done on the host: it moves the kept positions down and turns their keys back by the
shift, the rotation the torch cache applies (keys are stored after RoPE). The tokenizer is
llama.cpp's, read vocabulary-only from the GGUF.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from memplanner.onnx_sizes import resolve_onnx_format
from pocketspec.backends.base import CachedTokens
from pocketspec.backends.gguf_tokenizer import load_tokenizer
from pocketspec.errors import UserError
from pocketspec.onnx_model.export import ExportedModel, exported_model
from pocketspec.onnx_model.io_names import LOGITS, LOGITS_ROWS, TOKENS, new_name, past_names
from pocketspec.settings import EXECUTION_PROVIDERS, ModelSettings

ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "rocm": "ROCMExecutionProvider",
                 "dml": "DmlExecutionProvider", "coreml": "CoreMLExecutionProvider"}
# The onnxruntime build that has each provider (CoreML comes with the standard one, on macOS)
ORT_BUILDS = {"cuda": "install onnxruntime-gpu (POCKETSPEC_ACCEL=cuda make setup)",
              "rocm": "install AMD's onnxruntime-rocm in place of onnxruntime",
              "dml": "install onnxruntime-directml in place of onnxruntime (Windows)",
              "coreml": "run on macOS, whose onnxruntime has it"}
# Where each provider's cache buffers live, as OrtValue names a device; the others keep them on the host.
ORT_DEVICES = {"cuda": "cuda", "rocm": "cuda"}


def available_providers() -> list[str]:
    """The --ep names this onnxruntime build offers."""
    import onnxruntime

    offered = set(onnxruntime.get_available_providers())
    return [name for name in EXECUTION_PROVIDERS if ORT_PROVIDERS[name] in offered]


def check_provider(provider: str) -> None:
    """UserError unless this onnxruntime build has the execution provider `provider`."""
    if provider not in ORT_PROVIDERS:
        raise UserError(f"unknown execution provider {provider!r}: use one of {', '.join(ORT_PROVIDERS)}")
    try:
        present = available_providers()
    except ImportError:
        raise UserError("--backend onnx needs onnxruntime: pip install 'pocketspec[onnx]' "
                        "(or 'pocketspec[onnx-gpu]' for CUDA)") from None
    if provider not in present:
        raise UserError(f"--ep {provider}: this onnxruntime build has no {ORT_PROVIDERS[provider]} "
                        f"(it has {', '.join(present)}); {ORT_BUILDS[provider]}")


def _inference_session(exported: ExportedModel, settings: ModelSettings):
    """An ONNX Runtime session over the export, on the provider and threads the settings name."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = settings.resolved_num_threads
    options.inter_op_num_threads = 1
    # without the arena ONNX Runtime frees each step's buffers: peak RSS 110 MiB lower for SmolLM2 at 4096
    # positions and prompt chunks of 512 (fp32 and int4), at the same decode speed (onnxruntime 1.32, 2 EPYC cores)
    options.enable_cpu_mem_arena = False
    if not settings.prepack_weights:
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.log_severity_level = 3  # errors only: ORT warns about every node it leaves on the CPU
    try:
        return onnxruntime.InferenceSession(str(exported.model_file), options,
                                            providers=[ORT_PROVIDERS[settings.execution_provider]])
    except Exception as error:  # noqa: BLE001 - ORT raises its own classes for a bad file or provider
        raise UserError(f"ONNX Runtime could not open {exported.model_file}: {str(error).splitlines()[0]}; "
                        f"remove {exported.folder} to export it again") from None


class OnnxBackend(CachedTokens):
    def __init__(self, exported: ExportedModel, settings: ModelSettings, *, tokenizer, model_path: Path,
                 vocab_model=None):
        import onnxruntime

        super().__init__()
        self.settings = settings
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.exported = exported
        config = exported.config
        self.vocab_size = config["vocab_size"]
        self.n_batch = min(settings.n_batch, settings.max_context)
        self._vocab_model = vocab_model
        self._capacity = settings.max_context
        self._inv_freq = 1.0 / config["rope_base"] ** (np.arange(0, config["head_dim"], 2) / config["head_dim"])
        self.session = _inference_session(exported, settings)
        self._device = ORT_DEVICES.get(settings.execution_provider, "cpu")
        self._dtype = np.dtype(config["cache_dtype"])
        self._position_shape = [config["num_kv_heads"], config["head_dim"]]
        self._position_bytes = int(np.prod(self._position_shape)) * self._dtype.itemsize
        shape = [self._capacity, *self._position_shape]
        # [capacity, kv_heads, head_dim] each: on the CPU provider numpy arrays, on a GPU's OrtValues there
        if self._device == "cpu":
            self._buffers = [np.zeros(shape, self._dtype) for _ in range(2 * config["num_layers"])]
            addresses = [buffer.ctypes.data for buffer in self._buffers]
        else:
            self._buffers = [onnxruntime.OrtValue.ortvalue_from_shape_and_type(shape, self._dtype.type, self._device, 0)
                             for _ in range(2 * config["num_layers"])]
            addresses = [buffer.data_ptr() for buffer in self._buffers]
        # (input name, output name, buffer address) of every cache, bound anew each step
        self._caches = [(name, new_name(name), address)
                        for name, address in zip(past_names(config["num_layers"]), addresses)]
        self.binding = self.session.io_binding()

    @classmethod
    def open(cls, model_path: Path | str, settings: ModelSettings = ModelSettings(), *,
             notify=None) -> "OnnxBackend":
        """notify(line): told when the GGUF is exported (the first time, about a minute for 135M parameters)."""
        check_provider(settings.execution_provider)
        model_path = Path(model_path)
        vocab_model, tokenizer = load_tokenizer(model_path)
        try:
            exported = exported_model(model_path, resolve_onnx_format(settings.weights, settings.execution_provider),
                                      notify)
            return cls(exported, settings, tokenizer=tokenizer, model_path=model_path, vocab_model=vocab_model)
        except BaseException:
            vocab_model.close()
            raise

    @property
    def max_context(self) -> int:
        return self._capacity

    def forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        """Logits [len(logits_rows), vocab] as float32."""
        self.check_forward(tokens, logits_rows)
        num_cached, num_tokens = len(self._cached), len(tokens)
        binding, element_type = self.binding, self._dtype.type
        binding.bind_cpu_input(TOKENS, np.asarray([tokens], dtype=np.int64))
        binding.bind_cpu_input(LOGITS_ROWS, np.asarray(logits_rows, dtype=np.int64))
        binding.bind_output(LOGITS, self._device)  # its shape changes with the rows: a fresh buffer each step
        past_shape, new_shape = [num_cached, *self._position_shape], [num_tokens, *self._position_shape]
        new_offset = num_cached * self._position_bytes
        for past, new, address in self._caches:
            binding.bind_input(past, self._device, 0, element_type, past_shape, address)
            binding.bind_output(new, self._device, 0, element_type, new_shape, address + new_offset)
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()  # [R, vocab]
        self._cached.extend(tokens)
        return logits

    def rollback(self, num_kept: int) -> None:
        del self._cached[num_kept:]

    def shift_out(self, start: int, count: int) -> None:
        """Move positions start + count .. end down by count, keys turned back by count positions."""
        end = len(self._cached)
        angles = -float(count) * self._inv_freq  # [head_dim / 2]
        cos, sin = np.cos(angles), np.sin(angles)
        for index, buffer in enumerate(self._buffers):
            values = buffer if self._device == "cpu" else buffer.numpy()  # a GPU's: through the host
            moved = values[start + count:end].astype(np.float32)  # [kept, kv_heads, head_dim]
            if index % 2 == 0:  # keys: rotate-half layout, as pocketspec/torch_model/model.apply_rope
                half = moved.shape[-1] // 2
                first, second = moved[..., :half].copy(), moved[..., half:].copy()
                moved[..., :half] = first * cos - second * sin
                moved[..., half:] = second * cos + first * sin
            values[start:end - count] = moved.astype(values.dtype)
            if self._device != "cpu":
                buffer.update_inplace(values)
        del self._cached[start:start + count]

    def memory_report(self) -> dict[str, int]:
        """Bytes of the exported weights and of the KV cache buffers."""
        return {"weights": self.exported.num_bytes,
                "kv_cache": len(self._caches) * self._capacity * self._position_bytes}

    def close(self) -> None:
        self.binding = None
        self.session = None
        self._caches, self._buffers = [], []
        if self._vocab_model is not None:
            self._vocab_model.close()
            self._vocab_model = None
