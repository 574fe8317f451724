"""Prompt lookup: propose what followed an earlier occurrence of the text's most recent n-gram.

Output that echoes its input (code edits, summaries, quoting) repeats long spans of the prompt or of itself.
When the last ``n`` committed tokens occurred earlier, the tokens that followed them then are a free draft: no
model runs, so the only cost is the extra width of the target's verify.

The search is a dictionary lookup, not a scan. For every n in ``min_n..max_n`` an index maps each n-gram to
the positions ``e`` where it ended and a token followed (the n-gram is ``tokens[e-n:e]``, its continuation
starts at ``tokens[e]``). Positions are appended in increasing order, so the last one is the most recent
occurrence, and removing a suffix of the text (a new request that shares only part of the last one's context)
pops exactly the entries it added. Each committed token is indexed once. Where the n-gram occurred more than once,
the proposal copies the occurrence whose preceding text agrees longest with the text before the n-gram (of its
latest ``source_candidates``; the latest on a tie). (Replayed on 26 recorded Qwen code edits at five decode cost
curves measured on the 2-core dev CPU, auto's pooled share of the lookup ceiling went from 53-60 % to 56-64 %; the
answers that copy little stayed where they were.)

An edit that changes one token throughout (a rename, an indentation width) breaks every copy at each place the
token occurs. So the drafter watches the copy its last proposal came from: where the output wrote ``y`` in place
of the source's ``x`` and then went on copying (``resume_to_confirm`` tokens), it learns the *substitution*
``x -> y`` and writes ``y`` for ``x`` in later proposals; a substitution the output does not follow once is
dropped. (Replayed on recorded Qwen answers to a rename, a re-indent and an added parameter at two decode cost
curves measured on the 2-core dev CPU, lookup under the controller went from 1.24x to 1.32x and from 1.32x to 1.39x
plain; on the bench's other classes it moved by under 1 %.)
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.drafters.base import Draft
from edgespec.sampling import SamplingParams, Uniforms

NGram = tuple[int, ...]
AGREEMENT_CAP = 64  # how far back last_agreement compares: a longer agreement says nothing more


@dataclass(frozen=True)
class LookupConfig:
    """The drafter's tuned numbers (see the module docstring and docs/benchmarks.md for what each earns)."""

    # The n-gram lengths matched (llama.cpp's n-gram cache uses 1..4): a single repeated token (a bracket, a space)
    # predicts its successor poorly, and a rejected draft still widens the verify (on a CPU ~half a decode a token).
    min_n: int = 2
    max_n: int = 4
    learn_substitutions: bool = True  # watch the copies for one-token edits made throughout (the module docstring)
    resume_to_confirm: int = 2  # tokens a copy must go on for after a changed one before the change is a substitution
    max_substitutions: int = 32  # an edit changes a few tokens throughout, not dozens
    source_candidates: int = 8  # the latest occurrences of a repeated n-gram weighed as the place being copied


DEFAULT_LOOKUP = LookupConfig()


@dataclass
class _Copy:
    """The copy being watched: the output at position q is checked against the text at ``q - offset``."""

    offset: int
    since: int  # the first output position not yet checked
    changed: tuple[int, int] | None = None  # (there, here): a token the output changed, if the copy may resume
    resumed: int = 0  # tokens copied again since


