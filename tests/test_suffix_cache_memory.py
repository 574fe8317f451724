"""The suffix cache's memory stays bounded under a long run (issue #53): filled through ``add`` and ``propose``, as the
engine uses it, to a hundred times its token bound, it holds no more than the bound, and its structures (entries,
scopes, token arrays, chains, hash tables) stop growing once it evicts. The RSS of a whole engine over 2,000 requests
is measured by tests/rss_suffix_cache.py."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.drafters.suffix_cache import _MIN_ROOM, _MIN_TABLE, SuffixCache, _pow2

BOUND = 1024
ADDS = 1200


def _footprint(cache: SuffixCache) -> dict[str, int]:
    """What the cache's structures hold: entries and scopes counted, arrays by their length."""
    scopes = cache._scopes.values()
    return {
        "order": len(cache._order),
        "scopes": len(cache._scopes),
        "entries": sum(len(s.entries) for s in scopes),
        "buf": sum(s.buf.shape[0] for s in scopes),
        "prev": sum(s.prev.size for s in scopes),
        "heads": sum(s.heads.size for s in scopes),
    }


def _check_consistent(cache: SuffixCache) -> None:
    """The bookkeeping agrees with itself: every entry counted once, every scope holding one."""
    assert cache.tokens <= cache.max_tokens
    assert sum(s.tokens for s in cache._scopes.values()) == cache.tokens
    assert sum(n for s in cache._scopes.values() for _, n in s.entries) == cache.tokens
    assert sum(len(s.entries) for s in cache._scopes.values()) == len(cache._order) == len(cache)
    assert all(s.entries for s in cache._scopes.values())  # an emptied scope is dropped
    for s in cache._scopes.values():
        # the bounds the growth rules give: tables at most 4x the tokens (a power of two), arrays at most twice the
        # tokens and their sentinels (an entry has at least 3 tokens)
        assert s.heads.shape[1] <= max(_MIN_TABLE, _pow2(4 * cache.max_tokens))
        assert s.buf.shape[0] == s.prev.shape[1] <= max(_MIN_ROOM, 2 * (cache.max_tokens + cache.max_tokens // 3 + 2))


@pytest.mark.parametrize("scoping", ["one", "turns", "passing"])
def test_memory_levels_off_once_the_cache_evicts(scoping: str) -> None:
    rng = np.random.default_rng(7)
    cache = SuffixCache(BOUND)
    common = rng.integers(0, 500, size=64)  # text that recurs across requests, so proposals find matches
    added = 0
    evicting_from = None  # the add at which eviction began
    first: list[dict[str, int]] = []  # footprints over the first stretch of eviction
    later: list[dict[str, int]] = []  # and over the rest, five times as long
    for i in range(ADDS):
        scope = {"one": 0, "turns": i % 5, "passing": f"client-{i // 40}"}[scoping]
        n = int(rng.integers(3, 200))
        tokens = rng.integers(0, 5000, size=n)
        if i % 3 == 0:  # a reply that repeats an earlier one's text
            tokens[: min(n, 64)] = common[: min(n, 64)]
        for k in range(1, n, 97):  # the engine's query each round, on the context so far
            cache.propose(scope, tokens[:k].tolist(), 8, min_prob=0.6)
        before = len(cache)
        cache.add(scope, tokens.tolist())
        added += n
        if evicting_from is None and len(cache) <= before:
            evicting_from = i
        _check_consistent(cache)
        if evicting_from is not None:
            (first if i < evicting_from + ADDS // 6 else later).append(_footprint(cache))
    assert added > 100 * BOUND and evicting_from is not None and later
    for key in first[0]:
        early, late = max(f[key] for f in first), max(f[key] for f in later)
        # A leak grows with the adds: five times as many as in the first stretch would take it far past 1.5x.
        assert late <= 1.5 * early, f"{key}: {early} over the first {len(first)} adds that evicted, {late} after"
    if scoping == "passing":  # scopes come and go: only those with a live entry are kept
        assert max(f["scopes"] for f in later) <= BOUND // 3


def test_one_entry_past_the_bound_keeps_the_cache_to_it() -> None:
    cache = SuffixCache(1000)
    for _ in range(50):
        assert cache.add("s", list(range(3, 2003))) == 1000
        _check_consistent(cache)
        assert len(cache) == 1 and cache._scopes["s"].buf.shape[0] <= 2 * (1000 + 3)
