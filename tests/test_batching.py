"""Many requests at once on one engine (fakes): the same outputs as alone, exact distributions while sequences share
decodes, lanes taken and given back, load-aware plans."""

from __future__ import annotations

import math
import sys
import threading
import time

import numpy as np
import pytest
from biased_verifiers import accept_if_p_at_least_q
from exact_reference import output_checks
from fakes import FakeModel
from stat_tools import worst
from test_engine import ENGINE_PATHS, ENGINE_PROMPT, MARGIN, exact_output_joint, plain_greedy

from edgespec import engine as engine_module
from edgespec import prefill as prefill_module
from edgespec.api import Runtime
from edgespec.drafters.controller import Controller
from edgespec.drafters.estimates import VerifyCost
from edgespec.drafters.plan import NO_LOAD, Load, Plan
from edgespec.engine import Engine
from edgespec.errors import EdgespecError, InvalidParameterError
from edgespec.events import Chunk, Finished
from edgespec.generation import Request
from edgespec.prefill import Prefill
from edgespec.sampling import SamplingParams

PROMPTS = [[3, 5, 7, 5, 3], [1, 2, 3, 1, 2, 3], [4, 4, 9, 2], [8, 6, 8, 6, 8, 6, 8]]


def models(n_seq: int, noise: float = 1.0) -> tuple[FakeModel, FakeModel]:
    return FakeModel(eos_bias=-9, n_seq=n_seq), FakeModel(seed=1, noise=noise, eos_bias=-9, n_seq=n_seq)


def threaded(engine: Engine, prompts, params) -> list[Finished]:
    """Each prompt streamed from its own thread, all started together."""
    results: list[Finished | BaseException | None] = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def work(i: int) -> None:
        try:
            start.wait(timeout=10)
            events = list(engine.stream(prompts[i], params[i] if isinstance(params, list) else params))
            results[i] = events[-1]
        except BaseException as error:  # noqa: BLE001  # reported by the main thread
            results[i] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


@pytest.mark.parametrize("draft_len", [0, 3, "auto"])
def test_concurrent_greedy_requests_each_equal_their_solo_plain_decoding(draft_len) -> None:
    # Decodes that take 2 ms, as real ones take time: the four threads' requests overlap for certain.
    target = FakeModel(eos_bias=-9, n_seq=4, delay=0.002)
    draft = FakeModel(seed=1, noise=1.0, eos_bias=-9, n_seq=4, delay=0.001)
    engine = Engine(target, draft, draft_len=draft_len)
    done = threaded(engine, PROMPTS, SamplingParams(temperature=0, max_tokens=30))
    for prompt, finished in zip(PROMPTS, done, strict=True):
        assert list(finished.tokens) == plain_greedy(prompt, 30, target)
    # the verifies were shared: some decode carried more than one sequence
    assert max(len(b) for b in target.batches) > 1
    assert engine.steps > 0 and engine.step_sequences > engine.steps


def test_generate_many_batches_on_one_thread_and_keeps_the_order() -> None:
    target, draft = models(2)
    runtime = Runtime(Engine(target, draft, draft_len=2))
    params = SamplingParams(temperature=0, max_tokens=12)
    out = runtime.generate_many(PROMPTS, params)  # 4 prompts on 2 lanes: two waves
    assert [list(f.tokens) for f in out] == [plain_greedy(p, 12, target) for p in PROMPTS]
    assert max(len(b) for b in target.batches) == 2
    with pytest.raises(InvalidParameterError, match="sampling settings"):
        runtime.generate_many(PROMPTS, [params])


def test_a_seeded_request_gives_what_it_gives_alone_whatever_shares_its_decodes() -> None:
    params = SamplingParams(temperature=0.9, top_k=5, seed=11, max_tokens=25)
    target, draft = models(1)
    alone = list(Engine(target, draft, draft_len=3).stream(PROMPTS[0], params))[-1]
    target, draft = models(4)
    others = [SamplingParams(temperature=1.2, seed=s, max_tokens=40) for s in (1, 2, 3)]
    together = Runtime(Engine(target, draft, draft_len=3)).generate_many(PROMPTS, [params, *others])
    assert together[0].tokens == alone.tokens


