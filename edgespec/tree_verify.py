"""Exact acceptance over a tree of drafted candidates (SpecInfer: Miao et al. 2023, arXiv 2305.09781). No models.

A tree drafts several continuations at once: node ``i`` holds the token ``tokens[i]`` and hangs under node
``parents[i]`` (-1: under the root, the committed text). The verifier walks it from the root: it tries a node's
children in index order against the target's row ``r`` at that node, descends into the first one it accepts, and
when it rejects every child (or reaches a leaf) emits one token drawn from what is left of ``r``. A chain of γ
drafts is the tree whose node ``i`` hangs under node ``i - 1`` (:meth:`Tree.chain`); on it the walk makes the same
draws in the same order as :func:`~edgespec.verify.verify_stochastic`, so it returns the same verdicts.

Target rows: ``p[0]`` after the committed text, ``p[i + 1]`` after node ``i`` (conditioned on its path). Only the
rows of the nodes the walk reaches are read, so ``p`` may warp them lazily (:class:`~edgespec.warp.Warped`).

Why each rule is exact (per node, by induction over its children, then over depth):

* a deterministic child ``x`` (``q[i] is None``, e.g. prompt lookup's) is accepted with probability ``r(x)``; on
  a rejection the output must be ``r`` conditioned on "not ``x``", which is ``r`` with ``x`` removed and
  renormalised: :func:`~edgespec.verify.residual` against a one-hot ``q`` (Leviathan et al. 2023 with ``q = δ_x``);
* a sampled child ``x ~ q_x`` is accepted with probability ``min(1, r(x) / q_x(x))``, so it emits ``t`` with
  probability ``min(q_x(t), r(t))``; the rest of the mass is ``max(0, r - q_x)``, so continuing with its
  normalised form keeps the total at ``r`` (SpecInfer's multi-step speculative sampling, Miao et al. 2023);
* the remaining siblings are a fresh instance of the same problem with the residual as target, and the accepted
  child's subtree a fresh instance at its own row, provided each child was drafted independently of the siblings
  tried before it (deterministically from its path, or drawn from its ``q``: i.i.d. children as SpecInfer's, not
  draws without replacement) and its subtree given only its path; when every child is rejected the residual is the
  target's row conditioned on all those rejections, and the emitted token is drawn from it.

Cost per node the walk reaches: one uniform and one ``r(x)`` look-up per child tried, one residual
(``O(|r| + |q_x|)``) per rejected child, and one draw for the whole tree; children after the accepted one, and the
rows of nodes off the path, are never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from edgespec.sampling import Uniforms
from edgespec.verify import residual
from edgespec.warp import Dist, sample


class Tree(NamedTuple):
    """Drafted candidates: node ``i`` is ``tokens[i]`` after node ``parents[i]`` (-1: the root). Parents come
    before their children (``parents[i] < i``); siblings are tried in the order of their indices."""

    tokens: list[int]
    parents: list[int]

    @staticmethod
    def chain(draft: Sequence[int]) -> Tree:
        """The tree of one draft: node ``i`` after node ``i - 1``."""
        return Tree(list(draft), list(range(-1, len(draft) - 1)))


class TreeVerdict(NamedTuple):
    path: list[int]  # the accepted nodes, root to leaf (possibly none)
    token: int  # the corrected token (after the path's last node rejected its children) or the bonus token (a leaf)


def children(tree: Tree) -> list[list[int]]:
    """``kids[node + 1]``: the children of ``node`` (-1: the root), in index order."""
    n = len(tree.tokens)
    if len(tree.parents) != n:
        raise ValueError(f"a tree has one parent per token: {n} tokens, {len(tree.parents)} parents")
    return children_of(tree.parents)


def children_of(parents: Sequence[int]) -> list[list[int]]:
    """:func:`children` from the parents alone (``parents[i] < i``, -1 for the root)."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i}'s parent must be an earlier node or -1 (the root), got {parent}")
        kids[parent + 1].append(i)
    return kids


def verify_tree_greedy(tree: Tree, target_top: Sequence[int]) -> TreeVerdict:
    """Temperature 0: descend into the first child that is the target's argmax; emit the argmax where none is.

    ``target_top[0]`` is the argmax at the root, ``target_top[i + 1]`` after node ``i``.
    """
    kids = children(tree)
    if len(target_top) < len(tree.tokens) + 1:
        raise ValueError(f"{len(tree.tokens)} nodes need {len(tree.tokens) + 1} target rows, got {len(target_top)}")
    path: list[int] = []
    node = -1
    while True:
        top = target_top[node + 1]
        for child in kids[node + 1]:
            if tree.tokens[child] == top:
                path.append(child)
                node = child
                break
        else:
            return TreeVerdict(path, int(top))


def verify_tree_stochastic(
    tree: Tree, q: Sequence[Dist | None] | None, p: Sequence[Dist], rng: Uniforms
) -> TreeVerdict:
    """Rejection sampling over a tree (the rules and why they are exact: the module's docstring).

    ``p``: ``len(tree.tokens) + 1`` target rows (``p[0]`` at the root, ``p[i + 1]`` after node ``i``). ``q``: per
    node, the draft distribution its token was drawn from, or ``None`` for a deterministic one; ``q is None``: every
    node deterministic.
    """
    kids = children(tree)
    n = len(tree.tokens)
    if len(p) < n + 1:
        raise ValueError(f"{n} nodes need {n + 1} target rows, got {len(p)}")
    if q is not None and len(q) != n:
        raise ValueError(f"q has one entry per node: {n} nodes, {len(q)} entries")
    tokens = tree.tokens
    path: list[int] = []
    node, r = -1, p[0]
    while True:
        for child in kids[node + 1]:
            x = tokens[child]
            q_x = None if q is None else q[child]
            q_d = 1.0 if q_x is None else q_x.prob(x)  # q_x(x) > 0 for any token drawn from q_x
            if rng.random() * q_d < r.prob(x):  # u < r(x) / q_x(x), without dividing (as verify_stochastic)
                path.append(child)
                node, r = child, p[child + 1]
                break
            r = residual(r, Dist.one_hot(x) if q_x is None else q_x)
        else:  # every child rejected, or a leaf: the correction (or the bonus token) from what is left of r
            return TreeVerdict(path, sample(r, rng))
