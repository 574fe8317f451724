"""Exact acceptance of drafted tokens (Leviathan et al. 2023; Chen et al. 2023). Pure numpy, no models.

Symbols follow the papers: draft tokens ``d_1..d_γ`` with draft distributions ``q_1..q_γ``, target
distributions ``p_1..p_{γ+1}`` (``p_i`` conditions on the committed text plus ``d_1..d_{i-1}``).

* accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
* at the first rejection draw the *recovered* token from ``norm(max(0, p_i - q_i))`` and stop;
* when all γ are accepted draw the *bonus* token from ``p_{γ+1}``.

The emitted tokens are then distributed exactly as if sampled from ``p`` one at a time. A deterministic drafter
(prompt lookup) passes ``q=None``: its ``q_i`` is one-hot on ``d_i``. Greedy decoding has its own path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from edgespec.sampling import Dist, sample


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


def verify_stochastic(
    draft: Sequence[int],
    q: Sequence[Dist] | None,
    p: Sequence[Dist],
    rng: np.random.Generator,
) -> Verdict:
    """Rejection sampling over one draft. ``len(p) == len(draft) + 1``; ``q is None`` means one-hot drafts."""
    for i, d in enumerate(draft):
        p_d = p[i].prob(d)
        q_i = Dist.one_hot(d) if q is None else q[i]
        q_d = q_i.prob(d)
        if q_d > 0 and rng.random() * q_d < p_d:  # u < p/q without dividing (q_d > 0 for any sampled d)
            continue
        return Verdict(i, sample(residual(p[i], q_i), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def residual(p: Dist, q: Dist) -> Dist:
    """``norm(max(0, p - q))`` over the union of both supports.

    If ``p <= q`` everywhere (only possible when ``p == q`` up to rounding, in which case a rejection has
    probability ~0) the residual is empty and ``p`` itself is the right fallback.
    """
    ids = np.union1d(p.ids, q.ids)  # [m] sorted
    diff = np.zeros(ids.shape[0])
    diff[np.searchsorted(ids, p.ids)] += p.probs
    diff[np.searchsorted(ids, q.ids)] -= q.probs
    np.maximum(diff, 0.0, out=diff)
    total = float(diff.sum())
    if total <= 1e-12:
        return p
    keep = diff > 0
    return Dist(ids[keep], diff[keep] / total)
