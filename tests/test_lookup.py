"""Prompt lookup: what it proposes, and that its incremental index always equals a from-scratch scan."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from edgespec.drafters.base import Drafter
from edgespec.drafters.lookup import LookupConfig, LookupDrafter
from edgespec.sampling import SamplingParams

PARAMS = SamplingParams(temperature=0)


def propose(drafter: LookupDrafter, context, max_len: int = 8) -> list[int]:
    draft = drafter.propose(context, max_len, PARAMS, None)
    assert draft.q is None  # deterministic: the verifier treats it as one-hot
    return draft.tokens


def _agreement(tokens: list[int], a: int, b: int) -> int:
    """How many tokens before positions a < b are equal, read backwards, at most 64."""
    k = 0
    while k < min(a, 64) and tokens[a - 1 - k] == tokens[b - 1 - k]:
        k += 1
    return k


def brute_force(tokens: list[int], max_len: int, min_n: int, max_n: int) -> list[int]:
    """The specification: longest suffix n-gram; of its latest 8 earlier occurrences, the one whose preceding
    tokens agree longest with those before the suffix (at most 64 compared; the latest on a tie); what followed it."""
    end = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if end < n + 1:
            continue
        suffix = tokens[end - n :]
        # latest first; the suffix itself (e == end) is not earlier
        ends = [e for e in range(end - 1, n - 1, -1) if tokens[e - n : e] == suffix][:8]
        if ends:
            e = max(ends, key=lambda e, n=n: (_agreement(tokens, e - n, end - n), e))
            return [tokens[e + i % (end - e)] for i in range(max_len)]  # past the end: around the loop
    return []


def fresh(tokens: list[int], is_end: Callable[[int], bool] | None = None, **kwargs) -> LookupDrafter:
    drafter = LookupDrafter(LookupConfig(**kwargs), is_end=is_end)
    drafter.reset(tokens)
    return drafter


def test_satisfies_the_drafter_protocol():
    drafter: Drafter = LookupDrafter()
    assert drafter.name == "lookup"


@pytest.mark.parametrize(
    ("context", "max_len", "expected", "n"),
    [
        # "1 2 3" occurred before, followed by 4 5 9
        ([1, 2, 3, 4, 5, 9, 1, 2, 3], 3, [4, 5, 9], 3),
        ([1, 2, 3, 4, 5, 9, 1, 2, 3], 8, [4, 5, 9, 1, 2, 3, 4, 5], 3),  # past the end: the text repeats
        # longest n wins over a more recent shorter match: "1 2 3" -> 50, though "2 3" was last followed by 60
        ([1, 2, 3, 50, 9, 2, 3, 60, 1, 2, 3], 1, [50], 3),
        # same n: the most recent occurrence wins
        ([5, 6, 70, 5, 6, 80, 5, 6], 8, [80, 5, 6, 80, 5, 6, 80, 5], 2),
        # ... unless an earlier one is preceded by what precedes the suffix: "9 1 2 3 4" was followed by 50
        ([9, 1, 2, 3, 4, 50, 7, 8, 1, 2, 3, 4, 60, 7, 9, 1, 2, 3, 4], 2, [50, 7], 4),
        # overlapping occurrences in a repeating "a b a b a": the latest "a b a" is followed by "b a", and so on
        ([7, 8, 7, 8, 7], 5, [8, 7, 8, 7, 8], 3),
        # a proposal that reaches the end of the context goes on around the loop it found
        ([1, 2, 3, 1, 2], 10, [3, 1, 2, 3, 1, 2, 3, 1, 2, 3], 2),
        # a run of one token: "a a a" last followed by the final "a"
        ([4, 4, 4, 4], 5, [4, 4, 4, 4, 4], 3),
    ],
)
def test_proposals(context, max_len, expected, n):
    drafter = fresh(context)
    assert propose(drafter, context, max_len) == expected
    assert drafter.last_ngram == n
    assert expected == brute_force(context, max_len, 2, 4)


@pytest.mark.parametrize(
    "context",
    [[], [1], [1, 2], [1, 2, 3, 4, 5], [1, 2, 1, 3]],  # the last: "1" repeats, but 1-grams are off by default
)
def test_no_match_proposes_nothing(context):
    drafter = fresh(context)
    assert propose(drafter, context) == []
    assert drafter.last_ngram == 0


def test_agreement_counts_the_tokens_before_the_match_that_also_agree():
    # The 4-gram 2 3 4 5 matches its earlier occurrence; the token before it there is 1, here 8: no agreement.
    context = [9, 1, 2, 3, 4, 5, 0, 8, 2, 3, 4, 5]
    drafter = fresh(context)
    assert propose(drafter, context) and drafter.last_ngram == 4 and drafter.last_agreement == 0
    context = [7, 6, 1, 2, 3, 4, 5, 0, 0, 6, 1, 2, 3, 4, 5]
    drafter = fresh(context)  # here "6 1" before the 4-gram agrees with "6 1" there, "0" with "7" does not
    assert propose(drafter, context)[:1] == [0] and drafter.last_agreement == 2
    # A copy of a long text agrees as far back as the cap.
    text = list(range(100, 300))
    drafter = fresh(text + text[:150])
    assert propose(drafter, text + text[:150]) == text[150:158]
    assert drafter.last_agreement == 64
    # No proposal, no agreement.
    assert propose(drafter, [1, 2, 3]) == [] and drafter.last_agreement == 0


def test_a_match_from_the_prompt_is_told_from_one_in_the_reply_or_a_repeated_one():
    prompt = [9, 1, 2, 3, 4, 5, 6, 7]
    drafter = fresh(prompt)
    # The reply writes "2 3": that bigram occurred once, in the prompt.
    assert propose(drafter, [*prompt, 8, 2, 3]) == [4, 5, 6, 7, 8, 2, 3, 4] and drafter.last_from_prompt
    # "3 4" now also occurs in the reply (it was proposed and committed): twice, so a guess between two places.
    reply = [8, 2, 3, 4, 0, 3, 4]
    assert propose(drafter, [*prompt, *reply])[:1] == [0] and not drafter.last_from_prompt
    # "0 3" occurred once, in the reply itself.
    assert propose(drafter, [*prompt, *reply, 0, 3]) and not drafter.last_from_prompt
    # No proposal, nothing from anywhere; a new request's prompt is what the next reset is given.
    assert propose(drafter, [*prompt, *reply, 11, 12]) == [] and not drafter.last_from_prompt
    drafter.reset([*prompt, *reply, 0, 3, 5])  # a next turn: the last reply is part of its prompt
    assert propose(drafter, [*prompt, *reply, 0, 3, 5, 8, 2, 3, 4, 0]) and drafter.last_from_prompt


def test_min_n_one_matches_single_tokens():
    assert propose(fresh([1, 2, 1, 3], min_n=1), [1, 2, 1, 3]) == []
    assert propose(fresh([1, 2, 3, 1], min_n=1), [1, 2, 3, 1], 4) == [2, 3, 1, 2]


def test_max_len_zero_proposes_nothing():
    assert propose(fresh([1, 2, 3, 1, 2]), [1, 2, 3, 1, 2], 0) == []


def test_rejects_bad_n_range():
    with pytest.raises(ValueError):
        LookupDrafter(LookupConfig(min_n=0))
    with pytest.raises(ValueError):
        LookupDrafter(LookupConfig(min_n=3, max_n=2))


@pytest.mark.parametrize("seed", range(40))
def test_incremental_index_equals_brute_force(seed):
    """Random streams over a small alphabet (so matches abound), committed in random chunks."""
    rng = np.random.default_rng(seed)
    min_n = int(rng.integers(1, 3))
    max_n = min_n + int(rng.integers(0, 4))
    alphabet = int(rng.integers(2, 6))
    tokens = rng.integers(0, alphabet, size=int(rng.integers(0, 20))).tolist()
    drafter = LookupDrafter(LookupConfig(min_n, max_n, learn_substitutions=False))  # the spec has none
    drafter.reset(tokens)
    while len(tokens) < 150:
        tokens = tokens + rng.integers(0, alphabet, size=int(rng.integers(1, 6))).tolist()
        drafter.commit(tokens)
        max_len = int(rng.integers(1, 10))
        assert propose(drafter, tokens, max_len) == brute_force(tokens, max_len, min_n, max_n)
    assert drafter._index == fresh(tokens, min_n=min_n, max_n=max_n)._index


def test_propose_catches_up_without_commit():
    drafter = fresh([1, 2, 3])
    context = [1, 2, 3, 4, 1, 2]
    assert propose(drafter, context) == brute_force(context, 8, 2, 4) == [3, 4, 1, 2, 3, 4, 1, 2]


def test_accepts_numpy_context():
    context = np.array([1, 2, 3, 4, 1, 2, 3], dtype=np.int32)
    drafter = fresh(context)
    assert propose(drafter, context, 4) == [4, 1, 2, 3]
    assert all(type(t) is int for t in propose(drafter, context))


@pytest.mark.parametrize("seed", range(20))
def test_reset_reuses_a_shared_prefix_and_handles_unrelated_contexts(seed):
    rng = np.random.default_rng(seed)
    first = rng.integers(0, 3, size=80).tolist()
    drafter = fresh(first[:30], learn_substitutions=False)  # the spec has none
    drafter.commit(first)  # a request that generated 50 tokens
    shared = int(rng.integers(0, 81))
    cases = {
        "shares a prefix, then diverges": first[:shared] + rng.integers(0, 3, size=40).tolist(),
        "is a prefix (shrinks)": first[:shared],
        "extends it": first + rng.integers(0, 3, size=10).tolist(),
        "is unrelated": rng.integers(3, 6, size=60).tolist(),
    }
    for what, context in cases.items():
        drafter.reset(context)
        assert drafter._index == fresh(context)._index, what
        for max_len in (1, 4, 9):
            assert propose(drafter, context, max_len) == brute_force(context, max_len, 2, 4), what


def test_commit_that_shrinks_or_rewrites_the_last_token_is_reconciled():
    # Within a request the context only grows; commit checks just the last indexed token (cheap) and
    # reconciles anything else against the common prefix, like reset.
    drafter = fresh([1, 2, 3, 4, 1, 2])
    drafter.commit([1, 2, 3, 4, 1, 9, 9, 1, 2])
    assert drafter._index == fresh([1, 2, 3, 4, 1, 9, 9, 1, 2])._index
    assert propose(drafter, [1, 2, 3, 4, 1, 9, 9, 1, 2], 7) == [3, 4, 1, 9, 9, 1, 2]
    drafter.commit([1, 2, 3])
    assert drafter._index == fresh([1, 2, 3])._index


# ----- substitutions: one-token edits made throughout -------------------------------------------------------
X, Y = 7, 8  # the source writes X; the output renames it to Y
SOURCE = [20, 21, 22, X, 23, 24, 25, 26, X, 27, 28, 29, 30, 31, X, 32, 33, 34]


def write(drafter: LookupDrafter, context: list[int], tokens: list[int]) -> list[list[int]]:
    """Commit ``tokens`` one at a time, as plain rounds do, asking for a proposal before each; return them."""
    proposals = []
    for tok in tokens:
        proposals.append(propose(drafter, context, 6))
        context.append(tok)
        drafter.commit(context)
    return proposals


def test_a_rename_is_learned_once_the_copy_resumes_and_then_proposed():
    prompt = [1, *SOURCE, 2]
    renamed = [Y if t == X else t for t in SOURCE]
    drafter = fresh(prompt)
    context = list(prompt)
    proposals = write(drafter, context, renamed[:6])  # 20 21 22 Y 23 24: Y where X was, then the copy goes on
    assert proposals[3][0] == X  # before: the source's token
    assert drafter.substitutions == {X: Y}
    proposals = write(drafter, context, renamed[6:])
    # The next X of the source is proposed as Y: the copy goes through it.
    assert proposals[0] == [25, 26, Y, 27, 28, 29]
    # Renamed twice, it is a rule of this output: the text before a match agrees through it. Here the match is
    # the source's last tokens 32 33 34 (the 4-gram Y 32 33 34 is not in the source), and all of the copy before
    # it agrees, the renamed tokens included.
    assert propose(drafter, context, 1) == [2] and drafter.last_ngram == 3
    assert drafter.last_agreement == len(SOURCE) - 3


def test_a_substitution_the_output_does_not_make_again_is_dropped():
    prompt = [1, *SOURCE, 2]
    drafter = fresh(prompt)
    context = list(prompt)
    write(drafter, context, [20, 21, 22, Y, 23, 24, 25])
    assert drafter.substitutions == {X: Y}
    write(drafter, context, [26, X, 27])  # this time it kept X
    assert drafter.substitutions == {}


def test_an_insertion_or_a_copy_that_ends_teaches_nothing():
    prompt = [1, *SOURCE, 2]
    drafter = fresh(prompt)
    context = list(prompt)
    write(drafter, context, [20, 21, 22, 99, X, 23, 24, 25])  # a token inserted: the copy resumes one place later
    write(drafter, context, [40, 41, 42, 43])  # new text
    assert drafter.substitutions == {}


def test_substitutions_end_with_the_request_and_can_be_turned_off():
    prompt = [1, *SOURCE, 2]
    drafter = fresh(prompt)
    context = list(prompt)
    write(drafter, context, [20, 21, 22, Y, 23, 24, 25])
    assert drafter.substitutions
    drafter.reset(prompt)
    assert drafter.substitutions == {}
    off = fresh(prompt, learn_substitutions=False)
    context = list(prompt)
    write(off, context, [20, 21, 22, Y, 23, 24, 25, 26])
    assert off.substitutions == {} and propose(off, context, 1) == [X]


def test_a_substitution_learned_anew_counts_as_made_once():
    prompt = [1, *SOURCE, 2]
    drafter = fresh(prompt)
    context = list(prompt)
    write(drafter, context, [20, 21, 22, Y, 23, 24, 25, 26, Y, 27])  # X -> Y, made twice
    assert drafter.substitutions == {X: Y} and X in drafter._repeated
    write(drafter, context, [28, 29, 30, 31, 9, 32, 33])  # then 9 where the source has X, and the copy goes on
    assert drafter.substitutions == {X: 9} and X not in drafter._repeated


def test_a_proposal_ends_with_the_first_end_of_generation_it_copies():
    # The prompt's code block is followed by the chat template's end of turn (99) and the next turn's header: a reply
    # that copies the block's end ends there too, so nothing past the 99 is proposed.
    end = 99
    prompt = [7, 1, 2, 3, 4, 5, end, 60, 61, 62, 63]
    drafter = fresh(prompt, is_end=lambda t: t == end)
    context = [*prompt, 1, 2, 3]
    assert propose(drafter, context, 8) == [4, 5, end]
    assert propose(fresh(prompt), context, 8) == [4, 5, end, 60, 61, 62, 63, 1]  # without is_end: on and on
    # A copy that goes around the loop at the end of the text stops at its first end as well.
    looping = [1, 2, end, 5, 1, 2]
    assert propose(fresh(looping, is_end=lambda t: t == end), looping, 8) == [end]
    # The ends follow the text: committed ones count, and a context without them proposes in full again.
    drafter = fresh([1, 2, 3, 4, 5, 6], is_end=lambda t: t == end)
    drafter.commit([1, 2, 3, 4, 5, 6, 3, 4, end, 8])
    assert propose(drafter, [1, 2, 3, 4, 5, 6, 3, 4, end, 8, 3, 4], 8) == [end]
    drafter.reset([1, 2, 3, 4, 5, 6, 3, 4])
    assert propose(drafter, [1, 2, 3, 4, 5, 6, 3, 4], 4) == [5, 6, 3, 4]


def test_continuations_are_what_followed_each_earlier_occurrence():
    lookup = LookupDrafter()
    text = [7, 8, 9, 1, 2, 7, 8, 9, 3, 4, 5, 7, 8, 9]
    rows = lookup.continuations(text, 3)
    assert rows == [[1, 2, 7], [3, 4, 5]]  # oldest first, each cut at 3 tokens
    assert lookup.continuations(text, 3, limit=1) == [[3, 4, 5]]
    assert lookup.continuations([1, 2, 3, 4], 3) == []  # no n-gram occurs twice
    assert lookup.continuations(text, 0) == []
