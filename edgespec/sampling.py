"""Sampling settings and the one warp function every path uses.

The target's plain sampling, the draft's proposals and the verifier's target distributions all go through
:func:`warp`, so the speculative output distribution is exactly the distribution plain decoding would sample.

Order of the warps follows llama.cpp's default sampler chain: top-k, then top-p, then min-p (each on the
temperature-1 softmax of the survivors), then temperature. Distributions are kept *sparse* (the support's ids and
their probabilities): with a 151,936-token vocabulary, dense float64 rows per draft position would dominate the
Python side of a round.

Where the work happens. Copying a logits row out of llama.cpp and warping it in numpy costs ~1.5 ms per token on a
CPU, more than a GPU's whole decode step (~2 ms for a 1.5B model). So the first step of the warp, top-k, runs inside
llama.cpp's decode graph (its backend sampling): a decode hands back only the k candidates of each row with their
raw logits (:class:`Candidates`, ``Readout.top_k``), and greedy decoding only each row's argmax (``ARGMAX``). The
rest of the warp (top-p, min-p, temperature) and every random draw stay here, on every path, over k numbers a row:
one definition of the distribution, one seeded random generator. A request without top-k (``top_k = 0``) has no
in-graph reduction to use and reads whole rows (``LOGITS``); the stats say which path ran (:attr:`Readout.path`).
llama.cpp's in-graph top-p and min-p are not used: they mask with -inf in float32 rather than shrinking the set, and
their boundaries differ from the chain's (``>`` where llama.cpp's CPU chain and this warp keep ``>=``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

import numpy as np

from edgespec.errors import InvalidParameterError, ModelError


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. ``temperature == 0`` is greedy decoding."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # Accept a list for stop but store a tuple so the object stays hashable and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        problems = []
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            problems.append(f"temperature must be a finite number, got {self.temperature!r}")
        elif self.temperature < 0:
            problems.append(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            problems.append(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            problems.append(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p < 1):
            problems.append(f"min_p must be in [0, 1) (0 = off), got {self.min_p!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            problems.append(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            problems.append(f"seed must be a non-negative integer, got {self.seed!r}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            problems.append("stop strings must be non-empty strings")
        if problems:
            raise InvalidParameterError("; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        """A generator for one request: seeded when ``seed`` is set, so the run is reproducible."""
        return np.random.default_rng(self.seed)


# ----- what a decode hands back ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Readout:
    """What a decode returns for each row it scores.

    * ``logits``: the raw logits rows, ``[R, n_vocab]`` float32;
    * ``argmax``: each row's argmax, ``[R]`` int64 (taken inside llama.cpp);
    * ``top_k``: the ``k`` highest-logit tokens of each row and their raw logits, :class:`Candidates` (selected
      inside llama.cpp).
    """

    kind: Literal["logits", "argmax", "top_k"]
    k: int = 0

    @property
    def path(self) -> str:
        """How sampling runs with this readout, as the stats report it."""
        return {"argmax": "argmax in llama.cpp", "top_k": f"top-{self.k} in llama.cpp, rest in Python"}.get(
            self.kind, "numpy on full rows"
        )


LOGITS = Readout("logits")
ARGMAX = Readout("argmax")


def readout_for(params: SamplingParams, n_vocab: int) -> Readout:
    """The cheapest readout that still gives :func:`warp` everything it needs for ``params``."""
    if params.greedy:
        return ARGMAX
    if 0 < params.top_k < n_vocab:
        return Readout("top_k", params.top_k)
    return LOGITS  # no top-k: top-p and min-p need the whole row


@dataclass(frozen=True)
class Candidates:
    """Per row, the tokens llama.cpp's in-graph top-k kept and their raw logits (in no particular order)."""

    ids: np.ndarray  # [R, k] int
    logits: np.ndarray  # [R, k] float32

    def __len__(self) -> int:
        return self.ids.shape[0]


