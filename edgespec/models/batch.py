"""llama.cpp's token batch, and writing a decode's parts into it: each token's id, position, sequence and whether
its row is read out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import llama_cpp

from edgespec.models.slot import Part

if TYPE_CHECKING:
    pass

# What one sequence adds to a batched decode: (slot, tokens, rows, readout); the slot names the sequence (seq_id).


class Batch:
    """A ``llama_batch`` of ``n_batch`` tokens, each of one sequence (:attr:`c`, for ``llama_decode``)."""

    def __init__(self, n_batch: int) -> None:
        self.n_batch = n_batch
        self.c = llama_cpp.llama_batch_init(n_batch, 0, 1)
        # Every token belongs to one sequence: the counts are set once, so a decode writes only tokens, positions,
        # sequence ids and output flags (through pointers read once: each read of a ctypes struct field builds a
        # new object).
        for j in range(n_batch):
            self.c.n_seq_id[j] = 1
            self.c.seq_id[j][0] = 0
        self._token, self._pos, self._flags = self.c.token, self.c.pos, self.c.logits
        self._seq = [self.c.seq_id[j] for j in range(n_batch)]

    def fill(self, parts: Sequence[Part], starts: Sequence[int], wanted: list[tuple[int, int]]) -> Iterator[int]:
        """Write the parts' tokens into the batch (at positions from each part's start), flagging their rows and
        listing them in ``wanted``; yields the number of tokens each time the batch is full, and at the end."""
        token, pos, flags, seq = self._token, self._pos, self._flags, self._seq
        n_batch = self.n_batch
        filled = 0
        for p, (slot, tokens, rows, _) in enumerate(parts):
            seq_id, start = slot.seq_id, starts[p]
            next_row = 0
            row_at = rows[0] if len(rows) else -1
            for i, tok in enumerate(tokens):
                if filled == n_batch:
                    yield filled
                    filled = 0
                token[filled] = tok
                pos[filled] = start + i
                seq[filled][0] = seq_id
                if i == row_at:
                    flags[filled] = True
                    wanted.append((p, filled))
                    next_row += 1
                    row_at = rows[next_row] if next_row < len(rows) else -1
                else:
                    flags[filled] = False
                filled += 1
        if filled:
            yield filled

    def free(self) -> None:
        if self.c is not None:
            llama_cpp.llama_batch_free(self.c)
            self.c = None