@pytest.mark.exactness
@pytest.mark.parametrize("drafter", ["model", "lookup"])
def test_outputs_keep_the_targets_distribution_while_sequences_share_decodes(drafter: str) -> None:
    """4000 requests of γ+1 tokens, four at a time in the same decodes (with longer neighbours so that rounds of
    different positions mix), against the exact joint; the biased verifier must fail the same way."""
    params, _ = ENGINE_PATHS["top_k"]
    gamma, n = 3, 4000
    target = FakeModel(n_vocab=6, sharp=1.0, eos_bias=-1.0, n_seq=4)
    draft = FakeModel(n_vocab=6, seed=4, noise=1.0, sharp=1.0, eos_bias=-1.0, n_seq=4) if drafter == "model" else None
    engine = Engine(target, draft, draft_len=gamma, lookup=drafter == "lookup")
    runtime = Runtime(engine)
    seeds = np.random.default_rng(1).integers(2**31, size=n)
    requests = [
        SamplingParams(**{**params.__dict__, "max_tokens": gamma + 1 + 12 * (i % 2), "seed": int(seeds[i])})
        for i in range(n)
    ]
    outputs = np.zeros((n, gamma + 1), dtype=np.int64)
    for i, done in enumerate(runtime.generate_many([ENGINE_PROMPT] * n, requests)):
        tokens = list(done.tokens[: gamma + 1])
        outputs[i] = tokens + [0] * (gamma + 1 - len(tokens))
    assert max(len(b) for b in target.batches) == 4
    checks = output_checks(outputs, exact_output_joint(target, ENGINE_PROMPT, params, gamma + 1))
    assert worst(checks).ratio <= 1, checks


@pytest.mark.exactness
def test_the_batched_checks_reject_a_biased_verifier(monkeypatch) -> None:
    monkeypatch.setattr("edgespec.generation.verify_stochastic", accept_if_p_at_least_q)
    params, _ = ENGINE_PATHS["top_k"]
    gamma, n = 3, 4000
    target = FakeModel(n_vocab=6, sharp=1.0, eos_bias=-1.0, n_seq=4)
    draft = FakeModel(n_vocab=6, seed=4, noise=1.0, sharp=1.0, eos_bias=-1.0, n_seq=4)
    runtime = Runtime(Engine(target, draft, draft_len=gamma, lookup=False))
    seeds = np.random.default_rng(2).integers(2**31, size=n)
    requests = [SamplingParams(**{**params.__dict__, "max_tokens": gamma + 1, "seed": int(s)}) for s in seeds]
    outputs = np.zeros((n, gamma + 1), dtype=np.int64)
    for i, done in enumerate(runtime.generate_many([ENGINE_PROMPT] * n, requests)):
        outputs[i, : len(done.tokens)] = done.tokens
    checks = output_checks(outputs, exact_output_joint(target, ENGINE_PROMPT, params, gamma + 1))
    assert worst(checks).ratio > MARGIN, checks


def test_a_request_waits_for_a_lane_and_takes_the_one_with_its_prefix() -> None:
    target, draft = models(2)
    engine = Engine(target, draft, draft_len=2)
    runtime = Runtime(engine)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    first = runtime.generate_many(PROMPTS[:2], greedy)  # lane 0 holds PROMPTS[0]'s text, lane 1 PROMPTS[1]'s
    follow_up = PROMPTS[1] + list(first[1].tokens) + [5, 7]
    again = runtime.generate(follow_up, greedy)
    assert again.stats.prefilled_tokens == 2  # the last reply token and 5 (7 is pending): lane 1 was reused
    # A third thread waits until one of two running requests ends.
    long = SamplingParams(temperature=0, max_tokens=60)
    done = threaded(engine, PROMPTS[:3], [long, long, greedy])
    assert [len(d.tokens) for d in done] == [60, 60, 8]


