"""Exact acceptance of drafted tokens (Leviathan et al. 2023; Chen et al. 2023). No models.

Symbols follow the papers: draft tokens ``d_1..d_γ`` with draft distributions ``q_1..q_γ``, target
distributions ``p_1..p_{γ+1}`` (``p_i`` conditions on the committed text plus ``d_1..d_{i-1}``).

* accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
* at the first rejection draw the *recovered* token from ``norm(max(0, p_i - q_i))`` and stop;
* when all γ are accepted draw the *bonus* token from ``p_{γ+1}``.

The emitted tokens are then distributed exactly as if sampled from ``p`` one at a time. A deterministic drafter
(prompt lookup) passes ``q=None``: its ``q_i`` is one-hot on ``d_i``. Greedy decoding has its own path.

The positions are tested one by one, as the papers write it, and ``p`` may warp its rows only when asked
(:class:`~edgespec.warp.Warped`): the rows after the first rejection are never computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from edgespec.sampling import Uniforms
from edgespec.warp import Dist, sample


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
    draft: Sequence[int], q: Sequence[Dist] | None, p: Sequence[Dist], rng: Uniforms
) -> Verdict:
    """Rejection sampling over one draft. ``p`` has ``len(draft) + 1`` rows, ``q`` (if given) ``len(draft)``;
    ``q is None`` means one-hot drafts."""
    for i, d in enumerate(draft):
        p_i = p[i]
        q_d = 1.0 if q is None else q[i].prob(d)  # q_i(d_i) > 0 for any token drawn from q_i
        if rng.random() * q_d < p_i.prob(d):  # u < p_i(d_i) / q_i(d_i), without dividing
            continue
        q_i = Dist.one_hot(d) if q is None else q[i]
        return Verdict(i, sample(residual(p_i, q_i), rng))
    return Verdict(len(draft), sample(p[len(draft)], rng))


def residual(p: Dist, q: Dist) -> Dist:
    """``norm(max(0, p - q))``, over ``p``'s support (where ``p`` is 0 the difference is never positive).

    If ``p <= q`` everywhere (only possible when ``p == q`` up to rounding, in which case a rejection has
    probability ~0) the residual is empty and ``p`` itself is the right fallback.
    """
    if isinstance(p.ids, np.ndarray) or isinstance(q.ids, np.ndarray):
        return _residual_wide(p, q)
    q_of = dict(zip(q.ids, q.probs, strict=True))
    ids, diff = [], []
    total = 0.0
    for token, p_t in zip(p.ids, p.probs, strict=True):
        d = p_t - q_of.get(token, 0.0)
        if d > 0:
            ids.append(token)
            diff.append(d)
            total += d
    if total <= 1e-12:
        return p
    return Dist(ids, [d / total for d in diff])


def _residual_wide(p: Dist, q: Dist) -> Dist:
    """:func:`residual` of whole-vocabulary rows, in numpy."""
    p_ids, q_ids = np.asarray(p.ids), np.asarray(q.ids)
    ids = np.union1d(p_ids, q_ids)  # sorted
    diff = np.zeros(ids.shape[0])
    diff[ids.searchsorted(p_ids)] += np.asarray(p.probs)
    diff[ids.searchsorted(q_ids)] -= np.asarray(q.probs)
    np.maximum(diff, 0.0, out=diff)
    total = float(diff.sum())
    if total <= 1e-12:
        return p
    keep = diff > 0
    return Dist(ids[keep], diff[keep] / total)
