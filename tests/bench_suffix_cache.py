"""What the suffix cache costs: µs per inserted token and per query, and bytes per cached token, at several sizes.

    .venv/bin/python tests/bench_suffix_cache.py [--sizes 10000 100000 1000000] [--queries 2000]

Two kinds of synthetic traffic: *repetitive* (agent-like: each entry one of 300 templates of ~120 tokens with a
tenth of its tokens changed, so n-grams recur across entries) and *unique* (uniform random tokens: every n-gram
new, the index's worst case for memory). The cache is filled to its bound and then fed 10 % more, so inserts are
timed with eviction going on, as in a server that has run for a while. Queries are the tails (a random cut) of
fresh entries of the same traffic, 16 tokens asked. Memory: the Python and numpy allocations of a full cache
(tracemalloc, in a separate fill), and the resident set's growth while filling (RSS: coarse, the allocator reuses
what earlier sizes freed).
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from edgespec.drafters.suffix_cache import SuffixCache

VOCAB = 32_000


def repetitive(seed: int) -> Callable[[], np.ndarray]:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB + 1)
    zipf = (1 / ranks) / (1 / ranks).sum()
    templates = [rng.choice(VOCAB, size=int(rng.integers(60, 180)), p=zipf) for _ in range(300)]

    def entry() -> np.ndarray:
        t = templates[int(rng.integers(len(templates)))].copy()
        changed = rng.random(len(t)) < 0.1
        t[changed] = rng.choice(VOCAB, size=int(changed.sum()), p=zipf)
        return t

    return entry


def unique(seed: int) -> Callable[[], np.ndarray]:
    rng = np.random.default_rng(seed)
    return lambda: rng.integers(0, VOCAB, size=int(rng.integers(60, 180)))


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def fill(cache: SuffixCache, entry: Callable[[], np.ndarray], tokens: int) -> None:
    while cache.tokens + 180 < tokens:
        cache.add("scope", entry().tolist())


def bench(kind: str, make: Callable[[int], Callable[[], np.ndarray]], size: int, queries: int) -> None:
    gc.collect()
    before = rss()
    cache = SuffixCache(size)
    entry = make(1)
    fill(cache, entry, size)
    grown = rss() - before
    # Inserts in the steady state: every add evicts about as much as it brings.
    extra = [entry().tolist() for _ in range(max(size // 10 // 120, 50))]
    t0 = time.perf_counter()
    for e in extra:
        cache.add("scope", e)
    insert_us = 1e6 * (time.perf_counter() - t0) / sum(len(e) for e in extra)
    rng = np.random.default_rng(2)
    fresh = make(3)
    contexts = []
    for _ in range(queries):
        e = fresh().tolist()
        contexts.append(e[: int(rng.integers(8, len(e) - 1))])
    times, lengths = [], []
    for ctx in contexts:
        t0 = time.perf_counter()
        got = cache.propose("scope", ctx, 16)
        times.append(time.perf_counter() - t0)
        lengths.append(len(got.tokens))
    us = 1e6 * np.array(times)
    del cache
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cache = SuffixCache(size)
    fill(cache, make(1), size)
    traced = (tracemalloc.get_traced_memory()[0] - base) / cache.tokens
    tracemalloc.stop()
    print(
        f"{kind:<10} {size:>9,} tokens: insert {insert_us:5.2f} µs/token, query mean {us.mean():6.1f} µs "
        f"(p50 {np.percentile(us, 50):5.1f}, p99 {np.percentile(us, 99):6.1f}; proposed {np.mean(lengths):4.1f} "
        f"tokens, {np.mean(np.array(lengths) > 0):.0%} non-empty); {traced:.0f} B/token traced, "
        f"{grown / cache.tokens:.0f} RSS",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=2_000)
    args = ap.parse_args()
    for size in args.sizes:
        for kind, make in (("repetitive", repetitive), ("unique", unique)):
            bench(kind, make, size, args.queries)


if __name__ == "__main__":
    main()
