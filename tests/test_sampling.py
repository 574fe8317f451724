"""The warp (top-k → top-p → min-p → temperature) against a dense reference, on every readout path; validation;
sampling."""

from __future__ import annotations

import random

import numpy as np
import pytest
from dense import densify
from stat_tools import fits

from edgespec.errors import InvalidParameterError, ModelError
from edgespec.sampling import ARGMAX, LOGITS, Candidates, Readout, SamplingParams, readout_for
from edgespec.warp import Dist, sample, warp


def reference_warp(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """Straightforward dense version of llama.cpp's chain, for comparison (slow, obviously right)."""
    x = logits.astype(np.float64)
    alive = np.ones_like(x, dtype=bool)
    if sp.top_k > 0:
        alive[np.argsort(-x, kind="stable")[sp.top_k :]] = False
    p = np.where(alive, np.exp(x - x[alive].max()), 0.0)
    p /= p.sum()
    if sp.top_p < 1:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        n_keep = int(np.argmax(cum >= sp.top_p)) + 1 if (cum >= sp.top_p).any() else len(order)
        cut = np.zeros_like(alive)
        cut[order[:n_keep]] = True
        alive &= cut
    if sp.min_p > 0:
        alive &= p >= sp.min_p * p[alive].max()
    out = np.where(alive, np.exp((x - x[alive].max()) / sp.temperature), 0.0)
    return out / out.sum()


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
        dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        dict(temperature=1.3, top_k=5, top_p=1.0, min_p=0.0),
        dict(temperature=0.5, top_k=0, top_p=0.8, min_p=0.0),
        dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
        dict(temperature=2.0, top_k=100, top_p=0.5, min_p=0.01),
    ],
)
def test_warp_matches_dense_reference(params: dict) -> None:
    sp = SamplingParams(**params)
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = (rng.normal(size=500) * 3).astype(np.float32)
        np.testing.assert_allclose(densify(warp(logits, sp), 500), reference_warp(logits, sp), atol=1e-9)


PARAMS = [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0),
    dict(temperature=0.3, top_k=100, top_p=0.5, min_p=0.0),
    dict(temperature=1.7, top_k=25, top_p=0.9, min_p=0.1),
]


def shuffled_top_k(rows: np.ndarray, k: int, seed: int = 0) -> Candidates:
    """What llama.cpp's in-graph top-k hands back: the k best of each row with their logits, in no order."""
    ids = np.argsort(-rows, axis=1)[:, :k]
    ids = ids[:, np.random.default_rng(seed).permutation(k)]
    return Candidates(ids.astype(np.int32), np.take_along_axis(rows, ids, axis=1))


@pytest.mark.parametrize("params", PARAMS)
def test_warp_of_llama_cpp_top_k_candidates_equals_the_warp_of_whole_rows(params: dict) -> None:
    # The backend-sampled path (top-k inside llama.cpp, the rest here) and the whole-row path are one definition.
    sp = SamplingParams(**params)
    rows = (np.random.default_rng(3).normal(size=(5, 2000)) * 3).astype(np.float32)
    from_rows = densify(warp(rows, sp), 2000)
    from_candidates = densify(warp(shuffled_top_k(rows, sp.top_k), sp), 2000)
    np.testing.assert_allclose(from_candidates, from_rows, atol=1e-12)
    np.testing.assert_allclose(from_rows, [reference_warp(r, sp) for r in rows], atol=1e-9)


def test_warp_of_many_rows_equals_the_warp_of_each_row() -> None:
    sp = SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.02)  # the whole-row path, rows of any width
    rows = (np.random.default_rng(4).normal(size=(4, 300)) * 2).astype(np.float32)
    together = densify(warp(rows, sp), 300)
    for r in range(4):
        np.testing.assert_allclose(together[r], densify(warp(rows[r], sp), 300), atol=1e-12)


def test_candidates_wider_than_top_k_are_cut_to_the_k_best() -> None:
    sp = SamplingParams(temperature=1.0, top_k=5, top_p=1.0, min_p=0.0)
    rows = np.random.default_rng(5).normal(size=(2, 100)).astype(np.float32)
    np.testing.assert_allclose(
        densify(warp(shuffled_top_k(rows, 30), sp), 100), densify(warp(rows, sp), 100), atol=1e-12
    )


def test_readout_is_the_cheapest_that_serves_the_params() -> None:
    assert readout_for(SamplingParams(temperature=0), 1000) == ARGMAX
    assert readout_for(SamplingParams(top_k=40), 1000) == Readout("top_k", 40)
    assert readout_for(SamplingParams(top_k=0), 1000) == LOGITS  # top-p and min-p need the whole row
    assert readout_for(SamplingParams(top_k=5000), 1000) == LOGITS  # top-k wider than the vocabulary is off


def test_greedy_warp_is_one_hot_on_argmax() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert warp(logits, SamplingParams(temperature=0)) == [Dist([1], [1.0])]
    assert warp(shuffled_top_k(logits[None, :], 3), SamplingParams(temperature=0)) == [Dist([1], [1.0])]