def test_one_thread_cannot_wait_on_lanes_it_holds_itself() -> None:
    target, draft = models(2)
    engine = Engine(target, draft)
    greedy = SamplingParams(temperature=0, max_tokens=40)
    a, b = engine.stream(PROMPTS[0], greedy), engine.stream(PROMPTS[1], greedy)
    next(a), next(b)
    with pytest.raises(EdgespecError, match="busy"):
        next(engine.stream(PROMPTS[2], greedy))
    b.close()  # a consumer leaving frees its lane at once
    rest = list(engine.stream(PROMPTS[2], greedy))
    assert isinstance(rest[-1], Finished) and len(rest[-1].tokens) == 40
    assert isinstance(next(a), Chunk)
    a.close()
    assert engine.active == 0


def test_cancel_while_waiting_for_a_lane_ends_the_request_at_once() -> None:
    target, draft = models(1)
    engine = Engine(target, draft)
    holder = engine.stream(PROMPTS[0], SamplingParams(temperature=0, max_tokens=40))
    next(holder)
    cancel = threading.Event()
    result: list = []
    request = SamplingParams(max_tokens=9)
    waiter = threading.Thread(target=lambda: result.extend(engine.stream(PROMPTS[1], request, cancel=cancel)))
    waiter.start()
    cancel.set()
    waiter.join(timeout=10)
    assert not waiter.is_alive() and result[-1].finish_reason == "cancelled" and engine.waiting == 0
    holder.close()


def test_a_failing_draft_fails_its_own_request_only(monkeypatch) -> None:
    target, draft = models(2)
    engine = Engine(target, draft, draft_len=3, lookup=False)
    greedy = SamplingParams(temperature=0, max_tokens=20)
    bad = engine._lanes[1].drafters["model"]

    def broken(*_args):
        raise RuntimeError("draft model failed")

    monkeypatch.setattr(bad, "propose", broken)
    outcomes: list = []

    def work(prompt):
        try:
            outcomes.append(list(engine.stream(prompt, greedy))[-1])
        except RuntimeError as error:
            outcomes.append(error)

    a = engine.stream(PROMPTS[0], greedy)
    next(a)  # lane 0 is taken: the next request gets lane 1, whose drafter fails
    t = threading.Thread(target=work, args=(PROMPTS[1],))
    t.start()
    rest = list(a)
    t.join(timeout=10)
    assert isinstance(rest[-1], Finished) and len(rest[-1].tokens) == 20
    assert len(outcomes) == 1 and isinstance(outcomes[0], RuntimeError)
    assert engine.active == 0


# ----- load-aware planning ---------------------------------------------------------------------------------------
def calibrated(curve: dict[int, float], draft_cost: float = 0.0002) -> Controller:
    """A controller with a cheap draft model that has been right 9 times in 10."""
    controller = Controller(["model"], max_gamma=8)
    controller.record_costs(curve, {"model": draft_cost})
    drafted = Plan("model", 4)
    for _ in range(30):
        controller.plan()
        controller.observe(drafted, n_drafted=4, n_accepted=4, t_draft=0.0008, t_verify=curve[5])
        controller.plan()
        controller.observe(drafted, n_drafted=4, n_accepted=3, t_draft=0.0008, t_verify=curve[5])
    return controller


def test_a_flat_decode_cost_speculates_alone_and_stops_when_the_batch_is_compute_bound() -> None:
    # A GPU-like curve: flat to 8 rows, then every row costs as much as a step does alone.
    gpu = {b: 0.010 if b <= 8 else 0.010 * b / 8 for b in range(1, 66)}
    controller = calibrated(gpu)
    alone = controller.plan((), NO_LOAD)
    busy = controller.plan((), Load(rows=40, tokens=40.0, seconds=0.0, room=25))
    assert alone.gamma >= 4, alone
    assert busy.gamma == 0, busy


