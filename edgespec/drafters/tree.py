"""Which draft tree to verify: the candidate nodes likeliest to be accepted, as many as the rows pay for.

Candidates come as a trie of continuations (:func:`trie`), each edge with an estimate of the chance that the target
accepts its token once its path was accepted: the suffix cache's continuation counts, the several continuations of
an n-gram that prompt lookup found earlier in the text, a draft model's top-k where its distribution is flat.

A node is worth the chance that the verifier accepts it: the product of the estimates along its path. For
deterministic candidates the chances of a node's children are disjoint and add up (in greedy decoding only the
argmax is accepted; at T > 0 a child x tried after rejected siblings is accepted with probability p(x) in all:
:mod:`edgespec.tree_verify`), so a round that verifies a set of nodes is expected to commit one token more than the
sum of their worths, as a chain commits 1 + S(1) + ... + S(γ). The best tree of n rows is then the n worthiest
nodes, and they form a tree: a node is worth no more than its parent. :func:`best_tree` takes them best first, the
order EAGLE-2 grows its trees in, so every prefix of its nodes is itself the best tree of that size, and a planner
weighs n rows of a tree against the decode's cost exactly as it weighs γ for a chain (whose worths are
S(1) ≥ S(2) ≥ ...).

Cost: O(n log b) for n nodes taken from a trie of b branches (a heap of the frontier); a trie of the continuations
of r earlier occurrences (:func:`from_occurrences`) O(r) a node it grows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import accumulate
from typing import NamedTuple

from edgespec.tree_verify import Tree, children_of


class Branch(NamedTuple):
    """One edge of a candidate trie: ``token`` after candidate ``parent`` (-1: after the committed text), accepted
    with chance ``p`` once its parent was."""

    token: int
    parent: int
    p: float


class Drafted(NamedTuple):
    """A tree to verify and each node's worth (the chance it is accepted), best first."""

    tree: Tree
    worth: list[float]

    def expected(self) -> list[float]:
        """``E[n]``: the tokens a round that verifies the first n nodes is expected to commit, n = 0..len."""
        return [1.0, *(1.0 + s for s in accumulate(self.worth))]


def trie(continuations: Sequence[tuple[Sequence[int], Sequence[float]]]) -> list[Branch]:
    """Continuations (tokens, each token's estimate given the ones before it) merged where they share a prefix.

    A token two continuations both propose at the same place keeps the first one's estimate (list the sources
    likeliest first). The estimates of a node's children are disjoint chances, so where they add up to more than
    1 (estimates from different sources) they are scaled down to 1.
    """
    branches: list[Branch] = []
    at: dict[tuple[int, int], int] = {}  # (parent, token) -> branch index
    for tokens, probs in continuations:
        if len(tokens) != len(probs):
            raise ValueError(f"each token needs its estimate: {len(tokens)} tokens, {len(probs)} estimates")
        parent = -1
        for token, p in zip(tokens, probs, strict=True):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"an estimate is a probability, got {p}")
            key = (parent, int(token))
            if key not in at:
                at[key] = len(branches)
                branches.append(Branch(int(token), parent, float(p)))
            parent = at[key]
    totals: dict[int, float] = {}
    for b in branches:
        totals[b.parent] = totals.get(b.parent, 0.0) + b.p
    return [b._replace(p=b.p / totals[b.parent]) if totals[b.parent] > 1.0 else b for b in branches]


def best_tree(branches: Sequence[Branch], rows: int) -> Drafted:
    """The ``rows`` worthiest nodes of a candidate trie (``branches``: parents before children), best first, as a
    :class:`~edgespec.tree_verify.Tree` (a node's parent is an earlier node) with their worths."""
    kids = children_of([b.parent for b in branches])
    # The frontier: candidates whose parent is taken, by worth (ties: the earlier branch, so parents come first).
    frontier = [(-branches[i].p, i, -1) for i in kids[0]]
    heapq.heapify(frontier)
    tokens: list[int] = []
    parents: list[int] = []
    worth: list[float] = []
    while frontier and len(tokens) < rows:
        neg, i, parent_node = heapq.heappop(frontier)
        if -neg <= 0.0:
            break  # nothing left that could be accepted
        node = len(tokens)
        tokens.append(branches[i].token)
        parents.append(parent_node)
        worth.append(-neg)
        for k in kids[i + 1]:
            heapq.heappush(frontier, (neg * branches[k].p, k, node))
    return Drafted(Tree(tokens, parents), worth)


def from_occurrences(rows: Sequence[Sequence[int]], max_nodes: int, min_prob: float = 0.0) -> list[Branch]:
    """The trie of what followed several occurrences of one match (``rows``, oldest first: the suffix cache's
    :meth:`~edgespec.drafters.suffix_cache.SuffixCache.continuations`, the continuations of an n-gram lookup found
    more than once), its ``max_nodes`` worthiest nodes, best first: each token's estimate is the share of the rows
    at its parent that go on with it (a row that ends there still counts, as the cache's chain walk counts it), and
    a token under ``min_prob`` is left out. Of equally worthy nodes the latest row's comes first, so the trie's
    first path is the cache's chain proposal."""
    branches: list[Branch] = []
    # Candidate nodes: (-worth, tie-break, parent branch, token, estimate, depth, the rows that go through it).
    frontier: list[tuple[float, tuple[int, int], int, int, float, int, list[Sequence[int]]]] = []
    order = 0

    def offer(parent: int, worth: float, depth: int, here: list[Sequence[int]]) -> None:
        nonlocal order
        going: dict[int, list[Sequence[int]]] = {}
        latest: dict[int, int] = {}
        for i, row in enumerate(here):
            if depth < len(row):
                going.setdefault(row[depth], []).append(row)
                latest[row[depth]] = i
        for token, through in going.items():
            p = len(through) / len(here)
            if p >= min_prob and p > 0.0:
                order += 1
                heapq.heappush(frontier, (-worth * p, (-latest[token], order), parent, token, p, depth, through))

    offer(-1, 1.0, 0, list(rows))
    while frontier and len(branches) < max_nodes:
        neg, _, parent, token, p, depth, through = heapq.heappop(frontier)
        branches.append(Branch(int(token), parent, p))
        offer(len(branches) - 1, -neg, depth + 1, through)
    return branches
