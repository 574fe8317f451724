"""Prompt lookup: propose what followed the last occurrence of the text's most recent n-gram.

Output that echoes its input (code edits, summaries, quoting) repeats long spans of the prompt or of itself.
When the last ``n`` committed tokens occurred earlier, the tokens that followed them then are a free draft: no
model runs, so the only cost is the extra width of the target's verify.

The search is a dictionary lookup, not a scan. For every n in ``min_n..max_n`` an index maps each n-gram to
the positions ``e`` where it ended and a token followed (the n-gram is ``tokens[e-n:e]``, its continuation
starts at ``tokens[e]``). Positions are appended in increasing order, so the last one is the most recent
occurrence, and removing a suffix of the text (a new request that shares only part of the last one's context)
pops exactly the entries it added. Each committed token is indexed once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.drafters.base import Draft
from edgespec.sampling import SamplingParams, Uniforms

NGram = tuple[int, ...]


class LookupDrafter:
    """Deterministic drafter (``q=None``) that copies the continuation of the longest, latest n-gram match.

    ``min_n``/``max_n`` bound the n-gram length (llama.cpp's n-gram cache uses 1..4). The default skips
    1-grams: a single repeated token (a bracket, a space) predicts its successor poorly, and a rejected draft
    still widens the verify, which on a CPU costs about half a decode per token.
    """

    name = "lookup"

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.last_ngram = 0  # n of the match behind the last proposal (0: none), for diagnostics and tests
        self._tokens: list[int] = []  # what the index covers
        # _index[n - min_n][ngram] = ascending ends e with tokens[e-n:e] == ngram and e < len(tokens)
        self._index: list[dict[NGram, list[int]]] = [{} for _ in range(min_n, max_n + 1)]

    # ----- the Drafter protocol -----------------------------------------------------------------------------
    def reset(self, context: Sequence[int]) -> None:
        """Keep the index of the prefix shared with the last context, drop the rest, index the new tail."""
        tokens = _as_list(context)
        keep = _common_prefix_len(self._tokens, tokens)
        self._truncate(keep)
        self._extend(tokens[keep:])

    def propose(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams | None = None,
        rng: Uniforms | None = None,
    ) -> Draft:
        """``max_len`` tokens that followed the latest earlier occurrence of the longest suffix n-gram (periodic past
        the end of the text).

        ``params`` and ``rng`` are unused: the proposal is deterministic; the verifier treats it as one-hot.
        """
        self.last_ngram = 0
        if max_len <= 0:
            return Draft.empty()
        self._sync(context)
        tokens = self._tokens
        end = len(tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            hits = self._index[n - self.min_n].get(tuple(tokens[end - n :]))
            if hits:
                self.last_ngram = n
                e = hits[-1]  # most recent; e < end, so at least one token follows
                # Where the copy reaches the end of the text, the text is repeating with period end - e: go on
                # around the loop (a model stuck in a loop, a table's rows) instead of stopping there.
                period = end - e
                return Draft([tokens[e + i % period] for i in range(max_len)], None)
        return Draft.empty()

    def commit(self, context: Sequence[int]) -> None:
        """Index the tokens committed since the last call."""
        self._sync(context)

    # ----- the index ----------------------------------------------------------------------------------------
    def _sync(self, context: Sequence[int]) -> None:
        have = len(self._tokens)
        # Within a request the context only grows, so checking the last indexed token is enough to take the
        # fast path; anything else (shrunk or diverged) is reconciled against the common prefix.
        if len(context) >= have and (have == 0 or int(context[have - 1]) == self._tokens[-1]):
            if len(context) > have:
                self._extend(_as_list(context[have:]))
        else:
            self.reset(context)

    def _extend(self, new: list[int]) -> None:
        tokens = self._tokens
        start = len(tokens)
        tokens.extend(new)
        # Each new token at position e is the continuation of the n-grams ending just before it.
        for e in range(start, len(tokens)):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                self._index[n - self.min_n].setdefault(tuple(tokens[e - n : e]), []).append(e)

    def _truncate(self, length: int) -> None:
        tokens = self._tokens
        # Undo _extend newest first: each entry removed is the last of its list.
        for e in range(len(tokens) - 1, length - 1, -1):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                index = self._index[n - self.min_n]
                key = tuple(tokens[e - n : e])
                hits = index[key]
                hits.pop()
                if not hits:
                    del index[key]
        del tokens[length:]


def _as_list(tokens: Sequence[int]) -> list[int]:
    if isinstance(tokens, np.ndarray):
        return [int(t) for t in tokens.tolist()]
    return [int(t) for t in tokens]


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (a chat's next turn), compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])
