"""The engine at a GPU's decode costs, on a CPU: auto against plain decoding with all of edgespec's Python left.

A scripted target answers every decode with plain decoding's recorded greedy tokens (tests/data/qwen_traces.json:
the Qwen pair's answers to the bench's prompts) and waits as long as a cost profile says a decode of that many
rows takes (by default the H200's measured curve, ``H200_PROFILE``, plus ``--switch-ms`` when the width changes:
llama.cpp builds a new graph then), for each forward pass llama.cpp would cut the decode into with a KV buffer per
sequence (:mod:`edgespec.models.microbatch`: 1, 1 and 5 rows are a pass of 3 and one of 4). What is measured is
then the loop's own time beside a GPU-fast decode: plans, lookup and its checks, the controllers' bookkeeping. It is
an emulation, not a GPU measurement: the real adapter's Python (filling llama.cpp's batch, reading the rows) is not in
it, and the decode waits on this CPU's clock.

    python tests/gpu_regime.py --lanes 1,4 --rounds 2
    python tests/gpu_regime.py --agent --lanes 1,4 --rounds 1

Each class's prompts are repeated (to twice the lanes), so ``auto`` runs without a suffix cache there: a repeat
would copy its own earlier answer. ``--agent`` replays the agent class instead (tests/data/agent_traces.json), its
32 requests once each and in order, as the bench runs it: ``auto`` drafts from the replies before (a suffix cache,
emptied before each round), ``auto-nocache`` does not.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fakes import FakeModel  # noqa: E402

from edgespec.bench.load import closed_loop, engine_runner  # noqa: E402
from edgespec.drafters.controller_sim import H200_PROFILE, CostProfile  # noqa: E402
from edgespec.drafters.suffix_cache import SuffixCache  # noqa: E402
from edgespec.engine import Engine  # noqa: E402
from edgespec.models.microbatch import decode_passes  # noqa: E402
from edgespec.sampling import SamplingParams  # noqa: E402

TRACES = Path(__file__).resolve().parent / "data" / "qwen_traces.json"
AGENT_TRACES = Path(__file__).resolve().parent / "data" / "agent_traces.json"
END = 151645  # Qwen's <|im_end|>: what the script answers past a recorded answer's end
KEY = 8  # tokens of context that identify a place in a script


class ScriptedModel(FakeModel):
    """A target whose argmax after a prefix is the next token of the script that prefix is a part of, and whose
    decodes take ``profile``'s time for their rows (all sequences' together)."""

    def __init__(self, scripts: Sequence[Sequence[int]], profile: CostProfile, switch: float, n_seq: int = 1):
        super().__init__(n_vocab=151936, n_ctx=4096, n_seq=n_seq)
        self.n_batch = 512
        self.profile, self.switch = profile, switch
        self._last_rows: int | None = None
        self._next: dict[tuple[int, tuple[int, ...]], int] = {}
        for script in scripts:
            for p in range(1, len(script)):
                self._next[(p, tuple(script[max(0, p - KEY) : p]))] = script[p]

    def _wait(self, rows: int) -> None:
        seconds = self.profile.verify(rows) + (self.switch if rows != self._last_rows else 0.0)
        self._last_rows = rows
        end = time.perf_counter() + seconds
        if seconds > 4e-4:  # sleep (the GIL released, as during llama_decode), then wait out the rest exactly
            time.sleep(seconds - 3e-4)
        while time.perf_counter() < end:
            pass
        self.busy_seconds += seconds

    def decode_passes(self, tokens_by_seq):
        return decode_passes(tokens_by_seq, self.n_batch, gaps_filled=True)

    def decode_batch(self, parts):
        self.batches.append([len(rows) for _, _, rows, _ in parts])
        # As llama.cpp runs it with a KV buffer per sequence: one forward pass per micro-batch (see microbatch).
        for rows in self.decode_passes({slot.seq_id: len(tokens) for slot, tokens, _, _ in parts}):
            self._wait(rows)
        return [self._score(slot, tokens, rows, readout) for slot, tokens, rows, readout in parts]

    def _decode_on(self, seq, tokens, rows, readout):
        self._wait(len(tokens))
        return self._score(seq, tokens, rows, readout)

    def _score(self, seq, tokens, rows, readout):
        start = len(seq.kv_tokens)
        seq.kv_tokens.extend(tokens)
        self.decode_calls.append((len(tokens), len(rows)))
        best = []
        for i in rows:
            p = start + i + 1
            best.append(self._next.get((p, tuple(seq.kv_tokens[max(0, p - KEY) : p])), END))
        if readout.kind == "argmax":
            return best
        import numpy as np  # whole rows (a calibration's first decode): the scripted token on top

        logits = np.zeros((len(best), self.n_vocab), dtype=np.float32)
        logits[np.arange(len(best)), best] = 10.0
        return logits

    def is_eog(self, token: int) -> bool:
        return token == END

    def piece(self, token: int) -> bytes:
        return b"" if token == END else b"x"

    def token_text(self, token: int) -> str:
        return "" if token == END else "x"


def load_traces(path: Path = TRACES) -> dict[str, list[dict]]:
    classes: dict[str, list[dict]] = {}
    for trace in json.loads(path.read_text())["traces"]:
        classes.setdefault(trace["task"], []).append(trace)
    return classes


def load_agent_traces(path: Path = AGENT_TRACES) -> dict[str, list[dict]]:
    """The agent class's recorded replies, in the order its requests run (the held-out sequences left out)."""
    return {"agent": load_traces(path)["agent"]}


