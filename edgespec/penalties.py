"""Repetition penalties and logit bias: the part of the distribution that depends on the text so far.

Definitions (llama.cpp's sampler chain, which applies them in this order before top-k):

* ``logit_bias``: ``logit[t] += bias[t]``;
* over the last ``repeat_last_n`` tokens of the context (the prompt included, as llama.cpp's samplers see it), with
  ``c[t]`` the count of ``t`` there, every token with ``c[t] > 0`` gets
  ``logit /= repeat_penalty`` if positive else ``logit *= repeat_penalty`` (llama.cpp's repeat penalty), then
  ``logit -= c[t] * frequency_penalty + presence_penalty`` (OpenAI's frequency and presence penalties).

Under speculation the history moves along the draft: the target's row i (and the draft's q_i) is penalised with the
context *plus* ``d_1..d_{i-1}``, and only committed tokens ever enter the request's real history. :func:`windows`
gives each row its counts.

Which candidates to read. llama.cpp's in-graph top-k selects on the raw logits. Penalties and negative biases only
lower logits, so the top-k after them lies within the raw top-``k + m``, where ``m`` bounds how many tokens were
lowered (the window's distinct tokens plus the negatively biased ones): a token ranked below that has at least ``k``
untouched tokens above it. A positive bias can lift any token, and a repeat penalty below 1 or a negative frequency or
presence penalty raises the seen ones: those need whole rows. :func:`candidates_needed` says which.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class PenaltySettings(Protocol):
    """The settings this module reads: :class:`~edgespec.sampling.SamplingParams` has them (and checks their
    ranges)."""

    @property
    def repeat_penalty(self) -> float:
        """llama.cpp's repeat penalty (1 = off)."""
        ...

    @property
    def repeat_last_n(self) -> int:
        """The window the three penalties count over."""
        ...

    @property
    def presence_penalty(self) -> float:
        """OpenAI's presence penalty, -2..2 (0 = off)."""
        ...

    @property
    def frequency_penalty(self) -> float:
        """OpenAI's frequency penalty, -2..2 (0 = off)."""
        ...

    @property
    def logit_bias(self) -> Sequence[tuple[int, float]]:
        """(token id, bias) pairs, sorted by token id."""
        ...


def counting(params: PenaltySettings) -> bool:
    """Whether a penalty is on (they count the window's tokens; a logit bias alone does not)."""
    return params.repeat_penalty != 1 or params.presence_penalty != 0 or params.frequency_penalty != 0


def active(params: PenaltySettings) -> bool:
    return counting(params) or bool(params.logit_bias)


def only_lowers(params: PenaltySettings) -> bool:
    """True when no logit can rise: then the raw top-``k + m`` holds the penalised top-k."""
    return (
        params.repeat_penalty >= 1
        and params.presence_penalty >= 0
        and params.frequency_penalty >= 0
        and all(b <= 0 for _, b in params.logit_bias)
    )


def candidates_needed(params: PenaltySettings, top_k: int) -> int:
    """How many raw top candidates hold the top-``top_k`` after penalties that only lower (see the module doc)."""
    lowered = (params.repeat_last_n if counting(params) else 0) + sum(1 for _, b in params.logit_bias if b < 0)
    return top_k + lowered


def window(context: Sequence[int], draft: Sequence[int], n: int) -> Counter[int]:
    """The token counts a row after ``context + draft`` is penalised with: its last ``n`` tokens."""
    if n <= 0:
        return Counter()
    if len(draft) >= n:
        return Counter(draft[len(draft) - n :])
    return Counter([*context[max(0, len(context) - (n - len(draft))) :], *draft])


def windows(context: Sequence[int], draft: Sequence[int], n: int) -> RowWindows:
    """The counts of each verify row: row i sees ``context + d_1..d_{i-1}`` (``len(draft) + 1`` rows)."""
    return RowWindows(context, draft, n)


class RowWindows(Sequence[Counter[int]]):
    """:func:`windows`, each row's counts computed when it is first asked for: a verify reads the rows up to its first
    rejection."""

    def __init__(self, context: Sequence[int], draft: Sequence[int], n: int) -> None:
        self._context, self._draft, self._n = context, draft, n
        self._last: tuple[int, Counter[int]] | None = None  # the row asked for last, and its counts

    def __len__(self) -> int:
        return len(self._draft) + 1

    def __getitem__(self, i: int) -> Counter[int]:  # type: ignore[override]  # rows only, no slices
        if not 0 <= i < len(self):
            raise IndexError(i)
        last = self._last
        if last is not None and last[0] == i - 1 and self._n > 0:
            # Rows are read in order: row i's window is row i-1's with d_i-1 come in and, once the window is full,
            # the token n places before it gone (a copy and two updates, not a count of n tokens).
            counts = last[1].copy()
            counts[self._draft[i - 1]] += 1
            gone_at = len(self._context) + i - 1 - self._n
            if gone_at >= 0:
                n_context = len(self._context)
                gone = self._context[gone_at] if gone_at < n_context else self._draft[gone_at - n_context]
                if counts[gone] == 1:
                    del counts[gone]  # only tokens in the window are keys (penalize_list relies on it)
                else:
                    counts[gone] -= 1
        else:
            counts = window(self._context, self._draft[:i], self._n)
        self._last = (i, counts)
        return counts


def penalize_list(ids: list[int], logits: list[float], counts: Counter[int], params: PenaltySettings) -> list[float]:
    """The candidates' logits after bias and penalties."""
    out = list(logits)
    # Only the few candidates with a bias or in the window change: found by C-level set and list operations, not a
    # Python loop over every candidate (that loop was most of the loop's cost with penalties on).
    for t, b in params.logit_bias:
        if b and t in ids:
            out[ids.index(t)] += b
    if counts:
        rp, fp, pp = params.repeat_penalty, params.frequency_penalty, params.presence_penalty
        for t in counts.keys() & ids:
            j = ids.index(t)
            x = out[j]
            x = x / rp if x > 0 else x * rp
            out[j] = x - (counts[t] * fp + pp)
    return out


def penalize_row(logits: np.ndarray, counts: Counter[int], params: PenaltySettings) -> np.ndarray:
    """A whole row (``[n_vocab]``), penalised: a copy."""
    x = logits.astype(np.float64)
    for t, b in params.logit_bias:
        x[t] += b
    if counts:
        seen = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        c = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        v = x[seen]
        v = np.where(v > 0, v / params.repeat_penalty, v * params.repeat_penalty)
        x[seen] = v - c * params.frequency_penalty - params.presence_penalty
    return x
