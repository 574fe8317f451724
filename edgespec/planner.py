"""The batch plan: for one step, every request's drafter and γ, in one place.

The requests are planned one after another, each against what those before it put into the decode (a
:class:`~edgespec.drafters.plan.Load`), counting the ones after it as the one row each costs at least: a
controller maximises the *batch's* tokens per second, so speculation backs off as the batch fills where a wide
decode is dear. A constraint's forced tokens join a plan where their rows pay; lockstep (every request drafting
as far as the others) replaces the plans where equal rows in one pass beat them. The engine executes the plan; no
other module decides one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edgespec.drafters.base import FORCED, Draft
from edgespec.drafters.controller import Controller
from edgespec.drafters.estimates import VerifyCost
from edgespec.drafters.plan import LOOKUP, NO_LOAD, Load, Plan

if TYPE_CHECKING:
    from edgespec.generation import Generation, Proposal
    from edgespec.models.slot import Part

Split = Callable[[dict[int, int]], list[int]]  # the forward passes llama.cpp runs for tokens per sequence


def round_plan(generation: Generation, proposal: Proposal, load: Load) -> tuple[Plan, list[int]]:
    """One request's plan for this round, given the others' ``load``: its controller's choice, or the tokens its
    constraint forces where their rows pay (the plan's draft, then: returned with it)."""
    lookup = proposal.lookup
    controller = generation.controller
    plan = controller.plan(
        lookup,
        load,
        remaining=proposal.room,
        agreement=proposal.agreement,
        from_prompt=proposal.from_prompt,
    )
    every_forced = proposal.forced
    # Sure to be accepted, but each is a row of the decode: as many as pay in this batch.
    forced = every_forced[: controller.certain_len(len(every_forced), load)] if every_forced else []
    if not forced:
        return plan, []
    n_forced = len(forced)
    # Past them, lookup's proposal is a draft like any other: alone it rides along (it costs the decode little),
    # beside other requests only where the controller chose lookup.
    rides_along = forced == every_forced and (load is NO_LOAD or plan.drafter == LOOKUP)
    if rides_along and len(lookup) > n_forced and list(lookup[:n_forced]) == forced:
        forced = list(lookup)  # lookup's proposal goes on past them (into a value it copies): verified as well
    assert generation.constraint is not None
    why = f"{n_forced} forced by the {generation.constraint.grammar.describe()}"
    return Plan(FORCED, len(forced), why, expected=n_forced + 1.0), forced


class Planner:
    """Plans each step for the engine: who drafts what, and how far, for the decode that verifies them all.

    ``split``: the forward passes llama.cpp runs for a decode of so many tokens per sequence; ``budget``: the rows
    one decode may carry; ``curve``: the target's decode costs that the auto controllers share (None before the
    first one exists)."""

    def __init__(self, split: Split, budget: int, n_batch: int, curve: Callable[[], VerifyCost | None]) -> None:
        self._split = split
        self.budget = budget
        self._n_batch = n_batch
        self._curve = curve
        self._lockstep_declined: list[Plan | None] = []  # the plans of the last step that weighed lockstep and lost

    def plan(self, in_rounds: Sequence[Generation], prefills: Sequence[tuple[Generation, Part]]) -> list[Generation]:
        """Plan and draft every request in rounds, one after another, beside the prompt chunks of ``prefills``;
        returns those whose plan stands (a request whose drafting failed has failed).

        A prompt chunk in the same decode is load too, and its tokens are work done as surely as committed ones:
        a row of prompt counts as a token. Counted so, a draft row has to be worth a whole token to join a decode
        that prefills (where a CPU has no spare compute), and the prompt's first token is not delayed by drafts
        that would not pay; counting the chunk's cost but not its tokens would do the opposite (a big fixed cost
        that drafting amortises). Counted per sequence (:attr:`Load.sequences`), each row of a chunk is one that
        commits a token."""
        chunk = sum(len(part.tokens) for _, part in prefills) + sum(len(g.prompt_tail) for g in in_rounds)
        # The tokens each sequence puts into the decode, as planned so far (a request not yet planned: its one row),
        # from which a plan reads the forward passes llama.cpp will split the decode into.
        layout = {g.lane.index: len(part.tokens) for g, part in prefills} | {
            g.lane.index: len(g.prompt_tail) + 1 for g in in_rounds
        }
        alone = len(in_rounds) == 1 and not chunk
        budget = self.budget
        rows, tokens, seconds = 0, 0.0, 0.0
        log_tokens = 0.0  # of the tokens each request planned so far is expected to commit (see Load.sequences)
        live: list[Generation] = []
        for i, generation in enumerate(in_rounds):
            later = len(in_rounds) - i - 1
            load = (
                NO_LOAD
                if alone
                else Load(
                    chunk + rows + later,
                    chunk + tokens + later,
                    seconds,
                    budget - rows - later,
                    self._passes(layout, generation.lane.index),
                    sequences=chunk + len(live) + later,
                    log_tokens=log_tokens,
                )
            )
            try:
                proposal = generation.proposal(load)
                plan, forced = round_plan(generation, proposal, load)
                generation.start_draft(proposal, plan, forced, defer_model=not alone)
            except Exception as error:  # noqa: BLE001  # this request's own failure (its draft model), not the others'
                generation.abort(error)
                del layout[generation.lane.index]
                continue
            layout[generation.lane.index] = len(generation.prompt_tail) + generation.planned_rows
            rows += generation.planned_rows
            tokens += plan.expected
            log_tokens += math.log(max(plan.expected, 1e-9))
            # What its drafting is expected to cost: a draft model's steps run after every plan, so the time the plan
            # took is its own Python, which would move the load whenever a plan was worked out rather than reused.
            seconds += plan.draft_seconds
            live.append(generation)
        if len(live) > 1 and not prefills:
            self._lockstep(live)
        return live

    def _passes(self, layout: dict[int, int], me: int) -> Callable[[int], list[int]]:
        """What :attr:`Load.passes` tells sequence ``me``'s plan: the decode's passes if it puts n rows in beside the
        others' tokens planned so far."""
        others = dict(layout)
        known: dict[int, list[int]] = {}  # a plan weighs each width several times (each drafter, the probe)

        def passes(n: int) -> list[int]:
            if n not in known:
                others[me] = n
                known[n] = self._split(others)
            return known[n]

        return passes

    def _lockstep(self, live: list[Generation]) -> None:
        """Let every request draft as far as the others, when that beats the step as planned.

        The plans are made one request after another, each counting the ones after it as plain rows. With a KV
        buffer per sequence, llama.cpp runs a draft beside the others' single rows as a forward pass of its own
        (see :mod:`edgespec.models.microbatch`), so under load no one request's draft pays, even where every one
        of them would if all drafted: the same rows for every sequence are one pass. On a GPU, whose pass of
        4 x 8 rows costs little more than one of 4, that step answers several requests that copy their prompts
        faster than plain decoding can. It is priced on the shared curve against the step as planned, by the same
        count of the batch's tokens (:meth:`Load.batch_tokens`), and taken past the controllers' margin
        (``min_gain``). A request whose lookup proposal is shorter than the others' fills its rows with its last
        token, which the verify rejects unless the target would write it there (a one-hot draft is verified
        exactly whatever it proposes). On a CPU, whose decode grows by most of a step per row, it does not pay."""
        curve_cost = self._curve()
        if not any(g.lookup_proposal for g in live):
            return  # no request has a proposal: its rows would be filler, which the forecasts give no chance
        controllers: list[Controller] = []
        for g in live:
            c = g.controller
            if (
                curve_cost is None
                or not isinstance(c, Controller)
                or c is not g.lane.auto
                or g.lookup_proposal is None
                or g.constraint is not None
                or g.prompt_tail
                or g.drafting is not None
                or g.plan is None
                or g.plan.drafter not in (None, LOOKUP)
            ):
                return
            controllers.append(c)
        assert curve_cost is not None
        plans = [g.plan for g in live]
        declined, self._lockstep_declined = self._lockstep_declined, plans
        if len(declined) == len(plans) and all(a is b for a, b in zip(declined, plans, strict=True)):
            return  # every plan stands as it stood when lockstep last lost (see Controller._reuse): so does that
        n = len(live)
        ids = sorted(g.lane.index for g in live)
        widest = min(self.budget, self._n_batch) // n
        widest = min(widest, 1 + min(g.max_draft for g in live))
        # Equal rows are one pass only for a run of consecutive sequence ids (a gap's filler token would cut it).
        if widest < 2 or ids[-1] - ids[0] + 1 != n:
            return
        planned = {g.lane.index: g.planned_rows for g in live}
        # The curve as far as the plans read it, and the bound below needs: read further only past the bound (each
        # width past the measured ones is worked out, and the curve anew whenever a decode moves a point of it).
        curve = curve_cost.curve(max(2 * n, sum(planned.values())))
        if curve is None:
            return
        last, switch = curve_cost.last_width, curve_cost.switch
        passes = self._split(planned)
        # Both counted per sequence, as Load.batch_tokens counts them: n times the geometric mean.
        tokens = n * math.exp(sum(math.log(max(g.plan.expected, 1e-9)) for g in live if g.plan is not None) / n)
        seconds = sum(curve[b] for b in passes) + (0 if max(passes) == last else switch)
        as_planned = tokens / (seconds + sum(g.plan.draft_seconds for g in live if g.plan is not None))
        bar = as_planned * (1.0 + controllers[0].min_gain)

        def lockstep_seconds(width: int) -> float:
            # One pass; a new graph unless the last decode had that width, going there and coming back. A width
            # never measured is read off the fit as it is, without the optimism that gets a plan to try it: a
            # step of all sequences is too dear a way to explore.
            b = n * width
            fitted = curve[b] if curve_cost.measured(b) is not None else curve[b] / (1.0 - curve_cost.optimism)
            return fitted + (0 if b == last else 2 * switch)

        # A bound first, from each proposal's first token alone (its chance S(1) bounds every later S(k), so a
        # draft of g is expected to commit at most 1 + g S(1)) and the narrowest lockstep's cost (the curve's
        # least past it but for a CPU kernel's quirk): most steps end here, for a few microseconds.
        firsts = [c.alpha(LOOKUP) if g.lookup_proposal else 0.0 for g, c in zip(live, controllers, strict=True)]
        bound = n * math.exp(sum(math.log1p((widest - 1) * s) for s in firsts) / n)
        if bound <= bar * lockstep_seconds(2):
            return
        curve = curve_cost.curve(n * widest)
        assert curve is not None
        logs = [[math.log(e) for e in c.lookup_expected(widest - 1)] for c in controllers]
        best_rate, best_width = 0.0, 0
        for width in range(2, widest + 1):
            rate = n * math.exp(sum(row[width - 1] for row in logs) / n) / lockstep_seconds(width)
            if rate > best_rate:
                best_rate, best_width = rate, width
        if best_rate <= bar:
            return
        self._lockstep_declined = []
        why = f"lockstep: {n} requests x {best_width} rows, est {best_rate:.1f} tok/s, as planned {as_planned:.1f}"
        for g, row in zip(live, logs, strict=True):
            assert g.lookup_proposal is not None
            draft = g.lookup_proposal[: best_width - 1]
            draft += [g.ctx[-1]] * (best_width - 1 - len(draft))
            g.replan(Plan(LOOKUP, best_width - 1, why, expected=math.exp(row[best_width - 1])), Draft(draft, None))