def test_on_a_cpu_curve_the_load_shares_the_fixed_cost_that_made_drafting_pay() -> None:
    # A CPU: each row costs 0.7 of a step, plus a fixed part (streaming the weights) that a batch shares. Alone, a
    # draft pays by amortising that fixed part; with three other rows it is already amortised.
    cpu = calibrated({b: 0.010 * (0.3 + 0.7 * b) for b in range(1, 66)})
    assert cpu.plan((), NO_LOAD).gamma > 0
    assert cpu.plan((), Load(rows=3, tokens=3.0, room=62)).gamma == 0


def test_the_batch_counts_its_sequences_tokens_by_their_geometric_mean() -> None:
    three_twos = Load(rows=3, tokens=6.0, sequences=3, log_tokens=3 * math.log(2.0))
    assert three_twos.batch_tokens(2.0) == pytest.approx(8.0)  # all alike: the sum
    assert three_twos.batch_tokens(16.0) < 6.0 + 16.0  # one ahead of the others: less than the sum
    assert Load(rows=3, tokens=3.0).batch_tokens(5.0) == 8.0  # the others not given as sequences: summed
    assert NO_LOAD.batch_tokens(5.0) == 5.0


def test_the_load_counts_the_others_drafts_not_the_python_time_of_their_plans(monkeypatch) -> None:
    # A plan's own time is never the same twice (a plan worked out takes longer than one reused): counted in the
    # load, it made every later sequence's load look new, so their plans were worked out again each step.
    loads: list[Load] = []
    plan = Controller.plan

    def slow_plan(self, lookup=(), load=NO_LOAD, remaining=None, agreement=0, from_prompt=False):
        loads.append(load)
        time.sleep(0.003)
        return plan(self, lookup, load, remaining, agreement, from_prompt)

    monkeypatch.setattr(Controller, "plan", slow_plan)
    target = FakeModel(eos_bias=-9, n_seq=3)
    runtime = Runtime(Engine(target, None, draft_len="auto", lookup=True))  # lookup alone: its drafts cost nothing
    runtime.generate_many(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=10))
    shared = [load for load in loads if load.sequences]
    assert len(shared) >= 10  # the three requests planned beside each other
    assert all(load.seconds == 0.0 for load in shared), [load.seconds for load in shared]


def test_under_load_a_draft_that_would_slow_the_others_more_than_it_gains_is_not_chosen() -> None:
    # A slope between a GPU's and a CPU's: beside three plain rows, a 3-token draft adds 41 % to the decode and is
    # expected to commit ~3.2 tokens. Summed, the batch gains 10 %; per sequence, the three others lose 29 % of
    # their speed for it. Counted by sequences it stays plain; on a flat curve, where the draft's rows cost the
    # others nothing, it drafts either way.
    sloped = calibrated({b: 0.010 * (1 + 0.2 * (b - 1)) for b in range(1, 66)})
    summed = Load(rows=3, tokens=3.0, room=60)
    by_sequence = Load(rows=3, tokens=3.0, room=60, sequences=3)
    assert sloped.plan((), summed).gamma > 0
    assert sloped.plan((), by_sequence).gamma == 0
    flat = calibrated({b: 0.010 if b <= 8 else 0.010 * b / 8 for b in range(1, 66)})
    assert flat.plan((), by_sequence).gamma > 0
    assert sloped.plan((), NO_LOAD).gamma > 0  # alone nothing changes


