"""The forward passes llama.cpp runs for one batched decode of several sequences, so that a plan can price it.

With a KV buffer per sequence (``kv_unified`` off) and more than one sequence, llama.cpp 0.3.36 cuts every batch
with ``llama_batch_allocr::split_equal(n_ubatch, sequential=true)`` (``src/llama-batch.cpp``, called by
``llama_kv_cache::init_batch``), and each cut is a forward pass of its own:

- a pass takes the sequence of the first token not yet run, then each sequence whose id is one more than the
  last one taken, as long as it has tokens left: a run of consecutive ids, in the order the batch lists them;
- it takes the same number of tokens from each: as many as the one with fewest left has (and no more than
  ``n_ubatch`` in all).

So one token of each of sequences 0-3 is one pass, but 1, 1, 1 and 4 tokens are two (4 tokens, then 3), a gap in
the ids (0, 2, 3) is two, and a batch that lists 2, 0, 3, 1 is two passes of 2 where 0, 1, 2, 3 is one of 4.
:meth:`edgespec.models.backend.Model.decode_batch` lists sequences in ascending id order; the passes below are
those of a batch listed so. A pass costs about what a one-sequence decode of as many tokens costs (measured on
the Qwen 1.5B, 2-core CPU: 1, 1, 1, 4 tokens took about a pass of 4 plus a pass of 3).

A gap is filled: when a sequence between two busy ones has nothing in the decode (its request ended, its lane is
free), it gets one throw-away token there (:func:`fill_gaps`), so that the run stays whole. Measured on that CPU,
four clients of plain decoding whose replies end at different times: one token of sequences 0, 2 and 3 took 246 ms
as two passes, where one pass of four takes 148 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

# A filler token costs what a row does: on that CPU a sixth of a pass (a decode of one token 100 ms, four tokens in
# one pass 148 ms), on a GPU next to nothing. Gaps are filled while that saves a pass for every few fillers.
FILLERS_PER_PASS_SAVED = 4


def fill_gaps(tokens_by_seq: Mapping[int, int], n_batch: int) -> dict[int, int]:
    """``tokens_by_seq`` with one filler token for each sequence missing between the first and the last one in the
    decode, when that saves llama.cpp passes (with a KV buffer per sequence); else the same layout."""
    present = sorted(s for s, n in tokens_by_seq.items() if n > 0)
    layout = {s: tokens_by_seq[s] for s in present}
    if len(present) < 2:
        return layout
    gaps = [s for s in range(present[0], present[-1]) if s not in layout]
    if not gaps:
        return layout
    filled = layout | dict.fromkeys(gaps, 1)
    saved = len(decode_passes(layout, n_batch)) - len(decode_passes(filled, n_batch))
    return filled if 0 < len(gaps) <= FILLERS_PER_PASS_SAVED * saved else layout


def decode_passes(
    tokens_by_seq: Mapping[int, int], n_batch: int, per_sequence_kv: bool = True, gaps_filled: bool = False
) -> list[int]:
    """The token count of each forward pass llama.cpp runs for one
    :meth:`~edgespec.models.backend.Model.decode_batch` that carries ``tokens_by_seq[s]`` tokens of sequence ``s``:
    the batch goes to ``llama_decode`` ``n_batch`` tokens at a time (``n_ubatch`` is ``n_batch`` here), and each
    call is one pass with a single KV buffer, or :func:`split_equal`'s passes with a buffer per sequence
    (``gaps_filled``: after :func:`fill_gaps`, as the model's decode does)."""
    if n_batch < 1:
        raise ValueError(f"n_batch must be at least 1, got {n_batch}")
    layout = tuple(sorted((s, n) for s, n in tokens_by_seq.items() if n > 0))
    return list(_decode_passes(layout, n_batch, per_sequence_kv, gaps_filled))


# Remembered: every sequence's plan asks for the passes of each width it weighs (dozens of layouts a step, most of
# them the same from step to step), and on a GPU, whose decode of a few rows takes ~2 ms, working them out anew
# cost more than the decode (0.5-1 ms a plan with 4-16 sequences, measured on the dev CPU).
@lru_cache(maxsize=1 << 14)
def _decode_passes(
    layout: tuple[tuple[int, int], ...], n_batch: int, per_sequence_kv: bool, gaps_filled: bool
) -> tuple[int, ...]:
    tokens_by_seq: Mapping[int, int] = dict(layout)
    if gaps_filled and per_sequence_kv:
        tokens_by_seq = fill_gaps(tokens_by_seq, n_batch)
    passes: list[int] = []
    call: dict[int, int] = {}
    room = n_batch
    for seq, n in sorted(tokens_by_seq.items()):
        while n > 0:
            take = min(n, room)
            call[seq] = take
            n -= take
            room -= take
            if not room:
                passes.extend(split_equal(call, n_batch) if per_sequence_kv else [n_batch])
                call, room = {}, n_batch
    if call:
        passes.extend(split_equal(call, n_batch) if per_sequence_kv else [n_batch - room])
    return tuple(passes)


def split_equal(tokens_by_seq: Mapping[int, int], n_ubatch: int) -> list[int]:
    """The token count of each pass of one ``llama_decode`` call (at most ``n_ubatch`` tokens) that carries
    ``tokens_by_seq[s]`` tokens of sequence ``s``, listed in ascending id order, with a KV buffer per sequence."""
    left = {s: n for s, n in sorted(tokens_by_seq.items()) if n > 0}
    passes: list[int] = []
    while left:
        run: list[int] = []
        for s in left:  # ascending: the first with tokens left starts the run, the consecutive ids extend it
            if not run or s == run[-1] + 1:
                run.append(s)
            else:
                break
        # One token of each per round, while every one has a token left; a round ends the pass once another
        # would overflow the micro-batch (at least one round is taken).
        per_seq = min(min(left[s] for s in run), max(1, n_ubatch // len(run)))
        passes.append(per_seq * len(run))
        for s in run:
            left[s] -= per_seq
            if not left[s]:
                del left[s]
    return passes
