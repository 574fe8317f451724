"""The lookup ceiling on the agent sequences' recorded outputs (tests/data/agent_traces.json), three ways.

    .venv/bin/python tests/agent_ceiling.py

For each sequence, its requests in order, the speedup over plain decoding of the best possible schedule of exact
copies (:func:`~edgespec.drafters.controller_sim.lookup_ceiling`: at every position it drafts exactly as far as the
proposal is right, at the cheapest widths), pooled over the sequence, priced at the recorded dev CPU's decode curve
(``CPU_PROFILE``) and the H200's (``H200_PROFILE``), with γ up to 16:

* *prompt*: prompt lookup over the request's own prompt and output, as today;
* *+earlier*: prompt lookup with the earlier outputs of the same sequence placed before the prompt;
* *lookup|cache*: at each position the longer right proposal of prompt lookup (own text) and of a
  :class:`~edgespec.drafters.suffix_cache.SuffixCache` holding the earlier requests (each output led by the last
  ``LEAD`` tokens of its prompt), as a drafter choosing between the two could at best;
* *lookup|cache, 1 ms a width change* (H200 only): the same, where a decode whose width differs from the last one's
  costs 1 ms more (llama.cpp builds a new graph), as the GPU emulation (tests/gpu_regime.py) prices it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from edgespec.drafters.controller_sim import CPU_PROFILE, H200_PROFILE, lookup_ceiling
from edgespec.drafters.lookup import LookupDrafter
from edgespec.drafters.suffix_cache import SuffixCache

DATA = Path(__file__).resolve().parent / "data" / "agent_traces.json"
MAX_GAMMA = 16
LEAD = 8  # prompt tokens cached before each output: the template's assistant header and the question's last words
CURVES = {"CPU": CPU_PROFILE.verify, "H200": H200_PROFILE.verify}


def _agree(proposal: Sequence[int], output: Sequence[int], i: int) -> int:
    m = 0
    while m < len(proposal) and i + m < len(output) and proposal[m] == output[i + m]:
        m += 1
    return m


def best_schedule(agree: list[int], cost: Callable[[int], float]) -> float:
    """Seconds of the cheapest schedule that drafts at most ``agree[i]`` right tokens at each position i (the
    dynamic program of lookup_ceiling, over given agreements)."""
    costs = [0.0] + [cost(b) for b in range(1, MAX_GAMMA + 2)]
    best = [0.0] * (len(agree) + 1)
    for i in range(len(agree) - 1, -1, -1):
        best[i] = min(costs[g + 1] + best[i + g + 1] for g in range(min(agree[i], MAX_GAMMA) + 1))
    return best[0]


SWITCH = 0.001  # seconds a change of width adds, as tests/gpu_regime.py's default


def best_schedule_with_switch(agree: list[int], cost: Callable[[int], float], switch: float = SWITCH) -> float:
    """:func:`best_schedule` where a decode of another width than the last one's costs ``switch`` more (the state is
    the last decode's width; the first decode follows a plain one)."""
    widths = range(1, MAX_GAMMA + 2)
    costs = [0.0] + [cost(b) for b in widths]
    best = [[0.0] * (MAX_GAMMA + 2) for _ in range(len(agree) + 1)]  # best[i][w]: output[i:] after a width-w decode
    for i in range(len(agree) - 1, -1, -1):
        for w in widths:
            best[i][w] = min(
                costs[g + 1] + (switch if g + 1 != w else 0.0) + best[i + g + 1][g + 1]
                for g in range(min(agree[i], MAX_GAMMA) + 1)
            )
    return best[0][1]


def lookup_or_cache(prompt: list[int], output: list[int], cache: SuffixCache, scope: object) -> list[int]:
    """At each output position, the longer right proposal of prompt lookup and of the cache."""
    lookup = LookupDrafter()
    context = list(prompt)
    lookup.reset(context)
    out = []
    for i in range(len(output)):
        room = min(MAX_GAMMA, len(output) - i - 1)
        own = lookup.propose(context, room).tokens
        cached = cache.propose(scope, context, room).tokens if room else ()
        out.append(max(_agree(own, output, i), _agree(cached, output, i)))
        context.append(output[i])
        lookup.commit(context)
    return out


def seconds(traces: list[dict]) -> dict[str, dict[str, float]]:
    """Per curve: plain decoding's seconds and each way's ceiling seconds over a sequence's requests run in order."""
    out: dict[str, dict[str, float]] = {}
    for curve, cost in CURVES.items():
        cache = SuffixCache()
        took = {"plain": 0.0, "prompt": 0.0, "+earlier": 0.0, "lookup|cache": 0.0, "+switch": 0.0}
        earlier: list[int] = []
        for t in traces:
            prompt, output = t["prompt"], t["output"]
            took["plain"] += len(output) * cost(1)
            took["prompt"] += lookup_ceiling(prompt, output, cost, MAX_GAMMA)
            took["+earlier"] += lookup_ceiling(earlier + prompt, output, cost, MAX_GAMMA)
            agree = lookup_or_cache(prompt, output, cache, "s")
            took["lookup|cache"] += best_schedule(agree, cost)
            if curve == "H200":
                took["+switch"] += best_schedule_with_switch(agree, cost)
            earlier += output
            cache.add("s", prompt[-LEAD:] + output)
        out[curve] = took
    return out


WAYS = ("prompt", "+earlier", "lookup|cache")
COLUMNS = [(c, w) for c in CURVES for w in WAYS] + [("H200", "+switch")]


def main() -> None:
    data = json.loads(DATA.read_text())
    by_sequence: dict[tuple[str, str], list[dict]] = {}
    for t in data["traces"]:
        by_sequence.setdefault((t["task"], t["sequence"]), []).append(t)
    print("lookup ceiling (speedup over plain), requests of a sequence run in order; γ <= 16")
    print(f"{'sequence':<28}{'n':>3}{'tokens':>7}" + "".join(f"{c + ' ' + w:>18}" for c, w in COLUMNS))
    pooled: dict[str, dict[str, dict[str, float]]] = {}

    def row(name: str, n: int, tokens: int, took: dict[str, dict[str, float]]) -> None:
        cells = "".join(f"{took[c]['plain'] / took[c][w]:>17.2f}x" for c, w in COLUMNS)
        print(f"{name:<28}{n:>3}{tokens:>7}{cells}")

    counts: dict[str, tuple[int, int]] = {}
    for (task, seq), traces in by_sequence.items():
        took = seconds(traces)
        tokens = sum(len(t["output"]) for t in traces)
        row(f"{task}/{seq}", len(traces), tokens, took)
        mine = pooled.setdefault(task, {c: dict.fromkeys(took[c], 0.0) for c in CURVES})
        for c in CURVES:
            for k, v in took[c].items():
                mine[c][k] += v
        n, tok = counts.get(task, (0, 0))
        counts[task] = (n + len(traces), tok + tokens)
    for task, took in pooled.items():
        row(f"{task} (pooled)", *counts[task], took)


if __name__ == "__main__":
    main()
