"""Per-device plans: the target's layers split over several devices' budgets, the draft placed
where it fits best, and every device's terms.

A pipeline (layer) split, in the order llama.cpp runs the devices (execution_order): CPU
devices first, then the GPUs by ordinal. llama.cpp keeps the token embeddings in host memory
(llama-model.cpp, load_tensors: "always keep [the input layer] on the CPU"), so they are a host
term unless the first device is a CPU; the last device holds the output head and logits (a
tied head is token_embd itself, which llama.cpp copies onto a GPU), each device its share of
transformer blocks with their KV cache and its own compute buffer. Layers go to devices in proportion to the room each budget leaves after its
fixed terms. The draft model, whole, goes to the device where it leaves the most room. The
configuration (drafter, γ, KV type, window, n_ubatch) is the fastest candidate of
memplanner/options.py that splits, so the degradation order is the single-device one.
Pure: plans for devices this machine does not have.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from memplanner import terms
from memplanner.device import is_gpu
from memplanner.options import Candidate, PlanSettings, Workload
from memplanner.planner import REPACK_EITHER, alpha_table, plan_candidates, degradations_from
from memplanner.shapes import ModelShape
from memplanner.sizes import format_bytes, parse_size

DEVICE_NAME = re.compile(r"^(cpu|cuda|rocm)(:\d+)?$")  # cpu:0, cpu:1: devices simulated on one CPU
# Host memory, not device memory, when the devices are GPUs: the interpreter, llama.cpp's
# vocabulary tables, the Python side of a generation and the n-gram index.
HOST_TERMS = ("process_base", "huge_page_rounding", "target_metadata", "draft_metadata", "working_set", "ngram_index",
              "ngram_corpus")


@dataclass(frozen=True)
class DeviceBudget:
    name: str  # cpu | cuda[:N] | rocm[:N]
    budget_bytes: int

    @property
    def kind(self) -> str:
        """What the memory terms depend on: ROCm builds of torch and llama.cpp use CUDA's terms."""
        return "cuda" if is_gpu(self.name) else "cpu"


def device_ordinal(name: str) -> int:
    """cuda:2 -> 2; cuda, rocm or cpu alone -> 0."""
    _, _, index = name.partition(":")
    return int(index or 0)


def execution_order(names: list[str]) -> list[str]:
    """The order llama.cpp runs a layer split in: CPU devices as listed, then the GPUs by ordinal
    (llama.cpp numbers its GPUs and hands them consecutive runs of blocks in that order)."""
    return [name for name in names if not is_gpu(name)] + sorted(filter(is_gpu, names), key=device_ordinal)


def parse_device_budgets(devices: str | None, budgets: str) -> list[DeviceBudget]:
    """`cuda:0,cuda:1` with `6GiB,4GiB` (or one size for each), or `cuda:0=6GiB,cuda:1=4GiB`."""
    items = [item.strip() for item in budgets.split(",")]
    if not any(items):
        raise ValueError("--memory-budget is empty; give e.g. 6GiB,4GiB or cuda:0=6GiB,cuda:1=4GiB")
    if not all(items):  # `6GiB,,4GiB`: a budget left out by mistake, maybe
        raise ValueError("an entry of --memory-budget is empty; give the sizes separated by single commas")
    named = [item.partition("=") for item in items]
    if all(sep for _, sep, _ in named):
        pairs = [(name.strip(), size) for name, _, size in named]
        if devices is not None and [name for name, _ in pairs] != _device_names(devices):
            raise ValueError(f"--devices {devices} and the devices in --memory-budget {budgets} differ; give one")
    elif any(sep for _, sep, _ in named):
        raise ValueError(f"--memory-budget {budgets!r} mixes DEVICE=SIZE with plain sizes; use one form")
    else:
        names = _device_names(devices) if devices is not None else ["cpu"]
        if len(items) == 1:
            items = items * len(names)
        if len(items) != len(names):
            raise ValueError(f"{len(names)} devices ({', '.join(names)}) but {len(items)} budgets ({budgets}); "
                             "give one size, or one per device")
        pairs = list(zip(names, items))
    _check_names([name for name, _ in pairs])
    found = []
    for name, size in pairs:
        budget_bytes = parse_size(size)
        if budget_bytes <= 0:
            raise ValueError(f"the budget for {name} must be positive, got {size!r}")
        found.append(DeviceBudget(name, budget_bytes))
    return found


def parse_devices(devices: str) -> tuple[str, ...]:
    """`cuda:0,cuda:1`: device names, checked, each once."""
    names = _device_names(devices)
    _check_names(names)
    return tuple(names)


