"""One llama.cpp model and context holding one or more sequences, through the low-level batch API.

A decode carries forwards of several sequences at once: every token is tagged with its
sequence, and each sequence attends only to its own tokens. Each sequence has a KV stream of its
own (max_context cells, kv_unified off), where its tokens sit from cell 0 in position order, as
they sit in a context of one sequence. So its attention reads the same cells in the same order
(the batch's one-pass kernels add its cells in cell order, the prefill's tiled kernel in tiles of
64 cells from cell 0) and rounds as it does alone. In one buffer shared by all (kv_unified), a
prompt landed wherever cells were free, behind other sequences' tokens: 6 of 22 greedy replies of a
`--batch 4` (qwen-coder, 64 tokens, no drafting) parted from the same prompt alone, and the same run
twice did not give the same replies. llama.cpp splits a decode of several streams into passes of
as many tokens from each sequence of consecutive ids (split_equal). The sequences (LlamaSequence)
each refuse to hold more than max_context tokens. Logits are requested only at the
rows each forward asks for (per-position logit flags), never with logits_all, which would
cost n_ctx x vocab floats. This class keeps no token bookkeeping: the backends built on it
(LlamaCppBackend, one sequence; LlamaSequence, one of several) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaBatch, LlamaContext, LlamaModel

from memplanner.defaults import LLAMA_KV_TYPES
from memplanner.shapes import shape_from_gguf
from memplanner.terms import loads_without_mmap
from pocketspec.backends import llama_logs
from pocketspec.signals import stop_signals_held
from pocketspec.backends.llama_split import apply_llama_split, is_cpu_planned, llama_split
from pocketspec.errors import ContextFullError, UserError
from pocketspec.settings import ModelSettings
from pocketspec.tokenizer import Tokenizer

GGML_TYPE_BF16 = 30  # ggml.h's enum ggml_type: llama-cpp-python 0.3.36 exports the other KV types' numbers, not this
KV_TYPES = {name: GGML_TYPE_BF16 if name == "bf16" else getattr(llama_cpp, f"GGML_TYPE_{name.upper()}")
            for name in LLAMA_KV_TYPES}  # f16 -> GGML_TYPE_F16

_backend_ready = False


def init_llama() -> None:
    global _backend_ready
    if not _backend_ready:
        llama_logs.install()
        llama_cpp.llama_backend_init()
        _backend_ready = True


def max_sequences() -> int:
    """The most sequences one llama.cpp context holds (LLAMA_MAX_SEQ)."""
    return int(llama_cpp.llama_max_parallel_sequences())


def _device_kind(settings: ModelSettings) -> str:
    """Where the weights live, as the memory planner names it: cpu unless any layer is offloaded."""
    is_offloaded = settings.gpu_layers != 0 or any(not device.startswith("cpu") for device in settings.devices)
    return "cuda" if is_offloaded else "cpu"


@dataclass(frozen=True)
class SequenceForward:
    """Tokens appended to one sequence's cache from position `start`, with logits at `logits_rows`."""

    sequence_id: int
    start: int
    tokens: Sequence[int]
    logits_rows: Sequence[int]


def decode_groups(forwards: Sequence[SequenceForward], max_tokens: int, max_outputs: int) -> list[list[int]]:
    """Indexes of `forwards` in decode order, split where max_tokens tokens (n_batch, or fewer) or
    max_outputs logits rows would overflow one llama_decode (llama.cpp aborts the process past n_batch
    or its logits rows); a forward longer than max_tokens goes alone."""
    groups: list[list[int]] = [[]]
    num_tokens = num_rows = 0
    for index, forward in enumerate(forwards):
        tokens, rows = len(forward.tokens), len(forward.logits_rows)
        if groups[-1] and (num_tokens + tokens > max_tokens or num_rows + rows > max_outputs):
            groups.append([])
            num_tokens = num_rows = 0
        groups[-1].append(index)
        num_tokens += tokens
        num_rows += rows
    return groups