def test_a_draft_beside_single_rows_pays_for_the_forward_pass_llama_cpp_gives_it() -> None:
    # A flat (GPU-like) curve: in one pass, a draft beside three other rows costs only its drafting. But with a KV
    # buffer per sequence llama.cpp runs 1, 1, 1 and γ+1 rows as a pass of 4 and then a pass of γ: a whole decode.
    controller = calibrated({b: 0.010 for b in range(1, 66)}, draft_cost=0.001)
    one_pass = Load(rows=3, tokens=3.0, room=60)
    split = Load(rows=3, tokens=3.0, room=60, passes=lambda n: [4] if n == 1 else [4, n - 1])
    assert controller.plan((), one_pass).gamma > 0
    assert controller.plan((), split).gamma == 0
    # Forced tokens likewise: three sure tokens are worth a free pass, not a whole one.
    assert controller.certain_len(3, one_pass) == 3
    assert controller.certain_len(3, split) == 0


def test_the_engine_prices_a_plan_by_the_passes_and_gives_the_curve_each_shared_decode_with_its_passes(
    monkeypatch,
) -> None:
    """Each plan under load gets the decode's passes with its rows among the others' planned ones, and the shared
    curve gets every shared decode's time with the passes llama.cpp ran it as (one pass: a point of the curve;
    several: a sample of the widest, see test_controller)."""
    asked: list[dict[int, int]] = []
    given: list[list[int]] = []
    original = VerifyCost.add_decode

    def recording(self, passes, seconds):  # noqa: ANN001, ANN202
        if sys._getframe(1).f_code.co_name == "_settle":  # the engine's, not a calibration's
            given.append(list(passes))
        return original(self, passes, seconds)

    monkeypatch.setattr(VerifyCost, "add_decode", recording)
    for split in (False, True):
        target, draft = models(n_seq=3)

        def passes(tokens_by_seq: dict[int, int], split: bool = split) -> list[int]:
            asked.append(dict(tokens_by_seq))
            return [1] * sum(tokens_by_seq.values()) if split else [sum(tokens_by_seq.values())]

        target.decode_passes = passes
        given.clear()
        runtime = Runtime(Engine(target, draft, draft_len="auto"))
        greedy = SamplingParams(temperature=0, max_tokens=8)
        runtime.generate_many([ENGINE_PROMPT, [3, *ENGINE_PROMPT], [5, *ENGINE_PROMPT]], greedy)
        assert given  # every shared decode in rounds, ...
        assert all((len(p) > 1) is split for p in given if sum(p) > 1)  # ... with the passes it ran as
    # Plans under load asked about all three lanes together, each lane's rows tried at several widths.
    assert any(set(layout) == {0, 1, 2} and max(layout.values()) > 1 for layout in asked)


def test_the_row_budget_caps_a_plan() -> None:
    controller = calibrated({b: 0.01 for b in range(1, 66)})
    assert controller.plan((), Load(rows=3, tokens=3.0, room=3)).gamma == 2
    assert controller.plan((), Load(rows=3, tokens=3.0, room=1)).gamma == 0


def test_a_parallel_engine_needs_models_loaded_with_the_sequences() -> None:
    with pytest.raises(InvalidParameterError, match="parallel"):
        Engine(FakeModel(), None, parallel=2)


def test_a_prompt_another_lane_holds_is_copied_not_prefilled_again() -> None:
    target = FakeModel(eos_bias=-9, n_seq=3, n_ctx=512)
    draft = FakeModel(seed=1, noise=1.0, eos_bias=-9, n_seq=3, n_ctx=512)
    runtime = Runtime(Engine(target, draft, draft_len=2))
    long_prompt = [1 + (i * 7) % 11 for i in range(100)]
    greedy = SamplingParams(temperature=0, max_tokens=6)
    first, second, third = runtime.generate_many([long_prompt] * 3, greedy)
    assert first.tokens == second.tokens == third.tokens == tuple(plain_greedy(long_prompt, 6, target))
    assert first.stats.prefilled_tokens == 99 and second.stats.prefilled_tokens == third.stats.prefilled_tokens == 0
    assert {(to, n) for _, to, n in target.copies} == {(1, 99), (2, 99)}  # lanes 1 and 2 copied lane 0's prompt
    assert draft.copies  # the draft model's KV too