STRATEGIES = ("plain", "auto")
AGENT_STRATEGIES = ("plain", "auto", "auto-nocache")


def measure(
    classes: dict[str, list[dict]],
    lanes: int,
    *,
    rounds: int = 2,
    switch: float = 0.001,
    profile: CostProfile = H200_PROFILE,
    max_tokens: int | None = None,
    in_order: bool = False,
) -> dict[tuple[str, str], list[float]]:
    """(class, strategy) -> [tokens, seconds, drafted, accepted], greedy, the strategies taking turns per class and
    round; ``lanes`` clients at once, each class's prompts repeated to twice the lanes (at least 3). ``in_order``: each
    class's prompts once each, in order, to the end of each recorded reply (the agent class: see the module doc), and
    auto with the suffix cache and without it."""
    scripts = [t["prompt"] + t["output"] for traces in classes.values() for t in traces]
    model = ScriptedModel(scripts, profile, switch, n_seq=lanes)
    strategies = AGENT_STRATEGIES if in_order else STRATEGIES
    engines = {name: _engine(name, model, lanes, cache=in_order) for name in strategies}
    first = next(iter(classes.values()))[0]
    for engine in engines.values():  # the calibration and first calls out of the measurement
        warm = engine.stream(first["prompt"], SamplingParams(temperature=0.0, max_tokens=8), cache_prompt=False)
        for _ in warm:
            pass
    totals: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for name, traces in classes.items():
            jobs = [(t["prompt"], None) for t in traces]
            if not in_order:
                jobs = (jobs * (2 * lanes))[: max(2 * lanes, 3)]
            lengths = [len(t["output"]) for t in traces]
            # in order, each to its recorded end (past it the script answers the end of turn); else all alike
            n = max_tokens or (max(lengths) + 1 if in_order else min(lengths))
            params = SamplingParams(temperature=0.0, max_tokens=n)
            for strategy in strategies[r % len(strategies) :] + strategies[: r % len(strategies)]:
                engine = engines[strategy]
                if engine.suffix_cache is not None:  # the class's earlier replies only, as the bench's fresh engine
                    engine.suffix_cache.clear()
                record = closed_loop(engine_runner(engine), jobs, lanes, params)
                x = totals.setdefault((name, strategy), [0.0, 0.0, 0.0, 0.0])
                x[0] += record.generated
                x[1] += record.wall
                x[2] += sum(q.drafted for q in record.requests)
                x[3] += sum(q.accepted for q in record.requests)
    return totals


def _engine(name: str, model: ScriptedModel, lanes: int, *, cache: bool) -> Engine:
    if name == "plain":
        return Engine(model, None, draft_len=0, lookup=False, parallel=lanes)
    suffix_cache = SuffixCache() if cache and name == "auto" else None
    return Engine(model, None, draft_len="auto", lookup=True, parallel=lanes, suffix_cache=suffix_cache, cache_scope=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", default="1,4", help="comma-separated numbers of clients at once")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per class (the strategies' order alternates)")
    parser.add_argument("--switch-ms", type=float, default=1.0, help="what a change of width adds to a decode")
    parser.add_argument("--classes", default="", help="comma-separated classes (default: all six)")
    parser.add_argument("--agent", action="store_true", help="the agent class in order, auto with and without a cache")
    args = parser.parse_args()
    classes = load_agent_traces() if args.agent else load_traces()
    if args.classes:
        classes = {c: classes[c] for c in args.classes.split(",")}
    others = AGENT_STRATEGIES[1:] if args.agent else STRATEGIES[1:]
    print(f"scripted target at H200_PROFILE's costs, +{args.switch_ms:g} ms a change of width; tok/s, x plain")
    heads = "".join(f" {s:>13} {'x':>6} {'drafted':>8} {'accepted':>8}" for s in others)
    print(f"{'lanes':>5} {'class':<10} {'plain':>8}{heads}")
    for lanes in (int(x) for x in args.lanes.split(",")):
        totals = measure(classes, lanes, rounds=args.rounds, switch=args.switch_ms / 1e3, in_order=args.agent)
        for name in classes:
            plain = totals[(name, "plain")]
            p = plain[0] / plain[1]
            cells = ""
            for s in others:
                tokens, seconds, drafted, accepted = totals[(name, s)]
                cells += f" {tokens / seconds:13.1f} {tokens / seconds / p:6.3f} {int(drafted):>8} {int(accepted):>8}"
            print(f"{lanes:>5} {name:<10} {p:8.1f}{cells}")


if __name__ == "__main__":
    main()
