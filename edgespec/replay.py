"""Re-running the loop on recorded decodes: what edgespec's own Python costs with no forward pass in between.

On a CPU a decode streams the weights through every cache, so the Python that runs next pays for refilling them
(measured: a top-40 warp costs ~55 µs right after a decode, ~10 µs warm); a GPU decode leaves the CPU's caches
alone. Playing a run's decode outputs back instantly, with the same seed, repeats the run token for token with only
the loop left: the loop's own cost with warm caches. ``edgespec bench --loop-cost`` reports both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.models.backend import Model
from edgespec.sampling import LOGITS, Readout, Scores


class ReplayDiverged(EdgespecError):
    """The replayed run asked for other decodes than the recorded one made."""


class Recorder:
    """A :class:`Model` that keeps what each scoring decode returned (everything else is the model's own)."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self.outputs: list[tuple[int, int, Scores]] = []  # (tokens, rows, what came back) per decode with rows

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        out = self._model.decode(tokens, rows, readout)
        if len(rows):
            self.outputs.append((len(tokens), len(rows), out))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class Replay:
    """Stands in for a recorded :class:`Model`: each scoring decode returns the next recorded output at once, and the
    time that takes counts as the model's (``busy_seconds``), so what a run measures outside is the loop alone.
    Decodes without rows (a prefill) only move the positions. Text, vocabulary and limits are the model's."""

    sync = Model.sync  # the real prefix reuse, on this decode and truncate

    def __init__(self, recorder: Recorder) -> None:
        self._model = recorder._model
        self._outputs = iter(recorder.outputs)
        self._empty = np.empty((0, recorder._model.n_vocab), dtype=np.float32)
        self.kv_tokens: list[int] = []
        self.busy_seconds = 0.0

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        t0 = time.perf_counter()
        self.kv_tokens.extend(tokens)
        if not len(rows):
            out: Scores = self._empty
        else:
            recorded = next(self._outputs, None)
            if recorded is None or recorded[:2] != (len(tokens), len(rows)):
                raise ReplayDiverged("the replayed run asked for other decodes than the recorded one made")
            out = recorded[2]
        self.busy_seconds += time.perf_counter() - t0
        return out

    def truncate(self, n_keep: int) -> None:
        del self.kv_tokens[n_keep:]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
