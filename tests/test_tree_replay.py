"""The tree-against-chain replay's accounting (tests/tree_replay.py): where the cache never branches the tree is the
chain, and plain decoding is one decode a token."""

from __future__ import annotations

import pytest
from tree_replay import Clock, FromCache, replay

from edgespec.drafters.suffix_cache import SuffixCache


def _cost(rows: int) -> float:
    return 1.0 + 0.1 * (rows - 1)


def _run(policy: str, earlier: list[list[int]], prompt: list[int], output: list[int], rows: int = 4):
    cache = SuffixCache()
    for out in earlier:
        cache.add("s", prompt[-4:] + out)
    clock = Clock(_cost, switch=0.0)
    rounds = replay(prompt, output, FromCache(cache, "s"), policy, rows, clock)
    return rounds, clock.seconds


def test_plain_is_a_decode_a_token():
    output = list(range(100, 120))
    assert _run("plain", [], [1, 2, 3, 4], output) == (20, pytest.approx(20.0))


def test_without_branches_the_tree_is_the_chain():
    prompt, output = [1, 2, 3, 4], list(range(100, 130))
    chain = _run("chain", [output], prompt, output)
    assert chain[0] < len(output)  # the earlier copy drafted
    assert _run("tree", [output], prompt, output) == chain
    assert _run("tree, kept in place", [output], prompt, output) == chain


def test_a_side_branch_is_decoded_again_unless_kept_in_place():
    prompt = [1, 2, 3, 4]
    a, b = [50, 51, 52, 53, 54, 55], [50, 51, 60, 61, 62, 63]
    output = [50, 51, 60, 61, 62, 63]  # follows the earlier b; the latest entry, a, comes first on the tie
    redo = _run("tree", [b, a], prompt, output, rows=8)
    kept = _run("tree, kept in place", [b, a], prompt, output, rows=8)
    assert redo[0] == kept[0]
    assert redo[1] > kept[1]  # the side path's extra decode
