"""Round-level simulators for controllers: no models, costs from a profile.

:func:`simulate` uses synthetic acceptance. The target's output is the token stream 0, 1, 2, ...; each round the
lookup drafter "finds" a proposal whose first tokens are right with probability α each (until the first wrong one),
the controller plans, a draft model's tokens are accepted with its own α, and the committed tokens, the profile's
draft and verify costs go back through ``observe``. :func:`replay` runs a controller over a real token stream
(a recorded generation) with the real :class:`~edgespec.drafters.lookup.LookupDrafter`. Used by the controller's
tests and to compare strategies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgespec.drafters.estimates import expected_tokens
from edgespec.drafters.lookup import LookupDrafter
from edgespec.drafters.plan import LOOKUP, FixedController, Plan, RoundController


@dataclass(frozen=True)
class CostProfile:
    """Seconds a machine spends: target decodes by width, drafting per token, catch-up after sitting out."""

    t_token: float  # one target decode of one token
    verify_mult: Mapping[int, float]  # b -> cost of one decode of b tokens in units of t_token (1 -> 1.0)
    draft: Mapping[str, float]  # drafter -> seconds per drafted token
    catchup: Mapping[str, float] = field(default_factory=dict)  # drafter -> seconds per token it missed
    noise: float = 0.0  # sigma of a log-normal factor on every timing

    def verify(self, b: int) -> float:
        """c_v(b): measured points, linear in between and beyond the last two."""
        points = sorted({1: 1.0, **self.verify_mult}.items())
        for (b0, m0), (b1, m1) in zip(points, points[1:], strict=False):
            if b <= b1:
                return self.t_token * (m0 + (m1 - m0) * (b - b0) / (b1 - b0))
        (b0, m0), (b1, m1) = points[-2], points[-1]
        return self.t_token * (m1 + (m1 - m0) / (b1 - b0) * (b - b1))


# The 1.5B/0.5B Qwen2.5-Coder pair on the 2-core dev CPU (DESIGN.md, "Facts measured on this machine"): a wide
# verify is far from free and the draft costs half a target step. Catch-up is batched, near the draft's
# prefill rate.
CPU_PROFILE = CostProfile(
    t_token=0.0789,
    verify_mult={2: 1.57, 3: 2.15, 4: 1.99, 5: 2.63, 8: 5.07, 16: 6.06},
    draft={"model": 0.0406, LOOKUP: 0.00005},
    catchup={"model": 1 / 93},
)

# A GPU-like machine: verify width nearly free; a small draft is latency-bound, a third of a target step.
GPU_PROFILE = CostProfile(
    t_token=0.010,
    verify_mult={2: 1.02, 4: 1.06, 8: 1.15, 16: 1.35},
    draft={"model": 0.0035, LOOKUP: 0.00005},
    catchup={"model": 0.0002},
)

# Measured: the same 1.5B/0.5B pair on an NVIDIA H200, llama.cpp built for CUDA (`edgespec bench --costs`, fully
# offloaded). Small models leave the GPU waiting on kernel launches: a wide verify is not free (16 tokens: 2.76
# single steps) and the 0.5B draft costs two thirds of a 1.5B step (1.2 ms against 1.8 ms), so the draft model
# loses at the acceptance it gets (fixed γ=3 ran at 0.5-0.6x plain there) and free lookup drafts are what pay.
H200_PROFILE = CostProfile(
    t_token=0.0018,
    verify_mult={2: 1.19, 3: 1.33, 4: 1.56, 5: 1.71, 6: 1.86, 8: 2.16, 16: 2.76},
    draft={"model": 0.0012, LOOKUP: 0.00005},
    catchup={"model": 0.0002},
)

AlphaSchedule = Mapping[str, float] | Callable[[int], Mapping[str, float]]  # fixed, or by tokens generated
WRONG = -1  # a proposed token the target never commits (the stream is 0, 1, 2, ...)
# How many tokens the lookup drafter has ready: fixed, or by (tokens generated so far, rng). Output echoes its
# input at *text positions*, so a schedule by position (copy spans) is more faithful than a per-round coin.
LookupSchedule = int | Callable[[int, np.random.Generator], int]


@dataclass
class SimResult:
    tokens: int = 0
    seconds: float = 0.0
    rounds: list[tuple[int, Plan]] = field(default_factory=list)  # (tokens generated before it, plan)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def share(self, drafter: str | None, since: int = 0, until: int | None = None) -> float:
        """Fraction of the rounds between token counts [since, until) whose plan used ``drafter``."""
        picked = [p for t, p in self.rounds if t >= since and (until is None or t < until)]
        return sum(p.drafter == drafter for p in picked) / len(picked) if picked else 0.0


def simulate(
    controller: RoundController,
    profile: CostProfile,
    alpha: AlphaSchedule,
    *,
    n_tokens: int = 5000,
    lookup_len: LookupSchedule = 0,
    seed: int = 0,
) -> SimResult:
    """Run rounds until ``n_tokens`` are generated; return the totals and every round's plan."""
    rng = np.random.default_rng(seed)
    result = SimResult()
    gap: dict[str, int] = {}  # tokens each drafter missed since it last ran
    # Lookup's agreement (see LookupDrafter.last_agreement): in a copy, the text before the match agrees for as
    # long as the copy has gone on, i.e. for as many tokens in a row as the proposals predicted.
    streak = 0
    while result.tokens < n_tokens:
        at = result.tokens
        found = lookup_len(at, rng) if callable(lookup_len) else lookup_len
        alphas = alpha(at) if callable(alpha) else alpha
        right = _accepted(rng, alphas.get(LOOKUP, 0.0), found)
        proposal = list(range(at, at + right)) + [WRONG] * (found - right)
        plan = controller.plan(proposal, agreement=streak if found else 0)
        d = plan.drafter
        gamma = min(plan.gamma, found) if d == LOOKUP else plan.gamma
        if d == LOOKUP:
            accepted = min(right, gamma)
        else:
            accepted = _accepted(rng, alphas.get(d, 0.0), gamma) if d is not None else 0
        t_draft = t_verify = 0.0
        if d is not None:
            t_draft = gamma * profile.draft[d] + gap.get(d, 0) * profile.catchup.get(d, 0.0)
            gap[d] = 0
        t_verify = profile.verify(gamma + 1)
        if profile.noise:
            t_draft *= float(rng.lognormal(0.0, profile.noise))
            t_verify *= float(rng.lognormal(0.0, profile.noise))
        controller.observe(
            plan,
            n_drafted=gamma,
            n_accepted=accepted,
            t_draft=t_draft,
            t_verify=t_verify,
            committed=range(at, at + accepted + 1),
        )
        result.rounds.append((result.tokens, plan))
        for other in profile.draft:
            if other != d:
                gap[other] = gap.get(other, 0) + accepted + 1
        # The committed tokens are at, at + 1, ...: the proposal predicted its first `right` of them.
        streak = streak + accepted + 1 if found and right >= min(found, accepted + 1) else 0
        result.tokens += accepted + 1
        result.seconds += t_draft + t_verify
    return result


