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
from edgespec.engine import Engine  # noqa: E402
from edgespec.models.microbatch import decode_passes  # noqa: E402
from edgespec.sampling import SamplingParams  # noqa: E402

TRACES = Path(__file__).resolve().parent / "data" / "qwen_traces.json"
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


def measure(
    classes: dict[str, list[dict]],
    lanes: int,
    *,
    rounds: int = 2,
    switch: float = 0.001,
    profile: CostProfile = H200_PROFILE,
    max_tokens: int | None = None,
) -> dict[tuple[str, str], list[float]]:
    """(class, "plain" | "auto") -> [tokens, seconds, drafted, accepted], greedy, the strategies taking turns per
    class and round; ``lanes`` clients at once, each class's prompts repeated to twice the lanes (at least 3)."""
    scripts = [t["prompt"] + t["output"] for traces in classes.values() for t in traces]
    model = ScriptedModel(scripts, profile, switch, n_seq=lanes)
    engines = {
        "plain": Engine(model, None, draft_len=0, lookup=False, parallel=lanes),
        "auto": Engine(model, None, draft_len="auto", lookup=True, parallel=lanes),
    }
    first = next(iter(classes.values()))[0]
    for engine in engines.values():  # the calibration and first calls out of the measurement
        for _ in engine.stream(first["prompt"], SamplingParams(temperature=0.0, max_tokens=8), cache_prompt=False):
            pass
    totals: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for name, traces in classes.items():
            jobs = [(t["prompt"], None) for t in traces] * (2 * lanes)
            jobs = jobs[: max(2 * lanes, 3)]
            n = min(len(t["output"]) for t in traces) if max_tokens is None else max_tokens
            params = SamplingParams(temperature=0.0, max_tokens=n)
            for strategy in ("plain", "auto") if r % 2 == 0 else ("auto", "plain"):
                record = closed_loop(engine_runner(engines[strategy]), jobs, lanes, params)
                x = totals.setdefault((name, strategy), [0.0, 0.0, 0.0, 0.0])
                x[0] += record.generated
                x[1] += record.wall
                x[2] += sum(q.drafted for q in record.requests)
                x[3] += sum(q.accepted for q in record.requests)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", default="1,4", help="comma-separated numbers of clients at once")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per class (the strategies' order alternates)")
    parser.add_argument("--switch-ms", type=float, default=1.0, help="what a change of width adds to a decode")
    parser.add_argument("--classes", default="", help="comma-separated classes (default: all six)")
    args = parser.parse_args()
    classes = load_traces()
    if args.classes:
        classes = {c: classes[c] for c in args.classes.split(",")}
    print(f"scripted target at H200_PROFILE's costs, +{args.switch_ms:g} ms a change of width; tok/s, auto/plain")
    print(f"{'lanes':>5} {'class':<10} {'plain':>8} {'auto':>8} {'ratio':>6} {'drafted':>8} {'accepted':>8}")
    for lanes in (int(x) for x in args.lanes.split(",")):
        totals = measure(classes, lanes, rounds=args.rounds, switch=args.switch_ms / 1e3)
        for name in classes:
            plain, auto = totals[(name, "plain")], totals[(name, "auto")]
            p, a = plain[0] / plain[1], auto[0] / auto[1]
            print(f"{lanes:>5} {name:<10} {p:8.1f} {a:8.1f} {a / p:6.3f} {int(auto[2]):>8} {int(auto[3]):>8}")


if __name__ == "__main__":
    main()
