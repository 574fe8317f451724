"""Probes of this machine rather than of a workload: what a decode of k tokens costs, what a change of width adds, and
what edgespec's own loop costs beside llama.cpp (live and replayed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgespec.bench.measure import measure_engine
from edgespec.bench.tables import format_table
from edgespec.sampling import ARGMAX, Readout

if TYPE_CHECKING:
    from edgespec.models.backend import Model


# ----- decode costs -----------------------------------------------------------------------------------------
COST_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 16)


def decode_costs(
    model: Model,
    widths: Sequence[int] = COST_WIDTHS,
    reps: int = 8,
    readout: Readout = ARGMAX,
    context: int = 64,
) -> dict[int, float]:
    """Median seconds of one decode of k tokens after a ``context``-token context (less if the widest decode would
    not fit after it), every row read back as ``readout`` (as a verify asks; greedy's argmax by default)."""
    import statistics

    from edgespec.calibrate import time_decodes

    context = max(min(context, model.n_ctx - max(widths, default=1) - 1), 1)
    with _after_a_context(model, context) as token:
        # The first use of a batch shape builds a graph: not counted.
        return {k: statistics.median(time_decodes(model, token, k, reps + 1, readout)[1:]) for k in widths}


def width_change_cost(model: Model, reps: int = 8, readout: Readout = ARGMAX) -> float:
    """What a one-token decode costs more right after a 2-token one than after another one-token decode (llama.cpp
    builds a new graph for a batch of another shape), after a 64-token context: see
    :func:`edgespec.calibrate.time_switch`."""
    from edgespec.calibrate import time_switch

    with _after_a_context(model) as token:
        return time_switch(model, token, 2, reps, readout)


@contextmanager
def _after_a_context(model: Model, length: int = 64) -> Iterator[int]:
    """The model's KV holding a context of ``length`` tokens (the token given) while timings are taken, empty after."""
    token = model.vocab.bos if model.vocab.bos >= 0 else 0
    model.truncate(0)
    model.decode([token] * length)
    try:
        yield token
    finally:
        model.truncate(0)


def render_costs(table: dict[str, dict[int, float]], changes: dict[str, float] | None = None) -> str:
    """The decode costs by width, and (``changes``) what a change of width adds, per model."""
    headers = ["model", *(f"k={k}" for k in COST_WIDTHS)]
    rows = [
        [name, *(f"{1e3 * costs[k]:.1f} ms ({costs[k] / costs[1]:.2f}x)" for k in COST_WIDTHS)]
        for name, costs in table.items()
    ]
    notes = "one decode of k tokens: milliseconds (and multiple of a single token), each width decoded again and again"
    if changes:
        headers.append("width change")
        for row, (name, costs) in zip(rows, table.items(), strict=True):
            row.append(f"+{1e3 * changes[name]:.2f} ms ({changes[name] / costs[1]:.0%})")
        notes += (
            "\nwidth change: what a decode adds when its width differs from the last decode's (llama.cpp builds a new "
            "graph; a round that drafts between plain ones pays it twice, and auto prices that)"
        )
    return format_table(headers, rows) + "\n" + notes


# ----- the loop's own cost ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopCost:
    """One strategy at one temperature over the prompts, repeated: what the Python loop costs beside llama.cpp."""

    run: str  # e.g. "plain T=0.8"
    sampling_path: str
    tokens_per_second: float  # pooled over every repetition
    ms_per_token: float  # pooled
    best_ms_per_token: float  # the fastest repetition's
    outside_ms_per_token: float  # pooled: decode time outside llama.cpp's forward passes, per committed token
    outside_ms_per_round: float  # the same per verify round
    replayed_ms_per_token: float = 0.0  # the same runs with each decode's output played back: the loop, caches warm
    replayed_ms_per_round: float = 0.0


def loop_costs(
    target: Model,
    draft: Model | None,
    prompts: Sequence[list[int]],
    temperatures: Sequence[float],
    *,
    max_tokens: int,
    repeats: int = 3,
    draft_gamma: int = 4,
    seed: int = 0,
    on_run: Callable[[], None] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
) -> list[LoopCost]:
    """Plain decoding (and the draft model at a fixed γ, lookup off) at each temperature, the runs alternating
    within each repetition so that a slower spell of the machine hits all of them alike.

    Then each run once more, recorded, and replayed ``repeats`` times with every decode's output played back at once
    (:mod:`edgespec.replay`): the same tokens with no forward pass between the rounds, so what is left outside is
    the loop with warm caches. Sampling uses the CLI's defaults (top-k 40, top-p 0.95, min-p 0.05) at temperatures
    above 0. ``variants``: more sampling settings (a name and SamplingParams fields, e.g. penalties and logprobs),
    each run beside the plain settings at every temperature."""
    from edgespec.engine import Engine
    from edgespec.replay import Recorder, Replay, ReplayDiverged
    from edgespec.sampling import SamplingParams

    gammas = {"plain": 0}
    if draft is not None:
        gammas[f"draft-{draft_gamma}"] = draft_gamma

    def engine(name: str, t: Any, d: Any) -> Engine:
        return Engine(t, d if gammas[name] else None, draft_len=gammas[name], lookup=False)

    engines = {name: engine(name, target, draft) for name in gammas}
    extra = {"": {}, **(variants or {})}
    runs = [(name, t, v) for name in engines for t in temperatures for v in extra]
    totals: dict[tuple[str, float, str], list[dict[str, Any]]] = {run: [] for run in runs}
    for rep in range(repeats):
        for name, t, v in runs:
            params = SamplingParams(temperature=t, max_tokens=max_tokens, seed=seed + rep, **extra[v])
            results = [measure_engine(engines[name], prompt, params) for prompt in prompts]
            totals[(name, t, v)].append(
                dict(
                    tokens=sum(r["generated"] for r in results),
                    rounds=sum(r["rounds"] for r in results),
                    seconds=sum(r["t_decode"] for r in results),
                    outside=sum(r["t_outside"] for r in results),
                    path=results[0]["sampling_path"],
                )
            )
            if on_run is not None:
                on_run()
    replayed: dict[tuple[str, float, str], list[float]] = {}  # outside seconds, tokens, rounds
    for name, t, v in runs:
        params = SamplingParams(temperature=t, max_tokens=max_tokens, seed=seed, **extra[v])
        recorded = []
        for prompt in prompts:
            rec_t, rec_d = Recorder(target), Recorder(draft) if draft is not None else None
            tokens = measure_engine(engine(name, rec_t, rec_d), prompt, params)["tokens"]
            recorded.append((prompt, rec_t, rec_d, tokens))
        sums = [0.0, 0.0, 0.0]
        for _ in range(repeats):
            for prompt, rec_t, rec_d, tokens in recorded:
                r = measure_engine(engine(name, Replay(rec_t), Replay(rec_d) if rec_d else None), prompt, params)
                if r["tokens"] != tokens:
                    raise ReplayDiverged(f"{name} T={t:g} {v}: the replay generated other tokens than the recorded run")
                sums[0] += r["t_outside"]
                sums[1] += r["generated"]
                sums[2] += r["rounds"]
        replayed[(name, t, v)] = sums
        if on_run is not None:
            on_run()
    out = []
    for (name, t, v), reps in totals.items():
        tokens, rounds = sum(r["tokens"] for r in reps), sum(r["rounds"] for r in reps)
        seconds, outside = sum(r["seconds"] for r in reps), sum(r["outside"] for r in reps)
        r_outside, r_tokens, r_rounds = replayed[(name, t, v)]
        out.append(
            LoopCost(
                run=f"{name} T={t:g}" + (f" {v}" if v else ""),
                sampling_path=reps[0]["path"],
                tokens_per_second=tokens / seconds if seconds else 0.0,
                ms_per_token=1e3 * seconds / tokens if tokens else 0.0,
                best_ms_per_token=min(1e3 * r["seconds"] / r["tokens"] for r in reps if r["tokens"]),
                outside_ms_per_token=1e3 * outside / tokens if tokens else 0.0,
                outside_ms_per_round=1e3 * outside / rounds if rounds else 0.0,
                replayed_ms_per_token=1e3 * r_outside / r_tokens if r_tokens else 0.0,
                replayed_ms_per_round=1e3 * r_outside / r_rounds if r_rounds else 0.0,
            )
        )
    return out


def render_loop_costs(rows: Sequence[LoopCost], header: str) -> str:
    table = format_table(
        [
            "run",
            "sampling",
            "tok/s",
            "ms/tok",
            "best ms/tok",
            "outside ms/tok",
            "outside ms/round",
            "replayed ms/tok",
            "replayed ms/round",
        ],
        [
            [
                r.run,
                r.sampling_path,
                f"{r.tokens_per_second:.1f}",
                f"{r.ms_per_token:.2f}",
                f"{r.best_ms_per_token:.2f}",
                f"{r.outside_ms_per_token:.3f}",
                f"{r.outside_ms_per_round:.3f}",
                f"{r.replayed_ms_per_token:.3f}",
                f"{r.replayed_ms_per_round:.3f}",
            ]
            for r in rows
        ],
    )
    return (
        f"{header}\n{table}\n"
        "outside: decode time spent outside llama.cpp's forward passes (the Python loop: drafting logic, warps, "
        "acceptance, bookkeeping); best: the fastest repetition\n"
        "replayed: each run recorded once (the first seed) and played back --repeats times from its decode outputs: "
        "the same tokens and all of edgespec's Python (the batch filled, the rows copied out) with no forward pass "
        "between rounds, so the CPU's caches stay warm; on a CPU most of the gap to 'outside' is refilling the "
        "caches each decode evicts"
    )
