"""Choosing and verifying tokens on the model's device: the rules of pocketspec/speculation/sampling.py
and verify.py over torch tensors.

The logits never leave the device. A verify step returns one small tensor, [number accepted,
next token], that the caller reads in one transfer; nothing here branches on a device value
(no `.item()`, no data-dependent shapes), so a GPU never waits in the middle. The draws are
pocketspec/speculation/draws.py's: each row comes with its position's 64-bit key (an int64 tensor)
and the device hashes the key with every token id, so the device needs no generator of its own
and draws what the host would. Distributions are float64, as the host's: in float32 a token near the
race's tail threshold, or a pick inside the tail group, could fall otherwise than on the host (a review
counted 4 draws in 1,500 at temperature 1 over a flat 150k vocabulary), and a request would sample differently
alone (here) than in a batch (on the host). tests/test_device_sampling.py checks that the two agree
and that both keep the target distribution (χ²).
"""

from __future__ import annotations

import torch

from pocketspec.settings import SamplingSettings
from pocketspec.speculation.draws import GOLDEN, MIX1, MIX2, TAIL_BELOW, TAIL_PICK_ID, TAIL_RACE_ID, TO_UNIT


def distributions(logits: torch.Tensor, sampling: SamplingSettings) -> torch.Tensor:
    """Probabilities [rows, vocab] (float64, as the host's) after temperature, top-k and top-p, for logits
    [rows, vocab]. In place where the values allow: three [rows, vocab] float64/int64 tensors live at once
    (the probabilities, and top-p's sorted copy and its order) beside the sort's own workspace: about 4
    measured on a CPU, memplanner/torch_peak.py's SAMPLING_TEMPORARIES."""
    scores = logits.to(torch.float64, copy=True).div_(sampling.temperature)
    vocab_size = scores.shape[-1]
    if 0 < sampling.top_k < vocab_size:
        kth_best = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]  # [rows, 1]
        scores.masked_fill_(scores < kth_best, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    del scores
    if sampling.top_p >= 1.0:
        return probs
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    # keep the smallest prefix whose mass reaches top_p, the token crossing it included (the host's count)
    num_kept = (ordered.cumsum_(dim=-1) < sampling.top_p).sum(dim=-1, keepdim=True) + 1  # [rows, 1]
    del ordered
    is_kept_in_order = torch.arange(vocab_size, device=probs.device) < num_kept  # [rows, vocab]
    is_dropped = torch.ones_like(probs, dtype=torch.bool).scatter_(-1, order, is_kept_in_order).logical_not_()
    del order
    probs.masked_fill_(is_dropped, 0.0)
    return probs.div_(probs.sum(dim=-1, keepdim=True))


def _signed(value: int) -> int:
    """A uint64 constant as the int64 with its bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(values: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 values (torch's >> is arithmetic): a new tensor."""
    return (values >> bits).bitwise_and_((1 << (64 - bits)) - 1)


def _mix64_(values: torch.Tensor) -> torch.Tensor:
    """draws.mix64 in place on int64 values, whose arithmetic wraps as uint64's does: the same bits. One
    temporary of values' size lives beside them at a time."""
    values.add_(_signed(GOLDEN))
    values.bitwise_xor_(_shift_right(values, 30)).mul_(_signed(MIX1))
    values.bitwise_xor_(_shift_right(values, 27)).mul_(_signed(MIX2))
    return values.bitwise_xor_(_shift_right(values, 31))


def _unit_interval_(bits: torch.Tensor) -> torch.Tensor:
    """draws.unit_interval, shifting int64 bits in place: float64 values in (0, 1)."""
    bits.bitwise_right_shift_(12).bitwise_and_((1 << 52) - 1)
    return bits.double().add_(0.5).mul_(TO_UNIT)


def unit_interval(bits: torch.Tensor) -> torch.Tensor:
    """draws.unit_interval for int64 bits."""
    return _unit_interval_(bits.clone())


def uniforms(keys: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """draws.uniforms for keys [rows] and ids [n]: float64 [rows, n] in (0, 1). Hashed in place: two
    [rows, n] tensors live at once at most."""
    return _unit_interval_(_mix64_(ids[None, :] ^ keys[:, None]))


def race_rows(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """draws.race for each row of probs [rows, vocab] with its key of keys [rows] (int64): token ids [rows].
    Every token's race time is computed (a GPU does the whole vocabulary at once), in place over its uniform,
    hashed in one pass with the tail group's two ids; the tail group's draw is as the host's, so both draw
    the same token but where float32 and float64 probabilities part."""
    vocab_size = probs.shape[-1]
    ids = torch.arange(vocab_size + 2, device=probs.device, dtype=torch.long)
    ids[vocab_size].fill_(TAIL_RACE_ID)  # filled on the device: no host copy
    ids[vocab_size + 1].fill_(TAIL_PICK_ID)
    drawn = uniforms(keys, ids)  # [rows, vocab + 2]
    tail_race, tail_pick = drawn[:, vocab_size], drawn[:, vocab_size + 1]
    is_tail = probs < TAIL_BELOW
    times = drawn[:, :vocab_size].log_().neg_().div_(probs).masked_fill_(is_tail, float("inf"))
    best_time, best_token = times.min(dim=-1)
    cumulative = torch.where(is_tail, probs, 0.0)
    cumulative.cumsum_(dim=-1)
    tail_mass = cumulative[:, -1]
    tail_time = -torch.log(tail_race) / tail_mass  # inf where the tail has no mass
    picked = torch.searchsorted(cumulative, (tail_pick * tail_mass)[:, None], right=True)[:, 0]
    tail_token = picked.clamp(max=vocab_size - 1)
    return torch.where(tail_time < best_time, tail_token, best_token)


def choose(logits: torch.Tensor, sampling: SamplingSettings, key: torch.Tensor) -> torch.Tensor:
    """The next token (0-dim) from logits [vocab]: the argmax at temperature 0, else the draw for the
    position of key [1] (int64)."""
    if sampling.is_greedy:
        return torch.argmax(logits)
    return race_rows(distributions(logits[None], sampling), key.reshape(1))[0]


def _verdict(num_accepted: torch.Tensor, next_token: torch.Tensor) -> torch.Tensor:
    return torch.stack([num_accepted, next_token]).long()  # [2]: read once by the caller


def _num_accepted(is_accepted: torch.Tensor) -> torch.Tensor:
    """How many leading entries of is_accepted [γ] are true (0-dim)."""
    return torch.cumprod(is_accepted.long(), dim=0).sum()


def verify_greedy(draft_tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Temperature 0: accept while the draft [γ] equals the argmax of logits [γ + 1, vocab];
    the next token is the argmax after the last accepted one."""
    choices = torch.argmax(logits, dim=-1)  # [γ + 1]
    num_accepted = _num_accepted(draft_tokens == choices[:-1])
    return _verdict(num_accepted, choices.gather(0, num_accepted.reshape(1))[0])


def verify_sampled(draft_tokens: torch.Tensor, target_probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """verify.verify_sampled: every row draws the target's token for its position (keys [γ + 1]); a draft
    token [γ] is accepted while it is that draw, and the first other draw (or the last row's, the bonus)
    is emitted. target_probs [γ + 1, vocab]; a caller consumes only the first num_accepted + 1 positions."""
    draws = race_rows(target_probs, keys)  # [γ + 1]
    num_accepted = _num_accepted(draws[:draft_tokens.shape[0]] == draft_tokens)
    return _verdict(num_accepted, draws.gather(0, num_accepted.reshape(1))[0])


def verify(draft_tokens: torch.Tensor, logits: torch.Tensor, sampling: SamplingSettings,
           keys: torch.Tensor) -> torch.Tensor:
    """One step's rule from the target's logits [γ + 1, vocab] (verify.verify_logits on the device):
    [number accepted, next token] as a tensor [2]."""
    if sampling.is_greedy:
        return verify_greedy(draft_tokens, logits)
    return verify_sampled(draft_tokens, distributions(logits, sampling), keys)
