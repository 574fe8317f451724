"""A suffix cache: drafts for a request from what the runtime wrote for earlier requests.

Traffic that repeats itself across requests (an agent calling the same tools, SQL over one schema, the same
extraction from many documents) gets free drafts from earlier outputs where prompt lookup, which sees only the
request's own text, has none. The cache holds earlier requests' token sequences, shared by every lane of a runtime.

Library or own: ``arctic-inference`` (Snowflake's SuffixDecoding, Apache-2.0) ships its suffix tree as C++ built from
an sdist only (no release since 0.0.6 has a wheel), whose setup.py imports torch >= 2.10 to build, and it bounds its
cache by a count of requests with no scopes; the suffix-tree packages on PyPI (suffix-tree, suffix-trees, csuffixtree,
pydivsufsort) are static or string-only, with no deletion and no counts. So this is a compact one of its own.

**What it holds.** Entries, each one request's tokens (best: its output led by the last few tokens of its prompt,
so that the output's first tokens can be matched too), each under a *scope* key (any hashable: an API key's id, or
one scope for a whole runtime). A query for scope S sees S's entries only: another client's outputs never draft, so
a request's speed cannot reveal them. The cache is bounded by a total of ``max_tokens`` over all scopes and evicts
whole entries, oldest first. An entry longer than the whole bound keeps its first ``max_tokens`` tokens.

**What it proposes.** Given a request's context (prompt and output so far), the cache finds the longest suffix of
it, ``match_len`` tokens (2..``max_match``), that occurs followed by a token somewhere in the scope's entries. Its
*occurrences* are those places; the next token proposed is the one that follows most of them (ties: the latest
occurrence's), with the estimate ``p = count / occurrences``; the walk goes on among the occurrences that continued
with it, so each token's estimate is conditional on the tokens before it being right, and an occurrence whose entry
ends there still counts in the denominator. It stops at ``max_len`` tokens, where an estimate would fall below
``min_prob``, or where the occurrences run out. Each token also carries its *support* (the occurrences its estimate
was counted from): one occurrence says p = 1.0 on one piece of evidence, which a forecast should shrink.

**How.** Each scope keeps its entries in one token array (a sentinel -1 between entries, so no match or walk
crosses an entry's edge) and, for each n-gram length 2, 4, 8 and 16, hash chains over it as LZ77 match finders keep
them: a table from a hash bucket to the latest position the bucket's n-gram preceded, and per position the one
before it on its chain, all in numpy arrays. A query takes the longest indexed length whose n-gram of the context's
tail occurs, walks its chain back over the latest ``window`` live positions, verifies them against the context
backwards (up to ``max_match`` tokens, vectorised; this also drops other n-grams that share the bucket), keeps those
that agree longest, and walks forward from them. Where an n-gram has more than ``window`` live occurrences, the
match and the counts are those of its latest ``window`` (recent traffic predicts the next request best, and it
bounds a query's cost). Eviction is FIFO, so a scope's dead positions are a prefix: a chain walk stops at the first,
and the array drops them once they are half of it.

**Costs.** Inserting an entry of L tokens: per indexed length, hashing, a stable sort of its buckets and two
scatters, O(L log L) in numpy (the log over one entry only), plus amortised O(1) a token for growing or shrinking
the arrays and tables; evicting an entry is O(1) plus the same amortised moves. A query: 31 multiplications to hash
the tail, O(window) chain steps in Python at the longest length found, O(window · max_match) to verify, O(max_len ·
window) to walk: independent of how many tokens the cache holds. A query runs every round of a request that has a
scope, so the few occurrences that are the rule are verified and walked in plain Python (a numpy call costs more
than comparing a few tokens), the many in numpy.

The module is a little over 500 lines: one structure, the writes that keep its arrays and the queries that read them
(split apart, each half would reach into the other's arrays), and its file format.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections import Counter, deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

# The bound's default: a cached token takes 63-136 bytes (tracemalloc on synthetic agent-like and random text at 10k
# to 1M tokens, tests/bench_suffix_cache.py: the hash tables run a quarter to half full, the arrays up to twice what
# is live), so at most ~36 MB, beside the 1.1 GB of the 1.5B target's weights; it holds about two thousand outputs
# of the length agents write (~120 tokens) with their prompts' tails. A server with many scopes may want more.
DEFAULT_MAX_TOKENS = 262_144
LEVELS = (2, 4, 8, 16)  # n-gram lengths indexed (by doubling, below); a lone repeated token predicts poorly
MAX_MATCH = 32  # how far back a match is verified: a longer one says nothing more about the next token
WINDOW = 256  # latest occurrences of an n-gram a query weighs
MIN_PROB = 0.1  # a token whose estimate falls below this ends the proposal

FORMAT = "edgespec-suffix-cache"
VERSION = 1
_SENTINEL = -1  # between entries in a scope's token array: equals no token, so matches and walks stop there
_MIN_ROOM = 256  # a scope's smallest token array ...
_MIN_TABLE = 256  # ... and hash table (buckets per length): a scope with one entry costs ~10 kB
_FEW = 64  # occurrences a walk follows in plain Python rather than numpy


class SuffixCacheFileError(EdgespecError):
    """A saved suffix cache is unreadable, of another version or of another model: it was not loaded."""


@dataclass(frozen=True)
class CacheProposal:
    """What the cache proposes after a context: no tokens where nothing matches (``match_len`` 0) or where the first
    estimate is under the floor."""

    tokens: tuple[int, ...]  # d_1 .. d_k
    probs: tuple[float, ...]  # p_i = P(d_i | the match and d_1 .. d_(i-1)) from the continuation counts
    support: tuple[int, ...]  # the occurrences each p_i was counted from (non-increasing)
    match_len: int  # tokens of the context's tail matched in the cache
    source: str = "cache"


EMPTY = CacheProposal((), (), (), 0)


class _Scope:
    """One scope's entries in one token array, a sentinel before and after each, and a hash-chain index over it.

    For each indexed length n (``LEVELS[j]``): ``heads[j, bucket]`` is the latest position whose preceding n tokens
    hash to that bucket, ``prev[j, p]`` the position before p on that chain (as LZ77 match finders keep them), so a
    chain runs newest to oldest and every position on it below the first live one is evicted. Positions are indices
    into ``buf``; dropping the dead prefix shifts them all.
    """

    __slots__ = ("buf", "prev", "heads", "end", "entries", "tokens")

    def __init__(self) -> None:
        self.buf = np.full(_MIN_ROOM, _SENTINEL, dtype=np.int32)
        self.prev = np.full((len(LEVELS), _MIN_ROOM), -1, dtype=np.int32)
        self.heads = np.full((len(LEVELS), _MIN_TABLE), -1, dtype=np.int32)
        self.end = 1  # one past the last written position (buf[0] and buf[end - 1] are sentinels)
        self.entries: deque[tuple[int, int]] = deque()  # (start, length) of the live entries, oldest first
        self.tokens = 0  # in the live entries

    @property
    def live(self) -> int:
        """The first live position: every position below it is evicted."""
        return self.entries[0][0] if self.entries else self.end

    def append(self, tokens: np.ndarray) -> None:
        """Store ``tokens`` as a new entry and index it."""
        n = len(tokens)
        if self.end + n + 1 > self.buf.shape[0]:  # drop the dead and leave room for as much again
            self._move(self.live - 1, max(_MIN_ROOM, 2 * (self.end - self.live + n + 2)))
        if 2 * (self.tokens + n) > self.heads.shape[1]:  # keep the tables at most half full
            self._rehash(_pow2(4 * (self.tokens + n)))
        start = self.end
        self.buf[start : start + n] = tokens
        self.buf[start + n] = _SENTINEL
        self.end = start + n + 1
        self.entries.append((start, n))
        self.tokens += n
        self._link(start, n)

    def evict_oldest(self) -> int:
        """Drop the oldest entry; returns its length. Its positions fall below ``live``: nothing to unlink."""
        _, n = self.entries.popleft()
        self.tokens -= n
        if self.entries and self.tokens < self.heads.shape[1] // 8 and self.heads.shape[1] > _MIN_TABLE:
            self._rehash(_pow2(4 * self.tokens))
        if self.entries and 2 * (self.live - 1) > self.end:  # the dead are over half the array: drop them
            self._move(self.live - 1, max(_MIN_ROOM, 2 * (self.end - self.live + 1)))
        return n

    def _link(self, start: int, n: int) -> None:
        """Put the positions of the entry at ``start`` on their chains (vectorised: within the entry, the positions
        of one bucket link to each other in order, the first to the bucket's old head)."""
        mask = self.heads.shape[1] - 1
        tokens = self.buf[start : start + n]
        for j, (hashes, g) in enumerate(zip(_ngram_hashes(tokens), LEVELS, strict=True)):
            if n <= g:
                break
            # The n-gram ending at token i is followed by token i + 1 (which must exist: no match without a next).
            buckets = (hashes[g - 1 : n - 1] & np.uint64(mask)).astype(np.int64)
            order = np.argsort(buckets, kind="stable")
            b, p = buckets[order], np.arange(start + g, start + n)[order]
            first = np.ones(len(b), dtype=bool)
            first[1:] = b[1:] != b[:-1]
            before = np.empty_like(p)
            before[1:] = p[:-1]
            before[first] = self.heads[j, b[first]]
            self.prev[j, p] = before
            last = np.ones(len(b), dtype=bool)
            last[:-1] = first[1:]
            self.heads[j, b[last]] = p[last]

    def _rehash(self, size: int) -> None:
        """New tables of ``size`` buckets, the live entries linked anew."""
        self.heads = np.full((len(LEVELS), max(size, _MIN_TABLE)), -1, dtype=np.int32)
        self.prev[:, : self.end] = -1
        for start, n in self.entries:
            self._link(start, n)

    def _move(self, dead: int, room: int) -> None:
        """Drop the first ``dead`` positions (all evicted) and make room for ``room`` in all."""
        used = self.end - dead
        buf = np.full(room, _SENTINEL, dtype=np.int32)
        buf[:used] = self.buf[dead : self.end]
        prev = np.full((len(LEVELS), room), -1, dtype=np.int32)
        prev[:, :used] = np.maximum(self.prev[:, dead : self.end] - dead, -1)
        self.buf, self.prev, self.end = buf, prev, used
        np.maximum(self.heads - dead, -1, out=self.heads)
        self.entries = deque((start - dead, n) for start, n in self.entries)

    def occurrences(self, j: int, key: int, window: int) -> list[int]:
        """The latest ``window`` live positions on the chain of ``key``'s bucket at ``LEVELS[j]``, ascending (other
        n-grams that share the bucket among them: the caller verifies)."""
        heads, prev, live = self.heads[j], self.prev[j], self.live
        out = []
        p = heads.item(key & (heads.shape[0] - 1))
        while p >= live and len(out) < window:
            out.append(p)
            p = prev.item(p)
        out.reverse()
        return out


class SuffixCache:
    """Earlier requests' token sequences, by scope, bounded by ``max_tokens`` in all (see the module docstring).

    ``max_match``: the longest match verified. ``window``: the latest occurrences of an n-gram a query weighs. Not
    thread-safe: one runtime's lanes share it through the engine's step, which runs one at a time.
    """

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, *, max_match: int = MAX_MATCH, window: int = WINDOW):
        if max_tokens < 1 or max_match < LEVELS[0] or window < 1:
            raise ValueError(f"need max_tokens >= 1, max_match >= {LEVELS[0]}, window >= 1")
        self.max_tokens = max_tokens
        self.max_match = max_match
        self.window = window
        self._scopes: dict[Hashable, _Scope] = {}
        self._order: deque[Hashable] = deque()  # each live entry's scope, oldest first (FIFO over all scopes)
        self._tokens = 0

    # ----- contents --------------------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        """Tokens held, over all scopes (at most ``max_tokens``)."""
        return self._tokens

    def __len__(self) -> int:
        """Entries held, over all scopes."""
        return len(self._order)

    def scopes(self) -> list[Hashable]:
        """The scopes that hold an entry."""
        return list(self._scopes)

    def entries(self) -> Iterator[tuple[Hashable, list[int]]]:
        """Every entry as (scope, tokens), oldest first."""
        for key, tokens in self._entry_arrays():
            yield key, tokens.tolist()

    def _entry_arrays(self) -> Iterator[tuple[Hashable, np.ndarray]]:
        cursor = {key: iter(s.entries) for key, s in self._scopes.items()}
        for key in self._order:
            start, n = next(cursor[key])
            yield key, self._scopes[key].buf[start : start + n]

    def clear(self) -> None:
        self._scopes.clear()
        self._order.clear()
        self._tokens = 0

    def add(self, scope: Hashable, tokens: Sequence[int]) -> int:
        """Cache ``tokens`` (token ids >= 0) as an entry of ``scope``, evicting the oldest entries of any scope while
        the bound would be exceeded; returns how many tokens were kept (an entry longer than the bound keeps its first
        ``max_tokens``). An entry of under 3 tokens (no n-gram with a continuation) is not kept."""
        arr = np.asarray(tokens, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError("tokens must be a sequence of token ids")
        arr = arr[: self.max_tokens]
        if len(arr) and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
            raise ValueError("token ids must be in 0 .. 2**31 - 1")
        if len(arr) <= LEVELS[0]:
            return 0
        while self._tokens + len(arr) > self.max_tokens:
            self._evict_oldest()
        s = self._scopes.get(scope)
        if s is None:
            s = self._scopes[scope] = _Scope()
        s.append(arr.astype(np.int32))
        self._order.append(scope)
        self._tokens += len(arr)
        return len(arr)

    def _evict_oldest(self) -> None:
        key = self._order.popleft()
        s = self._scopes[key]
        self._tokens -= s.evict_oldest()
        if not s.entries:
            del self._scopes[key]  # frees its array and index at once

    # ----- proposing -------------------------------------------------------------------------------------------
    def propose(
        self, scope: Hashable, context: Sequence[int], max_len: int, *, min_prob: float = MIN_PROB
    ) -> CacheProposal:
        """Up to ``max_len`` tokens to follow ``context`` (the request's prompt and output so far; only its last
        ``max_match`` tokens are read), from the longest match among ``scope``'s entries; :data:`EMPTY` if none."""
        match = self._match(scope, context) if max_len >= 1 else None
        if match is None:
            return EMPTY
        buf, occ, match_len = match
        return _walk(buf, occ, match_len, max_len, min_prob)

    def continuations(
        self, scope: Hashable, context: Sequence[int], max_len: int, *, limit: int = _FEW
    ) -> tuple[list[list[int]], int]:
        """What followed each of the latest ``limit`` occurrences of the longest match (up to ``max_len`` tokens
        each, to the end of its entry), oldest first, and the match's length: the branches a draft tree can take
        (:func:`edgespec.drafters.tree.from_occurrences`). No rows where nothing matches."""
        match = self._match(scope, context) if max_len >= 1 else None
        if match is None:
            return [], 0
        buf, occ, match_len = match
        rows = []
        for p in occ[-limit:]:
            row = buf[p : p + max_len].tolist()
            rows.append(row[: row.index(_SENTINEL)] if _SENTINEL in row else row)
        return rows, match_len

    def _match(self, scope: Hashable, context: Sequence[int]) -> tuple[np.ndarray, list[int], int] | None:
        """The scope's token array, the positions that follow the longest match of the context's tail (ascending),
        and its length; None where nothing matches."""
        s = self._scopes.get(scope)
        if s is None:
            return None
        tail = [int(t) for t in context[-self.max_match :]]
        if len(tail) < LEVELS[0]:
            return None
        keys = _tail_hashes(tail)
        for j in range(len(keys) - 1, -1, -1):  # the longest indexed n-gram of the tail that occurs
            found = s.occurrences(j, keys[j], self.window)
            if not found:
                continue
            agree = _agreement(s.buf, found, tail)
            best = max(agree)
            if best >= LEVELS[j]:  # (else only other n-grams share the bucket: a shorter one is tried)
                return s.buf, [p for p, a in zip(found, agree, strict=True) if a == best], best
        return None

    # ----- persistence -----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, model: str) -> None:
        """Write every entry (oldest first) to ``path`` for ``model`` (the caller's identity of the model: the cache
        is only valid for the same vocabulary), atomically. Scopes must be str, int, None or tuples of them."""
        order = list(self._entry_arrays())
        scopes: list[Hashable] = []
        ids: dict[Hashable, int] = {}
        for key, _ in order:
            if key not in ids:
                _check_scope(key)
                ids[key] = len(scopes)
                scopes.append(key)
        meta = {"format": FORMAT, "version": VERSION, "model": model, "scopes": scopes}
        arrays = {
            "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            "tokens": np.concatenate([toks for _, toks in order] or [np.zeros(0, np.int32)]).astype(np.int32),
            "lengths": np.array([len(toks) for _, toks in order], dtype=np.int64),
            "scope_ids": np.array([ids[key] for key, _ in order], dtype=np.int32),
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike, model: str) -> int:
        """Replace what the cache holds with the entries saved in ``path`` for ``model`` (oldest evicted past the
        bound); returns how many entries were read, 0 where there is no file. A file that is corrupt, of another
        format version or of another model raises :class:`SuffixCacheFileError` and leaves the cache empty."""
        self.clear()
        path = Path(path)
        if not path.exists():
            return 0
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                tokens, lengths, scope_ids = z["tokens"], z["lengths"], z["scope_ids"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile) as exc:
            # (np.load of a file that is not an .npz: ValueError, or an array without the keys: AttributeError)
            raise SuffixCacheFileError(f"{path}: not a readable suffix cache ({exc}); starting empty") from exc
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SuffixCacheFileError(f"{path}: not a suffix cache file; starting empty")
        if meta.get("version") != VERSION:
            raise SuffixCacheFileError(
                f"{path}: suffix cache format version {meta.get('version')!r}, this edgespec reads {VERSION}; "
                "starting empty"
            )
        if meta.get("model") != model:
            raise SuffixCacheFileError(
                f"{path}: a suffix cache of model {meta.get('model')!r}, not {model!r}; starting empty"
            )
        scopes = [_scope_from_json(s) for s in meta.get("scopes", [])]
        if not (
            tokens.dtype == np.int32 and lengths.dtype == np.int64 and scope_ids.dtype == np.int32
            and tokens.ndim == lengths.ndim == scope_ids.ndim == 1 and len(lengths) == len(scope_ids)
            and (lengths >= 0).all() and int(lengths.sum()) == len(tokens) and (tokens >= 0).all()
            and ((scope_ids >= 0) & (scope_ids < len(scopes))).all()
        ):  # fmt: skip
            raise SuffixCacheFileError(f"{path}: a suffix cache whose arrays do not fit together; starting empty")
        ends = np.cumsum(lengths)
        for sid, end, n in zip(scope_ids.tolist(), ends.tolist(), lengths.tolist(), strict=True):
            self.add(scopes[sid], tokens[end - n : end])
        return len(lengths)


# ----- the pieces ------------------------------------------------------------------------------------------------
# Hashes of n-grams by doubling: h_1 from the token, h_2n(i) = h_n(i - n) * P_n + h_n(i) (mod 2**64, numpy wraps),
# so every indexed length is a few vectorised operations over an entry; a query does the same over its tail in
# Python ints (a few tokens, where each numpy call costs more than the arithmetic).
_MASK = (1 << 64) - 1
_MIX_INT = 0x9E3779B97F4A7C15
_STEP_INT = {1: 0xC2B2AE3D27D4EB4F, 2: 0x165667B19E3779F9, 4: 0xD6E8FEB86659FD93, 8: 0xFF51AFD7ED558CCD}
_MIX = np.uint64(_MIX_INT)
_STEP = {n: np.uint64(step) for n, step in _STEP_INT.items()}
# Occurrences a query compares with the context in plain Python; past these, vectorised (as a walk's, _FEW).
_FEW_TO_AGREE = 8


def _ngram_hashes(tokens: np.ndarray) -> list[np.ndarray]:
    """For each length n in LEVELS, h[i] = the hash of tokens[i - n + 1 .. i] (meaningful for i >= n - 1)."""
    h = (tokens.astype(np.uint64) + np.uint64(1)) * _MIX
    out = []
    n = 1
    while n < LEVELS[-1]:
        nxt = h.copy()
        nxt[n:] = h[: max(len(h) - n, 0)] * _STEP[n] + h[n:]
        h, n = nxt, 2 * n
        if n in LEVELS:
            out.append(h)
    return out


def _tail_hashes(tail: list[int]) -> list[int]:
    """The hash of the last n tokens of ``tail`` for each length n in LEVELS that it is long enough for: what
    :func:`_ngram_hashes` gives at the tail's last position, doubling only the hashes that lead to it (those at the
    last position and every n-th before it)."""
    h = [((t + 1) * _MIX_INT) & _MASK for t in reversed(tail[-LEVELS[-1] :])]  # h_1 at the last, the one before, ...
    out = []
    n = 1
    while len(h) >= 2:
        step = _STEP_INT[n]
        h = [(h[k + 1] * step + h[k]) & _MASK for k in range(0, len(h) - 1, 2)]  # h_2n at the last, 2n before, ...
        n *= 2
        if n in LEVELS:
            out.append(h[0])
    return out


def _agreement(buf: np.ndarray, occ: list[int], tail: list[int]) -> list[int]:
    """For each position in ``occ``, how many tokens before it equal the tail's last ones (at most len(tail))."""
    n = len(tail)
    if len(occ) <= _FEW_TO_AGREE:
        back = tail[::-1]
        out = []
        for p in occ:
            before = buf[max(p - n, 0) : p].tolist()[::-1]  # (buf[0] is a sentinel: a match stops there)
            k = 0
            while k < len(before) and before[k] == back[k]:
                k += 1
            out.append(k)
        return out
    at = np.array(occ, dtype=np.int64)
    idx = np.maximum(at[:, None] - np.arange(1, n + 1)[None, :], 0)  # past a mismatch (a sentinel at the latest)
    eq = buf[idx] == np.array(tail[::-1])[None, :]  # [occurrences, len(tail)]: it does not matter
    return np.where(eq.all(axis=1), n, eq.argmin(axis=1)).tolist()


def _walk(buf: np.ndarray, found: list[int], match_len: int, max_len: int, min_prob: float) -> CacheProposal:
    """Follow the most frequent continuation of the occurrences ``found`` (ascending positions): a numpy step while
    they are many, then plain Python over their next tokens (a numpy call costs more than a few dict updates)."""
    tokens: list[int] = []
    probs: list[float] = []
    support: list[int] = []
    occ = np.array(found, dtype=np.int64) if len(found) > _FEW else found
    while len(tokens) < max_len and len(occ) > _FEW:
        nxt = buf[occ]
        going = nxt[nxt != _SENTINEL]
        if not len(going):
            break
        values, inverse, counts = np.unique(going, return_inverse=True, return_counts=True)
        top = np.flatnonzero(counts == counts.max())
        # A tie goes to the latest occurrence's token: the newest traffic predicts the next request best.
        token = int(values[top[0]] if len(top) == 1 else going[np.flatnonzero(np.isin(inverse, top))[-1]])
        if not _take(token, int(counts.max()), len(occ), min_prob, tokens, probs, support):
            break
        occ = occ[nxt == token] + 1
    else:
        if len(tokens) < max_len and len(occ):
            # The next tokens of each occurrence (a row ends at its first sentinel, or the array's end).
            want = max_len - len(tokens)
            rows = [buf[p : p + want].tolist() for p in (occ.tolist() if isinstance(occ, np.ndarray) else occ)]
            _walk_rows(rows, min_prob, tokens, probs, support)
    return CacheProposal(tuple(tokens), tuple(probs), tuple(support), match_len)


def _walk_rows(
    rows: list[list[int]], min_prob: float, tokens: list[int], probs: list[float], support: list[int]
) -> None:
    """The walk over each occurrence's next tokens (``rows``, ascending positions), in plain Python."""
    if len(rows) == 1:  # a plain copy, up to the end of its entry
        row = rows[0]
        row = row[: row.index(_SENTINEL)] if _SENTINEL in row else row
        tokens += row
        probs += [1.0] * len(row)
        support += [1] * len(row)
        return
    for k in range(len(rows[0])):
        going = [row[k] for row in rows if k < len(row) and row[k] != _SENTINEL]  # (a row ends at the array's end)
        if not going:
            return
        token = going[-1]
        top = going.count(token)
        if top < len(going):  # the occurrences went different ways: the most frequent, the latest's on a tie
            counts = Counter(going)
            top = max(counts.values())
            token = next(t for t in reversed(going) if counts[t] == top)
        if not _take(token, top, len(rows), min_prob, tokens, probs, support):
            return
        if top < len(rows):
            rows = [row for row in rows if k < len(row) and row[k] == token]


def _take(
    token: int, count: int, total: int, min_prob: float, tokens: list[int], probs: list[float], support: list[int]
) -> bool:
    """Append ``token`` with its estimate count / total unless that falls below ``min_prob``."""
    if count / total < min_prob:
        return False
    tokens.append(token)
    probs.append(count / total)
    support.append(total)
    return True


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def _check_scope(key: Hashable) -> None:
    if isinstance(key, tuple):
        for k in key:
            _check_scope(k)
    elif not (key is None or isinstance(key, (str, int))) or isinstance(key, bool):
        raise ValueError(f"scope {key!r}: only str, int, None or tuples of them can be saved")


def _scope_from_json(value: object) -> Hashable:
    """JSON gives lists back for the tuples written."""
    return tuple(_scope_from_json(v) for v in value) if isinstance(value, list) else value  # type: ignore[return-value]
