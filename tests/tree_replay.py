"""Trees against chains of the same rows, on the recorded outputs: the agent sequences' from the suffix cache, the
bench's other classes (tests/data/qwen_traces.json) from prompt lookup's several earlier occurrences.

    .venv/bin/python tests/tree_replay.py

A replay, not a ceiling: an oracle that knows the output drafts the right branch as a chain, so trees only pay a
drafter that does not know it. For each sequence of tests/data/agent_traces.json, its requests in order with the
earlier outputs in a :class:`~edgespec.drafters.suffix_cache.SuffixCache` (as tests/agent_ceiling.py fills it),
greedy rounds are replayed against the recorded output (the target's own greedy text, so a drafted token is accepted
exactly when it is the recorded one) with a fixed budget of ``rows`` drafted rows a round:

* *chain*: the cache's proposal, up to ``rows`` tokens;
* *tree*: the ``rows`` worthiest nodes of the trie of what followed the cache's match
  (:func:`~edgespec.drafters.tree.from_occurrences`, :func:`~edgespec.drafters.tree.best_tree`), accepted by the
  greedy tree walk; a path that leaves the tree's first-child path pays one more decode of the rest of it
  (:func:`edgespec.models.tree_kv.keep_path` decodes it again);
* *tree, kept in place*: the same without that decode, as a KV whose cell order does not change the sums would
  allow (flash attention off, on SmolLM2: tests/test_tree_kv.py).

A round without a proposal is a plain decode. Each decode is priced at the H200's curve for the Qwen 1.5B
(``H200_PROFILE``), plus 1 ms when its width differs from the last one's (llama.cpp builds a new graph), as the GPU
emulation prices it. The table gives each policy's speed over plain decoding, pooled over a class's sequences.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from edgespec.drafters.controller_sim import H200_PROFILE
from edgespec.drafters.lookup import LookupDrafter
from edgespec.drafters.suffix_cache import MIN_PROB, SuffixCache
from edgespec.drafters.tree import best_tree, from_occurrences
from edgespec.models.tree_kv import depths, tree_order
from edgespec.tree_verify import verify_tree_greedy

DATA = Path(__file__).resolve().parent / "data" / "agent_traces.json"
TRACES = Path(__file__).resolve().parent / "data" / "qwen_traces.json"  # the bench's other classes
LEAD = 8  # prompt tokens cached before each output, as tests/agent_ceiling.py
SWITCH = 0.001
BUDGETS = (2, 4, 8, 16)


class Clock:
    """Seconds of the decodes so far, a change of width charged ``switch``."""

    def __init__(self, cost: Callable[[int], float], switch: float = SWITCH) -> None:
        self.cost, self.switch = cost, switch
        self.seconds, self._last = 0.0, 1

    def decode(self, rows: int) -> None:
        self.seconds += self.cost(rows) + (self.switch if rows != self._last else 0.0)
        self._last = rows


class Source(Protocol):
    """Where a round's drafts come from: a chain proposal, or the continuations of several earlier occurrences."""

    def propose(self, context: list[int], max_len: int) -> Sequence[int]: ...

    def continuations(self, context: list[int], max_len: int) -> list[list[int]]: ...


class FromCache:
    def __init__(self, cache: SuffixCache, scope: object) -> None:
        self.cache, self.scope = cache, scope

    def propose(self, context: list[int], max_len: int) -> Sequence[int]:
        return self.cache.propose(self.scope, context, max_len).tokens

    def continuations(self, context: list[int], max_len: int) -> list[list[int]]:
        return self.cache.continuations(self.scope, context, max_len)[0]


class FromLookup:
    """Prompt lookup over the request's own text (a new one per request)."""

    def __init__(self) -> None:
        self.lookup = LookupDrafter()

    def propose(self, context: list[int], max_len: int) -> Sequence[int]:
        return self.lookup.propose(context, max_len).tokens

    def continuations(self, context: list[int], max_len: int) -> list[list[int]]:
        return self.lookup.continuations(context, max_len)