Scores = np.ndarray | Candidates  # [R, n_vocab] logits, [R] argmax ids, or Candidates


# ----- sparse distributions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dists:
    """Sparse categorical distributions, one per row: row r gives token ``ids[r, j]`` probability ``probs[r, j]``.

    Tokens not in a row have probability 0. Rows narrower than ``m`` are padded with id -1 and probability 0.
    :func:`warp` sorts each row by descending probability (so column 0 is the mode); other constructors need not.
    """

    ids: np.ndarray  # [R, m] int64
    probs: np.ndarray  # [R, m] float64, each row sums to 1

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, row: int) -> Dists:
        """Row ``row`` as a one-row :class:`Dists`."""
        return Dists(self.ids[row : row + 1], self.probs[row : row + 1])

    def prob_of(self, tokens: np.ndarray) -> np.ndarray:
        """``[len(tokens)]``: the probability of ``tokens[r]`` under row ``r``."""
        n = len(tokens)
        return np.where(self.ids[:n] == np.asarray(tokens)[:, None], self.probs[:n], 0.0).sum(axis=1)

    def prob(self, token: int, row: int = 0) -> float:
        hit = np.flatnonzero(self.ids[row] == token)
        return float(self.probs[row, hit[0]]) if hit.size else 0.0

    @property
    def top(self) -> int:
        """The mode of row 0 (for sorted rows, as :func:`warp` makes them)."""
        return int(self.ids[0, int(np.argmax(self.probs[0]))])

    @property
    def top_prob(self) -> float:
        return float(self.probs[0].max())

    @staticmethod
    def one_hot(tokens: Sequence[int]) -> Dists:
        return Dists(np.asarray(tokens, dtype=np.int64).reshape(-1, 1), np.ones((len(tokens), 1)))

    @staticmethod
    def stack(rows: Sequence[Dists]) -> Dists:
        """One :class:`Dists` of all the rows of ``rows``, padded to the widest."""
        width = max(r.ids.shape[1] for r in rows)
        if all(r.ids.shape[1] == width for r in rows):
            return Dists(np.concatenate([r.ids for r in rows]), np.concatenate([r.probs for r in rows]))
        n = sum(len(r) for r in rows)
        ids, probs = np.full((n, width), -1, dtype=np.int64), np.zeros((n, width))
        at = 0
        for r in rows:
            rows_r, width_r = r.ids.shape
            ids[at : at + rows_r, :width_r] = r.ids
            probs[at : at + rows_r, :width_r] = r.probs
            at += rows_r
        return Dists(ids, probs)


def warp(scores: Scores, params: SamplingParams) -> Dists:
    """Rows of raw logits (``[n_vocab]`` or ``[R, n_vocab]``, or llama.cpp's top-k :class:`Candidates`) → the
    distributions the sampler draws from, one per row."""
    if isinstance(scores, Candidates):
        ids, x = scores.ids, scores.logits
        if params.greedy:
            return Dists.one_hot(np.take_along_axis(ids, x.argmax(axis=1)[:, None], axis=1).ravel())
        if 0 < params.top_k < ids.shape[1]:  # a readout wider than asked: cut it to the k best here
            ids, x = _top_k(ids, x, params.top_k)
        return _warp_candidates(ids, x, params)

    logits = scores.reshape(1, -1) if scores.ndim == 1 else scores
    if params.greedy:
        return Dists.one_hot(logits.argmax(axis=1))
    n_vocab = logits.shape[1]
    if 0 < params.top_k < n_vocab:
        ids, x = _top_k(np.broadcast_to(np.arange(n_vocab), logits.shape), logits, params.top_k)
        return _warp_candidates(ids, x, params)
    return Dists.stack([_warp_full_row(row, params) for row in logits])