def test_cache_prompt_false_prefills_the_whole_prompt_again_and_gives_the_same_reply(monkeypatch) -> None:
    """llama-server's cache_prompt: off, neither the lane's own KV nor another lane's copy stands in for the prompt
    (the load bench sends every request so, for a time to first token that includes its prefill)."""
    target = FakeModel(eos_bias=-9, n_seq=2, n_ctx=512)
    draft = FakeModel(seed=1, noise=1.0, eos_bias=-9, n_seq=2, n_ctx=512)
    engine = Engine(target, draft, draft_len=2)
    long_prompt = [1 + (i * 7) % 11 for i in range(100)]
    greedy = SamplingParams(temperature=0, max_tokens=6)
    cached = list(engine.stream(long_prompt, greedy))[-1]
    again = list(engine.stream(long_prompt, greedy))[-1]
    fresh = list(engine.stream(long_prompt, greedy, cache_prompt=False))[-1]
    assert cached.tokens == again.tokens == fresh.tokens == tuple(plain_greedy(long_prompt, 6, target))
    assert (cached.stats.prefilled_tokens, again.stats.prefilled_tokens, fresh.stats.prefilled_tokens) == (99, 0, 99)
    # Nor is another lane's KV copied: the engine does not look for one.
    looked: list[bool] = []
    monkeypatch.setattr(Prefill, "_share_prefix", lambda self, g: looked.append(g.cache_prompt))
    Runtime(engine).generate_many([long_prompt] * 2, greedy)
    for events in _interleave([engine.stream(long_prompt, greedy, cache_prompt=False) for _ in range(2)]):
        assert events[-1].stats.prefilled_tokens == 99 and events[-1].tokens == cached.tokens
    assert looked == [True, True]  # the cached requests only


def _interleave(streams):
    """Each stream's events, taking one event from each in turn (so that both hold a lane at once)."""
    events = [[] for _ in streams]
    live = dict(enumerate(streams))
    while live:
        for i, stream in list(live.items()):
            try:
                events[i].append(next(stream))
            except StopIteration:
                del live[i]
    return events


def test_the_shared_cost_curve_takes_the_calibration_once_per_readout(monkeypatch) -> None:
    """Every lane's controller gets the draft's calibrated costs, but the target's curve is shared: seeded again by
    each lane that starts, a single sequence's costs would keep pulling back what shared decodes measured since."""
    given: list[dict] = []
    original = Controller.record_costs

    def recording(self, verify, draft, catchup=None, switch=None):  # noqa: ANN001, ANN202
        given.append(dict(verify))
        return original(self, verify, draft, catchup, switch)

    monkeypatch.setattr(Controller, "record_costs", recording)
    target, draft = models(n_seq=3)
    runtime = Runtime(Engine(target, draft, draft_len="auto"))
    greedy = SamplingParams(temperature=0, max_tokens=4)
    runtime.generate_many([ENGINE_PROMPT, [3, *ENGINE_PROMPT], [5, *ENGINE_PROMPT]], greedy)
    assert len(given) == 3  # each lane's controller was calibrated...
    assert given[0] and not given[1] and not given[2]  # ...and the shared curve took the target's costs once
    given.clear()
    sampled = SamplingParams(temperature=0.8, top_k=40, max_tokens=4, seed=1)
    runtime.generate_many([ENGINE_PROMPT, [3, *ENGINE_PROMPT]], sampled)  # another readout: its own costs, once
    assert len(given) == 2 and given[0] and not given[1]


