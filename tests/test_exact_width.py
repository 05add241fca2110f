"""pocketspec.backends.exact_width: the on-disk cache key of the --exact-verify width probe, and what it
advises when the probed width is narrow."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pocketspec.backends.exact_width import exact_width_cache_key, wider_exact_advice
from pocketspec.settings import ModelSettings


@dataclass
class Loaded:
    """What the key reads of a loaded backend: its file and its settings."""

    model_path: object
    settings: ModelSettings


def test_the_width_cache_key_tells_devices_and_splits_apart(smollm2_path, monkeypatch):
    """Another GPU, another split of the blocks or another split mode runs other kernels, so a width
    probed on one must not be reused on the other."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    placements = [dict(), dict(devices=("cuda:0",)), dict(devices=("cuda:1",)),
                  dict(devices=("cuda:0", "cuda:1"), layers_per_device=(14, 16)),
                  dict(devices=("cuda:0", "cuda:1"), layers_per_device=(16, 14)),
                  dict(devices=("cuda:0", "cuda:1"), split_mode="row")]
    keys = [exact_width_cache_key(Loaded(smollm2_path, ModelSettings(**placement))) for placement in placements]
    assert len(set(keys)) == len(keys)
    assert exact_width_cache_key(Loaded(smollm2_path, ModelSettings(devices=("cuda:0",)))) == keys[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert exact_width_cache_key(Loaded(smollm2_path, ModelSettings(devices=("cuda:0",)))) != keys[1]


@pytest.mark.parametrize("settings, width, row_exact_rows, advised", [
    # a stock build: PocketSpec's, then the stock kernels' levers
    (ModelSettings(), 1, 0, ("row-exact-verify.patch", "--kv-type bf16", "--no-repack")),
    (ModelSettings(kv_type="bf16"), 3, 0, ("row-exact-verify.patch", "--no-repack")),
    (ModelSettings(kv_type="bf16", repack_weights=False), 7, 0, ("row-exact-verify.patch",)),
    (ModelSettings(repack_weights=False), 1, 0, ("row-exact-verify.patch", "--kv-type bf16")),
    # PocketSpec's build: only a repacked type without a row-exact kernel (Q4_0) narrows it
    (ModelSettings(), 3, 32, ("--no-repack",)),
    (ModelSettings(), 32, 32, ()),
    (ModelSettings(gpu_layers=-1), 1, 0, ()),  # the CPU kernels' advice is not a GPU's
    (ModelSettings(backend="torch"), 1, 0, ()),
])
def test_a_narrow_exact_width_names_the_cpu_settings_that_widen_it(settings, width, row_exact_rows, advised):
    advice = wider_exact_advice(settings, width, row_exact_rows)
    if not advised:
        assert advice is None
    else:
        for lever in ("row-exact-verify.patch", "--kv-type bf16", "--no-repack"):
            assert (lever in advice) == (lever in advised), advice


class KernelsThatSwitch:
    """A backend whose batches of `switch_width` rows or more round one row's last bit otherwise, past
    `switch_depth` cached tokens too: the probe's comparison, bit for bit, on logits whose values are
    the position's and the token's."""

    vocab_size = 64
    max_context = 512

    def __init__(self, switch_width: int, deep_switch_width: int, switch_depth: int = 100):
        self.switch_width, self.deep_switch_width, self.switch_depth = switch_width, deep_switch_width, switch_depth
        self.num_cached = 0

    def rollback(self, num_kept: int) -> None:
        self.num_cached = min(self.num_cached, num_kept)

    def prefill(self, tokens):
        return self.forward(tokens, [len(tokens) - 1])[0]

    def forward(self, tokens, logits_rows):
        import numpy as np

        start, width = self.num_cached, len(tokens)
        self.num_cached += width
        logits = np.array([[np.float32(start + row) / 7 + np.float32(token) for token in range(self.vocab_size)]
                           for row in logits_rows], dtype=np.float32)
        switch = self.switch_width if start < self.switch_depth else self.deep_switch_width
        if width >= switch and len(logits) > 1:
            logits[1] = np.nextafter(logits[1], np.float32(np.inf))  # one bit, in one row
        return logits


@pytest.mark.parametrize("switch_width, deep_switch_width, expected", [(5, 40, 4), (40, 3, 2), (40, 40, 32)])
def test_the_probe_finds_the_widest_batch_that_rounds_as_one_row_does(switch_width, deep_switch_width, expected):
    from pocketspec.backends.exact_width import probe_exact_width

    backend = KernelsThatSwitch(switch_width, deep_switch_width)
    assert probe_exact_width(backend, 32) == expected
    assert backend.num_cached == 0


class CountingKernels(KernelsThatSwitch):
    def __init__(self, *args, max_context: int = 512):
        super().__init__(*args)
        self.max_context, self.num_forwards = max_context, 0

    def forward(self, tokens, logits_rows):
        self.num_forwards += 1
        return super().forward(tokens, logits_rows)


def test_one_probe_answers_every_narrower_width_and_a_shallow_one_not_a_deep_context(tmp_path, monkeypatch):
    """The probe is cached without the widest width asked for: a later run that asks for fewer rows reads it,
    one that asks for more rows, or reaches deeper than the probe did, probes again."""
    from pocketspec.backends import exact_width as probe

    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "exact_width_cache_key", lambda backend: "one-model")

    def width(max_width: int, max_context: int = 512) -> tuple[int, bool]:
        backend = CountingKernels(40, 6, max_context=max_context)  # exact up to 5 rows deep in the context
        return probe.exact_width(backend, max_width), backend.num_forwards > 0

    assert width(4, max_context=300) == (4, True)  # too short a context to probe deep
    assert width(3, max_context=300) == (3, False)
    assert width(4) == (4, True)  # this context reaches past the probe's depth
    assert width(32) == (5, True)
    assert [width(9), width(5), width(2)] == [(5, False), (5, False), (2, False)]


def test_a_probe_that_cannot_be_saved_is_used_and_said_so(tmp_path, monkeypatch):
    """A read-only home (here a file where the folder goes) probed again every run, without a word."""
    from pocketspec.backends import exact_width as probe

    (tmp_path / "exact_widths").write_text("")
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "exact_width_cache_key", lambda backend: "one-model")
    notes = []
    assert probe.exact_width(CountingKernels(40, 6, max_context=300), 4, notes.append) == 4
    assert "could not save the probed verify widths" in notes[-1] and "the next one probes again" in notes[-1]
