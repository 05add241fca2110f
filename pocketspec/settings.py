"""One dataclass per concern, each the single home of its defaults.

CLI flags read their defaults from here (apps/flags.py), so defaults never drift; what the
planner shares with the runtime comes from memplanner.defaults.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace

from memplanner.defaults import (ACCEPTANCE_PRIORS, ATTENTION_SINK_TOKENS, LLAMA_KV_TYPES, MAX_DRAFTLESS_GAMMA,
                                 MAX_GAMMA, MAX_NEW_TOKENS, N_BATCH, NGRAM_MAX_N, NGRAM_MIN_N)
from memplanner.device import is_gpu
from memplanner.torch_sizes import AUTO, KV_DTYPES, WEIGHT_FORMATS, resolve_weights_format
from pocketspec.setting_ranges import check_ranges, in_range

RANDOM_SEED = -1  # --seed -1: draw a seed, and say which
LARGEST_GAMMA = MAX_DRAFTLESS_GAMMA + 1  # the longest draft --gamma and plan's --max-gamma accept
MAX_CONTEXT = 131072
MAX_TOKENS = 1 << 20

DRAFTERS = ("auto", "model", "ngram", "none")  # SpeculationSettings.drafter; auto: the controller picks per step
DRAFTLESS = ("ngram", "none")  # --draft values that load no draft model
SELF_DRAFTS = ("self-sparse", "self-skip")  # --draft values where the torch target drafts for itself
TORCH_WEIGHTS = (AUTO, *WEIGHT_FORMATS)  # --weights
TORCH_KV_TYPES = (AUTO, *KV_DTYPES)  # --torch-kv-type, --self-draft-kv-type
DECODE_STEPS = (AUTO, "static", "dynamic")  # --decode-step (torch_model/static_step.py)
# --self-draft-keys: what a self-sparse window keeps besides the recent tokens: StreamingLLM's sinks, or
# the keys the target attended to most (SnapKV-style, pocketspec/drafters/attended_window.py)
SELF_DRAFT_KEYS = ("sinks", "attended")
SCHEDULERS = ("pad", "group")  # BatchSettings.scheduler
BACKENDS = ("llama.cpp", "torch", "onnx")  # ModelSettings.backend
EXECUTION_PROVIDERS = ("cpu", "cuda", "rocm", "dml", "coreml")  # --ep: ONNX Runtime's, by the device they run on
SPLIT_MODES = ("layer", "row")  # ModelSettings.split_mode
# Read from here by the flags, homed in memplanner (the planner shares them): ACCEPTANCE_PRIORS,
# ATTENTION_SINK_TOKENS (self-sparse's kept prefix), LLAMA_KV_TYPES and resolve_weights_format
# (what `auto` weights are on a CPU and on a GPU).
REEXPORTED = (ACCEPTANCE_PRIORS, ATTENTION_SINK_TOKENS, resolve_weights_format)


@dataclass(frozen=True)
class SamplingSettings:
    """How a token is chosen from a distribution; identical for target and draft."""

    # Below 0.001, logits / temperature can overflow float64; 0 is greedy decoding instead.
    temperature: float = field(default=0.0, metadata=in_range("--temperature", 0.001, 100.0, also=(0.0,),
                                                               meaning="greedy"))
    top_k: int = field(default=0, metadata=in_range("--top-k", 0, MAX_TOKENS, is_integer=True))  # 0 keeps all
    top_p: float = field(default=1.0, metadata=in_range("--top-p", 0.0, 1.0, is_low_open=True))
    seed: int = field(default=0, metadata=in_range("--seed", 0, 2**63 - 1, is_integer=True, also=(RANDOM_SEED,),
                                                   meaning="a random seed"))

    def __post_init__(self) -> None:
        check_ranges(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0

    def with_seed_drawn(self) -> SamplingSettings:
        """A random seed in place of RANDOM_SEED; the caller shows it, so the run can be repeated."""
        return replace(self, seed=secrets.randbelow(2**31)) if self.seed == RANDOM_SEED else self


@dataclass(frozen=True)
class SpeculationSettings:
    """What drafts tokens and how many per step."""

    drafter: str = "auto"  # one of DRAFTERS
    gamma: int | None = field(default=None, metadata=in_range("--gamma", 0, LARGEST_GAMMA, is_integer=True))  # None: auto
    # a draft model's longest draft: each of its tokens costs a draft forward
    max_gamma: int = field(default=MAX_GAMMA, metadata=in_range("--max-gamma", 1, LARGEST_GAMMA, is_integer=True))
    # A draftless proposal costs nothing to draft: only the verify's width limits it. On the
    # 2-core CPU a verify of 16 rows costs what one of 8 does, so long accepted copies need room.
    max_draftless_gamma: int = field(default=MAX_DRAFTLESS_GAMMA, metadata=in_range(
        "max_draftless_gamma", 0, LARGEST_GAMMA - 1, is_integer=True))
    # The draft model's KV cache (llama.cpp): one of DRAFT_KV_PREFERENCE. Its precision moves only the
    # acceptance rate, never the output, so a memory plan may quantize it (the target's never).
    draft_kv_type: str = "f16"
    ngram_min: int = NGRAM_MIN_N
    # n-grams up to 8 tokens tell which earlier copy a suffix continues: on the recorded code edits
    # the replay (benchmarks/replay_drafting.py) went from 1.54x to 1.60x plain, in every category
    ngram_max: int = NGRAM_MAX_N
    # Batched kernels may round differently from one-token kernels (stock llama.cpp on the CPU
    # does: docs/exactness.md), so a verified greedy token can differ from plain decoding where
    # the target's two best logits are within that rounding. True caps γ + 1 at the widest batch
    # proven bit-identical at short and long contexts; False drafts freely; None: exact where
    # that is free (llama.cpp's CPU backend with PocketSpec's row-exact kernels), fast elsewhere
    # (pocketspec/speculation/verify_mode.py).
    exact_verify: bool | None = None
    # --draft self-sparse / self-skip (torch backend): the target drafts for itself
    self_draft_window: int = field(default=256, metadata=in_range("--self-draft-window", 16, MAX_CONTEXT,
                                                                  is_integer=True))  # attention sinks + recent tokens
    self_draft_kv_type: str = AUTO  # self-sparse KV: one of TORCH_KV_TYPES (auto: the target's compute format)
    self_draft_keys: str = SELF_DRAFT_KEYS[0]  # self-sparse: one of SELF_DRAFT_KEYS
    self_skip_layers: int = field(default=0, metadata=in_range("--self-skip-layers", 0, 4096, is_integer=True))  # 0: half
    # The planner's guess at the draft model's per-token acceptance (None: memplanner's default)
    expected_acceptance: float | None = field(default=None, metadata=in_range("--alpha", 0.0, 1.0))

    def skip_layers_kept(self, num_layers: int) -> int:
        """The layers a self-skip draft runs for a target of num_layers (not yet checked against it)."""
        return self.self_skip_layers or max(1, num_layers // 2)


def default_num_threads() -> int:
    """The cores this process may use: more threads than that only wait on each other."""
    return max(1, len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class ModelSettings:
    """How one model is loaded by a backend."""

    # 0: every core; more than the cores is capped where the flag is read (apps/flags.py)
    num_threads: int = field(default=0, metadata=in_range("--threads", 0, 2**31 - 1, is_integer=True))
    max_context: int = field(default=4096, metadata=in_range("--max-context", 64, MAX_CONTEXT, is_integer=True))
    n_batch: int = N_BATCH
    n_ubatch: int = N_BATCH
    kv_type: str = LLAMA_KV_TYPES[0]  # one of LLAMA_KV_TYPES
    max_logits_rows: int = MAX_GAMMA + 1  # verify width: max_gamma + 1
    use_mmap: bool = True
    gpu_layers: int = 0  # -1 offloads every layer on a CUDA/ROCm/Vulkan build
    # llama.cpp's repacked weights decode one token faster on x86 CPUs, but its batched
    # kernel then rounds differently from 4 rows on, which caps exact verify width at 3.
    repack_weights: bool = True
    backend: str = "llama.cpp"  # one of BACKENDS
    execution_provider: str = "cpu"  # onnx: one of EXECUTION_PROVIDERS
    # onnx: ONNX Runtime copies each MatMul weight into its kernels' layout (SmolLM2 decodes 25 % faster on a
    # CPU); off, it reads the mapped file in place, in less memory (memplanner/onnx_sizes.py). A memory plan
    # turns it off where the budget needs that.
    prepack_weights: bool = True
    device: str = "cpu"  # torch: cpu | cuda | cuda:N | rocm
    # torch: one of TORCH_WEIGHTS (auto: memplanner.torch_sizes.resolve_weights_format); onnx: auto or one of
    # memplanner.onnx_sizes.ONNX_FORMATS (auto: memplanner.onnx_sizes.resolve_onnx_format)
    weights: str = AUTO
    torch_kv_type: str = AUTO  # torch: one of TORCH_KV_TYPES (auto: the weights' compute format)
    compile: bool | None = None  # torch: torch.compile the forward; None: `compiles` says
    decode_step: str = AUTO  # torch: one of DECODE_STEPS; uses_static_step says what auto means
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

    @property
    def is_row_split(self) -> bool:
        """Every matrix split over several devices (tensor parallel), rather than runs of blocks."""
        return self.split_mode == "row" and len(self.devices) > 1

    @property
    def is_on_gpu(self) -> bool:
        """Whether the target's first device (the one holding the embedding) is a GPU."""
        return is_gpu(self.all_devices[0])

    @property
    def compiles(self) -> bool:
        """Whether the torch backend torch.compiles its forward. Unset: on a GPU with the static step,
        whose compiled blocks its CUDA graphs then replay (torch_model/static_step.py)."""
        return self.compile if self.compile is not None else self.uses_static_step and self.is_on_gpu

    @property
    def uses_static_step(self) -> bool:
        """Whether the torch backend decodes with the static step (torch_model/static_step.py). auto: on a
        GPU, which otherwise waits for the host several times a step and cannot replay a CUDA graph, and
        wherever --compile is asked for (the dynamic step compiled recompiles as its shapes change); not
        on a CPU otherwise, where the host is the device, so there is nothing to wait for, and attending
        over the whole cache costs more than over the filled part. A split model always decodes dynamically."""
        if self.backend != "torch" or len(self.devices) > 1:
            return False
        return self.decode_step == "static" or (self.decode_step == AUTO and (self.is_on_gpu or bool(self.compile)))


