"""The cost-aware controller on simulated rounds (synthetic costs and acceptance; no models, no real time)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgespec.drafters.controller import Controller
from edgespec.drafters.controller_sim import (
    CPU_PROFILE,
    GPU_PROFILE,
    H200_PROFILE,
    CostProfile,
    best_fixed,
    copy_spans,
    expected_rate,
    simulate,
)
from edgespec.drafters.estimates import Acceptance, VerifyCost, expected_tokens
from edgespec.drafters.plan import CACHE, LOOKUP, FixedController, Free, Load, Plan

# The CPU figures of DESIGN.md, with a little timing noise as a real clock has.
CPU = replace(CPU_PROFILE, noise=0.05)
# GPU-like: verify width almost free, drafting nearly free.
GPU = replace(GPU_PROFILE, draft={"model": 0.0005, "lookup": 0.00005}, noise=0.05)


def best_fixed_rate(profile: CostProfile, alphas: dict[str, float], lookup_len: int | None = None) -> float:
    """Expected tok/s of the best always-the-same strategy (exact, no simulation)."""
    rates = [expected_rate(profile, None, 0, 0.0)]
    for d, a in alphas.items():
        cap = lookup_len if d == "lookup" and lookup_len is not None else 8
        rates += [expected_rate(profile, d, g, a) for g in range(1, cap + 1)]
    return max(rates)


def rounds_from(result, tokens: int) -> int:
    """Index of the first round that started at or after ``tokens`` generated tokens."""
    return next(i for i, (t, _) in enumerate(result.rounds) if t >= tokens)


# ----- the round model --------------------------------------------------------------------------------------
def test_expected_tokens():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0


def test_plan_requires_gamma_zero_iff_plain():
    Plan(None, 0, "")
    Plan("model", 3, "")
    for bad in [(None, 2), ("model", 0), ("lookup", -1)]:
        with pytest.raises(ValueError):
            Plan(*bad)


def test_acceptance_estimate_converges_and_adapts():
    est = Acceptance(prior=0.6, prior_weight=2.0, decay=0.97)
    rng = np.random.default_rng(0)
    for alpha in (0.9, 0.2):
        for _ in range(300):
            k = 0
            while k < 4 and rng.random() < alpha:
                k += 1
            est.update(4, k)
        assert est.alpha == pytest.approx(alpha, abs=0.08)


def test_verify_cost_fills_unseen_widths():
    cost = VerifyCost(decay=0.9, slope_prior=0.5, optimism=0.0)
    assert cost.curve(4) is None
    cost.add(1, 0.1)
    assert cost.curve(3)[1:] == pytest.approx([0.1, 0.15, 0.2])  # the prior slope
    cost.add(3, 0.2)
    cost.add(5, 0.2)
    curve = cost.curve(7)
    assert curve[2] == pytest.approx(0.15)  # interpolated
    assert curve[4] == pytest.approx(0.2)
    assert curve[7] == pytest.approx(0.2 + 2 * 0.025)  # extrapolated with the least-squares slope
    optimistic = VerifyCost(decay=0.9, slope_prior=0.5, optimism=0.25)
    optimistic.add(1, 0.1)
    assert optimistic.curve(2)[1:] == pytest.approx([0.1, 0.75 * 0.15])  # unseen widths look cheaper


def _curve_from_scratch(cost: VerifyCost, max_b: int) -> list[float]:
    """The curve by its definition, from the measured widths alone (no cached sums or lists)."""
    seen = sorted((b, cost.measured(b)) for b in range(1, 200) if cost.measured(b) is not None)
    if len(seen) == 1:
        slope = cost.slope_prior * seen[0][1] / (1.0 + cost.slope_prior * (seen[0][0] - 1))
    else:
        mb = sum(b for b, _ in seen) / len(seen)
        mc = sum(c for _, c in seen) / len(seen)
        slope = max(sum((b - mb) * (c - mc) for b, c in seen) / sum((b - mb) ** 2 for b, _ in seen), 0.0)
    known = dict(seen)
    curve = [0.0]
    for b in range(1, max_b + 1):
        lower = [w for w, _ in seen if w < b]
        higher = [w for w, _ in seen if w > b]
        if b in known:
            curve.append(known[b])
            continue
        if lower and higher:
            lo, hi = lower[-1], higher[0]
            fill = known[lo] + (known[hi] - known[lo]) * (b - lo) / (hi - lo)
        elif lower:
            fill = known[lower[-1]] + slope * (b - lower[-1])
        else:
            fill = max(known[higher[0]] - slope * (higher[0] - b), 0.25 * known[higher[0]])
        curve.append(fill * (1.0 - cost.optimism))
    return curve


def test_verify_cost_curve_kept_up_to_date_equals_the_curve_worked_out_anew():
    # The curve is kept by add (values, widths in order, the fit's sums) for speed: after any mix of calibrated
    # widths, rounds at widths in and past them, and reads of the curve to any width, it is what its definition says.
    rng = np.random.default_rng(5)
    for trial in range(200):
        cost = VerifyCost(decay=0.9, slope_prior=0.5, optimism=0.25)
        widths = list(range(1, int(rng.integers(2, 18)) + 1))
        if trial % 2:
            widths = sorted({int(w) for w in rng.integers(1, 40, int(rng.integers(1, 10)))})
        else:
            for b in widths:
                cost.add(b, 0.01 * b, calibrated=True)
        for _ in range(int(rng.integers(1, 60))):
            cost.add(int(rng.choice(widths)), float(rng.uniform(0.001, 0.2)))
            max_b = int(rng.integers(1, 70))
            curve = cost.curve(max_b)  # a list read further before may come back whole
            assert curve[: max_b + 1] == pytest.approx(_curve_from_scratch(cost, max_b), rel=1e-9)


def test_a_decode_of_several_passes_is_a_sample_of_its_widest():
    cost = VerifyCost(decay=0.9, slope_prior=0.5, optimism=0.0)
    cost.add_decode([7, 3], 0.5)
    assert cost.measured(7) is None  # the other pass's cost unknown: nothing to subtract it from
    cost.add(3, 0.1)
    cost.add(7, 0.3)  # calibrated low
    for _ in range(30):
        cost.add_decode([3, 7], 0.5)  # beside a 3-row pass, the 7-row pass keeps taking 0.4 s
    assert cost.measured(7) == pytest.approx(0.4, rel=0.02)
    assert cost.measured(3) == pytest.approx(0.1)  # the narrower pass is what is subtracted, not what is learnt
    cost.add_decode([3, 7], 0.05)  # faster than the other pass alone: no sample
    assert cost.measured(7) == pytest.approx(0.4, rel=0.02)
    cost.add_decode([5], 0.2)  # one pass: a point of the curve as it is
    assert cost.measured(5) == pytest.approx(0.2)


# ----- the adaptive controller ------------------------------------------------------------------------------
def test_starts_by_measuring_plain_then_tries_the_draft_model_it_has_no_cost_for():
    ctl = Controller(["model", "lookup"])
    assert ctl.plain_tokens_per_second == 0.0
    first = ctl.plan()
    assert first.drafter is None and "measuring" in first.reason
    ctl.observe(first, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.08)
    assert ctl.plain_tokens_per_second == pytest.approx(12.5)
    second = ctl.plan()
    assert second.drafter == "model" and 0 < second.gamma <= 2 and "measuring" in second.reason


def test_without_drafters_it_is_plain_decoding():
    ctl = Controller([])
    for _ in range(3):
        plan = ctl.plan([1, 2, 3, 4, 5])  # no lookup drafter: its proposal is ignored
        assert plan.drafter is None and plan.gamma == 0
        ctl.observe(plan, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.05)


def test_observe_rejects_impossible_counts():
    ctl = Controller(["model"])
    with pytest.raises(ValueError):
        ctl.observe(Plan("model", 2), n_drafted=2, n_accepted=3, t_draft=0.0, t_verify=0.1)


def test_cpu_costly_drafts_choose_plain():
    alphas = {"model": 0.5}
    result = simulate(Controller(["model"]), CPU, alphas, n_tokens=4000, seed=1)
    assert best_fixed_rate(CPU_PROFILE, alphas) == expected_rate(CPU_PROFILE, None, 0, 0.0)  # plain is best
    assert result.share(None) > 0.98
    assert result.tokens_per_second > 0.97 * best_fixed_rate(CPU_PROFILE, alphas)
    last = result.rounds[-1][1]
    assert last.reason.startswith("plain est 1") and "tok/s; best draft model γ=" in last.reason


def test_cpu_draft_model_is_not_tried_again_once_its_cost_is_known():
    # Drafting with it loses on this CPU, its catch-up after plain rounds all the more: once measured, its estimate
    # keeps it out, also after its acceptance evidence has faded back to the prior.
    result = simulate(Controller(["model"]), CPU, {"model": 0.5}, n_tokens=4000, seed=2)
    assert sum(p.drafter == "model" for _, p in result.rounds) <= 4


def test_gpu_free_accepted_drafts_choose_long_drafts():
    alphas = {"model": 0.9}
    result = simulate(Controller(["model"]), GPU, alphas, n_tokens=10000, seed=3)
    later = [p for t, p in result.rounds if t >= 1000]
    assert sum(p.drafter == "model" for p in later) / len(later) > 0.98
    assert np.mean([p.gamma for p in later]) >= 6
    best = best_fixed_rate(replace(GPU, noise=0.0), alphas)
    assert result.tokens_per_second > 0.94 * best  # ~1% below it on average; the rest is sampling noise
    assert result.tokens_per_second > 2.5 * expected_rate(GPU, None, 0, 0.0)


def test_on_the_measured_h200_the_draft_model_stays_out_and_long_lookup_copies_pay():
    """The pair's costs as measured on an H200 (the draft two thirds of a target step): at the draft model's
    acceptance there (~0.65 per token on code), drafting with it loses at every γ, and the controller keeps to plain
    decoding within a few percent of it; a copy span that lookup proposes is still worth a long verify."""
    h200 = replace(H200_PROFILE, noise=0.05)
    plain = expected_rate(h200, None, 0, 0.0)
    assert all(expected_rate(h200, "model", g, 0.65) < plain for g in range(1, 9))
    result = simulate(Controller(["model"]), h200, {"model": 0.65}, n_tokens=6000, seed=5)
    later = [p for t, p in result.rounds if t >= 1000]
    assert sum(p.drafter == "model" for p in later) / len(later) < 0.05
    assert result.tokens_per_second > 0.95 * plain
    assert expected_rate(h200, LOOKUP, 8, 0.95) > 2 * plain


def test_recovers_after_a_phase_change():
    # α 0.9, then 0.1 (plain wins), then 0.9 again; the profile makes drafting lose at 0.1 and win at 0.9.
    profile = replace(GPU_PROFILE, noise=0.05)

    def alphas(tokens: int) -> dict[str, float]:
        return {"model": 0.1 if 2000 <= tokens < 4000 else 0.9}

    assert expected_rate(profile, "model", 1, 0.1) < expected_rate(profile, None, 0, 0.0)
    result = simulate(Controller(["model"]), profile, alphas, n_tokens=7000, seed=4)
    drop, back = rounds_from(result, 2000), rounds_from(result, 4000)
    plans = [p for _, p in result.rounds]
    low = plans[drop + 200 : back]
    assert sum(p.drafter is None for p in low) / len(low) > 0.95  # went plain within 200 rounds
    high = plans[back + 300 :]
    assert sum(p.drafter == "model" for p in high) / len(high) > 0.95  # speculating again within 300 rounds


@pytest.mark.parametrize("seed", range(3))
def test_cpu_lookup_with_long_accepted_matches_is_chosen(seed):
    alphas = {"model": 0.5, "lookup": 0.9}
    result = simulate(Controller(["model", "lookup"]), CPU, alphas, n_tokens=4000, lookup_len=8, seed=seed)
    later = [p for t, p in result.rounds if t >= 500]
    assert sum(p.drafter == "lookup" for p in later) / len(later) > 0.95
    assert result.tokens_per_second > 0.95 * best_fixed_rate(CPU_PROFILE, alphas, lookup_len=8)
    assert result.tokens_per_second > 1.5 * expected_rate(CPU, None, 0, 0.0)


def test_cpu_lookup_that_is_rarely_accepted_is_not_chosen():
    alphas = {"model": 0.5, "lookup": 0.2}
    result = simulate(Controller(["model", "lookup"]), CPU, alphas, n_tokens=4000, lookup_len=8, seed=5)
    assert result.share(None) > 0.95
    assert result.tokens_per_second > 0.97 * expected_rate(CPU, None, 0, 0.0)


def test_cpu_intermittent_lookup_matches_beat_plain():
    def found(tokens: int, rng: np.random.Generator) -> int:  # half the rounds have a match of 1..10 tokens
        return int(rng.integers(1, 11)) if rng.random() < 0.5 else 0

    def fixed_lookup_rate(gamma: int) -> float:  # exact: plain when nothing is found, else lookup min(γ, L)
        tokens, seconds = 0.5, 0.5 * CPU.verify(1)
        for length in range(1, 11):
            g = min(gamma, length)
            tokens += 0.05 * expected_tokens(0.9, g)
            seconds += 0.05 * (CPU.verify(g + 1) + g * CPU.draft["lookup"])
        return tokens / seconds

    alphas = {"model": 0.5, "lookup": 0.9}
    auto = simulate(Controller(["model", "lookup"]), CPU, alphas, n_tokens=6000, lookup_len=found, seed=6)
    best = max(fixed_lookup_rate(g) for g in range(1, 9))
    assert auto.tokens_per_second > 0.95 * best
    assert auto.tokens_per_second > 1.3 * expected_rate(CPU, None, 0, 0.0)


def test_gpu_mixes_lookup_in_copied_spans_with_the_model_elsewhere():
    # 40 of every 100 tokens repeat earlier text. No single fixed strategy can use lookup there and the draft
    # model elsewhere; the controller does, per round.
    alphas = {"model": 0.7, "lookup": 0.9}
    spans = copy_spans(100, 40)
    auto = simulate(Controller(["model", "lookup"]), GPU, alphas, n_tokens=6000, lookup_len=spans, seed=8)
    _, best = best_fixed(GPU, alphas, ["model", "lookup"], n_tokens=6000, lookup_len=spans, seed=8)
    assert auto.tokens_per_second > 1.1 * best.tokens_per_second
    in_span = [p.drafter for t, p in auto.rounds if t >= 1000 and t % 100 < 38]
    # Not all: a span's first tokens come right after proposals that found nothing (no run yet), where a fresh
    # match is a guess; the draft model takes those until the run shows the copy.
    assert in_span.count("lookup") / len(in_span) > 0.8


def test_best_fixed_helper_finds_the_best_strategy():
    plan, result = best_fixed(CPU, {"model": 0.5, "lookup": 0.9}, ["lookup"], n_tokens=1000, lookup_len=8)
    assert (plan.drafter, plan.gamma) == ("lookup", 3)  # b=4 is the CPU's sweet spot (1.99 vs 2.15 for b=3)
    assert result.tokens_per_second == pytest.approx(expected_rate(CPU, "lookup", 3, 0.9), rel=0.05)


def test_a_drafter_that_drafts_nothing_is_not_retried_every_round():
    # A draft model whose confidence cutoff always stops at once: its time is priced as one token's, and it is not
    # tried every round.
    ctl = Controller(["model"])
    model_rounds = 0
    for _ in range(500):
        plan = ctl.plan()
        model_rounds += plan.drafter == "model"
        ctl.observe(plan, n_drafted=0, n_accepted=0, t_draft=0.04 if plan.drafter else 0.0, t_verify=0.08)
    assert 1 <= model_rounds <= 25
    assert ctl.plain_tokens_per_second == pytest.approx(12.5)


def test_estimates_carry_across_requests():
    ctl = Controller(["model"])
    simulate(ctl, GPU, {"model": 0.9}, n_tokens=1000, seed=7)
    ctl.start_request()  # optional hint; estimates are kept
    plan = ctl.plan()
    assert plan.drafter == "model" and plan.gamma >= 5
    assert ctl.alpha("model") > 0.8


# ----- the fixed controller ---------------------------------------------------------------------------------
def test_fixed_controller():
    assert FixedController(None, 0).plan([7] * 5) == Plan(None, 0, "fixed: plain decoding")
    assert FixedController("model", 0).plan().drafter is None
    model = FixedController("model", 4)
    assert (model.plan([]).drafter, model.plan().gamma) == ("model", 4)
    lookup = FixedController("lookup", 5)
    assert (lookup.plan([7] * 3).drafter, lookup.plan([7] * 3).gamma) == ("lookup", 3)
    assert lookup.plan([7] * 9).gamma == 5
    assert lookup.plan([]) == Plan(None, 0, "fixed: lookup found nothing")
    with pytest.raises(ValueError):
        FixedController(None, 2)
    with pytest.raises(ValueError):
        FixedController("model", -1)


def test_fixed_controller_measures_plain_speed_from_one_token_decodes():
    ctl = FixedController("lookup", 4)
    assert ctl.plain_tokens_per_second == 0.0
    ctl.observe(Plan("lookup", 4), n_drafted=4, n_accepted=2, t_draft=0.0, t_verify=0.2)
    assert ctl.plain_tokens_per_second == 0.0
    ctl.observe(Plan(None, 0), n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.05)
    assert ctl.plain_tokens_per_second == pytest.approx(20.0)


def test_a_draft_model_far_behind_is_not_caught_up_for_a_few_tokens_left():
    # A GPU-like machine where the draft model pays, its catch-up cheap enough per token to be within the
    # allowance: after a new 500-token prompt it drafts, unless the request has only a few tokens left to win
    # the prefill back in (the bench's 64-token replies to long prompts: auto's first token came late).
    def primed() -> Controller:
        ctl = Controller(["model"])
        ctl.record_costs({b: 0.05 + 0.001 * b for b in range(1, 10)}, {"model": 0.004}, {"model": 0.002})
        for _ in range(20):
            ctl.observe(Plan("model", 4), n_drafted=4, n_accepted=4, t_draft=0.016, t_verify=0.055)
        ctl.start_request({"model": 500})
        return ctl

    assert primed().plan().drafter == "model"  # tokens left unknown: the allowance assumes a long reply
    assert primed().plan(remaining=100_000).drafter == "model"
    short = primed().plan(remaining=16)
    assert short.drafter is None and short.gamma == 0


def test_tokens_a_constraint_forces_go_in_as_far_as_the_batch_gains():
    """Forced tokens are sure to be accepted, but each is a row. Alone every one pays (a wider decode costs less
    than the steps it saves); in a batch whose next row is dear (here a decode past 4 rows costs almost twice as
    much), none does, and a fixed plan takes them all."""
    ctl = Controller(["lookup"], max_gamma=8)
    ctl.record_costs({1: 0.10, 2: 0.12, 3: 0.14, 4: 0.16, 5: 0.30, 6: 0.33, 7: 0.36}, {})
    assert ctl.certain_len(3) == 3
    assert ctl.certain_len(3, Load(rows=3, tokens=3.0, seconds=0.0, room=60)) == 0
    assert ctl.certain_len(5, Load(rows=1, tokens=1.0, seconds=0.0, room=60)) == 2  # up to the 4-row block
    assert ctl.certain_len(5, Load(rows=1, tokens=1.0, seconds=0.0, room=3)) == 2  # and within the decode's room
    assert ctl.certain_len(5, Load(rows=1, tokens=1.0, seconds=0.0, room=2)) == 1
    assert FixedController("lookup", 4).certain_len(3, Load(rows=3, tokens=3.0, room=60)) == 3


def test_stopping_early_weighs_every_draft_length_alike():
    """A plan stops weighing longer drafts once even their most tokens could not beat the best so far. On random
    machines (curves that need not grow with width), loads (one pass or llama.cpp's several) and evidence, the
    option it picks is the one weighing every γ picks; a bound that was not one would show up here."""
    from edgespec.drafters.plan import DecodeSeconds

    rng = np.random.default_rng(7)
    for _ in range(300):
        ctl = Controller(["model", "lookup"], max_gamma=16)
        step = float(rng.uniform(0.001, 0.06))
        slope = float(rng.uniform(0.0, 0.6))
        curve = {b: step * (1 + slope * (b - 1) * float(rng.uniform(0.2, 1.0))) for b in range(1, 60)}
        ctl.record_costs(curve, {"model": step * float(rng.uniform(0.05, 0.9))}, {"model": step * 0.1})
        ctl.start_request({"model": int(rng.integers(0, 40))})
        for _ in range(int(rng.integers(0, 6))):
            n = int(rng.integers(1, 8))
            ctl._state["model"].acceptance.update(n, int(rng.integers(0, n + 1)))
        proposal = int(rng.integers(1, 17))
        ctl._lookup.offer(list(range(proposal)), int(rng.integers(0, 6)))
        others = int(rng.integers(0, 6))
        if others == 0:
            load = Load()
        else:
            widths = [int(w) for w in rng.integers(1, 4, size=others)]
            load = Load(
                rows=sum(widths), tokens=float(sum(widths)), seconds=float(rng.uniform(0, step)), room=60,
                passes=(lambda n, w=widths: [*w, n]) if rng.random() < 0.5 else None,
                sequences=others, log_tokens=float(sum(np.log(widths))),
            )  # fmt: skip
        table = ctl._verify.curve(load.rows + 17)
        for drafter, alpha, cap in (("model", None, 16), ("model", 0.95, 16), ("lookup", None, proposal)):
            kw = dict(alpha=alpha, load=load, remaining=int(rng.integers(1, 200)))
            pruned = ctl._option(drafter, range(1, cap + 1), table, decode=DecodeSeconds(load, table), **kw)
            every = ctl._option(drafter, range(1, cap + 1), table, prune=False, **kw)
            assert pruned == every


class _Clock:
    """perf_counter for the controller: every reading 100 µs after the last, so a plan takes 100 µs."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-4
        return self.now


def _settling(monkeypatch: pytest.MonkeyPatch, step: float) -> Controller:
    import edgespec.drafters.controller as module

    monkeypatch.setattr(module, "time", _Clock())
    ctl = Controller(["model", "lookup"], max_gamma=16, plan_budget=0.01)
    # A GPU-like curve and a cheap draft model: beside three others' rows it does not pay at its prior α (0.6),
    # so plain decoding is the plan.
    ctl.record_costs({b: step * (1 + 0.15 * (b - 1)) for b in range(1, 40)}, {"model": step * 0.1}, {"model": 0.0})
    ctl.start_request({"model": 0})
    return ctl


def test_a_plain_plan_stands_for_some_rounds_where_planning_is_dear_beside_the_decode(monkeypatch):
    """With a 1.8 ms step, a 100 µs plan is 5.6 % of it: a plain plan stands for the next 5 rounds (one plan per
    6 rounds keeps planning under 1 %), then the controller plans again."""
    ctl = _settling(monkeypatch, 0.0018)
    load = Load(rows=3, tokens=3.0, seconds=0.0, room=60, sequences=3)

    def round_(lookup=(), load=load):
        plan = ctl.plan(lookup, load)
        ctl.observe(plan, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.0018, committed=[1], record_verify=False)
        return plan

    first = round_()
    assert first.drafter is None
    assert [round_() for _ in range(5)] == [first] * 5 and ctl.plans_reused == 5
    round_()  # worked out again
    assert ctl.plans_reused == 5
    round_()
    assert ctl.plans_reused == 6
    # What the plan was made from moves: a lookup proposal, another load. Each is planned.
    round_(lookup=[5, 6, 7])
    assert ctl.plans_reused == 6
    round_()  # nothing proposed: the plan that turned the proposal down stands
    assert ctl.plans_reused == 7
    round_(load=replace(load, rows=4, tokens=4.0, sequences=4))
    assert ctl.plans_reused == 7


def test_a_plain_plan_made_for_a_proposal_stands_for_proposals_no_firmer_and_no_longer(monkeypatch):
    """Where planning is dear (a GPU), lookup finds some match in most rounds of any text, mostly a guess that plain
    decoding beats. A plain plan made for a proposal in agreement bucket b of length n stands for later proposals of
    bucket <= b and length <= n; a longer proposal, or a firmer one (a copy getting under way), is planned anew."""
    ctl = _settling(monkeypatch, 0.0018)
    load = Load(rows=3, tokens=3.0, seconds=0.0, room=60, sequences=3)

    def round_(lookup, agreement=0):
        plan = ctl.plan(lookup, load, agreement=agreement)
        ctl.observe(plan, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.0018, committed=[1], record_verify=False)
        return plan

    first = round_([5, 6, 7])  # planned: a guess at its prior odds, turned down
    assert first.drafter is None and ctl.plans_reused == 0
    assert round_([8, 9]) is first and round_([2, 3, 4]) is first  # as weak, no longer
    assert ctl.plans_reused == 2
    longer = round_([5, 6, 7, 8])  # longer than the one turned down: planned anew
    assert ctl.plans_reused == 2 and longer is not first
    firmer = round_([5, 6, 7], agreement=2)  # better anchored: planned anew
    assert ctl.plans_reused == 2 and firmer is not longer
    assert round_([]) is firmer and ctl.plans_reused == 3  # nothing proposed: stands

    # Alone, where a short draft of a weak proposal is a close call, only a plan made with nothing proposed stands.
    alone = Controller(["lookup"], max_gamma=16, plan_budget=0.01)  # (planning still takes 100 µs a plan)
    alone.record_costs({b: 0.0018 * (1 + 0.5 * (b - 1)) for b in range(1, 40)}, {})  # a guess loses alone too
    first = alone.plan([5, 6, 7])
    assert first.drafter is None and alone.plan([8, 9]) is not first and alone.plans_reused == 0
    again = alone.plan([5, 6, 7])
    assert again.drafter is None and again is not first and alone.plans_reused == 0


def test_with_lookup_alone_a_round_that_proposes_nothing_is_plain_without_weighing(monkeypatch):
    """Lookup the only drafter and no proposal: plain decoding is the only option, so no plan is worked out (on a
    GPU most rounds of text that copies little are such rounds, and a plan each is a share of the step); with a draft
    model there is still a choice to weigh."""
    load = Load(rows=3, tokens=3.0, seconds=0.0, room=60, sequences=3)
    curve = {b: 0.0018 * (1 + 0.05 * (b - 1)) for b in range(1, 40)}
    ctl = Controller(["lookup"], max_gamma=16, plan_budget=0.01)
    ctl.record_costs(curve, {})

    def never(*args, **kwargs):
        raise AssertionError("weighed a round with nothing to draft")

    monkeypatch.setattr(ctl, "_plan", never)
    for _ in range(3):
        plan = ctl.plan([], load)
        assert plan.drafter is None and plan.gamma == 0
        ctl.observe(plan, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.0018, committed=[1], record_verify=False)
    with pytest.raises(AssertionError, match="weighed"):
        ctl.plan([5, 6, 7], load)  # a proposal is weighed
    both = Controller(["model", "lookup"], max_gamma=16, plan_budget=0.01)
    both.record_costs(curve, {"model": 0.0002})
    monkeypatch.setattr(both, "_plan", never)
    with pytest.raises(AssertionError, match="weighed"):
        both.plan([], load)  # the draft model can still draft


def test_where_planning_is_cheap_beside_the_decode_every_round_is_planned(monkeypatch):
    """On a CPU (a 40 ms step) a 100 µs plan is 0.25 % of it: the plan budget changes nothing."""
    ctl = _settling(monkeypatch, 0.040)
    load = Load(rows=3, tokens=3.0, seconds=0.0, room=60, sequences=3)
    for _ in range(20):
        plan = ctl.plan((), load)
        ctl.observe(plan, n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.04, committed=[1], record_verify=False)
    assert ctl.plans_reused == 0


def test_a_change_of_width_is_priced_apart_and_not_counted_twice():
    # llama.cpp builds a new graph for a batch of another shape: a round's decode pays ``switch`` when its width
    # differs from the last one's. The curve keeps what a width costs while its graph is reused.
    cost = VerifyCost(decay=0.5, slope_prior=0.5, optimism=0.0)
    cost.switch = 0.002
    for b in (1, 4):  # a calibration's repeated decodes of one width: taken as they are
        cost.add(b, 0.010 * b, calibrated=True)
    cost.add(1, 0.010)
    cost.add(4, 0.040 + 0.002)  # a round's draft after a plain round: the change comes off
    cost.add(1, 0.010 + 0.002)  # and back
    cost.add(1, 0.010)  # the same width again: as it is
    assert cost.measured(1) == pytest.approx(0.010) and cost.measured(4) == pytest.approx(0.040)


def _drafting_controller(switch: float) -> Controller:
    """A flat, GPU-like curve (1.8 ms a step, +2 % a row) and lookup's prior odds for a well-anchored proposal."""
    ctl = Controller([LOOKUP], max_gamma=8)
    ctl.record_costs({b: 0.0018 * (1 + 0.02 * (b - 1)) for b in range(1, 10)}, {}, switch=switch)
    return ctl


def test_a_draft_between_plain_rounds_pays_for_leaving_and_coming_back():
    proposal = list(range(100, 104))  # 4 tokens, at agreement 6: worth a draft where a change of width is free
    assert _drafting_controller(0.0).plan(proposal, agreement=6).drafter == LOOKUP
    # Where a change costs as much as a step (its cost: two changes, going and coming back), it is not worth it.
    assert _drafting_controller(0.0018).plan(proposal, agreement=6).drafter is None
    # Once drafting, the same width again costs no change, and going back to plain was paid on the way in.
    ctl = _drafting_controller(0.0018)
    assert ctl._width_change(1) == 0.0 and ctl._width_change(5) == pytest.approx(2 * 0.0018)
    ctl.observe(Plan(LOOKUP, 4), n_drafted=4, n_accepted=4, t_draft=0.0, t_verify=0.002, committed=[1] * 5)
    assert ctl._width_change(5) == 0.0 and ctl._width_change(1) == 0.0
    assert ctl._width_change(3) == pytest.approx(0.0018)  # one draft width to another: one change
    ctl.start_request()  # a new request starts from its prompt's decode: leaving plain is charged again
    assert ctl._width_change(5) == pytest.approx(2 * 0.0018)


def test_the_cached_curve_of_decode_costs_is_what_working_it_out_again_gives():
    """Rounds refine one width at a time: a curve of measured widths is updated in place, one with widths read off
    the fit is worked out again. Either way the plan reads what a fresh computation would give."""

    rng = np.random.default_rng(3)
    cost = VerifyCost(0.9, 0.5, 0.1)
    for b in range(1, 18):
        cost.add(b, 0.002 * (1 + 0.2 * b), calibrated=True)
    for _ in range(400):
        b = int(rng.integers(1, 24))  # now and then a width never measured: the fit moves
        cost.add(b, 0.002 * (1 + 0.2 * b) * float(rng.uniform(0.8, 1.3)))
        max_b = int(rng.integers(4, 30))
        cached = list(cost.curve(max_b))
        cost._curve = None
        assert cached[: max_b + 1] == cost.curve(max_b)[: max_b + 1]


def test_forgetting_costs_keeps_the_evidence_and_takes_new_costs():
    ctl = Controller(["model", LOOKUP], max_gamma=4)
    ctl.record_costs({b: 0.01 * b for b in range(1, 6)}, {"model": 0.005}, {"model": 0.001})
    for _ in range(10):
        ctl.observe(Plan("model", 2), n_drafted=2, n_accepted=2, t_draft=0.01, t_verify=0.03)
    alpha = ctl.alpha("model")
    ctl.forget_costs()
    assert ctl.verify_cost.curve(4) is None and ctl.plain_tokens_per_second == 0.0
    assert ctl._state["model"].cost.value is None and ctl._state["model"].catchup.value is None
    assert ctl.alpha("model") == alpha
    ctl.record_costs({b: 0.02 for b in range(1, 6)}, {"model": 0.002})
    assert ctl.plain_tokens_per_second == pytest.approx(50.0) and ctl.verify_cost.measured(5) == pytest.approx(0.02)


# ----- free proposals from two sources ----------------------------------------------------------------------------
def test_offer_weighs_the_likelier_free_proposal_and_both_forecasts_learn_from_every_round():
    """Lookup's proposal and the suffix cache's are each checked against the committed tokens by a forecast of their
    own, whichever is planned: a long cache match starts out likelier than a bare lookup match, and after rounds in
    which the cache's proposals were wrong and lookup's right, lookup's is the one planned."""
    ctl = Controller([LOOKUP], max_gamma=4, cache=True)
    ctl.record_costs({b: 0.01 * (1 + 0.1 * b) for b in range(1, 6)}, {})
    lookup, cached = Free([1, 2, 3], LOOKUP, agreement=0), Free([7, 8, 9], CACHE, agreement=32)
    assert ctl.offer([lookup, cached]) == cached
    plan = ctl.plan(cached.tokens, agreement=32)
    assert plan.drafter == LOOKUP and plan.reason.startswith("cache γ=3")  # a free draft, priced by the cache's
    ctl.observe(plan, n_drafted=3, n_accepted=0, t_draft=0.0, t_verify=0.013, committed=[1])
    for _ in range(40):
        ctl.offer([lookup, cached])
        ctl.plan(lookup.tokens)
        ctl.observe(Plan(None, 0), n_drafted=0, n_accepted=0, t_draft=0.0, t_verify=0.011, committed=[1, 2, 3])
    assert ctl.offer([lookup, cached]) == lookup
    # Nothing found by either: the first given (lookup's empty proposal), and nothing to draft.
    assert ctl.offer([Free([], LOOKUP), Free([], CACHE)]).tokens == []
    assert ctl.plan([]).drafter is None


def test_a_fixed_draft_length_drafts_the_longer_free_proposal():
    fixed = FixedController(LOOKUP, 4)
    lookup, cached = Free([1, 2], LOOKUP), Free([7, 8, 9], CACHE, agreement=3)
    assert fixed.offer([lookup, cached]) == cached
    assert fixed.offer([Free([1, 2, 3], LOOKUP), cached]).source == LOOKUP  # a tie: the first given
    assert fixed.offer([]).tokens == ()