def test_a_request_that_ends_while_another_thread_steps_frees_its_lane_when_that_step_ends() -> None:
    """Retiring never waits for a moment with no step: the stepper takes its role again as soon as it has handed out
    its own events, so a finished request waiting for one held its lane for dozens of steps (half the lanes idle
    through a bench's second wave). It is queued, and the step's end frees it."""
    target, draft = models(2)
    engine = Engine(target, draft, draft_len=0, parallel=2)
    params = SamplingParams(temperature=0.0, max_tokens=3)
    stream = engine.stream(ENGINE_PROMPT, params)
    assert isinstance(next(stream), Chunk)  # admitted, prefilled and in rounds on a lane
    lane = engine._active[0].lane
    other = threading.Thread(target=lambda: None)
    with engine._cond:
        engine._stepper = other  # another thread's step under way
    closing = threading.Thread(target=stream.close)
    closing.start()
    closing.join(5.0)
    assert not closing.is_alive(), "retiring waited for the step to end"
    assert lane.busy and engine.active == 1  # not under the step's feet
    engine._release()  # the step ends
    assert not lane.busy and engine.active == 0 and not engine._active
    assert isinstance(list(engine.stream(ENGINE_PROMPT, params))[-1], Finished)  # the engine serves on


def _busy_per_step(engine: Engine, monkeypatch) -> list[int]:
    """The requests in rounds or prefilling at each step's start, as the engine steps."""
    busy: list[int] = []
    step = engine._step

    def counted() -> None:
        busy.append(sum(not g.done for g in engine._active))
        step()

    monkeypatch.setattr(engine, "_step", counted)
    return busy


