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

Why plain Python lists. A CPU decode streams the weights through every cache, so the Python that runs right after
it pays for each distinct thing it touches: a numpy call measured 5-25 µs there, a top-40 warp and draw through
numpy arrays ~200 µs, the same rules in Python loops over 40 floats ~70 µs (~10 µs with warm caches). A sparse
row (:class:`Dist`) is two short lists; rows wider than :data:`PY_ROW_MAX` (a large top-k, whole rows) are cut in
numpy and handed over as lists of their survivors.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal, NamedTuple, Protocol

import numpy as np

from edgespec import penalties
from edgespec.constraint import Grammar, Mask
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
    # Penalties on what the context already holds, and a bias per token id (see edgespec.penalties).
    repeat_penalty: float = 1.0  # llama.cpp's: 1 = off
    repeat_last_n: int = 64  # the window the three penalties count over (llama.cpp's default)
    presence_penalty: float = 0.0  # OpenAI's, -2..2
    frequency_penalty: float = 0.0  # OpenAI's, -2..2
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; a dict is accepted
    # Report each output token's log-probability and this many alternatives' (0..20); None: none (edgespec.logprobs).
    logprobs: int | None = None
    # The same for the prompt's tokens (its first has none); with these, max_tokens may be 0: score the prompt only.
    prompt_logprobs: int | None = None
    # What the output must match: a JSON schema, a regular expression or a grammar (edgespec.constraint).
    constraint: Grammar | None = None

    def __post_init__(self) -> None:
        # Accept a list for stop (a dict for logit_bias) but store tuples so the object stays hashable and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:  # one bias per token id (the last of a repeated one wins, as in a JSON object)
            object.__setattr__(self, "logit_bias", tuple(sorted({int(t): float(b) for t, b in bias}.items())))
        except (TypeError, ValueError):
            raise InvalidParameterError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}") from None
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
        scoring_only = self.max_tokens == 0 and self.prompt_logprobs is not None
        if not isinstance(self.max_tokens, int) or (self.max_tokens < 1 and not scoring_only):
            problems.append(
                f"max_tokens must be an integer >= 1 (0 only with prompt_logprobs), got {self.max_tokens!r}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            problems.append(f"seed must be a non-negative integer, got {self.seed!r}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            problems.append("stop strings must be non-empty strings")
        if not (isinstance(self.repeat_penalty, (int, float)) and 0 < self.repeat_penalty < math.inf):
            problems.append(f"repeat_penalty must be a positive number (1 = off), got {self.repeat_penalty!r}")
        if not isinstance(self.repeat_last_n, int) or self.repeat_last_n < 0:
            problems.append(f"repeat_last_n must be an integer >= 0, got {self.repeat_last_n!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and -2 <= value <= 2):
                problems.append(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 20):
                problems.append(f"{name} must be an integer 0..20 (the alternatives to list), got {value!r}")
        if any(t < 0 or not math.isfinite(b) or abs(b) > 100 for t, b in self.logit_bias):
            problems.append("logit_bias maps token ids >= 0 to biases in [-100, 100]")
        if self.constraint is not None and not isinstance(self.constraint, Grammar):
            problems.append(f"constraint must be an edgespec.Grammar, got {type(self.constraint).__name__}")
        if problems:
            raise InvalidParameterError("; ".join(problems))
        if self.constraint is not None:
            self.constraint.compiled()  # a grammar that cannot compile is refused here, naming its problem

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether a row's distribution depends on the tokens before it (penalties) or on a logit bias."""
        return penalties.active(self)

    def rng(self) -> random.Random:
        """The uniforms of one request: seeded when ``seed`` is set, so the run is reproducible.

        Python's generator, not numpy's: every draw is one scalar, and right after a CPU decode a numpy
        ``Generator.random()`` measured 24 µs against 6 µs.
        """
        return random.Random(self.seed)


# ----- what a decode hands back ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Readout:
    """What a decode returns for each row it scores.

    * ``logits``: the raw logits rows, ``[R, n_vocab]`` float32;
    * ``argmax``: each row's argmax, a list of ``R`` ids (taken inside llama.cpp);
    * ``top_k``: the ``k`` highest-logit tokens of each row and their raw logits, :class:`Candidates` (selected
      inside llama.cpp).

    ``log_norm`` (``top_k`` only): each row's log softmax normaliser over the whole vocabulary as well, computed
    inside llama.cpp's graph (:attr:`Candidates.log_z`): what log-probabilities need, without reading whole rows.
    """

    kind: Literal["logits", "argmax", "top_k"]
    k: int = 0
    log_norm: bool = False

    @property
    def path(self) -> str:
        """How sampling runs with this readout, as the stats report it."""
        path = {"argmax": "argmax in llama.cpp", "top_k": f"top-{self.k} in llama.cpp, rest in Python"}.get(
            self.kind, "numpy on full rows"
        )
        return path + " (log-normaliser in llama.cpp)" if self.log_norm else path


LOGITS = Readout("logits")
ARGMAX = Readout("argmax")


def verify_readout(params: SamplingParams, n_vocab: int) -> Readout:
    """What the target's verify reads: :func:`readout_for`, and for a request that wants log-probabilities the
    top-k candidates (at least its ``logprobs`` alternatives) with each row's normaliser, computed in llama.cpp.

    A constrained request with log-probabilities reads whole rows: a row its candidates cannot settle is read again
    whole, and its token may then lie outside them."""
    readout = readout_for(params, n_vocab)
    if params.logprobs is None or readout.kind == "logits":
        return readout
    if params.constraint is not None:
        return LOGITS
    k = max(readout.k if readout.kind == "top_k" else 1, params.logprobs)
    return Readout("top_k", k, log_norm=True) if k < n_vocab else LOGITS


# A constrained row reads this many candidates beyond what it needs: the mask removes some, and a row whose
# candidates keep too few allowed ones is read again whole (NeedWholeRow).
CONSTRAINED_MARGIN = 32


def candidates_kept(params: SamplingParams) -> int:
    """How many of a row's best raw candidates are sure to hold every token its warp can keep: the top-k (1 when
    greedy) and the tokens penalties may push below it (see :mod:`edgespec.penalties`)."""
    k = 1 if params.greedy else params.top_k
    return penalties.candidates_needed(params, k) if params.penalized else k


def readout_for(params: SamplingParams, n_vocab: int) -> Readout:
    """The cheapest readout that still gives :func:`warp` everything it needs for ``params``."""
    if params.constraint is not None:
        # Candidates beyond the top-k: the mask drops some (a row left with too few is read again whole).
        if (params.penalized and not penalties.only_lowers(params)) or (not params.greedy and params.top_k == 0):
            return LOGITS
        k = candidates_kept(params) + CONSTRAINED_MARGIN
        return Readout("top_k", k) if k < n_vocab else LOGITS
    if params.penalized:
        # The candidates must hold every token that can make the top-k after penalties (edgespec.penalties).
        if not penalties.only_lowers(params):
            return LOGITS
        k = penalties.candidates_needed(params, 1 if params.greedy else params.top_k)
        return Readout("top_k", k) if (params.greedy or params.top_k > 0) and k < n_vocab else LOGITS
    if params.greedy:
        return ARGMAX
    if 0 < params.top_k < n_vocab:
        return Readout("top_k", params.top_k)
    return LOGITS  # no top-k: top-p and min-p need the whole row


class Candidates:
    """Per row, the tokens llama.cpp's in-graph top-k kept and their raw logits (in no particular order).

    Lists, as read out of llama.cpp; numpy rows (tests, whole rows cut here) are accepted too.
    """

    __slots__ = ("ids", "logits", "log_z")

    def __init__(
        self,
        ids: Sequence[Sequence[int]],
        logits: Sequence[Sequence[float]],
        log_z: Sequence[float] | None = None,
    ) -> None:
        self.ids = ids  # [R][k]
        self.logits = logits  # [R][k]
        # [R]: log of the softmax normaliser over the whole vocabulary, when the readout asked for it (log_norm)
        self.log_z = log_z

    def __len__(self) -> int:
        return len(self.ids)


Scores = np.ndarray | list[int] | Candidates  # [R, n_vocab] logits, R argmax ids, or Candidates


class Uniforms(Protocol):
    """A source of uniform draws in [0, 1): ``random.Random`` (what requests use) or a numpy ``Generator``."""

    def random(self) -> float: ...


# ----- sparse distributions ----------------------------------------------------------------------------------
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
