"""pocketspec.backends.exact_width: the on-disk cache key of the --exact-verify width probe."""

from __future__ import annotations

from dataclasses import dataclass

from pocketspec.backends.exact_width import _cache_key
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
    keys = [_cache_key(Loaded(smollm2_path, ModelSettings(**placement)), 8) for placement in placements]
    assert len(set(keys)) == len(keys)
    assert _cache_key(Loaded(smollm2_path, ModelSettings(devices=("cuda:0",))), 8) == keys[1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert _cache_key(Loaded(smollm2_path, ModelSettings(devices=("cuda:0",))), 8) != keys[1]
