"""Re-running the loop on recorded decodes: what edgespec's own Python costs with no forward pass in between.

On a CPU a decode streams the weights through every cache, so the Python that runs next pays for refilling them
(measured: a top-40 warp costs ~55 µs right after a decode, ~10 µs warm); a GPU decode leaves the CPU's caches
alone (a GPU run was not measured here). Playing a run's decode outputs back instantly, with the same seed, repeats
the run token for token with all of edgespec's Python left (the model adapter's batch filling and row copies
included) and only llama.cpp's calls gone: the loop's own cost with warm caches. ``edgespec bench --loop-cost``
reports both.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.models.backend import Model
from edgespec.models.slot import sync
from edgespec.sampling import LOGITS, Candidates, Readout, Scores


class ReplayDiverged(EdgespecError):
    """The replayed run asked for other decodes than the recorded one made."""


class Recorder:
    """A :class:`Model` that keeps what each scoring decode returned and how far each truncation went (everything
    else is the model's own)."""

    sync = sync  # the prefix reuse, through this decode and truncate

    def __init__(self, model: Model) -> None:
        self._model = model
        self.kv_at_start = list(model.kv_tokens)  # a replay starts from the same cache (a prefix it reuses)
        self.outputs: list[tuple[int, int, str, Any]] = []  # (tokens, rows, readout kind, what came back)
        self.kept: list[int] = []  # the KV's length after each truncate (a recurrent memory may keep nothing)

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        out = self._model.decode(tokens, rows, readout)
        if len(rows):
            kept = out
            if isinstance(out, Candidates):  # as llama.cpp's buffers hold them, for a replay to copy out again
                rows_kept = [(array("f", x), array("i", ids)) for x, ids in zip(out.logits, out.ids, strict=True)]
                kept = (rows_kept, None if out.log_z is None else list(out.log_z))
            self.outputs.append((len(tokens), len(rows), readout.kind, kept))
        return out

    def truncate(self, n_keep: int) -> None:
        self._model.truncate(n_keep)
        self.kept.append(len(self._model.kv_tokens))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class Replay:
    """Stands in for a recorded :class:`Model`: each scoring decode runs the model's own Python (checks, filling the
    batch, copying the rows out) but returns the next recorded output instead of calling llama.cpp, and the time
    between is counted as the model's (``busy_seconds``), so what a run measures outside is the loop alone.
    Decodes without rows (a prefill) only move the positions. Text, vocabulary and limits are the model's."""

    sync = sync  # the real prefix reuse, on this decode and truncate

    def __init__(self, recorder: Recorder) -> None:
        self._model = recorder._model
        self._outputs = iter(recorder.outputs)
        self._kept = iter(recorder.kept)
        self._empty = np.empty((0, recorder._model.n_vocab), dtype=np.float32)
        self.kv_tokens = list(recorder.kv_at_start)
        self.busy_seconds = 0.0

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        model, start = self._model, len(self.kv_tokens)
        model.rehearse(tokens, rows, readout, start)  # the checks and the batches llama.cpp would have been given
        t0 = time.perf_counter()
        if not len(rows):
            out: Any = self._empty
        else:
            recorded = next(self._outputs, None)
            if recorded is None or recorded[:3] != (len(tokens), len(rows), readout.kind):
                raise ReplayDiverged("the replayed run asked for other decodes than the recorded one made")
            out = recorded[3]
        self.busy_seconds += time.perf_counter() - t0
        if readout.kind == "top_k" and len(rows):  # copied out of llama.cpp's buffers, as Model.decode does
            rows_kept, log_z = out
            out = Candidates([ids.tolist() for _, ids in rows_kept], [x.tolist() for x, _ in rows_kept], log_z)
        elif readout.kind == "argmax":
            out = list(out)
        self.kv_tokens.extend(tokens)
        return out

    def truncate(self, n_keep: int) -> None:
        kept = next(self._kept, None)  # a memory that cannot drop part of a sequence (recurrent) kept nothing
        if kept is None or kept not in (min(n_keep, len(self.kv_tokens)), 0):
            raise ReplayDiverged("the replayed run truncated the KV where the recorded one did not")
        del self.kv_tokens[kept:]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)