@pytest.mark.parametrize("handover", [True, False])
def test_a_caller_that_sends_its_next_request_at_once_gets_it_into_the_next_step(monkeypatch, handover) -> None:
    """After a step that finished a request, the next step waits (a share of a step's time) for its caller to come
    back: a client that sends requests one after another keeps its lane busy. Without the wait the other caller's
    thread steps again at once, and the lane sits out a step (on a CPU, a step that prefills can take seconds)."""
    monkeypatch.setattr(engine_module, "HANDOVER_SHARE", 50.0 if handover else 0.0)  # wide: no race with the clock
    monkeypatch.setattr(engine_module, "HANDOVER_MAX_SECONDS", 1.0)
    target = FakeModel(eos_bias=-9, n_seq=2, delay=0.01)
    engine = Engine(target, None, draft_len=0, parallel=2)
    busy = _busy_per_step(engine, monkeypatch)
    short, long = SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0, max_tokens=40)
    start = threading.Barrier(2)
    replies: list[Finished] = []

    def one_after_another() -> None:
        start.wait(timeout=10)
        for prompt in PROMPTS:
            replies.append(list(engine.stream(prompt, short))[-1])

    def one_long() -> None:
        start.wait(timeout=10)
        replies.append(list(engine.stream(PROMPTS[0], long))[-1])

    threads = [threading.Thread(target=one_after_another), threading.Thread(target=one_long)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and len(replies) == 5
    both = busy.index(2)
    gaps = [i for i in range(both + 1, len(busy)) if busy[i] == 2 and busy[i - 1] < 2]
    if handover:
        assert not gaps, f"a lane sat out a step before its caller's next request: {busy}"
        assert busy.count(2) >= 10  # the four short requests ran beside the long one
    else:
        assert gaps, "the other thread stepped at once: the lane should have sat out steps"
    expected = {tuple(plain_greedy(p, 3, target)) for p in PROMPTS} | {tuple(plain_greedy(PROMPTS[0], 40, target))}
    assert {r.tokens for r in replies} == expected


def test_only_a_step_that_ends_requests_opens_the_hand_over(monkeypatch) -> None:
    """A request that ended before the step (its caller has not taken the end yet, or never will) opens no wait:
    otherwise every later step would wait for it."""
    monkeypatch.setattr(engine_module, "HANDOVER_MAX_SECONDS", 10.0)  # longer than this test, however slow
    target = FakeModel(eos_bias=-9, n_seq=2)
    engine = Engine(target, None, draft_len=0, parallel=2)
    params = SamplingParams(temperature=0, max_tokens=3)
    ended = engine._admit(Request(list(PROMPTS[0]), params, 0, None, False, 0))
    ended.done = True
    ended.owner = threading.Thread(target=lambda: None)  # its caller
    engine._release(1.0, ended_before={id(ended)})
    assert engine._handover_left() <= 0
    engine._release(1.0, ended_before=set())  # it ended in this step
    assert 0 < engine._handover_left() <= engine_module.HANDOVER_MAX_SECONDS
    with engine._cond:
        assert engine._handing_over()  # its caller, another thread, is still to take its end
        ended.owner = threading.current_thread()
        assert not engine._handing_over()  # this thread's own: it takes it before it steps


def test_prompts_go_in_first_come_first_served_and_the_first_token_comes_with_the_prompts_end(monkeypatch) -> None:
    """With none in rounds, the earliest prompt goes in whole and alone (those that arrived with it would otherwise
    all wait for the last of them); beside rounds, PREFILL_CHUNK tokens a step for each request prefilling, given
    to the earliest first; and a request's first verify row is in the decode that ends its prompt."""
    monkeypatch.setattr(prefill_module, "PREFILL_CHUNK", 8)
    target = FakeModel(eos_bias=-9, n_seq=3, n_ctx=512)
    engine = Engine(target, None, draft_len=0, parallel=3)
    greedy = SamplingParams(temperature=0, max_tokens=8)
    first, second = [1 + i % 9 for i in range(21)], [2 + i % 7 for i in range(13)]

    def parts_of(step: int) -> list[tuple[int, int]]:
        """(tokens, rows) of each part of the step's decode."""
        return target.decode_calls[calls_before[step] :]

    a, b = (engine._admit(Request(prompt, greedy, 0, None, False, 0)) for prompt in (first, second))
    calls_before = [len(target.decode_calls)]
    engine._step()  # a's whole prompt and its first row; b waits
    assert parts_of(0) == [(21, 1)] and len(a.events) == 1 and not b.prefill_begun
    c_prompt = [3 + i % 5 for i in range(11)]
    c = engine._admit(Request(c_prompt, greedy, 0, None, False, 0))
    calls_before.append(len(target.decode_calls))
    engine._step()  # a's row; b and c prefilling: 2 x 8 tokens, all b's 12 first (the last with its first row)
    assert sorted(parts_of(1)) == [(1, 1), (4, 0), (13, 1)]
    assert len(a.events) == 2 and len(b.events) == 1 and len(c.events) == 0 and c.prefill_begun
    calls_before.append(len(target.decode_calls))
    engine._step()  # c's last 6 and its first row, the others' rows
    assert sorted(parts_of(2)) == [(1, 1), (1, 1), (7, 1)] and len(c.events) == 1
    while not all(g.done for g in (a, b, c)):
        engine._step()
    for g, prompt in ((a, first), (b, second), (c, c_prompt)):
        assert g.events[-1].tokens == tuple(plain_greedy(prompt, 8, target))


def test_where_a_decode_is_fast_beside_a_plan_plain_plans_stand_for_some_rounds(monkeypatch) -> None:
    """Auto on 4 lanes whose decodes take 2 ms (a GPU's), with planning made to look dear beside them: plain plans
    are reused, and every reply is still the target's own greedy one."""
    monkeypatch.setattr(engine_module, "PLAN_BUDGET", 1e-6)  # any plan is far over it: plain ones stand 16 rounds
    target = FakeModel(eos_bias=-9, n_seq=4, delay=0.002)
    draft = FakeModel(seed=1, noise=40.0, eos_bias=-9, n_seq=4, delay=0.0015)  # a poor, dear draft: plain wins
    engine = Engine(target, draft, draft_len="auto", lookup=False)
    params = SamplingParams(temperature=0, max_tokens=40)
    for prompt, finished in zip(PROMPTS, Runtime(engine).generate_many(PROMPTS, params), strict=True):
        assert list(finished.tokens) == plain_greedy(prompt, 40, target)
    reused = sum(lane.auto.plans_reused for lane in engine._lanes if lane.auto is not None)
    assert reused > 40, reused