def draft_settings_for(target_settings: ModelSettings, draft_max_context: int | None = None,
                       draft_device: str | None = None, draft_kv_type: str = "f16") -> ModelSettings:
    """The draft follows the target's context unless the plan gives it a shorter window.

    It keeps its own KV type (f16 unless a memory plan quantized it: SpeculationSettings.draft_kv_type)
    and one logits row: it only ever reads its last position. When the target is split over several
    devices, the draft runs whole on one: the plan's choice, else the first.
    """
    devices = (draft_device or target_settings.devices[0],) if target_settings.devices else ()
    # a draft decodes the way its target does: a target that verifies on the host takes host distributions
    decode_step = target_settings.decode_step if target_settings.uses_static_step else "dynamic"
    return replace(target_settings, max_context=draft_max_context or target_settings.max_context,
                   kv_type=draft_kv_type, max_logits_rows=1, devices=devices, layers_per_device=(),
                   decode_step=decode_step)


@dataclass(frozen=True)
class GenerationSettings:
    """What one generate call asks for."""

    max_new_tokens: int = field(default=MAX_NEW_TOKENS, metadata=in_range("--max-tokens", 1, MAX_TOKENS, is_integer=True))
    # chat: the longest reply, longer than one generate call's default
    max_reply_tokens: int = field(default=512, metadata=in_range("--max-tokens", 1, MAX_TOKENS, is_integer=True))
    stop_at_eos: bool = True