def test_warp_output_is_sorted_by_probability() -> None:
    logits = np.random.default_rng(1).normal(size=1000).astype(np.float32)
    for top_k in (50, 500):  # in Python, in numpy
        (d,) = warp(logits, SamplingParams(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.0))
        assert len(d.ids) == top_k and np.all(np.diff(d.probs) <= 0) and d.ids[0] == d.top == int(np.argmax(logits))


def test_prob_reads_a_tokens_probability_and_zero_for_tokens_not_listed() -> None:
    d = Dist([4, 2, 7], [0.5, 0.3, 0.2])
    assert (d.prob(7), d.prob(4), d.prob(1)) == (0.2, 0.5, 0.0)
    assert (d.top, d.top_prob) == (4, 0.5)
    assert Dist([1, 2], [0.25, 0.75]).top == 2  # the mode of a row not sorted


def test_sample_follows_the_distribution() -> None:
    rng = np.random.default_rng(2)
    logits = np.array([1.0, 0.5, 0.0, -0.5, -3.0], dtype=np.float32)
    (d,) = warp(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    counts = np.zeros(5)
    for _ in range(20_000):
        counts[sample(d, rng)] += 1
    ok, why = fits(counts, densify([d], 5))
    assert ok, why


def test_sample_draws_from_the_row_asked_for() -> None:
    rng = np.random.default_rng(0)
    assert {sample(Dist.one_hot(3), rng) for _ in range(50)} == {3}
    assert {sample(Dist([1, 4, 2], [0.5, 0.0, 0.5]), rng) for _ in range(200)} == {1, 2}  # never a token of mass 0


def test_seed_makes_sampling_reproducible() -> None:
    sp = SamplingParams(temperature=1.0, seed=42)
    (d,) = warp(np.linspace(0, 1, 50).astype(np.float32), sp)
    a = [sample(d, r) for r in [sp.rng()] for _ in range(50)]
    b = [sample(d, r) for r in [sp.rng()] for _ in range(50)]
    assert a == b
    other = SamplingParams(temperature=1.0, seed=43)
    c = [sample(d, r) for r in [other.rng()] for _ in range(50)]
    assert c != a  # the seed decides the draws (50 draws over 50 tokens: equal by chance almost never)


@pytest.mark.parametrize(
    "bad, words",
    [
        (dict(temperature=-1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_k=-3), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=1.0), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(seed=-1), "seed"),
        (dict(stop=("",)), "stop"),
    ],
)
def test_invalid_parameters_are_rejected_with_a_clear_message(bad: dict, words: str) -> None:
    with pytest.raises(InvalidParameterError, match=words):
        SamplingParams(**bad)


def test_stop_accepts_a_single_string() -> None:
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_logits_a_damaged_model_computes_are_a_model_error(poison: float) -> None:
    """Mangled weights can make llama.cpp return NaN logits; sampling says so instead of failing on an empty set."""
    logits = np.linspace(-2.0, 2.0, 100)
    logits[7] = poison
    rows = np.stack([np.linspace(-1.0, 1.0, 100), logits])
    damaged = f"the model computed {poison} logits: its weights are damaged"
    for scores, params in [
        (logits, SamplingParams()),  # one row, top-k in numpy
        (logits, SamplingParams(top_k=0)),  # one whole row
        (rows, SamplingParams()),  # several rows (a verify)
        (shuffled_top_k(logits[None, :], 100), SamplingParams(top_k=100)),  # candidates from llama.cpp
    ]:
        with pytest.raises(ModelError, match=damaged):
            warp(scores, params)
    masked = np.full(100, -np.inf)
    masked[3] = 1.0  # -inf is a masked token, not damage
    for params in (SamplingParams(), SamplingParams(top_k=0)):
        (d,) = warp(masked, params)
        assert [t for t, p in zip(d.ids, d.probs, strict=True) if p > 0] == [3]


@pytest.mark.parametrize("params", PARAMS)
def test_the_python_row_path_is_the_numpy_row_path(params: dict) -> None:
    """Narrow rows are warped and sampled in plain Python (faster right after a decode); the numpy code for wide
    rows must give the same ids in the same order, the same probabilities and, from the same seed, the same
    draws. Rows include ties and masked (-inf) tokens."""
    import edgespec.warp as warp_module

    sp = SamplingParams(**params)
    rng = np.random.default_rng(7)
    for _ in range(50):
        logits = np.round(rng.normal(size=100) * 3, 1).astype(np.float32)  # rounding makes ties
        logits[rng.integers(100, size=3)] = -np.inf
        ids = rng.permutation(150_000)[:100].astype(np.int32)
        in_python = warp_module._warp_one(ids.tolist(), logits.tolist(), sp)
        (in_numpy,) = warp_module._warp_rows(ids[None, :], logits[None, :], sp, None)
        assert in_python.ids == in_numpy.ids
        np.testing.assert_allclose(in_python.probs, in_numpy.probs, rtol=1e-12, atol=0)
        draws = [sample(in_python, random.Random(s)) for s in range(40)]
        assert draws == [sample(in_numpy, random.Random(s)) for s in range(40)]
