"""The suffix cache of earlier requests' outputs: its proposals against counts worked out by brute force, scopes,
the bound and its eviction order, and the saved file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.drafters.suffix_cache import (
    EMPTY,
    LEVELS,
    CacheProposal,
    SuffixCache,
    SuffixCacheFileError,
)


def brute_force(
    entries: list[list[int]], context: list[int], max_len: int, *, max_match: int = 32, min_prob: float = 0.1
) -> CacheProposal:
    """The proposal by definition: the longest suffix of the context (2 .. max_match tokens) that occurs followed by
    a token in an entry; then, among its occurrences, the most frequent next token (ties: the latest occurrence's),
    p = its count / all occurrences, and on among those that continued with it."""
    tail = context[-max_match:]
    found: list[tuple[int, int, int]] = []  # (agreement, entry, position of the next token)
    for k, e in enumerate(entries):
        for p in range(1, len(e)):
            a = 0
            while a < len(tail) and a < p and e[p - 1 - a] == tail[-1 - a]:
                a += 1
            found.append((a, k, p))
    best = max((a for a, _, _ in found), default=0)
    if best < 2:
        return EMPTY
    occ = [(k, p) for a, k, p in found if a == best]  # in order: oldest entry first, then by position
    tokens, probs, support = [], [], []
    while len(tokens) < max_len and occ:
        nxt = [entries[k][p] if p < len(entries[k]) else None for k, p in occ]
        counts = Counter(t for t in nxt if t is not None)
        if not counts:
            break
        top = max(counts.values())
        token = [t for t in nxt if t is not None and counts[t] == top][-1]
        if top / len(occ) < min_prob:
            break
        tokens.append(token)
        probs.append(top / len(occ))
        support.append(len(occ))
        occ = [(k, p + 1) for (k, p), t in zip(occ, nxt, strict=True) if t == token]
    return CacheProposal(tuple(tokens), tuple(probs), tuple(support), best)


def same(a: CacheProposal, b: CacheProposal) -> bool:
    return (
        a.tokens == b.tokens and a.support == b.support and a.match_len == b.match_len
        and np.allclose(a.probs, b.probs) and a.source == b.source == "cache"
    )  # fmt: skip


# ----- proposals -------------------------------------------------------------------------------------------------
def test_a_hand_made_proposal_and_its_estimates() -> None:
    c = SuffixCache(100)
    c.add("s", [1, 2, 3, 4, 5, 6, 7])
    c.add("s", [9, 2, 3, 4, 8, 6, 7])
    c.add("s", [5, 2, 3, 4, 5, 6, 7, 1])
    # "2 3 4" occurs three times: 5 follows two of them (2/3); both go on 6 7; then one entry ends and the other goes
    # on with 1, which is 1 of the 2 occurrences left.
    got = c.propose("s", [0, 2, 3, 4], 10)
    assert got == CacheProposal((5, 6, 7, 1), (2 / 3, 1.0, 1.0, 0.5), (3, 2, 2, 2), 3)
    # A longer match narrows the occurrences: "5 2 3 4" occurs once, so its continuation is a plain copy.
    assert c.propose("s", [5, 2, 3, 4], 10) == CacheProposal((5, 6, 7, 1), (1.0,) * 4, (1,) * 4, 4)
    assert c.propose("s", [0, 2, 3, 4], 2).tokens == (5, 6)  # max_len
    # The first estimate under the floor: nothing proposed, though the match is there.
    assert c.propose("s", [0, 2, 3, 4], 10, min_prob=0.7) == CacheProposal((), (), (), 3)
    assert c.propose("s", [0, 2, 3, 4], 10, min_prob=0.6).tokens == (5, 6, 7)  # ... and the last
    assert c.propose("s", [0, 3], 10) == EMPTY  # a single token matched is no match
    assert c.propose("s", [7, 1], 10) == EMPTY  # occurs, but never followed by a token
    assert c.propose("other", [0, 2, 3, 4], 10) == EMPTY


def test_a_tie_goes_to_the_latest_occurrence_and_the_window_keeps_the_latest() -> None:
    c = SuffixCache(1000, window=4)
    for nxt in (7, 7, 7, 7, 8, 8):
        c.add("s", [1, 2, 3, nxt])
    # Of the latest 4 occurrences of "2 3", two go on with 7 and two (the newest) with 8.
    assert c.propose("s", [2, 3], 5) == CacheProposal((8,), (0.5,), (4,), 2)
    wide = SuffixCache(1000)
    for nxt in (7, 7, 7, 7, 8, 8):
        wide.add("s", [1, 2, 3, nxt])
    assert wide.propose("s", [2, 3], 5) == CacheProposal((7,), (4 / 6,), (6,), 2)


@pytest.mark.parametrize("each", [3, 20])  # few occurrences (walked in Python) and many (in numpy)
def test_a_tie_goes_to_the_latest_occurrence_however_many_there_are(each: int) -> None:
    for first, then in ((7, 8), (8, 7)):
        c = SuffixCache(10_000)
        for nxt in [first] * each + [then] * each:
            c.add("s", [1, 2, 3, nxt, 9])
        assert c.propose("s", [2, 3], 2) == CacheProposal((then, 9), (0.5, 1.0), (2 * each, each), 2)


def test_the_match_is_capped_at_max_match() -> None:
    text = list(range(100, 160))
    c = SuffixCache(1000, max_match=20)
    c.add("s", text)
    got = c.propose("s", text[:40], 5)
    assert got.match_len == 20 and got.tokens == tuple(text[40:45])


alphabet = st.integers(0, 3)  # few symbols, so that matches of every length and ties are common


@st.composite
def cached_texts(draw: st.DrawFn) -> tuple[list[list[int]], list[int]]:
    """Entries and a context over 2-4 symbols: with 2, an n-gram has dozens of occurrences (the walk's numpy steps)."""
    symbols = st.integers(0, draw(st.integers(1, 3)))
    entries = draw(st.lists(st.lists(symbols, max_size=40), max_size=6))
    return entries, draw(st.lists(symbols, max_size=40))


@settings(max_examples=100, deadline=None)
@given(
    texts=cached_texts(),
    max_len=st.integers(1, 12),
    min_prob=st.sampled_from([0.0, 0.1, 0.5]),
    max_match=st.integers(2, 40),
)
def test_proposals_equal_the_counts_worked_out_by_brute_force(
    texts: tuple[list[list[int]], list[int]], max_len: int, min_prob: float, max_match: int
) -> None:
    entries, context = texts
    c = SuffixCache(10_000, max_match=max_match)
    for e in entries:
        c.add("s", e)
    kept = [e for e in entries if len(e) > LEVELS[0]]  # shorter ones hold no n-gram with a next token
    want = brute_force(kept, context, max_len, max_match=max_match, min_prob=min_prob)
    got = c.propose("s", context, max_len, min_prob=min_prob)
    assert same(got, want), (got, want)


@settings(max_examples=40, deadline=None)
@given(
    adds=st.lists(st.tuples(st.sampled_from("AB"), st.lists(alphabet, min_size=3, max_size=30)), max_size=25),
    contexts=st.lists(st.lists(alphabet, min_size=2, max_size=20), min_size=1, max_size=4),
)
def test_under_eviction_and_scopes_proposals_stay_those_of_the_live_entries(
    adds: list[tuple[str, list[int]]], contexts: list[list[int]]
) -> None:
    bound = 60
    c = SuffixCache(bound)
    live: list[tuple[str, list[int]]] = []  # what FIFO eviction must leave, oldest first
    for scope, tokens in adds:
        c.add(scope, tokens)
        live.append((scope, tokens))
        while sum(len(t) for _, t in live) > bound:
            live.pop(0)
        assert [(s, t) for s, t in c.entries()] == live
        assert c.tokens == sum(len(t) for _, t in live) <= bound
        for ctx in contexts:
            for s in "AB":
                mine = [t for k, t in live if k == s]
                assert same(c.propose(s, ctx, 8), brute_force(mine, ctx, 8)), (s, ctx)


# ----- scopes ----------------------------------------------------------------------------------------------------
def test_a_scope_never_gets_a_token_that_only_another_scope_wrote() -> None:
    c = SuffixCache(10_000)
    secret = [11, 12, 13, 14, 15, 16, 17, 18]
    c.add("key-a", [1, 2, 3, *secret])
    c.add("key-b", [1, 2, 3, 4, 5, 6])
    assert c.propose("key-a", [1, 2, 3], 8).tokens == tuple(secret)
    got = c.propose("key-b", [1, 2, 3], 8)
    assert got.tokens == (4, 5, 6) and not set(got.tokens) & set(secret)
    assert c.propose("key-b", [1, 2, 3, 11, 12], 8) == EMPTY  # B's context may hold A's text: still nothing
    assert c.propose(None, [1, 2, 3], 8) == EMPTY  # a scope that wrote nothing sees nothing
    assert sorted(c.scopes()) == ["key-a", "key-b"]


# ----- the bound -------------------------------------------------------------------------------------------------
def test_eviction_drops_whole_entries_oldest_first_across_scopes() -> None:
    c = SuffixCache(20)
    c.add("a", [1, 2, 3, 4, 5, 6, 7, 8])  # 8
    c.add("b", [10, 11, 12, 13, 14, 15])  # 14
    c.add("a", [20, 21, 22, 23, 24, 25])  # 20
    assert c.tokens == 20 and len(c) == 3
    c.add("b", [30, 31, 32])  # 23 > 20: the oldest ("a", 8 tokens) goes, whole
    assert [(s, t[0]) for s, t in c.entries()] == [("b", 10), ("a", 20), ("b", 30)] and c.tokens == 15
    assert c.propose("a", [2, 3], 4) == EMPTY and c.propose("a", [21, 22], 2).tokens == (23, 24)
    c.add("a", list(range(40, 58)))  # 18 tokens: both "b" entries and "a"'s other go
    assert [(s, len(t)) for s, t in c.entries()] == [("a", 18)] and c.scopes() == ["a"]


def test_an_entry_longer_than_the_bound_keeps_its_first_tokens() -> None:
    c = SuffixCache(10)
    c.add("a", [1, 2, 3, 4])
    assert c.add("a", list(range(100, 130))) == 10
    assert list(c.entries()) == [("a", list(range(100, 110)))]
    assert c.add("a", [5, 6]) == 0 and len(c) == 1  # too short to match anything: not kept


def test_token_ids_are_checked() -> None:
    c = SuffixCache(10)
    with pytest.raises(ValueError):
        c.add("a", [1, -2, 3])
    with pytest.raises(ValueError):
        c.add("a", [[1, 2], [3, 4]])
    with pytest.raises(ValueError):
        SuffixCache(0)


def test_a_long_run_keeps_the_arrays_and_tables_within_a_multiple_of_the_bound() -> None:
    from edgespec.drafters.suffix_cache import _MIN_ROOM, _MIN_TABLE

    rng = np.random.default_rng(0)
    bound = 2_000
    c = SuffixCache(bound)
    for i in range(800):
        c.add(i % 3, rng.integers(0, 50, size=int(rng.integers(3, 120))).tolist())
        assert c.tokens <= bound
        for s in c._scopes.values():
            live = sum(n for _, n in s.entries)
            assert s.buf.shape[0] <= max(_MIN_ROOM, 4 * (live + len(s.entries) + 2))
            assert s.heads.shape[1] <= max(_MIN_TABLE, 16 * live)
        if i % 100 == 99:  # the tables were grown, shrunk and the arrays moved in between: proposals are still exact
            for scope in c.scopes():
                mine = [t for k, t in c.entries() if k == scope]
                some = mine[int(rng.integers(len(mine)))]
                cut = int(rng.integers(2, len(some) + 1))
                for ctx in (some[:cut], rng.integers(0, 50, size=6).tolist()):
                    assert same(c.propose(scope, ctx, 8), brute_force(mine, ctx, 8))


# ----- the saved file --------------------------------------------------------------------------------------------
def filled() -> SuffixCache:
    c = SuffixCache(1_000)
    c.add("key-a", [1, 2, 3, 4, 5, 6])
    c.add(("tenant", 7), [1, 2, 3, 9, 9, 9])
    c.add(None, [7, 8, 9, 10])
    c.add("key-a", [1, 2, 3, 4, 5, 7])
    return c


def test_a_saved_cache_loads_back_the_same(tmp_path: Path) -> None:
    path = tmp_path / "qwen.suffix"
    c = filled()
    c.save(path, "qwen2.5-coder-1.5b@abc")
    d = SuffixCache(1_000)
    assert d.load(path, "qwen2.5-coder-1.5b@abc") == 4
    assert list(d.entries()) == list(c.entries())
    for scope in c.scopes():
        assert d.propose(scope, [1, 2, 3], 5) == c.propose(scope, [1, 2, 3], 5)
    small = SuffixCache(10)  # a smaller bound keeps the newest entries
    small.load(path, "qwen2.5-coder-1.5b@abc")
    assert [s for s, _ in small.entries()] == [None, "key-a"]
    assert SuffixCache().load(tmp_path / "none-yet", "m") == 0  # no file: start empty, nothing to refuse
    with pytest.raises(ValueError, match="can be saved"):
        d.add(1.5, [1, 2, 3])  # a float scope is fine in memory ...
        d.save(tmp_path / "x", "m")  # ... but not in a file


def _damaged(tmp_path: Path) -> list[Path]:
    good = tmp_path / "good"
    filled().save(good, "m")
    raw = good.read_bytes()
    out = []
    for name, data in (
        ("truncated", raw[: len(raw) // 2]),
        ("flipped", raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:]),
        ("garbage", b"\x00not a cache at all" * 50),
        ("empty", b""),
    ):
        (tmp_path / name).write_bytes(data)
        out.append(tmp_path / name)
    np.save(tmp_path / "array.npy", np.arange(5))
    out.append(tmp_path / "array.npy")
    return out


def test_a_corrupt_file_is_refused_and_the_cache_starts_empty(tmp_path: Path) -> None:
    for path in _damaged(tmp_path):
        c = filled()
        with pytest.raises(SuffixCacheFileError, match="starting empty"):
            c.load(path, "m")
        assert len(c) == 0 and c.tokens == 0 and c.propose("key-a", [1, 2, 3], 4) == EMPTY, path.name


def _rewrite(src: Path, dst: Path, **changes: object) -> None:
    with np.load(src) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    for k, v in changes.items():
        if k in meta:
            meta[k] = v
        else:
            arrays[k] = v
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(dst, "wb") as f:
        np.savez(f, **arrays)


def test_a_file_of_another_model_or_version_or_with_inconsistent_arrays_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "good"
    filled().save(good, "m")
    cases = {
        "another model": ({"model": "other"}, "of model 'other', not 'm'"),
        "another version": ({"version": 2}, "version 2"),
        "another format": ({"format": "x"}, "not a suffix cache file"),
        "lengths": ({"lengths": np.array([1, 2, 3, 4], dtype=np.int64)}, "do not fit together"),
        "scope ids": ({"scope_ids": np.array([0, 1, 2, 9], dtype=np.int32)}, "do not fit together"),
    }
    for name, (changes, message) in cases.items():
        path = tmp_path / name
        _rewrite(good, path, **changes)
        c = filled()
        with pytest.raises(SuffixCacheFileError, match=message):
            c.load(path, "m")
        assert len(c) == 0, name
