"""Repetition penalties and logit bias: their definitions, the history each verify row sees, and the candidates read
from llama.cpp that must still hold the penalised top-k."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from dense import densify
from exact_reference import reference_penalize

from edgespec.errors import InvalidParameterError
from edgespec.penalties import penalize_list, penalize_row, window, windows
from edgespec.sampling import LOGITS, Candidates, Readout, SamplingParams, readout_for
from edgespec.warp import warp_row

V = 50


def test_penalties_follow_their_definitions_on_lists_and_rows() -> None:
    rng = np.random.default_rng(0)
    params = SamplingParams(
        repeat_penalty=1.3, repeat_last_n=6, presence_penalty=0.4, frequency_penalty=0.7, logit_bias={3: -2.0, 9: 1.5}
    )
    for length, n in [(12, 6)] * 30 + [(9, 16)] * 10 + [(3, 64)] * 10:  # windows shorter and longer than the text
        params = replace(params, repeat_last_n=n)
        logits = rng.normal(size=V).astype(np.float32) * 3
        history = rng.integers(0, V, size=length).tolist()
        expected = reference_penalize(
            logits, history, repeat_penalty=1.3, repeat_last_n=n, presence_penalty=0.4, frequency_penalty=0.7,
            logit_bias={3: -2.0, 9: 1.5},
        )  # fmt: skip
        counts = window(history, [], n)
        np.testing.assert_allclose(penalize_row(logits, counts, params), expected, rtol=1e-12)
        ids = rng.permutation(V)[:20].tolist()
        got = penalize_list(ids, [float(logits[t]) for t in ids], counts, params)
        np.testing.assert_allclose(got, expected[ids], rtol=1e-12)


@pytest.mark.parametrize(
    "context, draft, n, expected",
    [
        ([1, 2, 3, 4], [5, 6], 3, [[2, 3, 4], [3, 4, 5], [4, 5, 6]]),  # the window slides over the draft
        ([1, 2], [3], 8, [[1, 2], [1, 2, 3]]),  # a short context: all of it
        ([1, 2, 3], [4, 5, 6, 7], 2, [[2, 3], [3, 4], [4, 5], [5, 6], [6, 7]]),  # a draft longer than the window
        ([1, 2, 3], [4], 0, [[], []]),  # no window: no penalty
    ],
)
def test_each_verify_row_counts_the_context_plus_the_drafts_before_it(context, draft, n, expected) -> None:
    assert list(windows(context, draft, n)) == [Counter(e) for e in expected]


def test_rows_read_in_order_slide_the_window_as_counting_it_afresh_does() -> None:
    # The rows of a verify (and a draft's steps) are read in order, each window derived from the one before; any
    # order of reads, growing drafts and short contexts give each row's own count, with no zero-count keys.
    rng = np.random.default_rng(3)
    for _ in range(300):
        context = rng.integers(0, 6, size=int(rng.integers(0, 12))).tolist()
        draft = rng.integers(0, 6, size=int(rng.integers(0, 8))).tolist()
        n = int(rng.integers(0, 10))
        rows = windows(context, draft, n)
        order = list(range(len(draft) + 1)) if rng.random() < 0.7 else rng.permutation(len(draft) + 1).tolist()
        for i in order:
            got = rows[i]
            assert got == window(context, draft[:i], n) and all(c > 0 for c in got.values())
    growing: list[int] = []  # a draft model's steps: the draft grows between reads
    rows = windows([1, 2, 3], growing, 3)
    for i, token in enumerate([3, 3, 4, 1]):
        assert rows[i] == window([1, 2, 3], growing, 3)
        growing.append(token)


@pytest.mark.parametrize(
    "fields",
    [
        dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.02, repeat_penalty=1.5, repeat_last_n=8),
        dict(temperature=1, top_k=3, top_p=1.0, min_p=0.0, frequency_penalty=2.0, presence_penalty=1, repeat_last_n=9),
        dict(temperature=0.7, top_k=4, top_p=0.95, min_p=0.05, logit_bias={0: -100.0, 1: -5.0}, repeat_last_n=0),
        dict(temperature=0, repeat_penalty=1.8, repeat_last_n=10),  # greedy: the penalised argmax
    ],
)
def test_the_widened_candidates_give_the_distribution_of_the_whole_penalised_row(fields: dict) -> None:
    """Penalties lower the best raw tokens; the top-k read from llama.cpp is widened so that the penalised top-k is
    still inside it: the warp of those candidates equals the warp of the whole row, whatever the history."""
    params = SamplingParams(**fields)
    readout = readout_for(params, V)
    assert readout.kind == "top_k" and readout.k > (1 if params.greedy else params.top_k)
    rng = np.random.default_rng(1)
    for _ in range(200):
        row = (rng.normal(size=V) * 2).astype(np.float32)
        # a history made of the raw favourites, so the penalties reshuffle the top
        favourites = np.argsort(-row)[:12]
        history = rng.choice(favourites, size=16).tolist()
        counts = window(history, [], params.repeat_last_n)
        best = np.argsort(-row)[: readout.k]
        candidates = Candidates([rng.permutation(best).tolist()], [[]])
        candidates.logits = [[float(row[t]) for t in candidates.ids[0]]]
        from_candidates = densify([warp_row(candidates, 0, params, counts)], V)
        whole = densify([warp_row(row[None, :], 0, params, counts)], V)
        np.testing.assert_allclose(from_candidates, whole, atol=1e-9)


def test_a_penalty_that_can_raise_a_logit_reads_whole_rows() -> None:
    for fields in (dict(repeat_penalty=0.8), dict(presence_penalty=-1.0), dict(logit_bias={7: 3.0})):
        assert readout_for(SamplingParams(**fields), V) == LOGITS
    assert readout_for(SamplingParams(top_k=40, repeat_penalty=1.1, repeat_last_n=64), 151_936) == Readout("top_k", 104)
    assert readout_for(SamplingParams(temperature=0, repeat_penalty=1.1, repeat_last_n=64), 151_936) == Readout(
        "top_k", 65
    )
    assert readout_for(SamplingParams(top_k=40, repeat_penalty=1.1), 80) == LOGITS  # k + 64 is the whole row
    # a negative bias alone lowers only its own tokens: no window to read past
    assert readout_for(SamplingParams(top_k=40, logit_bias={5: -3.0, 9: -1.0}), 151_936) == Readout("top_k", 42)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(repeat_penalty=0), "repeat_penalty"),
        (dict(repeat_last_n=-1), "repeat_last_n"),
        (dict(frequency_penalty=2.5), "frequency_penalty"),
        (dict(presence_penalty="1"), "presence_penalty"),
        (dict(logit_bias={"x": 1}), "logit_bias"),
        (dict(logit_bias={5: 200.0}), "logit_bias"),
    ],
)
def test_bad_penalties_are_refused_with_their_name(fields: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        SamplingParams(**fields)


def test_logit_bias_is_stored_hashable_and_sorted() -> None:
    params = SamplingParams(logit_bias={"9": 1, 2: -3.5})
    assert params.logit_bias == ((2, -3.5), (9, 1.0)) and hash(params)
    assert not SamplingParams().penalized and params.penalized


def test_a_repeated_bias_id_keeps_one_bias_and_an_id_outside_the_vocabulary_is_refused() -> None:
    from fakes import FakeModel

    from edgespec.engine import Engine

    assert SamplingParams(logit_bias=((5, 1.0), (5, 2.0))).logit_bias == ((5, 2.0),)
    engine = Engine(FakeModel(n_vocab=12), None, draft_len=0)
    with pytest.raises(InvalidParameterError, match="logit_bias names token 12"):
        engine.stream([1, 2], SamplingParams(logit_bias={12: 1.0}))
    assert len(list(engine.stream([1, 2], SamplingParams(logit_bias={11: -5.0}, max_tokens=3)))) > 1