@dataclass(frozen=True)
class BenchSettings:
    """What `pocketspec bench` measures unless told otherwise."""

    per_category: int = field(default=3, metadata=in_range("--per-category", 1, 1 << 20, is_integer=True))
    max_new_tokens: int = field(default=128, metadata=in_range("--max-tokens", 2, MAX_TOKENS, is_integer=True))
    # every system gets the same context, so KV and logits buffers compare
    max_context: int = field(default=2048, metadata=in_range("--max-context", 256, MAX_CONTEXT, is_integer=True))
    # turns of each conversation (MT-Bench's follow-ups, the code-edit suite's second edits); None: all
    max_turns: int | None = field(default=None, metadata=in_range("--turns", 1, 1 << 10, is_integer=True))
    drafters: str = "auto,ngram"  # PocketSpec drafters: auto (draft model + n-gram, adaptive), ngram, self-sparse, self-skip
    peers: str = "auto"  # auto: the peers that run on --backend (llama.cpp + prompt-lookup, transformers; onnx: none)
    # llama-speculative-simple's --spec-draft-n-max (None: llama.cpp's default)
    peer_draft_max: int | None = field(default=None, metadata=in_range("--peer-draft-max", 1, MAX_GAMMA * 8,
                                                                       is_integer=True))
    num_warmup_tokens: int = 4  # generated once per process before timing, so page faults are not timed
    # A round runs every system over one category's prompts (at most this many; a suite without
    # categories is cut into groups of this size), so the systems interleave in time.
    max_prompts_per_round: int = 5
    # passes over the rounds: each ratio is also measured per pass, and reported with its spread
    num_repeats: int = field(default=1, metadata=in_range("--repeats", 1, 100, is_integer=True))


@dataclass(frozen=True)
class BatchSettings:
    """Batched decoding (`--batch`, torch): how many sequences step together and how their forwards are shaped."""

    max_batch: int = field(default=8, metadata=in_range("--batch", 1, 4096, is_integer=True))  # sequences per forward
    # sequences held in the KV cache at once (0: max_batch); the scheduler picks among them
    num_rows: int = field(default=0, metadata=in_range("--pool-rows", 0, 1 << 16, is_integer=True))
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
