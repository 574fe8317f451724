"""The one warp every path uses: rows of raw scores to sparse distributions, and the draw from them.

The target's plain sampling, the draft's proposals and the verifier's target distributions all go through
:func:`warp` (row by row: :func:`warp_row`, :class:`Warped`), so the speculative output distribution is exactly the
distribution plain decoding would sample.

Order of the warps follows llama.cpp's default sampler chain: top-k, then top-p, then min-p (each on the
temperature-1 softmax of the survivors), then temperature. Top-k usually ran in llama.cpp's graph already
(:mod:`edgespec.sampling`, "Where the work happens"). Distributions are kept *sparse* (the support's ids and their
probabilities): with a 151,936-token vocabulary, dense float64 rows per draft position would dominate the Python
side of a round.

Why plain Python lists. A CPU decode streams the weights through every cache, so the Python that runs right after
it pays for each distinct thing it touches: there a numpy call costs more than a Python loop over 40 floats, and a
top-40 warp and draw through numpy arrays is slower than the same rules in plain loops. A sparse row (:class:`Dist`)
is two short lists; rows wider than :data:`PY_ROW_MAX` (a large top-k, whole rows) are cut in numpy and handed over
as lists of their survivors.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from edgespec import penalties
from edgespec.constraint import Mask
from edgespec.errors import ModelError
from edgespec.sampling import Candidates, SamplingParams, Scores, Uniforms, candidates_kept


class Dist(NamedTuple):
    """One sparse categorical distribution: token ``ids[j]`` has probability ``probs[j]``, every other token 0.

    :func:`warp` lists only the tokens the warp kept, by descending probability (so ``ids[0]`` is the mode); other
    constructors (a residual, a test's dense row) need not sort, and may list tokens of probability 0. Lists, except
    a whole-vocabulary row (the ``LOGITS`` path), which stays two numpy arrays: no Python loop over the vocabulary.
    """

    ids: list[int] | np.ndarray
    probs: list[float] | np.ndarray

    def prob(self, token: int) -> float:
        """The probability of ``token`` (0 when it is not listed)."""
        if isinstance(self.ids, np.ndarray):
            hit = np.flatnonzero(self.ids == token)
            return float(self.probs[hit[0]]) if hit.size else 0.0
        try:
            return self.probs[self.ids.index(token)]
        except ValueError:
            return 0.0

    @property
    def top(self) -> int:
        """The mode (the first of equals)."""
        probs = self.probs
        if isinstance(probs, np.ndarray):
            return int(self.ids[int(probs.argmax())])
        return self.ids[probs.index(max(probs))]

    @property
    def top_prob(self) -> float:
        return float(max(self.probs))

    @staticmethod
    def one_hot(token: int) -> Dist:
        return Dist([int(token)], [1.0])


# Rows up to this wide are warped in plain Python (see the module's docstring); past ~128 floats numpy's vector loops
# win again.
PY_ROW_MAX = 128


class NeedWholeRow(Exception):
    """A constrained row's candidates hold too few allowed tokens to be sure of its top-k: read the row whole."""


def warp(scores: Scores, params: SamplingParams) -> list[Dist]:
    """Rows of raw logits (``[n_vocab]`` or ``[R, n_vocab]``, or llama.cpp's top-k :class:`Candidates`) → the
    distributions the sampler draws from, one per row."""
    if params.penalized or params.constraint is not None:
        raise ValueError("warp() knows no history for penalties or a constraint: use warp_row with the row's state")
    if isinstance(scores, np.ndarray) and scores.ndim == 1:
        scores = scores.reshape(1, -1)
    return [warp_row(scores, r, params) for r in range(len(scores))]


class Warped(Sequence[Dist]):
    """:func:`warp`, row by row when a row is first asked for: a verify reads the rows up to its first rejection.

    ``counts``: per row, the token counts its penalties see (:func:`edgespec.penalties.windows`), when ``params``
    has penalties or a logit bias. ``masks``: per row, the constraint's :class:`~edgespec.constraint.Mask`, when
    ``params`` has a constraint; ``reread``: the whole logits row of a row whose candidates were too few
    (:class:`NeedWholeRow`).
    """

    def __init__(
        self,
        scores: Scores,
        params: SamplingParams,
        counts: Sequence[Counter[int]] | None = None,
        masks: Callable[[int], Mask] | None = None,
        reread: Callable[[int], np.ndarray] | None = None,
    ) -> None:
        self._scores, self._params, self._counts = scores, params, counts
        self._masks, self._reread = masks, reread

    def __len__(self) -> int:
        return len(self._scores)

    def __getitem__(self, row: int) -> Dist:  # type: ignore[override]  # rows only, no slices
        counts = None if self._counts is None else self._counts[row]
        if self._masks is None:
            return warp_row(self._scores, row, self._params, counts)
        mask = self._masks(row)
        try:
            return warp_row(self._scores, row, self._params, counts, mask)
        except NeedWholeRow:
            if self._reread is None:
                raise
            return warp_row(self._reread(row)[None, :], 0, self._params, counts, mask)


def warp_row(
    scores: Scores, row: int, params: SamplingParams, counts: Counter[int] | None = None, mask: Mask | None = None
) -> Dist:
    """Row ``row`` of ``scores`` (see :func:`warp`), warped; with the constraint's ``mask`` applied first (when it
    has one), then ``params``'s penalties and logit bias, given the token ``counts`` of the row's window.

    :class:`NeedWholeRow` when ``scores`` are candidates and too few of them are allowed to be sure of the row."""
    if mask is not None and mask.count == 1:  # one allowed token: one-hot on it, whatever the logits
        only = mask.only()
        assert only is not None
        return Dist.one_hot(only)
    if isinstance(scores, Candidates):
        ids, x = scores.ids[row], scores.logits[row]
        if isinstance(x, np.ndarray):
            ids, x = ids.tolist(), x.tolist()
        if mask is not None:
            ids, x = _allowed(ids, x, mask, params)
        if counts is not None:
            x = penalties.penalize_list(ids, x, counts, params)
        if params.greedy:
            return Dist.one_hot(ids[x.index(max(x))])
        if 0 < params.top_k < len(x):  # a readout wider than asked: cut it to the k best here
            best = sorted(range(len(x)), key=x.__getitem__, reverse=True)[: params.top_k]
            ids, x = [ids[i] for i in best], [x[i] for i in best]
        return _warp_candidates(ids, x, params)

    logits = scores[row]
    top_k = params.top_k
    if mask is not None:
        logits = np.where(mask.dense(logits.shape[0]), logits, -np.inf)
        top_k = min(top_k, mask.count)
    if counts is not None:
        logits = penalties.penalize_row(logits, counts, params)
    if params.greedy:
        return Dist.one_hot(int(logits.argmax()))
    if 0 < top_k < logits.shape[0]:
        ids = logits.argpartition(-top_k)[-top_k:]
        return _warp_candidates(ids.tolist(), logits[ids].tolist(), params)
    return _warp_full_row(logits, params)


def _allowed(ids: list[int], x: list[float], mask: Mask, params: SamplingParams) -> tuple[list[int], list[float]]:
    """The candidates the mask allows. They are the best allowed tokens only if enough of them remain: the top-k
    (after penalties) of the allowed tokens lies within the first :func:`candidates_kept` allowed ones in raw
    order, or all of the allowed tokens are here."""
    kept_ids: list[int] = []
    kept_x: list[float] = []
    bits = mask.bits
    n_bytes = len(bits)
    for t, v in zip(ids, x, strict=True):
        b = t >> 3
        if b < n_bytes and (bits[b] >> (t & 7)) & 1:
            kept_ids.append(t)
            kept_x.append(v)
    if len(kept_ids) < candidates_kept(params) and len(kept_ids) < mask.count:
        raise NeedWholeRow
    return kept_ids, kept_x


def _warp_candidates(ids: list[int], x: list[float], params: SamplingParams) -> Dist:
    """One row of top-k candidates: in Python up to :data:`PY_ROW_MAX` wide, in numpy beyond."""
    if len(x) <= PY_ROW_MAX:
        return _warp_one(ids, x, params)
    return _warp_rows(np.asarray([ids]), np.asarray([x], dtype=np.float32), params, None)[0]


def _warp_one(ids: list[int], xs: list[float], params: SamplingParams) -> Dist:
    """top-p → min-p → temperature on one candidate row of at most :data:`PY_ROW_MAX`, in plain Python: the hot path
    of plain decoding, of each draft step and of each verified row. The same rules in the same order as
    :func:`_warp_rows`, with the same sequential sums (``math.exp`` and ``np.exp`` may differ in the last bit; a given
    row width always takes the same path, so plain decoding, q and p share one definition), and only the min-p
    survivors sorted. Plain loops rather than comprehensions: right after a decode each extra code object costs
    cache misses."""
    exp = math.exp
    top = max(xs)
    x: list[float] = []  # relative to the mode: <= 0
    w: list[float] = []  # temperature-1 weights relative to the mode
    z = 0.0  # their total, in candidate order (top-p's mass is measured against every candidate)
    for v in xs:
        v -= top
        x.append(v)
        v = exp(v)
        w.append(v)
        z += v
    if not z == z:  # NaN: a NaN logit, or +inf ones (inf - inf); -inf is a masked token and weighs 0
        _damaged(math.inf if top == math.inf else math.nan)
    # min-p keeps p_i >= min_p * p_max, i.e. w_i >= min_p: a prefix of the sorted order.
    min_p = params.min_p
    kept: list[int] = []
    j = 0
    for v in w:
        if v >= min_p:
            kept.append(j)
        j += 1
    kept.sort(key=x.__getitem__, reverse=True)  # stable: ties keep their candidate order
    if params.top_p < 1:  # the smallest prefix with mass >= top_p: token j stays while the mass before it is less
        limit, mass, n = params.top_p * z, 0.0, 0
        for j in kept:
            if n and mass >= limit:
                break
            mass += w[j]
            n += 1
        del kept[n:]
    t = params.temperature
    kept_ids: list[int] = []
    weights: list[float] = []
    total = 0.0
    for j in kept:
        v = w[j] if t == 1 else exp(x[j] / t)
        kept_ids.append(ids[j])
        weights.append(v)
        total += v
    return Dist(kept_ids, [v / total for v in weights])


def _warp_rows(
    ids: np.ndarray, logits: np.ndarray, params: SamplingParams, log_z: np.ndarray | None, *, arrays: bool = False
) -> list[Dist]:
    """:func:`_warp_one` in numpy, all rows at once, for rows wider than :data:`PY_ROW_MAX`.

    ``log_z``: per row ``[R, 1]``, the log of the temperature-1 softmax normaliser over all candidates, when
    ``logits`` hold only some of them (else it is computed from ``logits``). ``arrays``: the rows stay numpy arrays
    (a whole-vocabulary row), else they become lists.
    """
    x = logits.astype(np.float64)
    x_max = x.max(axis=1, keepdims=True)  # [R, 1] each row's largest logit (NaN if any is)
    with np.errstate(invalid="ignore"):
        x = x - x_max  # relative to each row's mode: x_i <= 0 (the same numbers as the one-row path)
        rel = np.exp(x)  # [R, m] temperature-1 weights relative to the mode
    # The total in candidate order, as the one-row path sums it (cumsum is sequential).
    z = rel.cumsum(axis=1)[:, -1:] if log_z is None else np.exp(log_z - x_max)
    if np.isnan(z).any():  # a NaN logit, or +inf ones; -inf is a masked token and weighs 0
        _damaged(np.inf if np.isposinf(x_max).any() else np.nan)
    order = (-x).argsort(axis=1, kind="stable")
    each_row = np.arange(x.shape[0])[:, None]
    ids, x, rel = ids[each_row, order].astype(np.int64, copy=False), x[each_row, order], rel[each_row, order]
    keep = np.ones(x.shape, dtype=bool)
    if params.min_p > 0:
        keep &= rel >= params.min_p
    if params.top_p < 1:
        # token j stays while the mass before it is below top_p (the mode always stays)
        keep[:, 1:] &= rel.cumsum(axis=1)[:, :-1] < params.top_p * z
    # Both cuts keep a prefix of the sorted order, so the order they run in does not matter.
    probs = (rel if params.temperature == 1 else np.exp(x / params.temperature)) * keep
    probs /= probs.sum(axis=1, keepdims=True)
    n_kept = keep.sum(axis=1).tolist()
    if arrays:
        return [Dist(ids[r, :n], probs[r, :n]) for r, n in enumerate(n_kept)]
    return [Dist(ids[r, :n].tolist(), probs[r, :n].tolist()) for r, n in enumerate(n_kept)]


def _warp_full_row(logits: np.ndarray, params: SamplingParams) -> Dist:
    """One whole row with no top-k (the ``LOGITS`` path): filter by min-p before sorting 150k logits."""
    x = logits.astype(np.float64)
    x_max = float(x.max())
    if not math.isfinite(x_max):  # NaN propagates through max(); -inf alone is a masked token, never the max
        _damaged(x_max)
    # top-p's mass is measured over every candidate, so its normaliser comes before the min-p filter.
    log_z = x_max + math.log(float(np.exp(x - x_max).sum()))
    # min-p's survivors and a margin (the exact test, on the weights, is _warp_rows's)
    ids = np.flatnonzero(x >= x_max + math.log(params.min_p) - 1e-6) if params.min_p > 0 else np.arange(x.shape[0])
    return _warp_rows(ids[None, :], x[ids][None, :], params, log_z=np.array([[log_z]]), arrays=True)[0]


def _damaged(value: float) -> None:
    # Mangled weights can make llama.cpp compute NaN or infinite logits: say so rather than sample from nonsense.
    raise ModelError(f"the model computed {value} logits: its weights are damaged; download it again")


def sample(dist: Dist, rng: Uniforms) -> int:
    """Draw one token from ``dist``: the first token whose cumulative mass exceeds u * total."""
    probs = dist.probs
    if len(probs) == 1:
        return int(dist.ids[0])
    if isinstance(probs, np.ndarray):  # a whole-vocabulary row
        cumulative = probs.cumsum()
        i = int(cumulative.searchsorted(rng.random() * cumulative[-1], side="right"))
        if i >= len(probs) or probs[i] == 0:  # rounding at the very top end: the last token with mass
            i = int(np.flatnonzero(probs)[-1])
        return int(dist.ids[i])
    cumulative = list(accumulate(probs))  # sequential sums
    i = bisect_right(cumulative, rng.random() * cumulative[-1])
    if i >= len(probs) or probs[i] == 0:  # rounding at the very top end: the last token with mass
        i = max(j for j, w in enumerate(probs) if w > 0)
    return dist.ids[i]