def _accepted(rng: np.random.Generator, alpha: float, gamma: int) -> int:
    k = 0
    while k < gamma and rng.random() < alpha:
        k += 1
    return k


def copy_spans(period: int, span: int) -> Callable[[int, np.random.Generator], int]:
    """A lookup schedule: the first ``span`` of every ``period`` tokens repeat earlier text; lookup has the
    rest of the span ready there and nothing elsewhere."""

    def found(tokens: int, rng: np.random.Generator) -> int:
        return max(span - tokens % period, 0)

    return found


def expected_rate(profile: CostProfile, drafter: str | None, gamma: int, alpha: float) -> float:
    """Tokens per second of always drafting ``gamma`` with ``drafter`` (no noise, no catch-up)."""
    if drafter is None or gamma == 0:
        return 1.0 / profile.verify(1)
    seconds = profile.verify(gamma + 1) + gamma * profile.draft[drafter]
    return expected_tokens(alpha, gamma) / seconds


def best_fixed(
    profile: CostProfile,
    alpha: AlphaSchedule,
    drafters: Sequence[str],
    *,
    max_gamma: int = 8,
    **kwargs,
) -> tuple[Plan, SimResult]:
    """Simulate every fixed strategy (plain, and each drafter at γ=1..max_gamma); return the fastest."""
    best: tuple[Plan, SimResult] | None = None
    for drafter, gamma in [(None, 0)] + [(d, g) for d in drafters for g in range(1, max_gamma + 1)]:
        result = simulate(FixedController(drafter, gamma), profile, alpha, **kwargs)
        if best is None or result.tokens_per_second > best[1].tokens_per_second:
            best = (Plan(drafter, gamma, "fixed"), result)
    assert best is not None
    return best


@dataclass(frozen=True)
class SyntheticDraftModel:
    """A draft model for :func:`replay`: each drafted token is the recorded one with probability ``alpha`` (until
    the first wrong one), at ``seconds`` a drafted token and ``catchup`` a token it missed while it sat out."""

    alpha: float
    seconds: float
    catchup: float = 0.0