def _check_names(names: list[str]) -> None:
    for name in names:
        if not DEVICE_NAME.match(name):
            raise ValueError(f"device {name!r} is not one of cpu[:N], cuda[:N], rocm[:N]")
    if len(set(names)) != len(names):
        raise ValueError(f"a device is listed twice in {', '.join(names)}")


def even_layer_counts(num_layers: int, num_devices: int) -> tuple[int, ...]:
    """Blocks per device as even as possible, the earlier devices taking one more (no plan given)."""
    return tuple(num_layers // num_devices + (index < num_layers % num_devices) for index in range(num_devices))


def layer_counts(planned: tuple[int, ...], num_layers: int, num_devices: int) -> tuple[int, ...]:
    """Blocks per device: the plan's (`layers_per_device`), or an even split when there is none."""
    return tuple(planned) or even_layer_counts(num_layers, num_devices)


def _device_names(devices: str) -> list[str]:
    names = [name.strip() for name in devices.split(",")]
    if not any(names):
        raise ValueError("--devices is empty; give e.g. cuda:0,cuda:1")
    if not all(names):  # `cpu:0,,cpu:1`: a device left out by mistake, maybe
        raise ValueError("an entry is empty; give the devices separated by single commas")
    return names


@dataclass
class DeviceShare:
    device: str
    budget_bytes: int
    first_layer: int
    num_layers: int
    holds_draft: bool
    terms: dict[str, int]

    @property
    def peak_bytes(self) -> int:
        return sum(self.terms.values())


@dataclass
class SplitPlan:
    feasible: bool
    reason: str
    settings: PlanSettings | None = None
    shares: list[DeviceShare] = field(default_factory=list)
    host_terms: dict[str, int] = field(default_factory=dict)
    predicted_tokens_per_second: float = 0.0
    degradations: list[str] = field(default_factory=list)

    @property
    def tensor_split(self) -> list[float]:
        """Each device's fraction of the target's blocks (llama.cpp's own tensor_split also counts the
        head: pocketspec/backends/llama_split.py)."""
        total = sum(share.num_layers for share in self.shares) or 1
        return [share.num_layers / total for share in self.shares]

    @property
    def draft_device(self) -> str | None:
        return next((share.device for share in self.shares if share.holds_draft), None)

    def to_dict(self) -> dict:
        found = asdict(self)
        found["settings"] = asdict(self.settings) if self.settings else None
        found.update(tensor_split=self.tensor_split, draft_device=self.draft_device,
                     predicted_peak_bytes={share.device: share.peak_bytes for share in self.shares})
        return found


def _fixed_terms(candidate: Candidate, target: ModelShape, index: int, devices: list[DeviceBudget],
                 holds_draft: bool) -> dict[str, int]:
    """A device's terms apart from its target blocks: overhead, compute, embeddings or head, the draft."""
    found, kind = candidate.terms, devices[index].kind
    is_first, is_last = index == 0, index == len(devices) - 1
    fixed = {"compute": found.get("target_compute", 0)}
    if kind == "cuda" or is_first:  # one CUDA context per GPU; one Python process in all
        fixed["runtime_overhead"] = terms.runtime_overhead_bytes(kind)
    if is_first and kind == "cpu":  # the host: token_embd never leaves it
        fixed["embeddings"] = target.embedding_bytes
    if is_last:
        fixed["output_head"] = target.output_bytes + (target.embedding_bytes if target.tied_output
                                                      and kind == "cuda" else 0)
        fixed.update({name: found.get(name, 0) for name in ("target_logits", "target_probs")})
    if holds_draft:
        fixed.update({name: value for name, value in found.items()
                      if name.startswith("draft_") and name not in HOST_TERMS})
    if kind == "cpu" and is_first:
        fixed.update({name: found.get(name, 0) for name in HOST_TERMS})
    # read without mmap, the repacked tensors are in the blocks' bytes once and the header is not mapped
    if kind == "cpu" and is_first and not terms.loads_without_mmap(target, kind, candidate.settings.repack_weights):
        fixed["gguf_header"] = target.file_bytes - target.weight_bytes  # mmapped with the tensors
        if candidate.settings.repack_weights:
            fixed["target_repacked_weights"] = found.get("target_repacked_weights", 0)
    return {name: int(value) for name, value in fixed.items() if value}


def _layer_bytes(target: ModelShape, settings: PlanSettings, first: int, count: int) -> tuple[int, int]:
    """(weights, KV cache) of target blocks first .. first + count - 1."""
    kv_all = terms.kv_cache_bytes(target, settings.target_n_ctx, settings.target_kv_type,
                                  num_seqs=settings.batch_size)
    return target.layer_weight_bytes(first, count), kv_all * count // target.num_layers


def assign_layers(per_layer: list[int], room: list[int]) -> list[int] | None:
    """Blocks per device (each block per_layer[i] bytes), in proportion to each device's room, never over
    it; None if they do not fit."""
    if min(room) < 0:
        return None
    num_layers = len(per_layer)
    total_room, total_layers = sum(room), sum(per_layer)
    if total_room < total_layers:
        return None
    counts, layer, used_share = [], 0, 0.0
    for index, device_room in enumerate(room):
        used_share += device_room / total_room
        count, used = 0, 0
        is_last = index == len(room) - 1
        while layer < num_layers and used + per_layer[layer] <= device_room and (
                is_last or sum(per_layer[:layer + 1]) <= used_share * total_layers + per_layer[layer] / 2):
            used += per_layer[layer]
            count += 1
            layer += 1
        counts.append(count)
    if layer < num_layers:  # rounding left blocks over: fill devices in order instead
        counts, layer = [], 0
        for device_room in room:
            count, used = 0, 0
            while layer < num_layers and used + per_layer[layer] <= device_room:
                used, count, layer = used + per_layer[layer], count + 1, layer + 1
            counts.append(count)
    return counts if layer == num_layers else None


def _split(candidate: Candidate, target: ModelShape, devices: list[DeviceBudget],
           draft_index: int | None) -> list[DeviceShare] | None:
    fixed = [_fixed_terms(candidate, target, index, devices, index == draft_index) for index in range(len(devices))]
    room = [device.budget_bytes - sum(terms_.values()) for device, terms_ in zip(devices, fixed)]
    per_layer = [sum(_layer_bytes(target, candidate.settings, index, 1)) for index in range(target.num_layers)]
    counts = assign_layers(per_layer, room)
    if counts is None:
        return None
    shares, first = [], 0
    for index, (device, count) in enumerate(zip(devices, counts)):
        weights, kv_cache = _layer_bytes(target, candidate.settings, first, count)
        device_terms = {"target_blocks": weights, "target_kv_cache": kv_cache, **fixed[index]}
        shares.append(DeviceShare(device.name, device.budget_bytes, first, count, index == draft_index,
                                  {name: value for name, value in device_terms.items() if value}))
        first += count
    return shares


def plan_split(devices: list[DeviceBudget], target: ModelShape, draft: ModelShape | None, workload: Workload,
               alpha: float | dict[str, float] | None = None,
               repack: tuple[bool, ...] = REPACK_EITHER) -> SplitPlan:
    """The fastest configuration whose layer split fits every device's budget, or a refusal. The
    shares come in execution_order, whatever order the devices were given in."""
    by_name = {device.name: device for device in devices}
    devices = [by_name[name] for name in execution_order(list(by_name))]
    kind = "cuda" if any(device.kind == "cuda" for device in devices) else "cpu"
    candidates = sorted(plan_candidates(target, draft, workload, kind, alpha_table(alpha), repack),
                        key=lambda c: c.preference, reverse=True)
    for candidate in candidates:
        placements = list(range(len(devices))) if candidate.settings.drafter == "model" else [None]
        splits = [shares for index in placements if (shares := _split(candidate, target, devices, index))]
        if splits:
            shares = max(splits, key=lambda found: min(s.budget_bytes - s.peak_bytes for s in found))
            host = {} if devices[0].kind == "cpu" else {
                **{name: value for name, value in candidate.terms.items() if name in HOST_TERMS},
                "embeddings": target.embedding_bytes}
            return SplitPlan(True, "", candidate.settings, shares, host, candidate.tokens_per_second,
                             degradations_from(candidate, candidates[0]))
    smallest = min(candidates, key=lambda c: c.peak_bytes)
    listed = ", ".join(f"{d.name} {format_bytes(d.budget_bytes)}" for d in devices)
    runs = "with the draft model it needs" if smallest.settings.drafter == "model" else "plain decoding needs"
    return SplitPlan(False, f"{target.name} does not fit across {listed}: {runs} about "
                            f"{format_bytes(smallest.peak_bytes)} in all, blocks of "
                            f"{format_bytes(target.layer_weight_bytes(0, 1))}, plus each device's own overhead; "
                            "raise a budget or add a device")
