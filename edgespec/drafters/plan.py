"""What a round is planned as, what it is planned against, and what plans it.

A :class:`Plan` is one round's drafter and γ; a :class:`Free` is a proposal made without running a model (prompt
lookup's or the suffix cache's); a :class:`Load` is what the other sequences put into the same target decode; a
:class:`SettledPlan` is a plain plan that stands while the load it was made against holds. A
:class:`RoundController` chooses among the free proposals, turns one and a load into a plan and learns from what
the round did.
:class:`FixedController` is the one that always plans the same (``--draft-len G``); the adaptive one is
:class:`~edgespec.drafters.controller.Controller`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from edgespec.drafters.estimates import DecayedRatio

LOOKUP = "lookup"  # the drafter whose proposal is given to plan() (it is computed first, every round)
# A free proposal's other source: the suffix cache of earlier requests. It is planned as LOOKUP (a Plan's drafter is
# never CACHE): both cost nothing to make and are one-hot drafts, so the planner has one path for free drafts.
CACHE = "cache"


@dataclass(frozen=True)
class Plan:
    drafter: str | None  # "model", "lookup", or None (= plain decoding, γ=0)
    gamma: int  # tokens to draft/verify (0 iff drafter is None)
    reason: str = ""  # short human text: the estimates behind the choice
    expected: float = 1.0  # the tokens the round is expected to commit (what the next sequence's Load counts)
    draft_seconds: float = 0.0  # what its drafting is expected to cost (likewise)

    def __post_init__(self) -> None:
        if self.gamma < 0 or (self.drafter is None) != (self.gamma == 0):
            raise ValueError(f"a plan drafts (drafter set, gamma > 0) or not (None, 0); got {self!r}")


@dataclass(frozen=True)
class Free:
    """A proposal made every round without running a model, and what its forecast reads of where it came from."""

    tokens: Sequence[int]  # d_1 .. d_k (empty: nothing found)
    source: str = LOOKUP  # LOOKUP (the request's own text) or CACHE (earlier requests' outputs)
    agreement: int = 0  # how firmly it is anchored: lookup's last_agreement, the cache's match length
    from_prompt: bool = False  # lookup's last_from_prompt


NOTHING = Free(())


@dataclass(frozen=True)
class Load:
    """What the other sequences put into the same target decode, as planned so far this step: their rows, the
    tokens they are expected to commit, and the seconds their drafting is expected to add; ``room``: the rows this
    sequence may add (the decode's row budget less theirs). A lone sequence plans against :data:`NO_LOAD`."""

    rows: int = 0
    tokens: float = 0.0
    seconds: float = 0.0
    room: int = 1 << 30
    # The rows of each forward pass the decode will run if this sequence puts ``n`` rows into it; None: one pass.
    # (llama.cpp splits a decode of several sequences into passes that cost about a decode each: a draft beside
    # others' single rows is a pass of its own. See edgespec.models.microbatch.)
    passes: Callable[[int], Sequence[int]] | None = None
    # The others as sequences: how many share the decode (a prompt chunk's every row counted as one, as its
    # tokens are), and the sum of the logs of what each is expected to commit (0 for a plain row or a prompt row).
    # Given, the batch's tokens are counted as their geometric mean (see batch_tokens); None: summed.
    sequences: int | None = None
    log_tokens: float = 0.0

    def batch_tokens(self, own: float) -> float:
        """The tokens the decode counts for, if this sequence is expected to commit ``own`` of them.

        With the others given as sequences: as many times the sequences' geometric mean, which is their sum while
        they all commit alike, and less when one gets ahead at the others' cost. A draft beside plain rows adds a
        forward pass that every sequence in the decode waits for (see ``passes``): counted by the sum, a long draft
        whose pass took longer than the others' plain rows looked worth it to the batch while it slowed the others
        severalfold, and a run's last requests then finished last, in a half-empty batch. Counted so, drafting under
        load is chosen when it lifts the batch as a whole, as it does when the lanes' drafts share a pass (on a GPU,
        when the pass costs little). A lone sequence: its own tokens either way."""
        if self.sequences is None or self.sequences == 0:
            return own + self.tokens
        n = self.sequences + 1
        return n * math.exp((self.log_tokens + math.log(max(own, 1e-9))) / n)

    def decode_seconds(self, curve: Sequence[float], n: int) -> float:
        """What the decode costs, read off ``curve`` (one pass of b rows), if this sequence puts ``n`` rows in."""
        if self.passes is None:
            return curve[self.rows + n]
        return sum(curve[b] for b in self.passes(n))


NO_LOAD = Load()


@dataclass
class SettledPlan:
    """A plain plan that stands for the next ``rounds`` rounds while what it was made from holds: the load (as
    :func:`load_key`, and the others' drafting seconds within ``slack`` of ``seconds``), the free proposal no firmer
    than the one it turned down (``offered``: its agreement bucket and length, (-1, 0) for none; ``source``: where it
    came from)."""

    plan: Plan
    load: tuple[float, ...]
    seconds: float
    slack: float
    rounds: int
    offered: tuple[int, int] = (-1, 0)
    source: str = LOOKUP

    def turned_down(self, offered: tuple[int, int], source: str = LOOKUP) -> bool:
        """Whether a proposal in this (bucket, length) is one the plan already turned down: no better anchored and no
        longer, from the same source (the buckets of two sources' forecasts say different things). (A copy getting
        under way raises its agreement every round, and is planned for anew.)"""
        if offered == (-1, 0):
            return True
        return source == self.source and offered[0] <= self.offered[0] and offered[1] <= self.offered[1]

    def holds(self, load: Load) -> bool:
        # The others' seconds are their drafts' expected costs, and a draft model's per-token cost moves with every
        # draft it makes: within a tenth of a step they are the same load.
        return load_key(load) == self.load and abs(load.seconds - self.seconds) <= self.slack


def load_key(load: Load) -> tuple[float, ...]:
    """What a :class:`SettledPlan` holds of the load it was made against, but the others' drafting seconds."""
    return (load.rows, load.tokens, load.room, load.sequences or 0, load.log_tokens)


class DecodeSeconds:
    """What one plan reads off the curve: the decode's cost by the rows this sequence puts in, each width worked out
    once (a plan weighs a width for each drafter), and ``floor``,
    which no width costs less than: the curve's cheapest entry the decode can land on (a decode is one pass or more,
    each of at least one row)."""

    def __init__(self, load: Load, curve: Sequence[float]) -> None:
        self._load, self._curve = load, curve
        self._known: dict[int, float] = {}
        self.floor = min(curve[load.rows + 1 :] if load.passes is None else curve[1:])

    def __call__(self, n: int) -> float:
        seconds = self._known.get(n)
        if seconds is None:
            seconds = self._known[n] = self._load.decode_seconds(self._curve, n)
        return seconds


class RoundController(Protocol):
    """What the engine needs from :class:`~edgespec.drafters.controller.Controller` and :class:`FixedController`."""

    max_gamma: int

    def offer(self, found: Sequence[Free]) -> Free: ...

    def plan(
        self,
        lookup: Sequence[int] = (),
        load: Load = NO_LOAD,
        remaining: int | None = None,
        agreement: int = 0,
        from_prompt: bool = False,
    ) -> Plan: ...

    def observe(
        self,
        plan: Plan,
        *,
        n_drafted: int,
        n_accepted: int,
        t_draft: float,
        t_verify: float,
        committed: Sequence[int] = (),
        record_verify: bool = True,
    ) -> None: ...

    @property
    def plain_tokens_per_second(self) -> float: ...

    def start_request(self, behind: Mapping[str, int] | None = None) -> None: ...

    def certain_len(self, n: int, load: Load = NO_LOAD) -> int: ...

    def record_costs(
        self,
        verify: dict[int, float],
        draft: dict[str, float],
        catchup: dict[str, float] | None = None,
        switch: float | None = None,
    ) -> None: ...


class FixedController:
    """``--draft-len G``: always the same drafter and γ (lookup capped at what it found; G=0: plain)."""

    def __init__(self, drafter: str | None, gamma: int) -> None:
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if gamma > 0 and drafter is None:
            raise ValueError("a fixed gamma > 0 needs a drafter")
        self.drafter = drafter if gamma > 0 else None
        self.gamma = gamma
        self.max_gamma = gamma
        self._plain = DecayedRatio(0.9)
        # The same plan every round (a lookup's γ depends on what it found)
        self._plan = Plan(None, 0, "fixed: plain decoding") if self.drafter is None else Plan(
            self.drafter, gamma, f"fixed: {self.drafter} γ={gamma}"
        )

    @property
    def plain_tokens_per_second(self) -> float:
        c1 = self._plain.value
        return 1.0 / c1 if c1 else 0.0

    def offer(self, found: Sequence[Free]) -> Free:
        """The longest of the free proposals (the first given on a tie): a fixed γ drafts as far as one goes."""
        return max(found, key=lambda free: len(free.tokens), default=NOTHING)

    def start_request(self, behind: Mapping[str, int] | None = None) -> None:
        """A fixed plan keeps no per-drafter state that a new request would change."""

    def certain_len(self, n: int, load: Load = NO_LOAD) -> int:
        """A fixed plan takes every token a constraint forces (within the decode's room)."""
        return max(min(n, load.room - 1), 0)

    def record_costs(
        self,
        verify: dict[int, float],
        draft: dict[str, float],
        catchup: dict[str, float] | None = None,
        switch: float | None = None,
    ) -> None:
        """A fixed plan needs no costs; the plain rate it reports comes from its own 1-token rounds."""
        if 1 in verify:
            self._plain.add(verify[1])

    def plan(
        self,
        lookup: Sequence[int] = (),
        load: Load = NO_LOAD,
        remaining: int | None = None,
        agreement: int = 0,
        from_prompt: bool = False,
    ) -> Plan:
        """The fixed plan, whatever the load and the tokens left; only the decode's row budget (``load.room``) can
        shorten it."""
        if load.room <= self.gamma:
            gamma = min(len(lookup), load.room - 1) if self.drafter == LOOKUP else load.room - 1
            if gamma <= 0:
                return Plan(None, 0, "fixed: no rows left in this decode")
            return Plan(self.drafter, gamma, f"fixed: {self.drafter} γ={gamma} (rows left in this decode)")
        if self.drafter != LOOKUP or len(lookup) >= self.gamma:
            return self._plan
        if not lookup:
            return Plan(None, 0, "fixed: lookup found nothing")
        return Plan(LOOKUP, len(lookup), f"fixed: {LOOKUP} γ={len(lookup)}")

    def observe(
        self,
        plan: Plan,
        *,
        n_drafted: int,
        n_accepted: int,
        t_draft: float,
        t_verify: float,
        committed: Sequence[int] = (),
        record_verify: bool = True,
    ) -> None:
        if n_drafted == 0 and record_verify:
            self._plain.add(t_verify)

    def record_decode(self, rows: int, seconds: float) -> None:
        """A shared decode: the plain rate this reports is a lone sequence's, so only 1-row decodes count."""
        if rows == 1:
            self._plain.add(seconds)
