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
    keys = [exact_width_cache_key(Loaded(smollm2_path, ModelSettings(**placement)), 8) for placement in placements]
    assert len(set(keys)) == len(keys)
    assert exact_width_cache_key(Loaded(smollm2_path, ModelSettings(devices=("cuda:0",))), 8) == keys[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert exact_width_cache_key(Loaded(smollm2_path, ModelSettings(devices=("cuda:0",))), 8) != keys[1]


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
