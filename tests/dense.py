"""Dense probability rows, to compare sparse distributions with a reference in tests (never the hot path)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.warp import Dist


def densify(dists: Sequence[Dist], n_vocab: int) -> np.ndarray:
    """The dense ``[R, n_vocab]`` probability rows of ``dists`` (``[n_vocab]`` for one row)."""
    out = np.zeros((len(dists), n_vocab))
    for r, d in enumerate(dists):
        np.add.at(out[r], np.asarray(d.ids, dtype=np.int64), d.probs)
    return out[0] if len(dists) == 1 else out


def from_probs(probs: Sequence[float]) -> Dist:
    """A :class:`Dist` from a dense probability vector (zeros dropped, sorted)."""
    p = np.asarray(probs, dtype=np.float64)
    ids = np.flatnonzero(p > 0)
    ids = ids[np.argsort(-p[ids], kind="stable")]
    return Dist(ids.tolist(), (p[ids] / p[ids].sum()).tolist())
