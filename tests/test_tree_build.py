"""Choosing a draft tree: the worthiest nodes of a candidate trie, best first (edgespec.drafters.tree)."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from edgespec.drafters.suffix_cache import SuffixCache
from edgespec.drafters.tree import Branch, best_tree, from_occurrences, trie
from edgespec.tree_verify import children


def test_one_continuation_is_a_chain_worth_its_survival():
    drafted = best_tree(trie([([5, 6, 7], [0.9, 0.5, 0.8])]), rows=8)
    assert drafted.tree.tokens == [5, 6, 7]
    assert drafted.tree.parents == [-1, 0, 1]
    assert drafted.worth == pytest.approx([0.9, 0.45, 0.36])
    assert drafted.expected() == pytest.approx([1.0, 1.9, 2.35, 2.71])


def test_a_likely_sibling_comes_before_an_unlikely_deep_node():
    # Two continuations after the committed text: 1 (0.6) then 2 (0.3 given 1); or 3 (0.35) then 4 (0.9 given 3).
    drafted = best_tree(trie([([1, 2], [0.6, 0.3]), ([3, 4], [0.35, 0.9])]), rows=3)
    assert drafted.tree.tokens == [1, 3, 4]  # 0.6, 0.35, 0.315; then 2 at 0.18 is left out
    assert drafted.tree.parents == [-1, -1, 1]
    assert drafted.worth == pytest.approx([0.6, 0.35, 0.315])


def test_shared_prefixes_merge_and_the_first_estimate_stands():
    branches = trie([([1, 2, 3], [0.8, 0.5, 0.5]), ([1, 2, 4], [0.1, 0.2, 0.3]), ([1, 5], [0.9, 0.2])])
    assert branches == [Branch(1, -1, 0.8), Branch(2, 0, 0.5), Branch(3, 1, 0.5), Branch(4, 1, 0.3), Branch(5, 0, 0.2)]


def test_childrens_chances_are_disjoint_so_they_are_scaled_to_one():
    branches = trie([([1], [0.7]), ([2], [0.6])])  # two sources that do not agree
    assert sum(b.p for b in branches) == pytest.approx(1.0)
    assert branches[0].p / branches[1].p == pytest.approx(0.7 / 0.6)


def test_nothing_that_cannot_be_accepted_is_drafted():
    drafted = best_tree(trie([([1, 2], [0.5, 0.0])]), rows=4)
    assert drafted.tree.tokens == [1]
    assert best_tree([], rows=4).tree.tokens == []


def test_bad_input():
    with pytest.raises(ValueError):
        trie([([1, 2], [0.5])])
    with pytest.raises(ValueError):
        trie([([1], [1.5])])
    with pytest.raises(ValueError):
        best_tree([Branch(1, 0, 0.5)], rows=2)  # its own parent


def _random_trie(rng: np.random.Generator, n: int) -> list[Branch]:
    branches = []
    for i in range(n):
        parent = int(rng.integers(-1, i)) if i else -1
        branches.append(Branch(i, parent, float(rng.uniform(0.05, 1.0))))
    return branches


def _worth(branches: list[Branch], i: int) -> float:
    w = 1.0
    while i >= 0:
        w *= branches[i].p
        i = branches[i].parent
    return w


@pytest.mark.parametrize("seed", range(20))
def test_every_prefix_is_the_best_tree_of_its_size(seed: int):
    """Against every connected set of n nodes of a small random trie: best first, the first n nodes are the
    worthiest tree of n rows."""
    rng = np.random.default_rng(seed)
    branches = _random_trie(rng, 9)
    drafted = best_tree(branches, rows=9)
    kids = children(drafted.tree)  # a valid tree: parents before children
    assert sum(len(k) for k in kids) == len(drafted.tree.tokens)
    assert all(a >= b for a, b in zip(drafted.worth, drafted.worth[1:], strict=False))
    for n in range(1, 10):
        best = 0.0
        for subset in combinations(range(9), n):
            chosen = set(subset)
            if all(branches[i].parent == -1 or branches[i].parent in chosen for i in subset):
                best = max(best, sum(_worth(branches, i) for i in subset))
        assert sum(drafted.worth[:n]) == pytest.approx(best)
        # and each chosen node's worth is its path's product, its parent among those before it
        for node in range(n):
            token = drafted.tree.tokens[node]  # tokens are the branch indices here
            assert drafted.worth[node] == pytest.approx(_worth(branches, token))
            parent = drafted.tree.parents[node]
            assert parent < node
            assert (parent == -1) == (branches[token].parent == -1)
            if parent >= 0:
                assert drafted.tree.tokens[parent] == branches[token].parent


def test_a_trie_of_what_followed_earlier_occurrences():
    rows = [[1, 2, 3], [1, 2, 4], [1, 5], [6]]
    branches = from_occurrences(rows, max_nodes=10)
    drafted = best_tree(branches, rows=10)
    assert drafted.tree.tokens[:2] == [1, 2]  # the likeliest path first: 1 (3 of 4 rows), then 2 (2 of 3)
    assert drafted.worth[:2] == pytest.approx([0.75, 0.5])
    assert sorted(drafted.worth[2:]) == pytest.approx([0.25] * 4)  # 6; 5 under 1; 3 and 4 under 2
    kids = children(drafted.tree)
    under_2 = [drafted.tree.tokens[k] for k in kids[1 + 1]]
    assert under_2 == [4, 3]  # equally likely: the latest occurrence's first
    assert len(from_occurrences(rows, max_nodes=3)) == 3
    assert [b.token for b in from_occurrences(rows, max_nodes=10, min_prob=0.4)] == [1, 2, 4, 3]
    assert from_occurrences([], max_nodes=4) == []


def test_the_caches_continuations_branch_where_its_chain_proposal_goes_one_way():
    cache = SuffixCache()
    prompt_tail = [11, 12, 13, 14]
    for reply in ([20, 21, 22, 23], [20, 21, 30, 31], [20, 21, 22, 24]):
        cache.add("s", prompt_tail + reply)
    context = [9, *prompt_tail]
    rows, match_len = cache.continuations("s", context, 8)
    assert match_len == 4 and rows == [[20, 21, 22, 23], [20, 21, 30, 31], [20, 21, 22, 24]]
    chain = cache.propose("s", context, 8, min_prob=0.0)
    drafted = best_tree(from_occurrences(rows, max_nodes=16), rows=16)
    first_path, node, kids = [], -1, children(drafted.tree)
    while kids[node + 1]:
        node = kids[node + 1][0]
        first_path.append(drafted.tree.tokens[node])
    assert first_path == list(chain.tokens)  # the tree's first path is the chain the cache proposes
    assert 30 in drafted.tree.tokens and 31 in drafted.tree.tokens  # and the branch it does not take is there
    assert cache.continuations("other", context, 8) == ([], 0)  # another scope sees nothing
