"""How llama.cpp cuts a decode of several sequences into forward passes (checked against llama.cpp's own log of
its micro-batches in test_backend.py)."""

from __future__ import annotations

import pytest

from edgespec.models.microbatch import FILLERS_PER_PASS_SAVED, decode_passes, fill_gaps, split_equal


@pytest.mark.parametrize(
    ("tokens_by_seq", "passes"),
    [
        ({0: 1, 1: 1, 2: 1, 3: 1}, [4]),  # a row of each of consecutive sequences: one pass
        ({3: 1, 1: 1, 0: 1, 2: 1}, [4]),  # whatever order they are given in (the batch lists them by id)
        ({0: 1, 1: 1, 2: 1, 3: 4}, [4, 3]),  # a draft beside single rows: a pass of its own
        ({0: 4, 1: 4, 2: 4, 3: 4}, [16]),  # drafts of the same length: one pass
        ({0: 1, 2: 1, 3: 1}, [1, 2]),  # a gap in the ids breaks the run
        ({0: 2, 1: 1, 2: 2, 3: 1}, [4, 1, 1]),  # what is left of 0 and 2 is no longer consecutive
        ({0: 0, 1: 3}, [3]),  # a sequence with nothing in the decode is not in it
        ({}, []),
    ],
)
def test_sequences_split_into_runs_of_consecutive_ids_with_equal_tokens(tokens_by_seq, passes) -> None:
    assert decode_passes(tokens_by_seq, n_batch=512) == passes


def test_a_pass_holds_at_most_n_ubatch_tokens() -> None:
    assert split_equal({0: 300, 1: 300}, 512) == [512, 88]  # 256 of each, then the 44 left of each
    assert split_equal({0: 600}, 512) == [512, 88]
    assert split_equal({s: 1 for s in range(6)}, 4) == [6]  # llama.cpp takes a round of each in any case


def test_a_batch_goes_to_llama_decode_n_batch_tokens_at_a_time() -> None:
    # 9 + 9 tokens, 16 a call: {0: 9, 1: 7} is passes of 14 and 2, then the 2 left of sequence 1.
    assert decode_passes({0: 9, 1: 9}, n_batch=16) == [14, 2, 2]
    # One KV buffer: a call is one pass, whatever its sequences.
    assert decode_passes({0: 1, 1: 1, 2: 1, 3: 4}, n_batch=512, per_sequence_kv=False) == [7]
    assert decode_passes({0: 9, 1: 9}, n_batch=16, per_sequence_kv=False) == [16, 2]
    with pytest.raises(ValueError, match="n_batch"):
        decode_passes({0: 1}, n_batch=0)


def test_a_gap_between_busy_sequences_is_filled_when_that_saves_a_pass() -> None:
    # One token of 0, 2 and 3 is two passes (1, then 2); with a filler in 1, one pass of 4.
    assert fill_gaps({0: 1, 2: 1, 3: 1}, 512) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert decode_passes({0: 1, 2: 1, 3: 1}, 512, gaps_filled=True) == [4]
    assert decode_passes({2: 1, 0: 1}, 512, gaps_filled=True) == [3]
    assert fill_gaps({0: 1, 2: 1, 3: 4}, 512) == {0: 1, 1: 1, 2: 1, 3: 4}  # 3 passes become 2
    # Nothing to fill: consecutive ids, a sequence alone, none; a sequence with no tokens is not in the decode.
    assert fill_gaps({1: 1, 2: 3}, 512) == {1: 1, 2: 3}
    assert fill_gaps({3: 5}, 512) == {3: 5}
    assert fill_gaps({}, 512) == {}
    assert fill_gaps({0: 1, 1: 0, 2: 1}, 512) == {0: 1, 1: 1, 2: 1}
    # A prompt chunk beside one row: a pass for each either way, so no filler.
    assert fill_gaps({0: 60, 2: 1}, 512) == {0: 60, 2: 1}
    # More fillers than the passes they save are worth: left as it is.
    wide = {0: 1, FILLERS_PER_PASS_SAVED + 2: 1}
    assert fill_gaps(wide, 512) == wide
    assert decode_passes(wide, 512, gaps_filled=True) == [1, 1]
    # One KV buffer has no gaps to fill: the filled layout is for a buffer per sequence only.
    assert decode_passes({0: 1, 2: 1, 3: 1}, 512, per_sequence_kv=False, gaps_filled=True) == [3]
