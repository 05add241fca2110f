"""BatchLayout on hand-made rows: where each packed token goes (row, slot, position), what each row
sees, and that attend writes keys at (row, position) and attends per row."""

from __future__ import annotations


import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pocketspec.batch.forward_shape import AlignmentTimer, AttentionShape
from pocketspec.batch.layout import BatchLayout, RowInput
from pocketspec.torch_model.kv_cache import StaticKVCache
from pocketspec.torch_model.model import rope_angles

ROPE = rope_angles(torch.arange(64), 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
ITEMS = [RowInput(row=2, start=5, tokens=[11, 12, 13], num_logits=3),
         RowInput(row=0, start=9, tokens=[21], num_logits=1)]


def _layout(shape: AttentionShape, items=ITEMS) -> BatchLayout:
    return BatchLayout(items, rope=ROPE, shape=shape, timer=AlignmentTimer())


def test_tokens_are_packed_with_their_rows_slots_and_positions():
    layout = _layout(AttentionShape(is_blockwise=False))
    assert layout.tokens.tolist() == [[11, 12, 13, 21]]
    assert layout.row_of.tolist() == [0, 0, 0, 1] and layout.slot_of.tolist() == [0, 1, 2, 0]
    assert layout.write_rows.tolist() == [2, 2, 2, 0] and layout.write_positions.tolist() == [5, 6, 7, 9]
    assert torch.equal(layout.cos, ROPE[0][[5, 6, 7, 9]])
    assert layout.logits_rows.tolist() == [0, 1, 2, 3] and layout.logits_counts == [3, 1]
    # the second row has one real query; its padded slots look at position 0 only
    assert layout.query_positions.tolist() == [[5, 6, 7], [9, 0, 0]]
    assert layout.key_length == 10
    assert layout.mask[1, 0, 0].tolist() == [True] * 10 and layout.mask[0, 0, 0].tolist() == [True] * 6 + [False] * 4


def test_blockwise_shapes_pad_queries_and_keys_to_whole_tiles_and_blocks():
    layout = _layout(AttentionShape(is_blockwise=True, key_block=8, query_tile=4))
    assert layout.num_slots == 4 and layout.key_length == 16 and layout.mask is None
    assert layout.cache_rows.tolist() == [2, 0]  # not a run of rows: gathered
    consecutive = [RowInput(row=3, start=0, tokens=[1]), RowInput(row=4, start=2, tokens=[1, 2])]
    assert _layout(AttentionShape(is_blockwise=True, key_block=8, query_tile=4), consecutive).cache_rows == slice(3, 5)


def test_attend_writes_at_each_row_position_and_reads_every_row_past():
    cache = StaticKVCache(num_layers=1, num_kv_heads=1, head_dim=8, max_context=16, kv_dtype="fp32",
                          device=torch.device("cpu"), max_batch=3)
    cache.keys[0][:, :, :10] = 1.0  # earlier tokens
    cache.values[0][:, :, :10] = torch.arange(10.0)[None, None, :, None]
    layout = _layout(AttentionShape(is_blockwise=True, key_block=8, query_tile=4))
    q = torch.zeros(1, 2, 4, 8)  # equal scores: each query averages the values it sees
    k = torch.full((1, 1, 4, 8), 1.0)
    v = torch.tensor([50.0, 60.0, 70.0, 80.0])[None, None, :, None].expand(1, 1, 4, 8)
    out = layout.attend(q, k, v, cache, layer=0)
    assert cache.values[0][2, 0, 5:8, 0].tolist() == [50.0, 60.0, 70.0] and cache.values[0][0, 0, 9, 0] == 80.0
    assert cache.values[0][1, 0, :10, 0].tolist() == list(range(10))  # an untouched row
    expected = [sum(range(5)) + 50, sum(range(5)) + 50 + 60, sum(range(5)) + 50 + 60 + 70, sum(range(9)) + 80]
    counts = [6, 7, 8, 10]
    assert torch.allclose(out[0, :, :, 0], torch.tensor([e / c for e, c in zip(expected, counts)]).expand(2, 4))
    assert layout.timer.seconds["layout"] > 0 and layout.timer.seconds["kv_and_padding"] > 0


class _HostToDeviceCopies(TorchDispatchMode):
    """Counts copies from the host to another device."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].device.type == "cpu" \
                and (kwargs or {}).get("device", torch.device("cpu")).type != "cpu":
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_layout_copies_its_indices_to_the_device_once():
    """A GPU forward blocked on each host-to-device copy: the layout makes one (a meta device stands in)."""
    meta_rope = (ROPE[0].to("meta"), ROPE[1].to("meta"))
    with _HostToDeviceCopies() as copies:
        layout = BatchLayout(ITEMS, rope=meta_rope, shape=AttentionShape(is_blockwise=False), timer=AlignmentTimer())
    assert copies.count == 1
    assert layout.tokens.device.type == layout.logits_rows.device.type == layout.mask.device.type == "meta"
    assert layout.tokens.shape == (1, 4) and layout.write_rows.shape == (4,) and layout.cache_rows.shape == (2,)


class _FakeEvent:
    """torch.cuda.Event on a scripted clock that moves 10 ms at every record, counting synchronizations."""

    num_synchronized = 0
    num_recorded = 0

    def __init__(self, enable_timing: bool):
        assert enable_timing

    def record(self):
        self.at = 0.01 * _FakeEvent.num_recorded
        _FakeEvent.num_recorded += 1

    def synchronize(self):
        _FakeEvent.num_synchronized += 1

    def elapsed_time(self, end) -> float:
        return 1000 * (end.at - self.at)


def test_gpu_timing_records_events_and_waits_only_when_read(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: pytest.fail("a mark waited for the GPU"))
    timer = AlignmentTimer(uses_events=True)
    for _ in range(3):
        started = timer.now()
        timer.add("kv_and_padding", started, timer.now())
    assert _FakeEvent.num_synchronized == 0 and len(timer.pending) == 3
    assert timer.seconds["kv_and_padding"] == pytest.approx(0.03) and timer.seconds["layout"] == 0.0
    assert _FakeEvent.num_synchronized == 1 and not timer.pending  # read once, then kept as totals
