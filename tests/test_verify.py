"""The acceptance rule's pieces: greedy acceptance, the residual, the bonus row. The joint output of whole rounds at
every position, and the biased verifiers those checks must reject, are in test_exactness.py."""

from __future__ import annotations

import numpy as np
import pytest
from dense import densify, from_probs
from stat_tools import fits

from edgespec.verify import residual, verify_greedy, verify_stochastic
from edgespec.warp import Dist


@pytest.mark.exactness
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