class LlamaModelContext:
    """settings.max_context and settings.max_logits_rows are per sequence; the context holds
    num_sequences times each."""

    def __init__(self, model_path: Path | str, settings: ModelSettings = ModelSettings(), num_sequences: int = 1):
        if settings.kv_type not in KV_TYPES:
            raise UserError(f"unknown KV type {settings.kv_type!r}: use one of {', '.join(KV_TYPES)}")
        init_llama()
        self.settings = settings
        self.num_sequences = num_sequences
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = settings.gpu_layers
        model_params.use_extra_bufts = settings.repack_weights
        try:
            shape = shape_from_gguf(model_path)
        except (OSError, ValueError) as error:
            raise UserError(f"llama.cpp could not load {model_path}: {error}; check the file or re-pull it") from None
        if loads_without_mmap(shape, _device_kind(settings), settings.repack_weights):
            model_params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE  # read, not mapped (default AUTO maps)
        if settings.devices:
            split = llama_split(settings, shape.num_layers, llama_cpp.LLAMA_MAX_DEVICES)
            self._tensor_split = apply_llama_split(model_params, split)
        try:
            with stop_signals_held():
                self._model = LlamaModel(path_model=str(model_path), params=model_params, verbose=False)
        except ValueError as error:
            raise UserError(f"llama.cpp could not load {model_path}: {error}; check the file or re-pull it") from None
        llama_logs.take_buffer_sizes()
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = settings.max_context * num_sequences
        context_params.n_batch = settings.n_batch
        context_params.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        context_params.n_seq_max = num_sequences
        context_params.kv_unified = False  # a KV stream for each sequence (see the module's docstring)
        context_params.n_outputs_max = settings.max_logits_rows * num_sequences
        context_params.n_outputs_max_per_seq = 0  # 0: same as n_outputs_max (the default 1 would abort)
        context_params.n_threads = settings.resolved_num_threads
        context_params.n_threads_batch = settings.resolved_num_threads
        context_params.type_k = KV_TYPES[settings.kv_type]
        context_params.type_v = KV_TYPES[settings.kv_type]
        context_params.no_perf = True
        context_params.op_offload = not is_cpu_planned(settings)
        try:
            with stop_signals_held():
                self._context = LlamaContext(model=self._model, params=context_params, verbose=False)
        except ValueError:
            self._model.close()
            what = f"{settings.max_context * num_sequences}-token context"
            lower = "--max-context"
            if num_sequences > 1:
                what += f" ({num_sequences} sequences of {settings.max_context})"
                lower += " or the sequences at once (--batch, --max-concurrency)"
            raise UserError(f"llama.cpp could not create a {what} for {model_path}: lower {lower}, or pass "
                            "--memory-budget to plan within the memory there is") from None
        self._buffer_bytes = llama_logs.take_buffer_sizes()
        # llama.cpp clamps n_batch to n_ctx; a bigger batch would abort it (GGML_ASSERT)
        self.n_batch = int(llama_cpp.llama_n_batch(self._context.ctx))
        self.max_outputs = settings.max_logits_rows * num_sequences
        self._batch = LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=False)
        self.tokenizer = Tokenizer(self._model)
        self.vocab_size = self._model.n_vocab()
        self.model_path = Path(model_path)

    @property
    def max_context(self) -> int:
        """Tokens one sequence may hold: its share. llama.cpp pads n_ctx up to a multiple of 256; the
        context is still the one asked for."""
        return min(self._context.n_ctx() // self.num_sequences, self.settings.max_context)

    def decode(self, forwards: Sequence[SequenceForward], *, copy: bool) -> list[np.ndarray]:
        """One llama_decode for every forward (at most n_batch tokens and max_outputs logits rows in all).

        Returns each forward's logits [len(logits_rows), vocab]: copies, or (copy=False, one forward)
        a view valid until the next decode.
        """
        batch = self._batch.batch
        index = 0
        for forward in forwards:
            for offset, token in enumerate(forward.tokens):
                batch.token[index] = token
                batch.pos[index] = forward.start + offset
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = forward.sequence_id
                batch.logits[index] = 0
                index += 1
        batch.n_tokens = index
        first_index = 0
        for forward in forwards:
            for row in forward.logits_rows:
                batch.logits[first_index + row] = 1
            first_index += len(forward.tokens)
        status = llama_cpp.llama_decode(self._context.ctx, batch)
        if status != 0:
            starts = ", ".join(str(forward.start) for forward in forwards)
            raise ContextFullError(f"llama_decode returned {status} at position {starts}")
        if len(forwards) == 1 and not copy:
            num_rows = len(forwards[0].logits_rows)
            if not num_rows:
                return [np.empty((0, self.vocab_size), dtype=np.float32)]
            # outputs are stored in batch order of the flagged rows
            pointer = llama_cpp.llama_get_logits(self._context.ctx)
            return [np.ctypeslib.as_array(pointer, shape=(num_rows, self.vocab_size))]
        return self._copied_logits(forwards)

    def _copied_logits(self, forwards: Sequence[SequenceForward]) -> list[np.ndarray]:
        results = []
        first_index = 0
        for forward in forwards:
            logits = np.empty((len(forward.logits_rows), self.vocab_size), dtype=np.float32)
            for output, row in enumerate(forward.logits_rows):
                pointer = llama_cpp.llama_get_logits_ith(self._context.ctx, first_index + row)
                logits[output] = np.ctypeslib.as_array(pointer, shape=(self.vocab_size,))
            results.append(logits)
            first_index += len(forward.tokens)
        return results

    def remove(self, sequence_id: int, start: int, end: int = -1) -> None:
        """Drop sequence_id's cached positions [start, end) (end -1: to the end)."""
        llama_cpp.llama_memory_seq_rm(self._context.memory, sequence_id, start, end)

    @property
    def can_shift(self) -> bool:
        return bool(llama_cpp.llama_memory_can_shift(self._context.memory))

    def shift_out(self, sequence_id: int, start: int, count: int) -> None:
        """Drop `count` cached positions of sequence_id from `start` and move the later ones down.

        llama.cpp re-rotates the moved keys (RoPE) lazily at the next decode.
        """
        memory = self._context.memory
        llama_cpp.llama_memory_seq_rm(memory, sequence_id, start, start + count)
        llama_cpp.llama_memory_seq_add(memory, sequence_id, start + count, -1, -count)

    def memory_report(self) -> dict[str, int]:
        """Model bytes plus every buffer llama.cpp logged for this context (e.g. 'CPU KV buffer')."""
        report = {"weights": int(llama_cpp.llama_model_size(self._model.model))}
        report.update({f"{kind} buffer": num_bytes for kind, num_bytes in self._buffer_bytes.items()})
        return report

    def close(self) -> None:
        for owner in ("_batch", "_context", "_model"):
            handle = getattr(self, owner, None)
            if handle is not None:
                handle.close()
                setattr(self, owner, None)
