"""Exactness of the acceptance rule, checked statistically, and proof that the check can fail."""

from __future__ import annotations

import numpy as np
import pytest
from stat_tools import fits

from edgespec.sampling import Dist, densify, from_probs, sample
from edgespec.verify import Verdict, residual, verify_greedy, verify_stochastic

V = 6  # a small vocabulary so every cell of the joint distribution gets counts
N = 30_000  # samples per check: enough that each biased verifier below fails at ALPHA
SHARP = 2.0


def random_chain(rng: np.random.Generator, sharp: float) -> np.ndarray:
    """A random Markov chain P[prev, next] (rows sum to 1); higher ``sharp`` → peakier rows."""
    logits = rng.normal(size=(V, V)) * sharp
    # some exact zeros, as top-k/top-p/min-p warps produce
    logits[rng.random((V, V)) < 0.2] = -np.inf
    logits[np.arange(V), rng.integers(0, V, V)] = 0.0  # keep every row non-empty
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def chain_rows(P: np.ndarray) -> list[Dist]:
    """Row ``c`` is P's next-token distribution after ``c``, over the whole vocabulary (zeros kept)."""
    return [Dist(list(range(V)), row.tolist()) for row in P]


def rows_of(d: list[Dist], contexts: list[int]) -> list[Dist]:
    return [d[c] for c in contexts]


def speculative_pairs(
    P: np.ndarray,
    Q: np.ndarray | None,
    gamma: int,
    n: int,
    rng: np.random.Generator,
    verify=verify_stochastic,
) -> np.ndarray:
    """Run speculative decoding on Markov chains from token 0 until 2 tokens exist; count (x1, x2) pairs.

    ``Q is None`` drafts deterministically (the most likely draft token, one-hot q), like prompt lookup.
    """
    p_rows = chain_rows(P)
    q_rows = None if Q is None else chain_rows(Q)
    counts = np.zeros((V, V))
    for _ in range(n):
        out = [0]
        while len(out) < 3:
            # draft γ tokens from q (or a deterministic guess), conditioned on the running context
            draft, prev = [], out[-1]
            for _ in range(gamma):
                d = (prev * 7 + 3) % V if q_rows is None else sample(q_rows[prev], rng)  # an arbitrary proposer
                draft.append(d)
                prev = d
            contexts = [out[-1], *draft]
            p = rows_of(p_rows, contexts)  # p_i conditions on the context plus d_1..d_{i-1}
            q = None if q_rows is None else rows_of(q_rows, contexts[:-1])
            k, t = verify(draft, q, p, rng)
            out.extend([*draft[:k], t])
        counts[out[1], out[2]] += 1
    return counts


def exact_pairs(P: np.ndarray) -> np.ndarray:
    return P[0][:, None] * P  # P(x1) P(x2 | x1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gamma", [1, 3])
def test_stochastic_verifier_matches_target_distribution(seed: int, gamma: int) -> None:
    rng = np.random.default_rng(seed)
    P, Q = random_chain(rng, SHARP), random_chain(rng, SHARP)
    counts = speculative_pairs(P, Q, gamma, N, rng)
    ok, why = fits(counts, exact_pairs(P))
    assert ok, why


def test_deterministic_drafter_is_exact() -> None:
    rng = np.random.default_rng(11)
    P = random_chain(rng, SHARP)
    counts = speculative_pairs(P, None, 2, N, rng)
    ok, why = fits(counts, exact_pairs(P))
    assert ok, why


def _accept_if_p_above_q(draft, q, p, rng) -> Verdict:
    """A plausible-looking but biased verifier: accepts d only when p(d) >= q(d), else resamples from p."""
    for i, d in enumerate(draft):
        if p[i].prob(d) >= q[i].prob(d):
            continue
        return Verdict(i, sample(p[i], rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def _resample_from_p(draft, q, p, rng) -> Verdict:
    """Correct acceptance, wrong correction: draws from p instead of norm(max(0, p - q))."""
    for i, d in enumerate(draft):
        if rng.random() < min(1.0, p[i].prob(d) / q[i].prob(d)):
            continue
        return Verdict(i, sample(p[i], rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def _token_match(draft, q, p, rng) -> Verdict:
    """Token-matching verification (accept d iff it is p's mode), a common shortcut that is biased at T > 0."""
    for i, d in enumerate(draft):
        if d == p[i].top:
            continue
        return Verdict(i, sample(p[i], rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("biased", [_accept_if_p_above_q, _resample_from_p, _token_match])
def test_the_check_catches_a_biased_verifier(biased, seed: int) -> None:
    # Same chains, sample size and γ range as the exactness tests: the bias must show at the power they have.
    rng = np.random.default_rng(seed)
    P, Q = random_chain(rng, SHARP), random_chain(rng, SHARP)
    counts = speculative_pairs(P, Q, 2, N, rng, verify=biased)
    ok, why = fits(counts, exact_pairs(P))
    assert not ok, f"a biased verifier passed the exactness check: {why}"


def test_bonus_token_comes_from_the_last_target_distribution() -> None:
    rng = np.random.default_rng(5)
    p_last = from_probs([0.1, 0.2, 0.3, 0.4])
    same = from_probs([0.0, 1.0, 0.0, 0.0])
    counts = np.zeros(4)
    for _ in range(4000):
        # q == p on the draft position: always accepted, so every emitted second token is a bonus from p_last
        k, t = verify_stochastic([1], [same], [same, p_last], rng)
        assert k == 1
        counts[t] += 1
    ok, why = fits(counts, densify([p_last], 4))
    assert ok, why


def test_greedy_accepts_the_matching_prefix_and_corrects() -> None:
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]) == (3, 1)  # all accepted: bonus is the last argmax
    assert verify_greedy([5], [4, 0]) == (0, 4)
    assert verify_greedy([], [8]) == (0, 8)  # γ = 0 is plain greedy decoding


def test_residual_is_positive_part_normalised() -> None:
    p = from_probs([0.5, 0.3, 0.2, 0.0])
    q = from_probs([0.2, 0.5, 0.0, 0.3])
    r = residual(p, q)
    np.testing.assert_allclose(densify([r], 4), [0.3 / 0.5, 0.0, 0.2 / 0.5, 0.0])


def test_residual_of_identical_distributions_falls_back_to_p() -> None:
    p = from_probs([0.5, 0.5])
    assert residual(p, p) is p


def test_one_hot_draft_rejection_never_returns_the_rejected_token() -> None:
    rng = np.random.default_rng(0)
    p = [Dist([0, 1, 2], [0.2, 0.3, 0.5]), from_probs([1.0])]
    for _ in range(500):
        k, t = verify_stochastic([0], None, p, rng)
        if k == 0:
            assert t != 0
