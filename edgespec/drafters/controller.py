"""Before every round, choose the drafter and the draft length γ that maximise expected tokens per second.

:class:`Controller` weighs every drafter and γ by the round model and the online estimates of
:mod:`edgespec.drafters.estimates` against what the other sequences put into the same decode
(:class:`~edgespec.drafters.plan.Load`), and returns a :class:`~edgespec.drafters.plan.Plan`. Estimates are never
reset: a lane's controller serves all of its requests, and an engine's lanes share one decode curve.

When one option wins, the others are no longer observed, so their estimates would freeze at whatever made
them lose. An idle drafter's acceptance evidence fades instead (``idle_decay`` per round), drifting back to the
prior, so a draft model that lost on one stretch of text is tried again where the prior says it may pay. (Probes
paid for by exploration credit did that as well; beside the fading they changed nothing: docs/benchmarks.md.)

Prompt lookup needs no exploration: it costs nothing to ask and is deterministic, so its proposal is checked
against the committed tokens every round, drafted or not, and its estimate is not one α but the chance that the first
k proposed tokens are all accepted, by how firmly the proposal is anchored (:mod:`edgespec.drafters.lookup_forecast`).
On a CPU, where a verify of b tokens costs ~b single steps, a long draft pays only where acceptance is near 1, and
this is what tells those rounds apart. The suffix cache's proposals (earlier requests' outputs) are free and
deterministic too, and get a forecast of their own, kept the same way with the match length as the anchor; each
round the likelier of the two proposals is the one planned (:meth:`Controller.offer`).

A decode whose width differs from the last one's pays for a new compute graph (llama.cpp reuses a graph only for a
batch of the same shape): ``switch`` seconds, measured by the engine's calibration. A round that leaves plain
decoding pays it twice, going and coming back, and is charged both at once; staying at its width or returning costs
nothing more (see :meth:`Controller._width_change`). Where a step takes a couple of milliseconds, as on a GPU, a
sparse draft can cost more in changes than it saves (docs/benchmarks.md, "Costs of single features").

A drafter that sat out pays a catch-up on return (a draft model decodes the tokens it missed). That cost is
measured apart from the per-token cost. Up to ``catchup_allowance`` of a plain step per missed token is
accepted as the price of keeping a drafter in the game; any excess is charged to the round that brings it
back, so a drafter whose catch-up costs more than it could win back (the draft model on a CPU) stays out.

The controller's own Python is a cost of every round too: nothing beside a CPU's step, a sizeable share of a GPU's
(docs/benchmarks.md, "auto's own loop beside a GPU's step"). It is timed (:meth:`Controller.plan` and
:meth:`Controller.observe`, by the rows a round drafted) and charged to the plans like the decode.

This module is one class, a little under 600 lines: the Controller's planning reads the estimates its bookkeeping
keeps, and split apart each half would reach into the other's state.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

from edgespec.drafters.estimates import Acceptance, DecayedRatio, VerifyCost, expected_tokens
from edgespec.drafters.lookup_forecast import DEFAULT_FORECAST, ForecastConfig, LookupForecast
from edgespec.drafters.plan import (
    CACHE,
    LOOKUP,
    NO_LOAD,
    NOTHING,
    DecodeSeconds,
    Free,
    Load,
    Plan,
    SettledPlan,
    load_key,
)


@dataclass(frozen=True)
class ControllerConfig:
    """The controller's tuned numbers (what each earns, measured by replay: docs/benchmarks.md)."""

    alpha_prior: float = 0.6  # a draft model's per-token acceptance before evidence, and what idle evidence fades to
    prior_weight: float = 2.0  # the drafted positions that prior counts for
    alpha_decay: float = 0.97  # evidence kept per observed draft position: ~30 positions of memory
    idle_decay: float = 0.99  # evidence kept per round a drafter sits out (see the module doc)
    cost_decay: float = 0.9  # kept of a timing estimate per sample
    # The extra cost per verified token, in one-token decodes, assumed while only one width is measured.
    verify_slope_prior: float = 0.5
    optimism: float = 0.25  # how much cheaper a width never measured is assumed, so that it gets tried once
    # The share of a plain step per missed token accepted as the price of bringing a drafter back (the module doc).
    catchup_allowance: float = 0.05
    # The margin by which a draft's expected rate must beat plain decoding's: the estimates are noisy, and the best
    # of several noisy estimates is biased upward, so a bare win is as likely a loss.
    min_gain: float = 0.03
    # With a plan budget (see Controller): a plain plan is reused for at most this many rounds, whatever it costs,
    max_plan_reuse: int = 16
    settled_slack: float = 0.1  # ... while the others' drafting seconds stay within this share of a one-token decode
    forecast: ForecastConfig = DEFAULT_FORECAST  # lookup's forecast


