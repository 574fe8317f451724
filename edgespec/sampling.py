"""Sampling settings and the one warp function every path uses.

The target's plain sampling, the draft's proposals and the verifier's target distributions all go through
:func:`warp`, so the speculative output distribution is exactly the distribution plain decoding would sample.

Order of the warps follows llama.cpp's default sampler chain: top-k, then top-p, then min-p (each on the
temperature-1 softmax of the survivors), then temperature. Distributions are kept *sparse* (the support's ids and
their probabilities): with a 151,936-token vocabulary, dense float64 rows per draft position would dominate the
Python side of a round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Dist:
    """A sparse categorical distribution: ``probs[i]`` is the probability of token ``ids[i]``.

    Tokens outside ``ids`` have probability 0. :func:`warp` returns ``ids`` sorted by descending probability
    (so ``top`` is the mode); other constructors need not.
    """

    ids: np.ndarray  # [n] int64
    probs: np.ndarray  # [n] float64, sums to 1

    def prob(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.probs[hit[0]]) if hit.size else 0.0

    @property
    def top(self) -> int:
        return int(self.ids[int(np.argmax(self.probs))])

    @property
    def top_prob(self) -> float:
        return float(self.probs.max())

    @staticmethod
    def one_hot(token: int) -> Dist:
        return Dist(np.array([token], dtype=np.int64), np.array([1.0]))


def warp(logits: np.ndarray, params: SamplingParams) -> Dist:
    """Turn one row of raw logits ``[n_vocab]`` into the distribution the sampler draws from."""
    if params.greedy:
        return Dist.one_hot(int(np.argmax(logits)))

    if 0 < params.top_k < logits.shape[0]:
        ids = np.argpartition(logits, -params.top_k)[-params.top_k :]
    else:
        ids = np.arange(logits.shape[0])
    x = logits[ids].astype(np.float64)
    x_max = float(x.max())
    if not math.isfinite(x_max):  # NaN propagates through max(); -inf alone is a masked token, never the max
        raise ModelError(f"the model computed {x_max} logits: its weights are damaged; download it again")
    # log of the temperature-1 softmax normaliser over the current candidates (what top-p's mass is measured in)
    log_z = x_max + math.log(float(np.exp(x - x_max).sum()))

    if params.min_p > 0:
        # min-p keeps p_i >= min_p * p_max, i.e. x_i >= x_max + ln(min_p). Both min-p and top-p keep a prefix of
        # the sorted order, so filtering first only saves sorting tokens that could not survive anyway.
        keep = x >= x_max + math.log(params.min_p)
        ids, x = ids[keep], x[keep]

    order = np.argsort(-x, kind="stable")
    ids, x = ids[order], x[order]

    if params.top_p < 1:
        cumulative = np.cumsum(np.exp(x - log_z))
        # smallest prefix whose mass reaches top_p (at least one token)
        n_keep = int(np.searchsorted(cumulative, params.top_p, side="left")) + 1
        ids, x = ids[:n_keep], x[:n_keep]

    scaled = (x - x[0]) / params.temperature
    probs = np.exp(scaled)
    probs /= probs.sum()
    return Dist(ids.astype(np.int64, copy=False), probs)


def sample(dist: Dist, rng: np.random.Generator) -> int:
    """Draw one token from ``dist``."""
    if dist.ids.shape[0] == 1:
        return int(dist.ids[0])
    u = rng.random() * float(dist.probs.sum())
    i = int(np.searchsorted(np.cumsum(dist.probs), u, side="right"))
    return int(dist.ids[min(i, dist.ids.shape[0] - 1)])


def densify(dist: Dist, n_vocab: int) -> np.ndarray:
    """The dense ``[n_vocab]`` probability vector of ``dist`` (for tests and diagnostics, not the hot path)."""
    out = np.zeros(n_vocab)
    out[dist.ids] = dist.probs
    return out


def from_probs(probs: Sequence[float]) -> Dist:
    """A :class:`Dist` from a dense probability vector (zeros dropped), for tests and diagnostics."""
    p = np.asarray(probs, dtype=np.float64)
    ids = np.flatnonzero(p > 0)
    order = np.argsort(-p[ids], kind="stable")
    ids = ids[order]
    return Dist(ids.astype(np.int64), p[ids] / p[ids].sum())