def _top_k(ids: np.ndarray, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    cut = x.argpartition(-k, axis=1)[:, -k:]
    each_row = np.arange(x.shape[0])[:, None]
    return ids[each_row, cut], x[each_row, cut]


def _warp_full_row(logits: np.ndarray, params: SamplingParams) -> Dists:
    """One whole row with no top-k (the ``LOGITS`` path): filter by min-p before sorting 150k logits."""
    x = logits.astype(np.float64)
    x_max = float(x.max())
    if not math.isfinite(x_max):  # NaN propagates through max(); -inf alone is a masked token, never the max
        _damaged(x_max)
    # top-p's mass is measured over every candidate, so its normaliser comes before the min-p filter.
    log_z = x_max + math.log(float(np.exp(x - x_max).sum()))
    ids = np.flatnonzero(x >= x_max + math.log(params.min_p)) if params.min_p > 0 else np.arange(x.shape[0])
    return _warp_candidates(ids[None, :], x[ids][None, :], params, log_z=np.array([[log_z]]))


def _warp_candidates(
    ids: np.ndarray, logits: np.ndarray, params: SamplingParams, log_z: np.ndarray | None = None
) -> Dists:
    """top-p → min-p → temperature on candidate rows ``[R, m]`` (the survivors of top-k), all rows at once.

    ``log_z``: per row ``[R, 1]``, the log of the temperature-1 softmax normaliser over all candidates, when
    ``logits`` hold only some of them (else it is computed from ``logits``). Rows keep their width ``m``: tokens
    cut by top-p or min-p stay in place with probability 0, so draft rows stack without padding.
    """
    if ids.shape[0] == 1 and log_z is None and ids.shape[1] <= PY_ROW_MAX:
        return _warp_one(ids[0], logits[0], params)
    return _warp_rows(ids, logits, params, log_z)


def _warp_rows(ids: np.ndarray, logits: np.ndarray, params: SamplingParams, log_z: np.ndarray | None) -> Dists:
    """:func:`_warp_candidates` in numpy, all rows at once."""
    x = logits.astype(np.float64)
    order = (-x).argsort(axis=1, kind="stable")
    each_row = np.arange(x.shape[0])[:, None]
    ids, x = ids[each_row, order].astype(np.int64, copy=False), x[each_row, order]
    if not (np.isfinite(x[:, 0]).all() and not np.isnan(x[:, -1]).any()):  # sorted: NaN last, +inf first
        _damaged(np.nan if np.isnan(x).any() else np.inf)
    x_max = x[:, :1]  # [R, 1] each row's largest logit
    x = x - x_max  # [R, m] relative to each row's mode: x_i <= 0 (the same numbers as the one-row path)
    rel = np.exp(x)  # [R, m] temperature-1 weights relative to the mode
    keep = np.ones(x.shape, dtype=bool)
    if params.min_p > 0:
        # min-p keeps p_i >= min_p * p_max, i.e. x_i - x_max >= ln(min_p).
        keep &= x >= math.log(params.min_p)
    if params.top_p < 1:
        # The smallest prefix whose temperature-1 mass reaches top_p: token j stays while the mass before it is
        # below top_p (the mode always stays). The total is the cumulative sum's last, as in the one-row path.
        cumulative = rel.cumsum(axis=1)
        z = cumulative[:, -1:] if log_z is None else np.exp(log_z - x_max)
        keep[:, 1:] &= cumulative[:, :-1] < params.top_p * z
    # Both cuts keep a prefix of the sorted order, so the order they run in does not matter.
    probs = (rel if params.temperature == 1 else np.exp(x / params.temperature)) * keep
    probs /= probs.sum(axis=1, keepdims=True)
    return Dists(ids, probs)


# Rows up to this wide are warped and sampled in plain Python. Right after a decode has streamed the weights through
# the CPU's caches, each numpy call costs ~5-10 µs (measured: 235 µs for warp + sample of a top-40 row, 15 calls),
# while a Python loop over 40 floats costs a few µs; past ~128 floats numpy's vector loops win again.
PY_ROW_MAX = 128


def _warp_one(ids: np.ndarray, logits: np.ndarray, params: SamplingParams) -> Dists:
    """:func:`_warp_rows` for one row of at most :data:`PY_ROW_MAX`, the hot path of plain decoding and of each draft
    step: the same rules in the same order (the same sequential float64 sums), with the kept prefix found by a scan."""
    m = logits.shape[0]
    xs = logits.tolist()
    if any(x != x or x == math.inf for x in xs):  # NaN or +inf; -inf is a token masked out
        _damaged(math.nan if any(x != x for x in xs) else math.inf)
    order = sorted(range(m), key=xs.__getitem__, reverse=True)  # stable: ties keep their index order
    top = xs[order[0]]
    x = [xs[i] - top for i in order]  # relative to the mode: x_i <= 0
    n = m
    if params.min_p > 0:  # x_i >= ln(min_p): a prefix of the sorted order
        floor = math.log(params.min_p)
        n = next((j for j, v in enumerate(x) if not v >= floor), m)
    rel = None
    if params.top_p < 1:  # the mass before token j below top_p: up to the first j whose cumulative mass reaches it
        rel = [math.exp(v) for v in x]
        cumulative = list(accumulate(rel))  # sequential sums, as numpy's cumsum
        n = min(n, bisect_left(cumulative, params.top_p * cumulative[-1]) + 1)
    t = params.temperature
    kept = rel[:n] if rel is not None and t == 1 else [math.exp(v / t) for v in x[:n]]
    total = sum(kept)
    probs = np.zeros((1, m))
    probs[0, :n] = [w / total for w in kept]
    row_ids = ids.tolist()
    return Dists(np.array([[row_ids[i] for i in order]], dtype=np.int64), probs)


def _damaged(value: float) -> None:
    # Mangled weights can make llama.cpp compute NaN or infinite logits: say so rather than sample from nonsense.
    raise ModelError(f"the model computed {value} logits: its weights are damaged; download it again")


def sample(dist: Dists, rng: np.random.Generator, row: int = 0) -> int:
    """Draw one token from row ``row`` of ``dist``: the first token whose cumulative mass exceeds u * total."""
    probs = dist.probs[row]
    m = probs.shape[0]
    if m == 1:
        return int(dist.ids[row, 0])
    u = rng.random()
    if m <= PY_ROW_MAX:  # in Python (see PY_ROW_MAX), the same sequential sums as numpy's cumsum
        ps = probs.tolist()
        cumulative = list(accumulate(ps))
        i = bisect_right(cumulative, u * cumulative[-1])
        if i >= m or ps[i] == 0:  # rounding at the very top end: the last token with mass
            i = max(j for j, w in enumerate(ps) if w > 0)
        return int(dist.ids[row, i])
    cumulative = probs.cumsum()
    i = int(cumulative.searchsorted(u * cumulative[-1], side="right"))
    if i >= m or probs[i] == 0:  # rounding at the very top end: the last token with mass
        i = int(np.flatnonzero(probs)[-1])
    return int(dist.ids[row, i])


def densify(dist: Dists, n_vocab: int) -> np.ndarray:
    """The dense ``[R, n_vocab]`` probability rows of ``dist`` (``[n_vocab]`` for one row); for tests and
    diagnostics, not the hot path."""
    out = np.zeros((len(dist), n_vocab))
    for r in range(len(dist)):
        real = dist.ids[r] >= 0
        np.add.at(out[r], dist.ids[r][real], dist.probs[r][real])
    return out[0] if len(dist) == 1 else out


def from_probs(probs: Sequence[float]) -> Dists:
    """A one-row :class:`Dists` from a dense probability vector (zeros dropped), for tests and diagnostics."""
    p = np.asarray(probs, dtype=np.float64)
    ids = np.flatnonzero(p > 0)
    order = np.argsort(-p[ids], kind="stable")
    ids = ids[order]
    return Dists(ids.astype(np.int64)[None, :], (p[ids] / p[ids].sum())[None, :])