DEFAULT_CONTROLLER = ControllerConfig()
NOTHING_TO_DRAFT = Plan(None, 0, "nothing to draft")


@dataclass
class _DrafterState:
    """What the controller tracks of a drafter other than lookup (which has its LookupForecast)."""

    acceptance: Acceptance  # per-position α
    cost: DecayedRatio  # seconds per drafted token
    catchup: DecayedRatio  # extra seconds per token committed while the drafter sat out
    gap: int = 0  # tokens committed since the drafter last ran


@dataclass(frozen=True)
class _Option:
    drafter: str | None
    gamma: int
    rate: float  # expected tokens per second (the batch's: see Load.batch_tokens)
    tokens: float  # expected tokens per round (likewise)
    seconds: float  # expected seconds per round
    own: float  # the tokens this sequence is expected to commit
    p_all: float | None = None  # lookup: the chance that all γ drafted tokens are accepted (for the plan's reason)


class Controller:
    """Adaptive choice of drafter and γ per round from measured acceptance and costs (see the module doc).

    ``drafters`` names the available drafters; the one named ``"lookup"`` can only draft what :meth:`plan` is
    given as its proposal, and costs nothing (the engine asks it every round anyway). ``cache``: proposals may also
    come from a suffix cache (:meth:`offer`), which then keeps a forecast of its own. Any other (``"model"``) is
    weighed at no cost until its cost is measured (the engine's calibration measures it), so the first plan that
    weighs it tries it.

    ``config``: the tuned numbers (:class:`ControllerConfig`). ``plan_budget``: the share of a one-token decode
    that planning may take per round, on average; given, a plain plan made while lookup had nothing to propose
    stands for as many rounds as keep it within that (none where a decode is slow, as on a CPU), and the
    controller's own time per round is measured and charged to the plans (see the module doc); None: a plan
    every round, and no clock read (what replays and simulations of rounds want: decisions that do not depend on
    the machine they run on).
    """

    def __init__(
        self,
        drafters: Sequence[str],
        *,
        max_gamma: int = 8,
        config: ControllerConfig = DEFAULT_CONTROLLER,
        verify_cost: VerifyCost | None = None,
        plan_budget: float | None = None,
        cache: bool = False,
    ) -> None:
        if max_gamma < 1:
            raise ValueError("max_gamma must be >= 1")
        if len(set(drafters)) != len(drafters):
            raise ValueError(f"duplicate drafter names in {list(drafters)}")
        self.drafters = tuple(drafters)
        self.max_gamma = max_gamma
        self.config = config
        self.idle_decay = config.idle_decay
        self.catchup_allowance = config.catchup_allowance
        self.min_gain = config.min_gain
        # The target's decode cost is the machine's, not a sequence's: the controllers of an engine's sequences
        # share one curve (``verify_cost``), and each keeps its own acceptance evidence.
        self._verify = verify_cost if verify_cost is not None else VerifyCost(
            config.cost_decay, config.verify_slope_prior, config.optimism
        )  # fmt: skip
        self._state = {
            d: _DrafterState(
                Acceptance(config.alpha_prior, config.prior_weight, config.alpha_decay),
                DecayedRatio(config.cost_decay),
                DecayedRatio(config.cost_decay),
            )
            for d in self.drafters
            if d != LOOKUP
        }
        self._lookup = LookupForecast(max_gamma, config.forecast) if LOOKUP in self.drafters else None
        # The cache's proposals are checked like lookup's, in a forecast of their own: the match length that anchors
        # them says other things than lookup's agreement does (see docs/design.md).
        self._cache = LookupForecast(max_gamma, config.forecast) if cache and self._lookup is not None else None
        self._free = self._lookup  # the forecast of the free proposal this round's plan weighs (see offer)
        self._free_source = LOOKUP
        self._offered = False  # offer() was called for this round's plan
        self._last_rows = 1  # the rows this sequence put into the last decode (its width, for a lone sequence)
        self.plan_budget = plan_budget
        self._plan_seconds = DecayedRatio(config.cost_decay)  # what a plan (worked out, not reused) takes here
        self._settled: SettledPlan | None = None
        self.plans_reused = 0
        # This controller's own Python per round (plan and observe): what a plain round takes, and what each drafted
        # row adds to it (a drafted round settles more of lookup's proposals).
        self.loop = DecayedRatio(config.cost_decay)
        self.loop_per_row = DecayedRatio(config.cost_decay)
        self._plan_took = 0.0  # what the last plan took

    # ----- public ----------------------------------------------------------------------------------------
    @property
    def plain_tokens_per_second(self) -> float:
        """1 / the measured cost of a one-token target decode; 0.0 before one was measured."""
        c1 = self._verify.measured(1)
        return 1.0 / c1 if c1 else 0.0

    def start_request(self, behind: Mapping[str, int] | None = None) -> None:
        """Optional hint that every drafter was just reset to a new prompt; ``behind``: the prompt tokens each still
        has to catch up (a draft model prefills lazily), charged like the tokens of rounds it sat out."""
        for name, st in self._state.items():
            st.gap = (behind or {}).get(name, 0)
        for forecast in (self._lookup, self._cache):
            if forecast is not None:
                forecast.reset()
        self._settled = None
        self._offered = False
        self._last_rows = 1  # a new request's first decode is its prompt's: a width of its own

    def record_costs(
        self,
        verify: dict[int, float],
        draft: dict[str, float],
        catchup: dict[str, float] | None = None,
        switch: float | None = None,
    ) -> None:
        """Costs measured outside rounds (the engine's calibration): seconds of a target decode of b tokens,
        seconds per drafted token and seconds per caught-up token of each drafter. They seed the estimates that
        rounds then refine, so no live round is spent discovering that a wide verify, the draft model, or
        bringing the draft model back after it sat out is dear on this machine. ``switch``: what a decode costs more
        when its width differs from the last one's (shared by the sequences, like the curve)."""
        self._settled = None
        if switch is not None:
            self._verify.switch = switch
        for b, seconds in verify.items():
            self._verify.add(b, seconds, calibrated=True)
        for name, seconds in draft.items():
            if name in self._state:
                self._state[name].cost.add(seconds)
        for name, seconds in (catchup or {}).items():
            if name in self._state:
                self._state[name].catchup.add(seconds)

    def forget_costs(self) -> None:
        """Drop every cost estimate, the shared curve's with them, for a calibration that replaces them (the engine's,
        when cached costs turned out not to hold)."""
        self._verify.forget()
        for st in self._state.values():
            st.cost = DecayedRatio(st.cost.decay)
            st.catchup = DecayedRatio(st.catchup.decay)
        self._settled = None

    def alpha(self, drafter: str) -> float:
        """The acceptance estimate of ``drafter``'s next drafted token (lookup: the current free proposal's first)."""
        if drafter == LOOKUP and self._free is not None:
            first = self._free.survival(1)
            return float(first[0]) if len(first) else 0.0
        return self._state[drafter].acceptance.alpha

    def lookup_expected(self, max_len: int) -> list[float]:
        """``E[γ]`` for γ = 0..max_len: the tokens a round is expected to commit if it drafts the first γ tokens of
        the current free proposal (the one given to the last :meth:`plan`), past its end tokens sure to be
        rejected."""
        survival = self._free.survival(max_len) if self._free is not None else []
        expected = [1.0, *(1.0 + s for s in accumulate(survival))]
        return expected + [expected[-1]] * (max_len + 1 - len(expected))

    def offer(self, found: Sequence[Free]) -> Free:
        """This round's free proposals (prompt lookup's, the suffix cache's), before its :meth:`plan`: each is offered
        to its own source's forecast, which checks it against the tokens the round commits whichever is planned, so
        neither source ever needs exploring. Returns the likelier, by the forecasts' expected accepted tokens (the
        first given on a tie), which the plan then weighs."""
        best, most = NOTHING, -1.0
        for free in found:
            forecast = self._cache if free.source == CACHE else self._lookup
            if forecast is None:
                continue
            forecast.offer(free.tokens, free.agreement, free.from_prompt)
            # Weighed only against another proposal (on most rounds there is one): the first offered wins a tie.
            expected = sum(forecast.survival(len(free.tokens))) if len(found) > 1 else 0.0
            if expected > most:
                best, most = free, expected
                self._free, self._free_source = forecast, free.source
        self._offered = True
        return best

    @property
    def verify_cost(self) -> VerifyCost:
        """The curve of target decode costs this controller plans with (shared by an engine's sequences)."""
        return self._verify

    def plan(
        self,
        lookup: Sequence[int] = (),
        load: Load = NO_LOAD,
        remaining: int | None = None,
        agreement: int = 0,
        from_prompt: bool = False,
    ) -> Plan:
        """``lookup``: the free proposal at this position (it is checked whatever the plan): the one :meth:`offer`
        returned, or, where this round had no offer, lookup's, offered here;
        ``agreement``: how firmly it is anchored (:attr:`~edgespec.drafters.lookup.LookupDrafter.last_agreement`);
        ``from_prompt``: its n-gram occurred once before, in the prompt
        (:attr:`~edgespec.drafters.lookup.LookupDrafter.last_from_prompt`).
        ``load``: what the other sequences put into the same decode. ``remaining``: the most tokens the request
        may still generate (its max_tokens left), which a draft model's catch-up has to be won back within.
        The choice then maximises the whole batch's expected tokens per second (counted per sequence when the
        load gives its sequences: see :meth:`Load.batch_tokens`): on a GPU, whose decode costs about
        the same up to many rows, a lone sequence drafts long and a full batch does not; on a CPU, whose cost
        grows with every row, it barely changes.

        With a ``plan_budget``, a plain plan is reused while nothing it was made from has moved, for as many rounds
        as its cost asks (see :meth:`_reuse`): a plan weighs every drafter and γ, and beside a GPU's decode of a few
        milliseconds, working it out anew every round for several sequences costs a share of plain decoding's speed
        (docs/benchmarks.md, "auto's own loop beside a GPU's step")."""
        if self.plan_budget is None:
            return self._plan_round(lookup, load, remaining, agreement, from_prompt, 0.0)
        t0 = time.perf_counter()
        plan = self._plan_round(lookup, load, remaining, agreement, from_prompt, t0)
        self._plan_took = time.perf_counter() - t0
        return plan

    def loop_seconds(self, gamma: int) -> float:
        """What this controller's Python is expected to take in a round that drafts ``gamma`` tokens."""
        return (self.loop.value or 0.0) + gamma * (self.loop_per_row.value or 0.0)

    def _plan_round(
        self, lookup: Sequence[int], load: Load, remaining: int | None, agreement: int, from_prompt: bool, t0: float
    ) -> Plan:
        if not self._offered and self._lookup is not None:  # (a replay that has lookup alone)
            self._lookup.offer(lookup, agreement, from_prompt)
            self._free, self._free_source = self._lookup, LOOKUP
        self._offered = False
        if not lookup and self.drafters == (LOOKUP,):
            return NOTHING_TO_DRAFT  # no free proposal and no other drafter: nothing to weigh against plain decoding
        offered = self._free.offered if self._free is not None else (-1, 0)
        source = self._free_source
        settled = self._settled
        if settled is not None:
            if settled.rounds > 0 and settled.turned_down(offered, source) and settled.holds(load):
                settled.rounds -= 1
                self.plans_reused += 1
                return settled.plan
            self._settled = None
        if self.plan_budget is None:
            return self._plan(lookup, load, remaining)
        plan = self._plan(lookup, load, remaining)
        self._plan_seconds.add(time.perf_counter() - t0)
        rounds = self._reuse()
        # A plan that turned a proposal down stands only in a shared decode (see SettledPlan): there every lane plans
        # every step, and its proposals lose to the batch by a wide margin; alone a short draft of a weak proposal
        # is a close call that the next one may win, and a plan standing against it loses those wins.
        shared = bool(load.sequences)
        if plan.drafter is None and rounds > 0 and (shared or offered == (-1, 0)):
            slack = self.config.settled_slack * (self._verify.measured(1) or 0.0)
            self._settled = SettledPlan(plan, load_key(load), load.seconds, slack, rounds, offered, source)
        return plan

    def _reuse(self) -> int:
        """For how many more rounds a plain plan may stand: enough that planning, spread over them, takes at most
        ``plan_budget`` of a one-token decode. None where planning is cheap beside the decode (on a CPU), so there
        every round is planned."""
        assert self.plan_budget is not None
        spent, step = self._plan_seconds.value, self._verify.measured(1)
        if spent is None or not step:
            return 0
        return min(self.config.max_plan_reuse, math.ceil(spent / (self.plan_budget * step)) - 1)

    def _plan(self, lookup: Sequence[int], load: Load, remaining: int | None) -> Plan:
        curve = self._verify.curve(load.rows + self.max_gamma + 1)
        if curve is None or self._verify.measured(1) is None:
            return Plan(None, 0, "measuring the plain decode cost")
        caps = {d: max(min(self._cap(d, len(lookup)), load.room - 1), 0) for d in self.drafters}
        decode = DecodeSeconds(load, curve)
        seconds = decode(1) + load.seconds + self.loop_seconds(0)
        tokens = load.batch_tokens(1.0)
        plain = _Option(None, 0, tokens / seconds, tokens, seconds, 1.0)
        best_draft: _Option | None = None
        bar = plain.rate * (1.0 + self.min_gain)
        for d, cap in caps.items():
            option = self._option(d, range(1, cap + 1), curve, load=load, remaining=remaining, decode=decode)
            if option is not None and (best_draft is None or option.rate > best_draft.rate):
                best_draft = option
        # Drafting must promise a margin over plain (see ControllerConfig.min_gain).
        drafts_pay = best_draft is not None and best_draft.rate > bar
        best = best_draft if drafts_pay and best_draft is not None else plain

        if best is plain:
            why = f"plain est {plain.rate:.1f} tok/s"
            if best_draft is not None:
                why += f"; best draft {self._describe(best_draft, None)}"
            return Plan(None, 0, why)
        return Plan(
            best.drafter, best.gamma, self._describe(best, plain), best.own,
            best.gamma * (self._draft_cost(best.drafter) or 0.0),
        )  # fmt: skip

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
        """What the round did. ``committed``: the tokens it committed, which settle lookup's proposals.
        ``record_verify=False``: the verify was shared with other sequences, and the engine records its cost
        once, at its width, with :meth:`record_decode`."""
        t0 = time.perf_counter() if self.plan_budget is not None else 0.0
        if not 0 <= n_accepted <= n_drafted:
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
        if record_verify:
            self._verify.add(n_drafted + 1, t_verify)
        self._last_rows = n_drafted + 1
        if n_drafted:
            self._settled = None  # a drafter's evidence moved
        for forecast in (self._lookup, self._cache):
            if forecast is not None:
                forecast.commit(committed)
        used = plan.drafter
        st = self._state.get(used) if used is not None else None
        if st is not None:
            if n_drafted:
                st.acceptance.update(n_drafted, n_accepted)
            self._record_draft_cost(st, n_drafted, t_draft)
            st.gap = 0
        for d, other in self._state.items():
            if d != used:
                other.acceptance.forget(self.idle_decay)
                other.gap += n_accepted + 1
        if self.plan_budget is None:
            return
        # This round's own Python: its plan and this bookkeeping.
        spent = self._plan_took + time.perf_counter() - t0
        self._plan_took = 0.0
        if n_drafted == 0:
            self.loop.add(spent)
        elif self.loop.value is not None:
            self.loop_per_row.add(max(spent - self.loop.value, 0.0), n_drafted)

    def record_decode(self, rows: int, seconds: float) -> None:
        """A target decode of ``rows`` rows, shared by several sequences, took ``seconds``."""
        self._verify.add(rows, seconds)

    def certain_len(self, n: int, load: Load = NO_LOAD) -> int:
        """How many of ``n`` tokens that are sure to be accepted and free to propose (a constraint forces them) to
        put into the decode: as many as raise the batch's tokens per second. Alone that is nearly always all of
        them (a wider decode costs less than the steps it saves); in a full batch on a CPU, where each row adds most
        of a step and the fixed part is already shared, it can be fewer, down to none."""
        n = max(min(n, load.room - 1), 0)
        curve = self._verify.curve(load.rows + n + 1)
        if curve is None or not n:
            return n
        # Summed, not per sequence (Load.batch_tokens): a structured reply's keys and punctuation are sure tokens,
        # and counted per sequence they would almost never ride beside other requests on a CPU, where the sum puts
        # them in (docs/benchmarks.md, "Structured output").
        rates = [(load.tokens + k + 1) / (load.decode_seconds(curve, k + 1) + load.seconds) for k in range(n + 1)]
        return max(range(n + 1), key=rates.__getitem__)

    # ----- internals -------------------------------------------------------------------------------------
    def _cap(self, drafter: str, lookup_len: int) -> int:
        return min(self.max_gamma, max(lookup_len, 0)) if drafter == LOOKUP else self.max_gamma

    def _draft_cost(self, drafter: str) -> float | None:
        if drafter == LOOKUP:
            return 0.0  # an index lookup the engine makes every round, drafting or not
        return self._state[drafter].cost.value

    def _option(
        self,
        drafter: str,
        gammas: range,
        curve: list[float],
        cost: float | None = None,
        alpha: float | None = None,
        load: Load = NO_LOAD,
        remaining: int | None = None,
        decode: DecodeSeconds | None = None,
        prune: bool = True,
    ) -> _Option | None:
        """The fastest of drafting γ in ``gammas`` with ``drafter`` (None if its cost is unknown); ``alpha``
        replaces a draft model's acceptance estimate. Rates are the batch's: ``load``'s tokens and seconds in.
        ``remaining``: the request's tokens left, over which the allowed part of a catch-up is spread. ``decode``:
        the plan's decode costs (worked out here if not given). ``prune=False`` weighs every γ (the tests' reference
        for the bound that stops early)."""
        cost = self._draft_cost(drafter) if cost is None else cost
        if cost is None:
            cost = 0.0  # never measured: weighed at no cost, so that it is tried and measured
        if not gammas:
            return None
        decode = DecodeSeconds(load, curve) if decode is None else decode
        switch = 0.0
        allowed = 0.0  # the part of the catch-up the allowance covers, spread over the tokens left
        survival: list[float] | None = None
        if drafter == LOOKUP:  # checked every round, so it never sits out and has nothing to catch up
            assert self._free is not None
            survival = self._free.survival(gammas[-1])
            # E[tokens] = the target's own token + each drafted token's chance to be reached and accepted.
            expected: Callable[[int], float] = [1.0, *(1.0 + s for s in accumulate(survival))].__getitem__
        else:
            st = self._state[drafter]
            a = st.acceptance.alpha if alpha is None else alpha
            expected = partial(expected_tokens, a)  # in closed form: only the γ weighed are worked out
            if st.gap > 2:
                # Back after sitting out: the catch-up beyond the allowance (see the module doc) is charged to
                # this round, so a drafter dear to bring back is not switched to on a marginal estimate.
                per_token = st.catchup.value or 0.0
                excess = max(per_token - self.catchup_allowance * curve[1], 0.0)
                switch = st.gap * excess
                if remaining is not None:
                    # The allowance assumes a long generation to win it back in. A request with few tokens left
                    # (a prompt of 500 tokens the draft model has to prefill, 64 to generate) pays it in full over
                    # those: each round its share, as if the draft model drafted from here to the end.
                    allowed = st.gap * min(per_token, self.catchup_allowance * curve[1]) / max(remaining, 1)
        # The most any γ here can count for: the expected tokens grow with γ, and the batch's count with them.
        top = load.batch_tokens(float(expected(gammas[-1])))
        best = None
        for gamma in gammas:
            # Every γ from here on costs at least this (drafting and the catch-up share grow with γ; the decode
            # costs at least decode.floor), so once even ``top`` tokens for it cannot beat the best so far, no
            # longer draft can: the answer is the same as weighing them all, for a fraction of the work (weighing
            # every width is a share of a GPU's step: docs/benchmarks.md, "auto's own loop beside a GPU's step").
            own = float(expected(gamma))
            loop = self.loop_seconds(gamma)
            if prune and best is not None:
                floor = decode.floor + gamma * cost + switch + allowed * own + load.seconds + loop
                if top <= best[0] * floor:
                    break
            tokens = load.batch_tokens(own)
            seconds = decode(gamma + 1) + self._width_change(gamma + 1) + gamma * cost + switch + allowed * own
            seconds += load.seconds + loop
            if best is None or tokens / seconds > best[0]:
                best = (tokens / seconds, gamma, tokens, seconds, own)
        assert best is not None
        rate, gamma, tokens, seconds, own = best
        return _Option(drafter, gamma, rate, tokens, seconds, own, survival[gamma - 1] if survival else None)

    def _width_change(self, rows: int) -> float:
        """The graph changes a round of ``rows`` rows is charged, after a round of ``self._last_rows``. Leaving plain
        decoding (1 row) pays for the change there and, in advance, for the one back; staying at the same width, or
        coming back to plain, then costs nothing more; moving from one draft width to another pays one change. So a
        lone draft between plain rounds carries both of the changes it causes (where steps are short, as on a GPU, a
        sparse draft of a token or two saves less than that), and a run of drafts of one width pays them once."""
        last, switch = self._last_rows, self._verify.switch
        if rows == last or rows == 1:
            return 0.0
        return 2.0 * switch if last == 1 else switch

    def _record_draft_cost(self, st: _DrafterState, n_drafted: int, t_draft: float) -> None:
        per_token = st.cost.value
        # A gap of a token or two is the usual pending input ([t] or [d_γ, t]), part of every round's cost.
        if per_token is not None and st.gap > 2:
            # The drafter first caught up on the tokens it missed; charge the excess to catch-up.
            st.catchup.add(max(t_draft - n_drafted * per_token, 0.0), st.gap)
            return
        if per_token is None:
            # First price. A long catch-up is counted as drafted tokens: better to underestimate, since a
            # drafter that looks cheap gets used and re-measured, while one that looks dear is not tried again. A
            # round that drafted nothing prices its time as one token's (or the drafter would be tried every round).
            st.cost.add(t_draft, max(n_drafted, 1) + (st.gap if st.gap > 2 else 0))
            return
        st.cost.add(t_draft, n_drafted)  # time spent drafting nothing is overhead spread over the tokens drafted

    def _describe(self, option: _Option, plain: _Option | None) -> str:
        assert option.drafter is not None
        name = self._free_source if option.drafter == LOOKUP else option.drafter
        head = f"{name} γ={option.gamma}"
        if self._draft_cost(option.drafter) is None:
            return f"{head}: measuring its cost"
        if option.drafter == LOOKUP:
            assert self._free is not None
            p_all = option.p_all if option.p_all is not None else self._free.survival(option.gamma)[-1]
            odds = f"P(all)={p_all:.2f}"
        else:
            odds = f"α={self._state[option.drafter].acceptance.alpha:.2f}"
        text = f"{head} {odds} est {option.rate:.1f} tok/s"
        return text if plain is None else f"{text} vs plain {plain.rate:.1f}"
