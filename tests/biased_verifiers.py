"""Biased verifiers: plausible-looking mistakes in speculative sampling that the exactness tests must reject.

Each has :func:`edgespec.verify.verify_stochastic`'s signature, so a test can put it in the verifier's place (at the
verifier's level, or in the engine by patching). A test that cannot tell one of them from the exact verifier, at its
own sample size and α, proves nothing; every exactness test is paired with these controls.
"""

from __future__ import annotations

from collections.abc import Callable

from edgespec.verify import Verdict, residual, verify_stochastic
from edgespec.warp import Dist, sample


def _q_of(q, i, draft) -> Dist:
    return Dist.one_hot(draft[i]) if q is None else q[i]


def _q_prob(q, i, d) -> float:
    return 1.0 if q is None else q[i].prob(d)


def resample_from_p_from_the_third_position(draft, q, p, rng) -> Verdict:
    """Exact for d_1 and d_2; from d_3 on a rejection draws from p instead of the residual (issue 21's example)."""
    for i, d in enumerate(draft):
        if rng.random() * _q_prob(q, i, d) < p[i].prob(d):
            continue
        return Verdict(i, sample(p[i] if i >= 2 else residual(p[i], _q_of(q, i, draft)), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def bonus_from_the_first_row(draft, q, p, rng) -> Verdict:
    """Exact acceptance and residuals; the bonus token drawn from p_1 instead of p_{γ+1}."""
    k, t = verify_stochastic(draft, q, p, rng)
    return Verdict(k, sample(p[0], rng)) if k == len(draft) else Verdict(k, t)


def accept_if_p_at_least_q(draft, q, p, rng) -> Verdict:
    """Deterministic acceptance: d_i stays iff p_i(d_i) >= q_i(d_i) (a one-hot draft: iff p_i(d_i) >= 1/2); the
    residual as it should be."""
    for i, d in enumerate(draft):
        if p[i].prob(d) >= (0.5 if q is None else q[i].prob(d)):  # one-hot q: p_i(d_i) >= 1/2
            continue
        return Verdict(i, sample(residual(p[i], _q_of(q, i, draft)), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def one_uniform_per_round(draft, q, p, rng) -> Verdict:
    """The right test, but one uniform shared by every position of the round."""
    u = rng.random()
    for i, d in enumerate(draft):
        if u * _q_prob(q, i, d) < p[i].prob(d):
            continue
        return Verdict(i, sample(residual(p[i], _q_of(q, i, draft)), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def residual_with_the_next_positions_q(draft, q, p, rng) -> Verdict:
    """After a rejection at i, the residual takes q_{i+1} (cyclically) instead of q_i."""
    for i, d in enumerate(draft):
        if rng.random() * _q_prob(q, i, d) < p[i].prob(d):
            continue
        wrong = (i + 1) % len(draft)
        return Verdict(i, sample(residual(p[i], _q_of(q, wrong, draft)), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def resample_from_p(draft, q, p, rng) -> Verdict:
    """Exact acceptance, and every correction drawn from p instead of the residual."""
    for i, d in enumerate(draft):
        if rng.random() * _q_prob(q, i, d) < p[i].prob(d):
            continue
        return Verdict(i, sample(p[i], rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def token_match(draft, q, p, rng) -> Verdict:
    """Accept d_i iff it is p_i's mode (llama.cpp's greedy rule used at T > 0), corrections from p."""
    for i, d in enumerate(draft):
        if d == p[i].top:
            continue
        return Verdict(i, sample(p[i], rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


# Which controls are biased for which drafts (γ, and "model" for drafts with a q or "one_hot"): a shared uniform is
# exact at γ = 1; the next position's q needs γ >= 2 and a q; drawing "from p after the second" needs γ >= 3.
CONTROLS: dict[Callable, Callable[[int, str], bool]] = {
    resample_from_p_from_the_third_position: lambda gamma, proposer: gamma >= 3,
    bonus_from_the_first_row: lambda gamma, proposer: True,
    accept_if_p_at_least_q: lambda gamma, proposer: True,
    one_uniform_per_round: lambda gamma, proposer: gamma >= 2,
    residual_with_the_next_positions_q: lambda gamma, proposer: gamma >= 2 and proposer == "model",
    resample_from_p: lambda gamma, proposer: True,
    token_match: lambda gamma, proposer: True,
}