def replay(
    controller: RoundController,
    prompt: Sequence[int],
    output: Sequence[int],
    verify_cost: Callable[[int], float],
    *,
    lookup: LookupDrafter | None = None,
    switch_cost: float = 0.0,
    model: SyntheticDraftModel | None = None,
    noise: float = 0.0,
    seed: int = 0,
) -> SimResult:
    """Generate ``output`` again after ``prompt`` with lookup drafting under ``controller``.

    The target is assumed to commit ``output`` whatever is drafted (greedy decoding does, up to near-ties), so a
    lookup draft is accepted for as long as it agrees with it. ``verify_cost(b)`` is the seconds of a decode of
    b tokens, and ``switch_cost`` what a decode adds when its width differs from the last one's (a new graph for
    llama.cpp); lookup itself is free. ``model``: a draft model (without one, a plan for one is an error).
    ``noise``: sigma of a log-normal factor on the timings the controller is told (the result counts the costs
    as they are), drawn from ``seed``.
    """
    rng = np.random.default_rng(seed)
    lookup = lookup or LookupDrafter()
    context = list(prompt)
    lookup.reset(context)
    controller.start_request({"model": len(prompt)} if model is not None else None)
    result = SimResult()
    n = len(output)
    last_width = 1
    gap = len(prompt)  # tokens the draft model has not seen
    while result.tokens < n:
        at = result.tokens
        room = n - at
        proposal = lookup.propose(context, min(controller.max_gamma, room - 1)).tokens
        plan = controller.plan(
            proposal, agreement=lookup.last_agreement, from_prompt=lookup.last_from_prompt, remaining=room
        )
        t_draft = 0.0
        if plan.drafter == LOOKUP:
            gamma = min(plan.gamma, len(proposal))
            accepted = 0
            while accepted < gamma and proposal[accepted] == output[at + accepted]:
                accepted += 1
        elif plan.drafter is None:
            gamma = accepted = 0
        elif plan.drafter == "model" and model is not None:
            gamma = min(plan.gamma, room - 1)
            accepted = _accepted(rng, model.alpha, gamma)
            t_draft = gamma * model.seconds + gap * model.catchup
            gap = 0
        else:
            raise ValueError(f"replay has no {plan.drafter!r} drafter")
        committed = output[at : at + accepted + 1]
        t_verify = verify_cost(gamma + 1) + (switch_cost if gamma + 1 != last_width else 0.0)
        last_width = gamma + 1
        told_draft, told_verify = t_draft, t_verify
        if noise:
            told_draft *= float(rng.lognormal(0.0, noise))
            told_verify *= float(rng.lognormal(0.0, noise))
        controller.observe(
            plan, n_drafted=gamma, n_accepted=accepted, t_draft=told_draft, t_verify=told_verify, committed=committed
        )
        result.rounds.append((at, plan))
        context.extend(committed)
        lookup.commit(context)
        if plan.drafter != "model":
            gap += len(committed)
        result.tokens += len(committed)
        result.seconds += t_draft + t_verify
    return result


def lookup_ceiling(
    prompt: Sequence[int],
    output: Sequence[int],
    verify_cost: Callable[[int], float],
    max_gamma: int,
    *,
    lookup: LookupDrafter | None = None,
) -> float:
    """Seconds the best possible lookup schedule would take to generate ``output`` after ``prompt``.

    An upper bound for any controller of lookup drafting: at each position it knows how far the lookup proposal
    agrees with the output and drafts exactly that far (or nothing). A dynamic program over positions picks the
    cheapest sequence of verify widths, priced by ``verify_cost(b)``; ``max_gamma`` caps a draft.
    """
    lookup = lookup or LookupDrafter()
    context = list(prompt)
    lookup.reset(context)
    n = len(output)
    agree: list[int] = []  # agree[i]: leading tokens of the proposal at position i that equal output[i:]
    for i in range(n):
        proposal = lookup.propose(context, min(max_gamma, n - i - 1)).tokens
        m = 0
        while m < len(proposal) and proposal[m] == output[i + m]:
            m += 1
        agree.append(m)
        context.append(output[i])
        lookup.commit(context)
    costs = [0.0] + [verify_cost(b) for b in range(1, max_gamma + 2)]
    best = [0.0] * (n + 1)  # best[i]: seconds to generate output[i:]
    for i in range(n - 1, -1, -1):
        # Drafting g tokens that are all accepted commits g + 1 (the target adds its own).
        best[i] = min(costs[g + 1] + best[i + g + 1] for g in range(agree[i] + 1))
    return best[0]
