"""One measured generation: its record, and an engine's run timed by the engine's own clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgespec.engine import Engine
    from edgespec.sampling import SamplingParams


@dataclass
class RunRecord:
    """One prompt under one strategy. ``token_times`` spreads each round's time over the tokens it made."""

    task: str
    prompt: str
    strategy: str
    generated: int  # tokens committed (an end-of-generation token included)
    decode_tokens: int  # tokens the decode time covers (peers: the first token comes with their prefill)
    t_prefill: float
    t_decode: float
    t_outside: float | None  # decode time spent outside llama.cpp (the Python loop); unknown for peers
    rounds: int  # target decodes after the prompt
    drafted: int
    accepted: int
    finish_reason: str
    text: str
    token_times: list[float] = field(default_factory=list)  # seconds per token, one entry per decode token
    ceiling: float | None = None  # greedy only: the lookup ceiling's speedup on this output (see lookup_ceiling)
    sampling_path: str | None = None  # where the target's rows were sampled (engine runs)
    forced: int = 0  # committed tokens a constraint forced (free drafts)
    t_constraint: float = 0.0  # seconds in the constraint engine (masks, its state): part of t_outside
    repeat: int = 0  # which of the class's repeats (see run_bench's ``repeats``)


def spread(times: list[float], dt: float, n: int) -> None:
    times.extend([dt / n] * n)


def measure_engine(engine: Engine, prompt: Sequence[int], params: SamplingParams) -> dict[str, Any]:
    """Generate once; times come from the engine's own clock in each event's stats, not the consumer's."""
    from edgespec.events import Finished

    times: list[float] = []
    t_mark: float | None = None
    n_mark = 0
    for event in engine.stream(prompt, params):
        s = event.stats
        if t_mark is None:
            t_mark = s.t_prefill
        if s.generated > n_mark:  # a round committed tokens (a tail-only chunk repeats the last stats)
            spread(times, s.t_total - t_mark, s.generated - n_mark)
            t_mark, n_mark = s.t_total, s.generated
        if isinstance(event, Finished):
            done = event
    s = done.stats
    return dict(
        generated=s.generated,
        decode_tokens=s.generated,
        t_prefill=s.t_prefill,
        t_decode=s.t_decode,
        t_outside=s.t_outside,
        rounds=s.rounds,
        drafted=s.drafted,
        accepted=s.accepted,
        finish_reason=done.finish_reason,
        text=done.text,
        token_times=times,
        tokens=list(done.tokens),
        sampling_path=s.sampling_path,
        forced=s.forced,
        t_constraint=s.t_constraint,
    )
