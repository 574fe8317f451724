"""Biased tree verifiers: plausible mistakes in multi-candidate acceptance that tests/test_tree_verify.py must reject.

Each has :func:`edgespec.tree_verify.verify_tree_stochastic`'s signature and differs from it in one rule; the
exactness checks, at their own sample size and α, must tell every one of them from the exact verifier.
"""

from __future__ import annotations

from edgespec.tree_verify import TreeVerdict, children
from edgespec.verify import residual
from edgespec.warp import Dist, sample


def _q_of(q, child: int, token: int) -> Dist:
    q_x = None if q is None else q[child]
    return Dist.one_hot(token) if q_x is None else q_x


def no_renormalisation(tree, q, p, rng) -> TreeVerdict:
    """Every sibling tried against the node's own row, and the final draw from it too: the mass of the rejected
    siblings is never taken out."""
    kids, path, node = children(tree), [], -1
    while True:
        r = p[node + 1]
        for child in kids[node + 1]:
            x = tree.tokens[child]
            if rng.random() * _q_of(q, child, x).prob(x) < r.prob(x):
                path.append(child)
                node = child
                break
        else:
            return TreeVerdict(path, sample(r, rng))


def later_siblings_with_the_first_childs_ratio(tree, q, p, rng) -> TreeVerdict:
    """Each sibling accepted with the chance the first child had (its ``r(x_1) / q(x_1)`` at the node's own row);
    the residuals and the draw exact."""
    kids, path, node = children(tree), [], -1
    r = p[0]
    while True:
        first = None
        for child in kids[node + 1]:
            x = tree.tokens[child]
            q_x = _q_of(q, child, x)
            if first is None:
                first = (q_x.prob(x), r.prob(x))
            if rng.random() * first[0] < first[1]:
                path.append(child)
                node, r = child, p[child + 1]
                break
            r = residual(r, q_x)
        else:
            return TreeVerdict(path, sample(r, rng))


def draw_from_the_parents_row(tree, q, p, rng) -> TreeVerdict:
    """Exact acceptance; the correction (or bonus) token of a node below the root drawn from its parent's row."""
    kids, path, node = children(tree), [], -1
    r = p[0]
    while True:
        for child in kids[node + 1]:
            x = tree.tokens[child]
            q_x = _q_of(q, child, x)
            if rng.random() * q_x.prob(x) < r.prob(x):
                path.append(child)
                node, r = child, p[child + 1]
                break
            r = residual(r, q_x)
        else:
            wrong = r if node == -1 else p[tree.parents[node] + 1]
            return TreeVerdict(path, sample(wrong, rng))


CONTROLS = (no_renormalisation, later_siblings_with_the_first_childs_ratio, draw_from_the_parents_row)