def replay(prompt: list[int], output: list[int], source: Source, policy: str, rows: int, clock: Clock) -> int:
    """One request's rounds under ``policy`` ("plain", "chain", "tree", "tree, kept in place"); returns the rounds
    it took."""
    context, i, rounds = list(prompt), 0, 0
    while i < len(output):
        room = min(rows, len(output) - i - 1)
        target = output[i:]
        accepted, width, redo = 0, 1, 0
        if policy == "chain" and room > 0:
            chain = source.propose(context, room)
            while accepted < len(chain) and chain[accepted] == target[accepted]:
                accepted += 1
            width = 1 + len(chain)
        elif policy in ("tree", "tree, kept in place") and room > 0:
            found = source.continuations(context, room)
            tree = best_tree(from_occurrences(found, room, MIN_PROB), room).tree
            depth = depths(tree.parents)
            # The target's argmax after each node: the recorded token at that depth where the node's path is the
            # recorded text (elsewhere it is never read: the walk only descends along the recorded text).
            top = [target[0]] + [target[depth[k]] if depth[k] < len(target) else -1 for k in range(len(tree.tokens))]
            verdict = verify_tree_greedy(tree, top)
            accepted, width = len(verdict.path), 1 + len(tree.tokens)
            order = tree_order(tree.parents)
            on_first = 0
            while on_first < accepted and order[on_first] == verdict.path[on_first]:
                on_first += 1
            redo = accepted - on_first if policy == "tree" else 0
        clock.decode(width)
        if redo:
            clock.decode(redo)
        context += target[: accepted + 1]
        i += accepted + 1
        rounds += 1
    return rounds


def seconds(traces: list[dict], policy: str, rows: int, source: str) -> float:
    """A sequence's requests in order, drafting from the earlier ones (``source`` "cache"), or each from its own text
    ("lookup")."""
    cache, clock = SuffixCache(), Clock(H200_PROFILE.verify)
    for t in traces:
        drafts: Source = FromCache(cache, "s") if source == "cache" else FromLookup()
        replay(t["prompt"], t["output"], drafts, policy, rows, clock)
        cache.add("s", t["prompt"][-LEAD:] + t["output"])
    return clock.seconds


def main() -> None:
    by_class: dict[str, list[list[dict]]] = {}
    sequences: dict[tuple[str, str], list[dict]] = {}
    for t in json.loads(DATA.read_text())["traces"]:
        sequences.setdefault((t["task"], t["sequence"]), []).append(t)
    for (task, _), traces in sequences.items():
        by_class.setdefault(task, []).append(traces)
    for t in json.loads(TRACES.read_text())["traces"]:  # each request alone
        by_class.setdefault(t["task"], []).append([t])
    print("drafts at the H200 curve (+1 ms a width change), x plain; rows: drafted rows a round")
    print("the agent classes draft from the suffix cache, the others with prompt lookup")
    print(f"{'class':<16}{'rows':>5}{'chain':>8}{'tree':>8}{'tree/chain':>12}{'kept in place':>15}{'/chain':>8}")
    for task, seqs in by_class.items():
        source = "cache" if "agent" in task else "lookup"
        plain = sum(seconds(s, "plain", 0, source) for s in seqs)
        for rows in BUDGETS:
            chain = sum(seconds(s, "chain", rows, source) for s in seqs)
            tree = sum(seconds(s, "tree", rows, source) for s in seqs)
            kept = sum(seconds(s, "tree, kept in place", rows, source) for s in seqs)
            print(
                f"{task:<16}{rows:>5}{plain / chain:>7.3f}x{plain / tree:>7.3f}x{chain / tree:>11.3f}x"
                f"{plain / kept:>14.3f}x{chain / kept:>7.3f}x"
            )


if __name__ == "__main__":
    main()

