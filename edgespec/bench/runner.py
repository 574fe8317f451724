"""`edgespec bench`: a workload suite run under several decoding strategies on the same loaded models.

Strategies (names as ``--strategies`` takes them):

* ``plain``: the target alone (γ = 0), the reference every speedup is a ratio to;
* ``draft-N``: the draft model at a fixed γ = N, no lookup;
* ``lookup``: prompt lookup at a fixed γ (``lookup_len``), plain rounds where it finds nothing;
* ``auto``: the cost-aware controller over the draft model, lookup and plain, also drafting from the class's
  earlier replies (a suffix cache, as ``edgespec.load`` keeps one by default);
* ``auto-nocache``: the same without the suffix cache;
* ``llama-cpp`` / ``llama-cpp-lookup``: llama-cpp-python's own ``Llama`` on the target file, plain and with
  its ``LlamaPromptLookupDecoding`` (γ = ``lookup_len``), as peers.

Fairness: every strategy uses the same loaded models (the peers load their own copy of the target file, which
the OS shares through mmap), one warm-up generation precedes timing, and for each prompt all strategies run
back to back, starting at a rotating position, so load from other processes hits them alike. Only decoding is
timed: the prompt's prefill (cached across strategies for the engine, not for peers) is excluded. ``auto``
gets one fresh engine per task class, run over all of that class's prompts in order: its estimates (and its
suffix cache) carry over between prompts of one kind of text, as they would in a session, but no class benefits
from what another taught it or wrote.

One pass over a class is a few seconds of decoding per strategy, and on a shared 2-core VM the machine's speed moves
by a few per cent between two runs seconds apart: a class's ratio to plain moves with it, and a share of the lookup
ceiling's gain (below) several times as much (at a ceiling of 1.4x, 3 % of speed is 9 points of share; six runs
of the code edits ranged over 42-52 %). ``repeats`` runs each class that many times over, each repeat a replicate
of the whole class (``auto`` on a fresh engine calibrated anew, the ceiling priced around it); the report pools
the repeats and gives the range of their own ratios and shares beside the pooled ones.

Greedy runs also report each class's *lookup ceiling*: the speedup that the best possible lookup schedule would
reach on plain's output (drafting exactly as far as each proposal turns out right), priced with the mean of the
decode costs measured right before and right after that class (the curve drifts within minutes on a shared VM). No
controller of prompt lookup can beat it, so it says how much of what is there ``auto`` takes, and when a goal is out
of reach on this machine. Each strategy's share of it is taken against the ceiling
of its *own* outputs: a batched verify can flip a greedy near-tie, and the text after the flip may copy more or
less of the prompt than plain's (on the re-indent prompt, plain's answer kept the old indentation, a copy with a
ceiling of 2.3x, and auto's re-indented it, 1.2x).

Speedups are ratios of rates measured side by side in one run; nothing here asserts a time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgespec.bench.measure import RunRecord, measure_engine
from edgespec.bench.peers import Peer
from edgespec.bench.probes import decode_costs
from edgespec.bench.report import BenchResult
from edgespec.bench.strategies import (
    AUTO,
    DEFAULT_LOOKUP_LEN,
    PEER_STRATEGIES,
    WARMUP_TOKENS,
    engine_for,
    parse_strategies,
)
from edgespec.bench.workloads import Task, prompt_job

if TYPE_CHECKING:
    from edgespec.engine import Engine
    from edgespec.models.backend import Model
    from edgespec.sampling import SamplingParams


OnRun = Callable[[RunRecord, int, int], None]  # (record, runs done, runs in all)


def run_bench(
    target: Model,
    draft: Model | None,
    tasks: Sequence[Task],
    strategies: Sequence[str],
    params: SamplingParams,
    *,
    lookup_len: int = DEFAULT_LOOKUP_LEN,
    p_min: float = 0.0,
    warmup: bool = True,
    ceiling: bool = True,
    on_run: OnRun | None = None,
    repeats: int = 1,
) -> BenchResult:
    """Run every prompt of ``tasks`` under every strategy (see the module docstring); collect the records.

    ``ceiling`` (greedy only): also compute, on each output, the speedup of the best possible lookup schedule
    under this machine's decode costs (measured once here): what no lookup controller can beat. ``repeats``: run
    each class that many times over, each a replicate of the whole class (``auto`` on a fresh engine that calibrates
    anew, the strategies' order rotating on, the ceiling priced around that repeat); the report pools them."""
    from edgespec.drafters.controller_sim import lookup_ceiling
    from edgespec.engine import DEFAULT_MAX_GAMMA

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    strategies = parse_strategies(strategies, has_draft=draft is not None)
    jobs = {(t.name, p.id): prompt_job(target, p) for t in tasks for p in t.prompts}
    prompts = {key: tokens for key, (tokens, _) in jobs.items()}
    longest = max((len(p) for p in prompts.values()), default=0)
    engines = {s: engine_for(s, target, draft, lookup_len, p_min) for s in strategies if s not in PEER_STRATEGIES}
    peers: dict[str, Peer] = {}
    total, done = len(prompts) * len(strategies) * repeats, 0
    records: list[RunRecord] = []
    try:
        # The peers keep an n_ctx × n_vocab logits buffer when drafting: size their context to the need.
        peer_ctx = min(target.n_ctx, -(-(longest + params.max_tokens + lookup_len + 16) // 256) * 256)
        for name in strategies:
            if name in PEER_STRATEGIES:
                peers[name] = Peer(
                    target.path,
                    n_ctx=peer_ctx,
                    n_threads=target.n_threads,
                    n_gpu_layers=target.n_gpu_layers,
                    lookup_len=lookup_len if name == "llama-cpp-lookup" else 0,
                )
        if warmup and prompts:
            # First calls pay one-off costs (page faults on mmapped weights, allocations, caches): not timed.
            first = next(iter(prompts.values()))
            short = replace(params, max_tokens=min(WARMUP_TOKENS, params.max_tokens))
            for runner in (*engines.values(), *peers.values()):
                _measure(runner, first, short)

        widths = range(1, DEFAULT_MAX_GAMMA + 2)

        # Priced where the verifies run: after a prompt of the run's median length and half the tokens asked for. A
        # wide decode's attention grows with the context (a 16-token decode measured 7.2 single steps after 64
        # tokens, 7.5 after 400 and 8.0 after 700 on the dev CPU), so costs read after a short context promise a
        # ceiling that the runs' longer contexts cannot reach.
        lengths = sorted(len(p) for p in prompts.values())
        context = lengths[len(lengths) // 2] + params.max_tokens // 2 if lengths else 64

        def price() -> dict[int, float]:
            # A median of 4 per width: of 2 it is their mean, which one slow decode moves, and the ceiling with it.
            return decode_costs(target, widths, reps=4, context=context)

        # The ceiling of a class is priced at the mean of the costs measured right before and right after it: on a
        # 2-core VM the curve drifts within minutes (a 16-token decode at 7.0, 9.3 and 6.8 single steps within one
        # hour), and a ceiling priced at costs from another part of the run says what was possible then, not while
        # the strategies ran.
        priced = ceiling and params.greedy
        curves = [price()] if priced else []  # before the first class, then after each (each of its repeats)
        i = 0
        for task in tasks:
            for repeat in range(repeats):
                for name in AUTO:  # fresh per task class and repeat: see the module docstring
                    if name in engines:
                        engines[name] = engine_for(name, target, draft, lookup_len, p_min)
                outputs: list[tuple[int, list[int], list[int]]] = []  # (record index, prompt, output) to price
                for prompt in task.prompts:
                    order = strategies[i % len(strategies) :] + strategies[: i % len(strategies)]
                    i += 1
                    for name in order:
                        runner = engines[name] if name in engines else peers[name]
                        tokens, grammar = jobs[(task.name, prompt.id)]
                        if grammar is not None and name in peers:  # llama-cpp-python's loop takes no llguidance grammar
                            total -= 1
                            continue
                        result = _measure(runner, tokens, replace(params, constraint=grammar))
                        output = result.pop("tokens", None)
                        if priced and output:
                            outputs.append((len(records), tokens, output))
                        records.append(RunRecord(task.name, prompt.id, name, **result, repeat=repeat))
                        done += 1
                        if on_run is not None:
                            on_run(records[-1], done, total)
                if outputs:
                    curves.append(price())
                    cost = {b: (curves[-2][b] + curves[-1][b]) / 2 for b in widths}
                    for at, tokens, output in outputs:
                        seconds = lookup_ceiling(tokens, output, cost.__getitem__, DEFAULT_MAX_GAMMA)
                        records[at] = replace(records[at], ceiling=len(output) * cost[1] / seconds)
    finally:
        for peer in peers.values():
            peer.close()
    config = _config(target, draft, tasks, strategies, params, lookup_len, DEFAULT_MAX_GAMMA)
    config["repeats"] = repeats
    if curves:
        # Seconds per decode by width, as measured before the first class and after each (each of its repeats): how
        # the machine drifted.
        config["ceiling_costs"] = [{str(b): c[b] for b in widths} for c in curves]
        config["ceiling_context"] = context
    return BenchResult(config, records)


def _measure(runner: Engine | Peer, prompt: list[int], params: SamplingParams) -> dict[str, Any]:
    if isinstance(runner, Peer):
        return runner.measure(prompt, params)
    return measure_engine(runner, prompt, params)


def _config(
    target: Model,
    draft: Model | None,
    tasks: Sequence[Task],
    strategies: Sequence[str],
    params: SamplingParams,
    lookup_len: int,
    max_gamma: int,
) -> dict[str, Any]:
    import os
    import platform

    import llama_cpp

    return {
        "target": str(target.path),
        "target_description": target.description,
        "draft": str(draft.path) if draft is not None else None,
        "draft_description": draft.description if draft is not None else None,
        "tasks": [t.name for t in tasks],
        "strategies": list(strategies),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "seed": params.seed,
        "lookup_len": lookup_len,
        "ceiling_max_gamma": max_gamma,
        "n_threads": target.n_threads,
        "n_gpu_layers": target.n_gpu_layers,
        "bit_exact": getattr(target, "bit_exact", False),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
    }
