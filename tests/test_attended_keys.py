"""The attended-keys draft window (--self-draft-keys attended): which keys it keeps, and that the draft's cache
holds exactly those keys and values of the target's, rotated to their slots."""

from __future__ import annotations

import pytest
import torch

from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.settings import ModelSettings
from pocketspec.torch_model.attended_keys import attended_positions, attention_mass
from pocketspec.torch_model.model import apply_rope, rope_angles
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SETTINGS = ModelSettings(backend="torch", weights="fp32", max_context=512)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    target_path, _ = write_tiny_pair(tmp_path_factory.mktemp("attended"), quant=None)
    backend = TorchBackend.open(target_path, SETTINGS)
    yield backend
    backend.close()


def _context(backend, num_tokens: int) -> list[int]:
    return [int(token) for token in torch.randint(3, backend.vocab_size, (num_tokens,),
                                                  generator=torch.Generator().manual_seed(num_tokens))]


def test_each_head_keeps_its_most_attended_positions_and_their_neighbours_in_order():
    mass = torch.full((2, 40), 0.01)
    mass[0, 30], mass[1, 5], mass[1, 12] = 5.0, 4.0, 3.0
    chosen = attended_positions(mass, 7, pool_size=3)
    assert chosen[0].tolist() == sorted(chosen[0].tolist())
    assert {29, 30, 31} <= set(chosen[0].tolist())
    assert {4, 5, 6, 11, 12, 13} <= set(chosen[1].tolist())
    assert attended_positions(mass, 40).tolist() == [list(range(40))] * 2  # a budget past the candidates keeps all


def test_the_attention_mass_sums_each_observed_query_to_one(tiny_target):
    context = _context(tiny_target, 120)
    tiny_target.rollback(0)
    tiny_target.prefill(context)
    masses = attention_mass(tiny_target.model, tiny_target.cache, context[-8:], 120, 120, 2)
    num_query_heads = tiny_target.model.config.num_heads
    assert len(masses) == 2 and masses[0].shape == (2, 120)
    # every candidate is visible: each of the 8 queries of each query head puts a whole unit of attention on them
    assert torch.allclose(sum(mass.sum() for mass in masses), torch.tensor(2.0 * 8 * num_query_heads), rtol=1e-4)


def test_the_draft_holds_the_chosen_keys_rotated_to_their_slots(tiny_target):
    context = _context(tiny_target, 200)
    tiny_target.rollback(0)
    tiny_target.prefill(context)
    draft = tiny_target.self_draft(ModelSettings(backend="torch", weights="fp32", max_context=96, max_logits_rows=1),
                                   keeps_attended=True)
    selection = list(range(-1, -41, -1))
    draft.hold_attended_view(selection, 16, 170, 200)
    assert draft.cached_tokens == selection + context[170:200]
    chosen = attended_positions(attention_mass(tiny_target.model, tiny_target.cache, context[184:200], 200, 170,
                                               2)[0], 40)
    positions = torch.cat([chosen, torch.arange(170, 200).expand(2, -1)], dim=1)  # [kv_heads, 70]
    # layer 0's keys depend only on the token and its position: compute each one unrotated, then rotate to its slot
    model = tiny_target.model
    unrotated_cos, unrotated_sin = rope_angles(torch.zeros(len(context)), model.inv_freq)
    _, keys, values = model.layers[0].project(model.embed(torch.tensor([context])), unrotated_cos, unrotated_sin)
    for head in range(2):
        cos, sin = rope_angles(torch.arange(70), model.inv_freq)
        expected = apply_rope(keys[0, head, positions[head]], cos, sin)
        assert torch.allclose(draft.cache.keys[0][0, head, :70], expected, atol=1e-4)
        assert torch.allclose(draft.cache.values[0][0, head, :70], values[0, head, positions[head]], atol=1e-5)


def test_a_draft_that_keeps_every_key_computes_what_the_target_computes(tiny_target):
    """Keeping all 60 earlier positions and the 40 recent ones, every key sits at its own position: the draft's
    next-token logits are the target's, bit for bit."""
    context = _context(tiny_target, 101)
    tiny_target.rollback(0)
    tiny_target.prefill(context[:100])
    draft = tiny_target.self_draft(ModelSettings(backend="torch", weights="fp32", max_context=128, max_logits_rows=1),
                                   keeps_attended=True)
    draft.hold_attended_view(list(range(-1, -61, -1)), 16, 60, 100)
    assert torch.equal(torch.from_numpy(draft.forward(context[100:], [0])),
                       torch.from_numpy(tiny_target.forward(context[100:], [0])))
