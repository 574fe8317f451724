"""The suffix cache's memory over a long run: process RSS after N requests through one engine, with the cache and
without it, side by side (issue #53: the cache stays within its bound).

A fake target (no weights) answers each request with a reply scripted for it: random prompts and replies, distinct
for every request, so the cache fills to its token bound and must evict. Each configuration runs in a fresh
process of its own (this script again), so the two RSS columns do not share a heap. At every checkpoint the table
gives the cache's entries and tokens held, the bytes of its numpy arrays (token arrays, chains and hash tables,
read from its scopes: the cache has no size estimate of its own), and VmRSS from /proc/self/status; after every
request the tokens held are checked against the bound.

    python tests/rss_suffix_cache.py --requests 2000
    python tests/rss_suffix_cache.py --requests 2000 --cache-tokens 32768
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes import EOS, FakeModel  # noqa: E402

from edgespec.drafters.suffix_cache import DEFAULT_MAX_TOKENS, SuffixCache  # noqa: E402
from edgespec.engine import Engine  # noqa: E402
from edgespec.events import Finished  # noqa: E402
from edgespec.generation import CACHE_LEAD  # noqa: E402
from edgespec.sampling import SamplingParams  # noqa: E402


class ReplyModel(FakeModel):
    """A target whose argmax at position p is ``script[p]`` of the request running now (one lane, requests in
    order: the caller sets ``script`` before each), the end of generation past it. It keeps no record of its
    decodes and no cache of rows, so its own memory does not grow with requests."""

    def __init__(self, n_vocab: int, n_ctx: int) -> None:
        super().__init__(n_vocab=n_vocab, n_ctx=n_ctx)
        self.script: list[int] = []

    def decode_batch(self, parts):
        return [self._score(slot, tokens, rows, readout) for slot, tokens, rows, readout in parts]

    def _decode_on(self, seq, tokens, rows, readout):
        return self._score(seq, tokens, rows, readout)

    def _score(self, seq, tokens, rows, readout):
        if len(seq.kv_tokens) + len(tokens) > self.n_ctx:
            raise AssertionError("fake context overflow")
        start = len(seq.kv_tokens)
        seq.kv_tokens.extend(tokens)
        script = self.script
        best = [script[start + i + 1] if start + i + 1 < len(script) else EOS for i in rows]
        if readout.kind == "argmax":
            return best
        logits = np.zeros((len(best), self.n_vocab), dtype=np.float32)  # whole rows: the scripted token on top
        logits[np.arange(len(best)), best] = 10.0
        return logits

    def piece(self, token: int) -> bytes:
        return b"" if token == EOS else b"x"

    def token_text(self, token: int) -> str:
        return "" if token == EOS else "x"


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def cache_array_bytes(cache: SuffixCache) -> int:
    """The bytes of the cache's numpy arrays over its scopes (its token arrays, chains and hash tables)."""
    return sum(s.buf.nbytes + s.prev.nbytes + s.heads.nbytes for s in cache._scopes.values())


def run_one(args: argparse.Namespace, with_cache: bool) -> list[dict]:
    """The run itself, in this process: a row per checkpoint."""
    rng = np.random.default_rng(args.seed)
    model = ReplyModel(args.vocab, args.prompt_tokens + args.reply_tokens + 64)
    cache = SuffixCache(args.cache_tokens) if with_cache else None
    engine = Engine(model, None, draft_len="auto", lookup=True, suffix_cache=cache, cache_scope=0)
    params = SamplingParams(temperature=0.0, max_tokens=args.reply_tokens)
    rows: list[dict] = []
    most_held = 0

    def checkpoint(done: int) -> None:
        gc.collect()
        rss, hwm = rss_kib()
        held = cache.tokens if cache is not None else 0
        entries = len(cache) if cache is not None else 0
        arrays = cache_array_bytes(cache) if cache is not None else 0
        rows.append({"done": done, "entries": entries, "held": held, "most": most_held, "arrays": arrays,
                     "rss": rss, "hwm": hwm})  # fmt: skip

    checkpoint(0)
    for i in range(1, args.requests + 1):
        prompt = rng.integers(1, args.vocab, size=args.prompt_tokens).tolist()
        reply = rng.integers(1, args.vocab, size=args.reply_tokens).tolist()
        model.script = prompt + reply
        scope = i % args.scopes
        finished = None
        for event in engine.stream(prompt, params, cache_scope=scope if cache is not None else None):
            if isinstance(event, Finished):
                finished = event
        if finished is None or list(finished.tokens) != reply:
            raise AssertionError(f"request {i}: the reply is not the scripted one")
        if cache is not None:
            most_held = max(most_held, cache.tokens)
            if cache.tokens > cache.max_tokens:
                raise AssertionError(f"request {i}: the cache holds {cache.tokens} tokens, over {cache.max_tokens}")
        if i % args.every == 0 or i == args.requests:
            checkpoint(i)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests run, one after another")
    parser.add_argument("--cache-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="the cache's token bound")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="tokens of each request's prompt")
    parser.add_argument("--reply-tokens", type=int, default=256, help="tokens of each request's reply")
    parser.add_argument("--vocab", type=int, default=32000, help="the fake target's vocabulary")
    parser.add_argument("--scopes", type=int, default=1, help="scopes the requests take turns in")
    parser.add_argument("--every", type=int, default=250, help="requests between checkpoints")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", choices=("cache", "nocache"), help=argparse.SUPPRESS)  # a child's own run
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args, args.one == "cache")))
        return
    runs = {}
    for mode in ("cache", "nocache"):
        child = [sys.executable, __file__, *sys.argv[1:], "--one", mode]
        out = subprocess.run(child, check=True, capture_output=True, text=True)
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    per_entry = args.reply_tokens + CACHE_LEAD  # an entry: the output led by the prompt's last tokens
    print(
        f"{args.requests} requests of {args.prompt_tokens} + {args.reply_tokens} tokens, cache bound "
        f"{args.cache_tokens:,} tokens (~{args.cache_tokens // per_entry} entries), {args.scopes} scope(s); MiB"
    )
    print(f"{'requests':>8} {'entries':>7} {'tokens held':>11} {'cache arrays':>12} {'RSS cache':>9} "
          f"{'RSS no cache':>12} {'difference':>10}")  # fmt: skip
    for on, off in zip(runs["cache"], runs["nocache"], strict=True):
        print(
            f"{on['done']:>8} {on['entries']:>7} {on['held']:>11,} {on['arrays'] / 2**20:>12.2f} "
            f"{on['rss'] / 1024:>9.1f} {off['rss'] / 1024:>12.1f} {(on['rss'] - off['rss']) / 1024:>10.1f}"
        )
    last_on, last_off = runs["cache"][-1], runs["nocache"][-1]
    print(
        f"most tokens held after a request: {last_on['most']:,} (bound {args.cache_tokens:,}); peak RSS (VmHWM) "
        f"{last_on['hwm'] / 1024:.1f} MiB with the cache, {last_off['hwm'] / 1024:.1f} MiB without"
    )


if __name__ == "__main__":
    main()
