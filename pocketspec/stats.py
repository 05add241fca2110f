"""Counters for one generation and the peak-memory readings they report."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, field
from typing import Callable


def vm_hwm_bytes(pid: int | str) -> int | None:
    """A process's peak resident set size (VmHWM of /proc/PID/status); None where there is none."""
    return _status_bytes(pid, "VmHWM:")


def vm_rss_bytes(pid: int | str) -> int | None:
    """A process's resident set size now (VmRSS of /proc/PID/status): what it keeps, below its peak."""
    return _status_bytes(pid, "VmRSS:")


def _status_bytes(pid: int | str, field_name: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field_name):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def gpu_allocator_peaks(reserved: bool = False) -> dict[str, int]:
    """torch's allocator peak (allocated, or reserved) on every GPU this process used (target, draft,
    each split device), by name; {} when torch never touched a GPU. torch.cuda.max_memory_allocated()
    with no argument reads only the current device: a draft on cuda:1 or a split's later devices
    would go uncounted."""
    torch = sys.modules.get("torch")  # never imported here: a llama.cpp run has no torch allocator
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    read = torch.cuda.max_memory_reserved if reserved else torch.cuda.max_memory_allocated
    peaks = {f"cuda:{index}": int(read(index)) for index in range(torch.cuda.device_count())}
    return {name: peak for name, peak in peaks.items() if peak}


def budgeted_peak_bytes(other_gpu_peaks: dict[str, int] | None = None,
                        other_processes_rss: Callable[[], int] = lambda: 0) -> int:
    """What --memory-budget bounds: torch's allocator peaks summed over every GPU used (this process's, and
    other_gpu_peaks: a row split's other ranks'); on a CPU this process's peak resident memory plus
    other_processes_rss() (asked only then: a row split's other ranks, one round trip)."""
    gpu_peaks = {**gpu_allocator_peaks(), **(other_gpu_peaks or {})}
    if gpu_peaks:
        return sum(gpu_peaks.values())
    return peak_rss_bytes() + other_processes_rss()


def peak_rss_bytes() -> int:
    """Highest resident set size of this process's own address space so far.

    Linux's ru_maxrss survives execve: a process spawned by a large parent (pytest after
    importing torch, an IDE) starts with the parent's high-water mark. VmHWM belongs to
    the new address space, so it is read first; ru_maxrss is the fallback elsewhere
    (KiB on Linux, bytes on macOS).
    """
    peak = vm_hwm_bytes("self")
    if peak is not None:
        return peak
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss if sys.platform == "darwin" else max_rss * 1024


def drafting_text(num_drafted: int, num_accepted: int, num_steps: int | None = None) -> str:
    """A summary line's drafting part: 'acceptance 62%, 1.40 accepted/step' (without num_steps, the acceptance
    alone), or 'nothing drafted' (plain decoding, or a controller that never found a draft worth verifying:
    not an acceptance of 0 %)."""
    if not num_drafted:
        return "nothing drafted"
    acceptance = f"acceptance {num_accepted / num_drafted:.0%}"
    return acceptance if num_steps is None else f"{acceptance}, {num_accepted / max(num_steps, 1):.2f} accepted/step"


def decode_token_count(num_tokens: int, is_ended_by_end_token: bool, num_first_tokens: int = 1) -> int:
    """The tokens a generation's decode steps produced, from the num_tokens it emitted: those after the first
    num_first_tokens (which the prefill yields), its end-of-generation token included, since that token's step is
    decoded and timed like any other. llama.cpp's tools count the same way (llama-speculative-simple's n_predict
    includes the end token), so every system's decode rate divides the same tokens by the same steps' time."""
    return max(num_tokens + int(is_ended_by_end_token) - num_first_tokens, 0)


@dataclass
class GenerationStats:
    num_tokens: int = 0  # the tokens emitted: an end-of-generation token is not one
    is_ended_by_end_token: bool = False  # the target produced its end-of-generation token (not emitted)
    num_prompt_tokens: int = 0
    num_reused_tokens: int = 0  # prompt tokens whose KV was kept from an earlier call
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    num_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    steps_by_drafter: dict[str, int] = field(default_factory=dict)
    step_seconds_by_drafter: dict[str, float] = field(default_factory=dict)  # whole steps, drafting included
    steps_by_gamma: dict[int, int] = field(default_factory=dict)  # how often each draft length was verified
    peak_rss_bytes: int = 0
    # seconds of the steps spent outside the models' forwards: drafting lookups, the controller, verification
    loop_seconds: float = 0.0

    def record_step(self, drafter: str, num_drafted: int, num_accepted: int, seconds: float,
                    forward_seconds: float | None = None) -> None:
        """forward_seconds: the step's time inside model forwards (target and draft model, each with the choice or
        verification of its tokens), when known."""
        if forward_seconds is not None:
            self.loop_seconds += max(seconds - forward_seconds, 0.0)
        self.num_steps += 1
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        self.steps_by_drafter[drafter] = self.steps_by_drafter.get(drafter, 0) + 1
        self.step_seconds_by_drafter[drafter] = self.step_seconds_by_drafter.get(drafter, 0.0) + seconds
        self.steps_by_gamma[num_drafted] = self.steps_by_gamma.get(num_drafted, 0) + 1

    @property
    def plain_step_seconds(self) -> float:
        """Mean seconds of a step that drafted nothing: what speculation costs when it cannot help."""
        steps = self.steps_by_drafter.get("none", 0)
        return self.step_seconds_by_drafter.get("none", 0.0) / steps if steps else 0.0

    @property
    def mean_drafted_gamma(self) -> float:
        """Mean draft length over the steps that drafted (0.0 when none did)."""
        drafting = {gamma: count for gamma, count in self.steps_by_gamma.items() if gamma > 0}
        num_steps = sum(drafting.values())
        return sum(gamma * count for gamma, count in drafting.items()) / num_steps if num_steps else 0.0

    @property
    def loop_seconds_per_step(self) -> float:
        """Mean seconds a step spends outside the forwards: the speculative loop's own overhead."""
        return self.loop_seconds / self.num_steps if self.num_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_seconds(self) -> float:
        return max(self.seconds - self.prefill_seconds, 0.0)

    @property
    def num_decode_tokens(self) -> int:
        return decode_token_count(self.num_tokens, self.is_ended_by_end_token)

    @property
    def decode_tokens_per_second(self) -> float:
        """The decode steps' tokens (num_decode_tokens) per second of decoding."""
        return self.num_decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def mean_accepted_per_step(self) -> float:
        """Accepted draft tokens per verify step (the recovered or bonus token not counted)."""
        return self.num_accepted / self.num_steps if self.num_steps else 0.0

    def as_dict(self) -> dict:
        return {
            "num_tokens": self.num_tokens,
            "is_ended_by_end_token": self.is_ended_by_end_token,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_reused_tokens": self.num_reused_tokens,
            "seconds": round(self.seconds, 4),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "decode_seconds": round(self.decode_seconds, 4),
            "decode_tokens_per_second": round(self.decode_tokens_per_second, 3),
            "num_steps": self.num_steps,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_per_step": round(self.mean_accepted_per_step, 4),
            "steps_by_drafter": dict(self.steps_by_drafter),
            "steps_by_gamma": {str(gamma): count for gamma, count in sorted(self.steps_by_gamma.items())},
            "plain_step_seconds": round(self.plain_step_seconds, 6),
            "loop_seconds_per_step": round(self.loop_seconds_per_step, 6),
            "peak_rss_bytes": self.peak_rss_bytes,
        }
