"""pocketspec/speculation/prefix.py: which cached tokens a fresh prefill would compute alike (whole n_batch
chunks from position 0), and how many of them a later prompt may reuse."""

from pocketspec.speculation.prefix import exact_after_prefill, reusable_whole_chunks


def test_a_prefill_from_zero_is_exact_up_to_its_last_whole_chunk():
    assert exact_after_prefill(0, 0, 1100, 512) == 1024
    assert exact_after_prefill(0, 0, 1024, 512) == 1024  # the last chunk whole too
    assert exact_after_prefill(0, 0, 511, 512) == 0


def test_a_prefill_after_reused_whole_chunks_extends_them_and_one_after_a_part_chunk_does_not():
    assert exact_after_prefill(1024, 512, 600, 512) == 1024  # rolled back to 512, then one more whole chunk
    assert exact_after_prefill(1024, 100, 1000, 512) == 100  # from a part chunk: chunks of other bounds
    assert exact_after_prefill(0, 512, 512, 512) == 0  # the chunk before was never exact


def test_a_prompt_reuses_whole_exact_chunks_and_leaves_a_token_to_prefill():
    cached = list(range(1100))
    assert reusable_whole_chunks(cached, 1024, list(range(1000)) + [-1], 512) == 512
    assert reusable_whole_chunks(cached, 512, cached, 512) == 512
    assert reusable_whole_chunks(cached, 1024, cached[:1024], 512) == 512  # its last token is prefilled again
    assert reusable_whole_chunks(cached, 0, cached, 512) == 0
