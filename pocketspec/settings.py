"""One dataclass per concern, each the single home of its defaults.

CLI flags read their defaults from here (apps/options.py), so defaults never drift.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingSettings:
    """How a token is chosen from a distribution; identical for target and draft."""

    temperature: float = 0.0
    top_k: int = 0  # 0 keeps the whole vocabulary
    top_p: float = 1.0
    seed: int = 0

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class SpeculationSettings:
    """What drafts tokens and how many per step."""

    drafter: str = "auto"  # auto | model | ngram | none | mixed
    gamma: int | None = None  # None: adaptive (`--gamma auto`)
    max_gamma: int = 8
    ngram_min: int = 2
    ngram_max: int = 4
    # llama.cpp's batched kernels round differently from its one-token kernels (on CPU,
    # every width past 256 cached tokens), so a verified greedy token can differ from plain
    # decoding where the target's two best logits are within that rounding. True caps
    # γ + 1 at the widest batch proven bit-identical at short and long contexts, which on
    # llama.cpp's CPU backend means plain decoding.
    exact_verify: bool = False
    # --draft self-sparse / self-skip (torch backend): the target drafts for itself
    self_draft_window: int = 256  # self-sparse: KV positions the draft keeps (4 sinks + recent tokens)
    self_draft_kv_type: str = "auto"  # self-sparse KV: auto (the target's dtype) | int8 | fp32 | bf16 | fp16
    self_skip_layers: int = 0  # self-skip: first layers the draft runs (0: half of them)

    def skip_layers_kept(self, num_layers: int) -> int:
        """The layers a self-skip draft runs for a target of num_layers (not yet checked against it)."""
        return self.self_skip_layers or max(1, num_layers // 2)


def default_num_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class ModelSettings:
    """How one model is loaded by a backend."""

    num_threads: int = 0  # 0: every core this process may use
    max_context: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    kv_type: str = "f16"  # f16 | q8_0 | q4_0
    max_logits_rows: int = 9  # verify width: max_gamma + 1
    use_mmap: bool = True
    gpu_layers: int = 0  # -1 offloads every layer on a CUDA/ROCm/Vulkan build
    # llama.cpp's repacked weights decode one token faster on x86 CPUs, but its batched
    # kernel then rounds differently from 4 rows on, which caps exact verify width at 3.
    repack_weights: bool = True
    backend: str = "llama.cpp"  # llama.cpp | torch
    device: str = "cpu"  # torch: cpu | cuda | cuda:N | rocm
    weights: str = "auto"  # torch: auto (fp32 on CPU, bf16 or fp16 on GPU) | fp32 | bf16 | fp16 | int8 | int4
    torch_kv_type: str = "auto"  # torch: auto (the weights' compute dtype) | fp32 | bf16 | fp16 | int8
    compile: bool = False  # torch: torch.compile the forward (GPU)
    # Several devices (cuda:N, rocm:N, or cpu:N: devices simulated on one CPU); empty: `device` alone
    devices: tuple[str, ...] = ()
    split_mode: str = "layer"  # layer: blocks spread over the devices | row: every matrix split (tensor parallel)
    layers_per_device: tuple[int, ...] = ()  # layer split: target blocks per device, from the plan; empty: even
    distributed_timeout_s: float = 120.0  # row split (torch): longest wait for another rank before giving up

    @property
    def resolved_num_threads(self) -> int:
        return self.num_threads or default_num_threads()

    @property
    def all_devices(self) -> tuple[str, ...]:
        """Every device the target uses: `devices`, or `device` alone; the first holds the embedding."""
        return self.devices or (self.device,)


@dataclass(frozen=True)
class GenerationSettings:
    """What one generate call asks for."""

    max_new_tokens: int = 128
    stop_at_eos: bool = True


@dataclass(frozen=True)
class BenchSettings:
    """What `pocketspec bench` measures unless told otherwise."""

    per_category: int = 3
    max_context: int = 2048  # every system gets the same context, so KV and logits buffers compare
    drafters: str = "auto,ngram"  # PocketSpec drafters: auto (draft model + n-gram, adaptive), ngram, self-sparse, self-skip
    peers: str = "auto"  # auto: the peers that run on --backend (llama.cpp + prompt-lookup, or transformers)
    peer_draft_max: int | None = None  # llama-speculative-simple's --spec-draft-n-max (None: llama.cpp's default)
    num_warmup_tokens: int = 4  # generated once per process before timing, so page faults are not timed
    # A round runs every system over one category's prompts (at most this many; a suite without
    # categories is cut into groups of this size), so the systems interleave in time.
    max_prompts_per_round: int = 5


@dataclass(frozen=True)
class BatchSettings:
    """Batched decoding (`--batch`, torch): how many sequences step together and how their forwards are shaped."""

    max_batch: int = 8  # sequences per forward
    num_rows: int = 0  # sequences held in the KV cache at once (0: max_batch); the scheduler picks among them
    scheduler: str = "pad"  # pad: step the longest-waiting rows together | group: equal-length rows (EXSPEC)
    # Batch-invariant kernels (pocketspec/torch_model/invariant.py): every generated token's
    # logits are bit-identical whatever else shares its forward, so batched greedy output equals
    # decoding each prompt alone. False uses the faster SDPA and one matmul per linear.
    # None: by device (batch_invariance_on).
    is_batch_invariant: bool | None = None
    row_tile: int = 16  # rows per linear call when decoding; MKL takes slower paths below 16 rows
    query_tile: int = 4  # queries per attention tile when decoding (batch-invariant)
    key_block: int = 128  # keys per attention block; every row's key length is padded to a multiple

    def batch_invariance_on(self, device_type: str) -> bool:
        """The setting, or its default for the device: on for a CPU, where tests/test_invariant.py
        proves the property; off for a GPU, where the fixed tiles only fix shapes: whether cuBLAS
        and CUDA's reductions then give bit-identical rows is unverified (invariant.py), and the
        padded tiles and blockwise attention give up the fused kernels. `--batch-invariant` asks
        for it on a GPU all the same."""
        return self.is_batch_invariant if self.is_batch_invariant is not None else device_type == "cpu"
