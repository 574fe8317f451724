"""Sampling settings, and what a decode reads back for them.

:class:`SamplingParams` says what to sample and when to stop. :func:`readout_for` and :func:`verify_readout` choose
the cheapest :class:`Readout` of a decode's rows that still gives the warp (:mod:`edgespec.warp`) everything it
needs.

Where the work happens. Copying a whole logits row out of llama.cpp and warping it in numpy costs, on a CPU, about
as much as a GPU's whole decode step. So the first step of the warp, top-k, runs inside llama.cpp's decode graph
(its backend sampling): a decode hands back only the k candidates of each row with their raw logits
(:class:`Candidates`, ``Readout.top_k``), and greedy decoding only each row's argmax (``ARGMAX``). The rest of the
warp (top-p, min-p, temperature) and every random draw stay in Python, on every path, over k numbers a row: one
definition of the distribution, one seeded random generator. A request without top-k (``top_k = 0``) has no
in-graph reduction to use and reads whole rows (``LOGITS``); the stats say which path ran (:attr:`Readout.path`).
llama.cpp's in-graph top-p and min-p are not used: they mask with -inf in float32 rather than shrinking the set, and
their boundaries differ from the chain's (``>`` where llama.cpp's CPU chain and the warp keep ``>=``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from edgespec import penalties
from edgespec.constraint import Grammar
from edgespec.errors import InvalidParameterError


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

        Python's generator, not numpy's: every draw is one scalar, and right after a CPU decode a scalar from numpy's
        ``Generator.random()`` costs several times one from Python's.
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
