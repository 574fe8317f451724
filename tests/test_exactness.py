"""Exactness of whole speculative rounds, at every position of a draft, and proof that the checks can fail.

A toy model (:class:`~exact_reference.PositionalChain`: next-token logits depend on the previous token and the
position) is decoded speculatively to ``γ + 1`` output tokens, many times. The output's per-position marginals,
its consecutive pairs and its first three tokens must fit the exact distributions, computed by enumeration from
the logits with a reference warp that shares no code with edgespec's. Every γ (1, 3, 5), both proposers (a draft
model's sampled tokens with their q; a deterministic one-hot proposer, as prompt lookup is) and both sampling paths
(top-k candidate rows as llama.cpp's in-graph top-k hands them back; whole-vocabulary rows) are covered.

The same checks, at the same sample size and α, must reject each of a set of biased verifiers: a test that
cannot tell them from the exact one proves nothing.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import pytest
from biased_verifiers import (
    CONTROLS,
    accept_if_p_at_least_q,
    bonus_from_the_first_row,
    one_uniform_per_round,
    resample_from_p_from_the_third_position,
    residual_with_the_next_positions_q,
)
from exact_reference import PositionalChain, output_checks, prefix_joint
from stat_tools import Check, worst

from edgespec.sampling import Candidates, SamplingParams
from edgespec.verify import Verdict, verify_stochastic
from edgespec.warp import Dist, warp_row

pytestmark = pytest.mark.exactness

V = 6  # small enough that every cell of a pair's joint gets counts
N = 12_000  # speculative runs per check; each biased verifier below fails at this size by a clear margin

PATHS = {
    # top-k rows as llama.cpp hands them back (k candidates in no order), the rest warped in Python lists
    "top_k": SamplingParams(temperature=0.8, top_k=4, top_p=0.95, min_p=0.05),
    # whole-vocabulary rows (no top-k), warped and sampled as numpy arrays
    "whole": SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.02),
}

Verifier = Callable[[list[int], list[Dist] | None, list[Dist], np.random.Generator], Verdict]


@dataclass
class Setup:
    """A target chain, a draft chain, and their rows as the code under test warps them."""

    gamma: int
    path: str
    proposer: str  # "model": sampled from q; "one_hot": q's mode, drafted deterministically (prompt lookup's case)
    target: PositionalChain
    p_rows: list[list[Dist]]  # [position][previous token]
    q_rows: list[list[Dist]]

    @property
    def length(self) -> int:
        return self.gamma + 1

    @property
    def params(self) -> SamplingParams:
        return PATHS[self.path]


def rows_as_edgespec_warps_them(chain: PositionalChain, path: str, shuffle: np.random.Generator) -> list[list[Dist]]:
    """Each (position, previous token) row warped by edgespec, from the readout the path's decode returns."""
    params = PATHS[path]
    J, _, n = chain.logits.shape
    flat = chain.logits.reshape(J * n, n).astype(np.float32)  # the chain's logits are float32 values already
    if path == "top_k":  # llama.cpp's in-graph top-k: the k best of each row, in no particular order
        best = np.argsort(-flat, axis=1)[:, : params.top_k]
        best = np.array([row[shuffle.permutation(len(row))] for row in best])
        scores = Candidates(best.tolist(), np.take_along_axis(flat, best, axis=1).tolist())
    else:
        scores = flat
    rows = [warp_row(scores, r, params) for r in range(J * n)]
    return [rows[j * n : (j + 1) * n] for j in range(J)]


def make_setup(gamma: int, path: str, proposer: str) -> Setup:
    rng = np.random.default_rng(1000 * gamma)
    positions = 2 * gamma + 2  # a draft may reach γ positions past the last output token
    target = PositionalChain.random(rng, V, positions, sharp=1.5)
    draft = target.perturbed(rng, noise=1.0)
    p_rows = rows_as_edgespec_warps_them(target, path, rng)
    return Setup(gamma, path, proposer, target, p_rows, rows_as_edgespec_warps_them(draft, path, rng))


