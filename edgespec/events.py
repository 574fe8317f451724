"""What the engine yields: frozen event dataclasses, spans of text, and a stats snapshot per event.

CLI, TUI, bench and any server consume these; none of them reaches into the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

FinishReason = Literal["stop", "eos", "length", "cancelled"]


@dataclass
class Stats:
    """Counters and timings of one request (a snapshot; the engine makes a new one per event and never changes it;
    not frozen because a frozen dataclass costs the loop ~10 µs more per round to build).

    Times are seconds of wall clock. ``t_draft`` is time inside the drafter (draft model decodes and its
    sampling), ``t_verify`` the target's batched decodes, ``t_sample`` warping and acceptance on the target side,
    ``t_prefill`` the prompt's decode. Whatever else the loop spends is ``t_other``.
    """

    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually decoded (a reused KV prefix is not re-decoded)
    generated: int = 0  # tokens committed to the output
    rounds: int = 0  # target verify calls after the prefill
    drafted: int = 0  # draft tokens sent to the target for verification
    accepted: int = 0  # of those, how many the target accepted
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_sample: float = 0.0
    t_total: float = 0.0
    t_llama: float = 0.0  # of the time after the prefill, how much was spent inside llama.cpp decodes (both models)
    accepted_per_round: tuple[
        int, ...
    ] = ()  # histogram: accepted_per_round[k] = rounds that accepted k drafts
    drafter: str = "none"  # what the last round used: "none", "model", "lookup", "cache", "forced"
    draft_len: int = 0  # γ of the last round
    decision: str = ""  # why the controller chose it (estimates and costs), for display
    plain_tokens_per_second: float = (
        0.0  # plain-decoding rate estimated from measured 1-token verifies; 0 = unknown
    )
    sampling_path: str = ""  # where the target's rows were sampled: in llama.cpp's graph, or numpy on whole rows
    forced: int = 0  # of the accepted drafts, those the output's constraint forced (proposed without a drafter)
    # Drafted and accepted tokens copied from the request's own prompt and output (prompt lookup), and from earlier
    # requests' outputs (the suffix cache)
    lookup_drafted: int = 0
    lookup_accepted: int = 0
    cache_drafted: int = 0
    cache_accepted: int = 0
    rereads: int = 0  # constrained rows whose candidates held too few allowed tokens, read again whole
    t_constraint: float = 0.0  # of the time outside llama.cpp, the constraint engine's (masks, its state)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verify(self) -> float:
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def t_decode(self) -> float:
        """Wall time after the prompt was processed."""
        return max(self.t_total - self.t_prefill, 0.0)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.t_decode if self.t_decode > 0 else 0.0

    @property
    def t_other(self) -> float:
        return max(self.t_total - self.t_prefill - self.t_draft - self.t_verify - self.t_sample, 0.0)

    @property
    def t_outside(self) -> float:
        """Post-prefill wall time spent outside llama.cpp's decodes: the Python loop's own cost."""
        return max(self.t_decode - self.t_llama, 0.0)

    @property
    def outside_ms_per_token(self) -> float:
        return 1e3 * self.t_outside / self.generated if self.generated else 0.0

    @property
    def python_overhead(self) -> float:
        """Share of the post-prefill wall time spent outside llama.cpp: the Python loop's cost."""
        return self.t_outside / self.t_decode if self.t_decode > 0 else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "generated": self.generated,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_verify": round(self.tokens_per_verify, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "t_prefill": round(self.t_prefill, 4),
            "t_draft": round(self.t_draft, 4),
            "t_verify": round(self.t_verify, 4),
            "t_sample": round(self.t_sample, 4),
            "t_other": round(self.t_other, 4),
            "t_total": round(self.t_total, 4),
            "t_llama": round(self.t_llama, 4),
            "python_overhead": round(self.python_overhead, 4),
            "accepted_per_round": list(self.accepted_per_round),
            "drafter": self.drafter,
            "draft_len": self.draft_len,
            "plain_tokens_per_second": round(self.plain_tokens_per_second, 3),
            "outside_ms_per_token": round(self.outside_ms_per_token, 4),
            "sampling_path": self.sampling_path,
            "forced": self.forced,
            "lookup_drafted": self.lookup_drafted,
            "lookup_accepted": self.lookup_accepted,
            "cache_drafted": self.cache_drafted,
            "cache_accepted": self.cache_accepted,
            "rereads": self.rereads,
            "t_constraint": round(self.t_constraint, 4),
        }


class Span(NamedTuple):
    """A piece of output text and where its token came from (a tuple: one is built per token)."""

    text: str
    from_draft: bool  # True: an accepted draft token; False: sampled from the target (correction/bonus/plain)


class TokenLogprob(NamedTuple):
    """A committed token's log-probability under the target's raw softmax at its position (its logits before any
    penalty, bias, temperature or truncation: what OpenAI and llama-server report), and the ``top`` most likely
    tokens there with theirs, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Chunk:
    """Output of one round: the committed tokens and the text that became printable with them.

    ``text`` can be empty (an incomplete UTF-8 character or a possible stop string is held back) and can carry
    text of earlier tokens once it is released; ``spans`` split ``text`` by origin for highlighting.
    """

    text: str
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]  # one flag per token in ``tokens``
    spans: tuple[Span, ...]
    stats: Stats
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token in ``tokens`` when the request asked for them


@dataclass(frozen=True)
class Finished:
    """The last event of a request."""

    text: str  # the whole output text (stop string excluded)
    tokens: tuple[int, ...]  # the whole output's token ids
    finish_reason: FinishReason
    stats: Stats
    stopped_by: str | None = field(default=None)  # the stop string or EOG token text that ended it
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token in ``tokens`` when the request asked for them
    # with prompt_logprobs: one per prompt token, the first None (nothing precedes it)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()


Event = Chunk | Finished
