"""A request's running counts and times, and the :class:`~edgespec.events.Stats` snapshot each of its events carries."""

from __future__ import annotations

import time

from edgespec.drafters.plan import Plan, RoundController
from edgespec.events import Stats


class Tally:
    """A request's running counts and times, kept mutable so a round costs additions, not a dataclass copy; each
    event carries a :class:`Stats` snapshot of them."""

    def __init__(self, prompt_tokens: int, max_gamma: int, sampling_path: str) -> None:
        self.prompt_tokens = prompt_tokens
        self.sampling_path = sampling_path
        self.prefilled = 0
        self.t_prefill = 0.0
        self.rounds = self.drafted = self.accepted = 0
        # of those, the free drafts by source: from the request's own text (prompt lookup), from earlier outputs
        self.lookup_drafted = self.lookup_accepted = self.cache_drafted = self.cache_accepted = 0
        self.forced = 0  # accepted tokens the constraint forced
        self.rereads = 0  # constrained verify rows read again whole
        self.t_constraint = 0.0
        self.t_draft = self.t_verify = self.t_sample = 0.0
        self.hist = [0] * (max_gamma + 1)  # hist[k]: rounds that accepted k drafts

    def add_round(
        self, gamma: int, k: int, t_draft: float, t_verify: float, t_sample: float, drafter: str | None = None
    ) -> None:
        self.rounds += 1
        self.drafted += gamma
        self.accepted += k
        if drafter == "lookup":
            self.lookup_drafted += gamma
            self.lookup_accepted += k
        elif drafter == "cache":
            self.cache_drafted += gamma
            self.cache_accepted += k
        self.hist[k] += 1
        self.t_draft += t_draft
        self.t_verify += t_verify
        self.t_sample += t_sample

    def snapshot(
        self,
        t_start: float,
        t_llama: float,
        plan: Plan | None,
        controller: RoundController,
        *,
        generated: int = 0,
        draft_len: int = 0,
        drafter: str | None = None,
    ) -> Stats:
        """``drafter``: what drafted the round, where it is not the plan's drafter's name (a free draft from the
        suffix cache is planned as lookup's)."""
        return Stats(
            prompt_tokens=self.prompt_tokens,
            prefilled_tokens=self.prefilled,
            generated=generated,
            rounds=self.rounds,
            drafted=self.drafted,
            accepted=self.accepted,
            t_prefill=self.t_prefill,
            t_draft=self.t_draft,
            t_verify=self.t_verify,
            t_sample=self.t_sample,
            t_total=time.perf_counter() - t_start,
            t_llama=t_llama,
            accepted_per_round=tuple(self.hist),
            drafter=(drafter or (plan.drafter if plan is not None else None)) or "none",
            draft_len=draft_len,
            decision=plan.reason if plan is not None else "",
            plain_tokens_per_second=controller.plain_tokens_per_second,
            sampling_path=self.sampling_path,
            forced=self.forced,
            lookup_drafted=self.lookup_drafted,
            lookup_accepted=self.lookup_accepted,
            cache_drafted=self.cache_drafted,
            cache_accepted=self.cache_accepted,
            rereads=self.rereads,
            t_constraint=self.t_constraint,
        )