def speculate(setup: Setup, n: int, rng: np.random.Generator, verify: Verifier = verify_stochastic) -> np.ndarray:
    """``n`` speculative runs of ``γ + 1`` output tokens each; returns ``[n, γ + 1]`` token ids."""
    gamma, length = setup.gamma, setup.length
    p_rows, q_rows = setup.p_rows, setup.q_rows
    one_hot = setup.proposer == "one_hot"
    # The drafter's draws, as (ids, cumulative probabilities) lists per row: the drafter is not under test here, and
    # numpy on a 6-token row costs more than the whole verify.
    draws = [[(list(map(int, q.ids)), list(accumulate(map(float, q.probs)))) for q in row] for row in q_rows]
    tops = [[int(q.top) for q in row] for row in q_rows]
    out = np.zeros((n, length), dtype=np.int64)
    start = setup.target.start
    for r in range(n):
        x: list[int] = []
        prev = start
        while len(x) < length:
            # 1. draft d_1..d_γ, each conditioned on the output so far and the drafts before it
            draft, q, ctx = [], [], prev
            for i in range(gamma):
                row = len(x) + i
                if one_hot:
                    d = tops[row][ctx]
                else:
                    ids, cumulative = draws[row][ctx]
                    d = ids[min(bisect_right(cumulative, rng.random() * cumulative[-1]), len(ids) - 1)]
                draft.append(d)
                q.append(q_rows[row][ctx])
                ctx = d
            # 2. the target's rows p_1..p_{γ+1}: p_i conditions on the output plus d_1..d_{i-1}
            contexts = [prev, *draft]
            p = [p_rows[len(x) + i][c] for i, c in enumerate(contexts)]
            # 3. accept
            k, t = verify(draft, None if one_hot else q, p, rng)
            x.extend([*draft[:k], int(t)])
            prev = x[-1]
        out[r] = x[:length]
    return out


def checks_of(samples: np.ndarray, setup: Setup) -> list[Check]:
    """Per-position marginals, consecutive pairs and the first three tokens, against the exact distributions."""
    warps = setup.params
    T = setup.target.transitions(
        temperature=warps.temperature, top_k=warps.top_k, top_p=warps.top_p, min_p=warps.min_p
    )
    return output_checks(samples, prefix_joint(T, setup.target.start, setup.length))


CONFIGS = [
    (gamma, path, proposer) for gamma in (1, 3, 5) for path in ("top_k", "whole") for proposer in ("model", "one_hot")
]


@pytest.mark.parametrize("gamma, path, proposer", CONFIGS)
def test_every_position_of_a_round_has_the_targets_distribution(gamma: int, path: str, proposer: str) -> None:
    setup = make_setup(gamma, path, proposer)
    rng = np.random.default_rng(7)
    samples = speculate(setup, N, rng)
    checks = checks_of(samples, setup)
    assert worst(checks).ratio <= 1, checks
    _assert_the_draft_reaches_every_position(setup, rng)


def _assert_the_draft_reaches_every_position(setup: Setup, rng: np.random.Generator) -> None:
    """The test has teeth only if drafts are both accepted to the end and rejected at every position."""
    accepted = np.zeros(setup.gamma + 1, dtype=int)  # accepted[k]: rounds that accepted exactly k drafts

    def counting(draft, q, p, rng) -> Verdict:
        verdict = verify_stochastic(draft, q, p, rng)
        if len(draft) == setup.gamma:
            accepted[verdict.n_accepted] += 1
        return verdict

    speculate(setup, 600, rng, counting)
    assert (accepted > 0).all(), f"rounds by drafts accepted: {accepted.tolist()}"


# The controls each configuration must reject: every control that is biased for its drafts, except where rows cost
# more (whole rows run numpy on every row, ~4x; γ = 5), so that the fast tier stays under a minute. There the
# position-specific controls (the third position on; the next position's q) still meet every configuration they are
# biased for; the others meet γ = 1 and 3 on top-k rows and γ = 1 on whole rows, and some of them γ = 5 (listed).
SUBSETS = {
    ("whole", 3): (resample_from_p_from_the_third_position, residual_with_the_next_positions_q),
    ("whole", 5): (resample_from_p_from_the_third_position, residual_with_the_next_positions_q),
    ("top_k", 5): (
        resample_from_p_from_the_third_position, residual_with_the_next_positions_q, bonus_from_the_first_row,
        accept_if_p_at_least_q, one_uniform_per_round,
    ),
}  # fmt: skip
CONTROL_CASES = [
    pytest.param(biased, gamma, path, proposer, id=f"{biased.__name__}-{gamma}-{path}-{proposer}")
    for gamma, path, proposer in CONFIGS
    for biased, applies in CONTROLS.items()
    if applies(gamma, proposer) and biased in SUBSETS.get((path, gamma), (biased,))
]

# How far past its critical value the worst check of a biased verifier must be: a clear margin, not a near miss.
MARGIN = 2.0


@pytest.mark.parametrize("biased, gamma, path, proposer", CONTROL_CASES)
def test_the_checks_reject_a_biased_verifier(biased: Verifier, gamma: int, path: str, proposer: str) -> None:
    setup = make_setup(gamma, path, proposer)
    samples = speculate(setup, N, np.random.default_rng(7), biased)
    checks = checks_of(samples, setup)
    assert worst(checks).ratio > MARGIN, f"{biased.__name__} passed the exactness checks: {checks}"
