"""Exact acceptance of drafted tokens (Leviathan et al. 2023; Chen et al. 2023). Pure numpy, no models.

Symbols follow the papers: draft tokens ``d_1..d_γ`` with draft distributions ``q_1..q_γ``, target
distributions ``p_1..p_{γ+1}`` (``p_i`` conditions on the committed text plus ``d_1..d_{i-1}``).

* accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
* at the first rejection draw the *recovered* token from ``norm(max(0, p_i - q_i))`` and stop;
* when all γ are accepted draw the *bonus* token from ``p_{γ+1}``.

The emitted tokens are then distributed exactly as if sampled from ``p`` one at a time. A deterministic drafter
(prompt lookup) passes ``q=None``: its ``q_i`` is one-hot on ``d_i``. Greedy decoding has its own path.

The accept tests of all γ positions run at once, on the sparse rows: γ independent uniforms decide the same as
drawing them one by one up to the first rejection, since the ones after it are never looked at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from edgespec.sampling import Dists, sample


class Verdict(NamedTuple):
    n_accepted: int  # how many leading draft tokens were accepted
    token: int  # the recovered token (after a rejection) or the bonus token (all accepted)


def verify_greedy(draft: Sequence[int], target_top: Sequence[int]) -> Verdict:
    """Temperature 0: accept ``d_i`` iff it is the target's argmax; the correction is that argmax.

    ``target_top`` holds ``argmax p_1 .. argmax p_{γ+1}``.
    """
    for i, d in enumerate(draft):
        if d != target_top[i]:
            return Verdict(i, int(target_top[i]))
    return Verdict(len(draft), int(target_top[len(draft)]))


def verify_stochastic(draft: Sequence[int], q: Dists | None, p: Dists, rng: np.random.Generator) -> Verdict:
    """Rejection sampling over one draft. ``p`` has ``len(draft) + 1`` rows, ``q`` (if given) ``len(draft)``;
    ``q is None`` means one-hot drafts."""
    gamma = len(draft)
    if gamma:
        d = np.asarray(draft)
        p_d = p.prob_of(d)  # [γ] p_i(d_i)
        q_d = np.ones(gamma) if q is None else q.prob_of(d)  # [γ] q_i(d_i), > 0 for any token drawn from q_i
        accepted = rng.random(gamma) * q_d < p_d  # u_i < p_i(d_i) / q_i(d_i), without dividing
        k = gamma if accepted.all() else int(np.argmin(accepted))
        if k < gamma:
            q_k = Dists.one_hot([draft[k]]) if q is None else q[k]
            return Verdict(k, sample(residual(p[k], q_k), rng))
    return Verdict(gamma, sample(p, rng, row=gamma))


def residual(p: Dists, q: Dists) -> Dists:
    """``norm(max(0, p - q))`` of one-row distributions, over the union of both supports.

    If ``p <= q`` everywhere (only possible when ``p == q`` up to rounding, in which case a rejection has
    probability ~0) the residual is empty and ``p`` itself is the right fallback.
    """
    p_real, q_real = p.probs[0] > 0, q.probs[0] > 0
    p_ids, q_ids = p.ids[0][p_real], q.ids[0][q_real]
    ids = np.union1d(p_ids, q_ids)  # [m] sorted
    diff = np.zeros(ids.shape[0])
    diff[ids.searchsorted(p_ids)] += p.probs[0][p_real]
    diff[ids.searchsorted(q_ids)] -= q.probs[0][q_real]
    np.maximum(diff, 0.0, out=diff)
    total = float(diff.sum())
    if total <= 1e-12:
        return p
    keep = diff > 0
    return Dists(ids[keep][None, :], (diff[keep] / total)[None, :])
