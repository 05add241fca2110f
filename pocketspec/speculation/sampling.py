"""Turning logits into the distribution a token is drawn from (temperature, top-k, top-p).

The same function shapes target and draft distributions, which lossless
speculative sampling requires.
"""

from __future__ import annotations

import numpy as np

from pocketspec.settings import SamplingSettings
from pocketspec.speculation.draws import SeededDraws

# top-p first looks among this many best tokens; almost always enough mass is there.
_TOP_P_CANDIDATES = 1024


def greedy_tokens(logits: np.ndarray) -> np.ndarray:
    """Argmax per row of logits [rows, vocab] -> [rows]."""
    return np.argmax(logits, axis=-1)


def _keep_top_k(scores: np.ndarray, top_k: int) -> np.ndarray:
    if top_k <= 0 or top_k >= scores.shape[-1]:
        return scores
    kth_best = np.partition(scores, -top_k)[-top_k]
    return np.where(scores >= kth_best, scores, -np.inf)


def _keep_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    if top_p >= 1.0:
        return probs
    num_candidates = min(_TOP_P_CANDIDATES, probs.shape[-1])
    least_candidate = probs[np.argpartition(probs, -num_candidates)[-num_candidates:]].min()
    # every token tied with the least candidate too, in id order: the prefix with which a stable sort of the
    # whole vocabulary (the device's, device_sampling.distributions) starts, ties in id order
    candidates = np.flatnonzero(probs >= least_candidate)
    if probs[candidates].sum() < top_p:
        candidates = np.arange(probs.shape[-1])
    ordered = candidates[np.argsort(-probs[candidates], kind="stable")]
    cumulative = np.cumsum(probs[ordered])
    # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
    num_kept = int(np.searchsorted(cumulative, top_p, side="left")) + 1
    kept = np.zeros_like(probs)
    kept_ids = ordered[:num_kept]
    kept[kept_ids] = probs[kept_ids]
    return kept / kept.sum()


def distribution(logits: np.ndarray, sampling: SamplingSettings) -> np.ndarray:
    """Probabilities [vocab] (float64) after temperature, top-k and top-p, for one row."""
    scores = logits.astype(np.float64) / sampling.temperature
    scores = _keep_top_k(scores, sampling.top_k)
    scores -= scores.max()
    probs = np.exp(scores)
    probs /= probs.sum()
    return _keep_top_p(probs, sampling.top_p)


def choose_token(logits: np.ndarray, sampling: SamplingSettings, draws: SeededDraws) -> int:
    """The next token from logits [vocab]: the argmax at temperature 0, else the draw at draws' position."""
    if sampling.is_greedy:
        return int(np.argmax(logits))
    return draws.token(distribution(logits, sampling))