class LookupDrafter:
    """Deterministic drafter (``q=None``) that copies the continuation of the longest n-gram match, from the
    occurrence whose preceding text agrees longest.

    ``config``: the n-gram lengths and the substitutions' and sources' numbers (:class:`LookupConfig`). ``is_end``: the
    target's test for an end-of-generation token; a proposal then ends with the first one it copies (see
    :meth:`propose`).
    """

    name = "lookup"

    def __init__(self, config: LookupConfig = DEFAULT_LOOKUP, *, is_end: Callable[[int], bool] | None = None) -> None:
        if not 1 <= config.min_n <= config.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={config.min_n}, max_n={config.max_n}")
        self.config = config
        self.min_n = config.min_n
        self.max_n = config.max_n
        self.learn_substitutions = config.learn_substitutions
        self.last_ngram = 0  # n of the match behind the last proposal (0: none), for diagnostics and tests
        # How many tokens before that n-gram also agree with the text before its earlier occurrence (at most
        # AGREEMENT_CAP): 0 where the match may be a coincidence, many where the output is copying that place.
        self.last_agreement = 0
        # Whether that n-gram occurred once before, in the text given at the last reset (the prompt): then the
        # proposal can only be a copy of that place, and in a reply that is copying its prompt (a code edit) such a
        # proposal is as a rule right for long even before any agreement shows (see LookupForecast).
        self.last_from_prompt = False
        self._is_end = is_end
        self._ends: list[int] = []  # ascending positions of the text's end-of-generation tokens (with is_end)
        self.substitutions: dict[int, int] = {}  # source token -> the token this output writes for it
        self._repeated: set[int] = set()  # the substitutions' source tokens the output has substituted again since
        self._copy: _Copy | None = None
        self._tokens: list[int] = []  # what the index covers
        self._given = 0  # how many of them the last reset was given (the prompt); the rest were committed since
        # _index[n - min_n][ngram] = ascending ends e with tokens[e-n:e] == ngram and e < len(tokens)
        self._index: list[dict[NGram, list[int]]] = [{} for _ in range(self.min_n, self.max_n + 1)]

    # ----- the Drafter protocol -----------------------------------------------------------------------------
    def reset(self, context: Sequence[int]) -> None:
        """Keep the index of the prefix shared with the last context, drop the rest, index the new tail. What
        the last output was substituting ends with it."""
        self.substitutions.clear()
        self._repeated.clear()
        self._copy = None
        tokens = _as_list(context)
        keep = _common_prefix_len(self._tokens, tokens)
        self._truncate(keep)
        self._extend(tokens[keep:])
        self._given = len(tokens)

    def propose(
        self,
        context: Sequence[int],
        max_len: int,
        params: SamplingParams | None = None,
        rng: Uniforms | None = None,
    ) -> Draft:
        """``max_len`` tokens that followed the latest earlier occurrence of the longest suffix n-gram (periodic past
        the end of the text), each through the substitutions learned; with ``is_end``, no further than the first
        end-of-generation token among them.

        Nothing after an end of generation is ever generated, so a token proposed past one can only widen the
        verify. A reply that copies the end of a code block in the prompt would otherwise copy on into the chat
        template's end of turn and the next turn's header (recorded Qwen code edits ended so: 15 tokens drafted
        where 1 or 2 could be right). ``params`` and ``rng`` are unused: the proposal is deterministic; the verifier
        treats it as one-hot.
        """
        self.last_ngram = self.last_agreement = 0
        self.last_from_prompt = False
        if max_len <= 0:
            return Draft.empty()
        self._sync(context)
        tokens = self._tokens
        end = len(tokens)
        match = self._longest_match()
        if match is None:
            return Draft.empty()
        n, hits = match
        self.last_ngram = n
        subs = self.substitutions
        e, self.last_agreement = self._source(hits, n, end)  # e < end: at least one token follows
        self.last_from_prompt = len(hits) == 1 and e < self._given
        # Where the copy reaches the end of the text, the text is repeating with period end - e: go on
        # around the loop (a model stuck in a loop, a table's rows) instead of stopping there.
        period = end - e
        if self.learn_substitutions and (self._copy is None or self._copy.changed is None):
            # (a change waits for its copy to resume)
            self._copy = _Copy(offset=period, since=end)
        ends = self._ends
        if ends:
            first = bisect_left(ends, e)  # the first end at or after e (a copy going around meets it first)
            if first < len(ends):
                max_len = min(max_len, ends[first] - e + 1)
        copied = [tokens[e + i % period] for i in range(max_len)]
        return Draft([subs.get(t, t) for t in copied] if subs else copied, None)

    def continuations(self, context: Sequence[int], max_len: int, limit: int = 16) -> list[list[int]]:
        """What followed each of the latest ``limit`` earlier occurrences of the context's longest suffix n-gram
        (up to ``max_len`` tokens each, oldest first, as written: no substitutions, no going around a loop): the
        branches a draft tree can take (:func:`edgespec.drafters.tree.from_occurrences`). Empty where none occurs."""
        if max_len <= 0:
            return []
        self._sync(context)
        match = self._longest_match()
        if match is None:
            return []
        tokens, end = self._tokens, len(self._tokens)
        return [tokens[e : min(e + max_len, end)] for e in match[1][-limit:]]

    def _longest_match(self) -> tuple[int, list[int]] | None:
        """The longest suffix n-gram of the indexed text that occurred before, and the ends of its occurrences."""
        tokens = self._tokens
        end = len(tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            hits = self._index[n - self.min_n].get(tuple(tokens[end - n :]))
            if hits:
                return n, hits
        return None

    def commit(self, context: Sequence[int]) -> None:
        """Index the tokens committed since the last call."""
        self._sync(context)

    def _source(self, hits: list[int], n: int, end: int) -> tuple[int, int]:
        """Of the latest ``source_candidates`` ends of the suffix n-gram, the one whose preceding text agrees
        longest with the text before the suffix (the latest on a tie), and that agreement.

        A repeated n-gram (an indented ``return``, a closing bracket) is most recently found in the output's own
        last lines, while the place the output is copying is an earlier one, in the prompt: the longest agreement
        finds it, as a suffix tree's longest match would."""
        tokens, subs, repeated = self._tokens, self.substitutions, self._repeated
        best, best_agreement = hits[-1], -1
        for e in reversed(hits[-self.config.source_candidates :]):
            agreement = _agreement(tokens, e - n, end - n, subs, repeated)
            if agreement > best_agreement:
                best, best_agreement = e, agreement
                if agreement >= AGREEMENT_CAP:
                    break
        return best, best_agreement

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
        is_end = self._is_end
        if is_end is not None:
            self._ends.extend(q for q in range(start, len(tokens)) if is_end(tokens[q]))
        # Each new token at position e is the continuation of the n-grams ending just before it.
        for e in range(start, len(tokens)):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                self._index[n - self.min_n].setdefault(tuple(tokens[e - n : e]), []).append(e)
        if self._copy is not None:
            self._watch(self._copy)

    def _watch(self, copy: _Copy) -> None:
        """Check the newly committed tokens against the copy: learn or drop substitutions, or let the copy go."""
        tokens, subs = self._tokens, self.substitutions
        for q in range(copy.since, len(tokens)):
            there, here = tokens[q - copy.offset], tokens[q]
            if copy.changed is None:
                if here == subs.get(there, there):
                    if here != there:
                        self._repeated.add(there)
                    continue
                if here == there:  # a substitution this output did not make here: not a rule of it
                    del subs[there]
                    self._repeated.discard(there)
                    continue
                copy.changed, copy.resumed = (there, here), 0
            elif here == subs.get(there, there):
                copy.resumed += 1
                if copy.resumed >= self.config.resume_to_confirm:
                    there_was, here_is = copy.changed
                    if there_was in subs or len(subs) < self.config.max_substitutions:
                        subs[there_was] = here_is
                        self._repeated.discard(there_was)  # made once so far, as this substitution
                    copy.changed = None
            else:  # not one token changed in a copy, but the copy ended
                self._copy = None
                return
        copy.since = len(tokens)

    def _truncate(self, length: int) -> None:
        self._copy = None  # it watched positions that go
        del self._ends[bisect_left(self._ends, length) :]
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


def _agreement(tokens: list[int], a: int, b: int, subs: dict[int, int], repeated: set[int]) -> int:
    """How many tokens before positions ``a < b`` agree, read backwards (at most AGREEMENT_CAP). The later text may
    differ from the earlier by a substitution the output has made more than once: a rule of this edit (one made
    once is as often a sentence repeated with one word changed, and reading through those made lookup draft
    where it lost: 3 % on replayed math answers)."""
    k = 0
    while k < min(a, AGREEMENT_CAP):
        there, here = tokens[a - 1 - k], tokens[b - 1 - k]
        if here != there and (there not in repeated or here != subs.get(there)):
            break
        k += 1
    return k


def _as_list(tokens: Sequence[int]) -> list[int]:
    if isinstance(tokens, np.ndarray):
        return [int(t) for t in tokens.tolist()]
    return [int(t) for t in tokens]


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (a chat's next turn), compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])
