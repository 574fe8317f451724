"""The round loop's bookkeeping on a fake backend: exactness, rollback, stops, cancellation, context checks."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fakes import EOS, FakeModel
from stat_tools import fits

from edgespec.engine import Engine
from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError
from edgespec.events import Chunk, Finished
from edgespec.sampling import LOGITS, Readout, SamplingParams, densify, warp

GREEDY = SamplingParams(temperature=0, max_tokens=40)
PROMPT = [3, 5, 7, 5, 3]


def run(engine: Engine, prompt=PROMPT, params=GREEDY, cancel=None) -> tuple[list[Chunk], Finished]:
    events = list(engine.stream(prompt, params, cancel=cancel))
    assert isinstance(events[-1], Finished) and all(isinstance(e, Chunk) for e in events[:-1])
    return events[:-1], events[-1]


def plain_greedy(prompt, n: int, model: FakeModel) -> list[int]:
    out, ctx = [], list(prompt)
    for _ in range(n):
        t = int(np.argmax(model.logits_after(ctx)))
        if t == EOS:
            break
        out.append(t)
        ctx.append(t)
    return out


@pytest.mark.parametrize("draft_len", [0, 1, 3, 6, "auto"])
@pytest.mark.parametrize("noise", [0.0, 1.5])
def test_greedy_speculation_equals_plain_greedy(draft_len, noise: float) -> None:
    target, draft = FakeModel(eos_bias=-9), FakeModel(seed=1, noise=noise, eos_bias=-9)
    engine = Engine(target, draft, draft_len=draft_len)
    chunks, done = run(engine)
    assert list(done.tokens) == plain_greedy(PROMPT, 40, target)
    assert done.text == "".join(c.text for c in chunks)
    assert done.stats.generated == 40 and done.finish_reason == "length"


def test_kv_holds_exactly_the_committed_prefix_after_every_round() -> None:
    target, draft = FakeModel(eos_bias=-9), FakeModel(seed=1, noise=1.0, eos_bias=-9)
    engine = Engine(target, draft, draft_len=4, lookup=False)
    committed = list(PROMPT)
    for event in engine.stream(PROMPT, SamplingParams(temperature=1.0, seed=3, max_tokens=30)):
        committed += list(event.tokens)
        if isinstance(event, Chunk):
            assert target.kv_tokens == committed[:-1]  # x[n-1] is pending
            assert draft.kv_tokens == committed[: len(draft.kv_tokens)]


def test_verify_is_one_decode_with_logits_only_where_needed() -> None:
    target, draft = FakeModel(eos_bias=-9), FakeModel(seed=1, eos_bias=-9)
    engine = Engine(target, draft, draft_len=3, lookup=False)
    run(engine, params=SamplingParams(temperature=0, max_tokens=12))
    prefill, *rounds = target.decode_calls
    assert prefill == (len(PROMPT) - 1, 0)  # the prompt's KV, no logits
    assert all(n == rows for n, rows in rounds)  # γ+1 tokens, γ+1 rows, one call per round


@pytest.mark.parametrize(
    "warps, readout",
    [
        (dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), LOGITS),  # whole rows, warped in numpy
        (dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05), Readout("top_k", 4)),  # top-k "in llama.cpp"
    ],
)
def test_stochastic_output_distribution_is_the_targets(warps: dict, readout: Readout) -> None:
    """First two generated tokens vs the exact target distribution (computed from the fake's logits, whole rows)."""
    target, draft = FakeModel(n_vocab=6, sharp=1.0), FakeModel(n_vocab=6, seed=4, noise=1.5, sharp=1.0)
    params = SamplingParams(**warps, max_tokens=2)
    engine = Engine(target, draft, draft_len=3, lookup=False)
    prompt = [1, 2]
    exact = np.zeros((6, 6))
    p1 = densify(warp(target.logits_after(prompt), params), 6)
    for a in range(6):
        exact[a] = p1[a] * (densify(warp(target.logits_after(prompt + [a]), params), 6) if a != EOS else 0)
    exact[EOS, EOS] = p1[EOS]  # EOS first: the output stops (counted in its own cell)
    counts = np.zeros((6, 6))
    rng = np.random.default_rng(0)
    for _ in range(6000):
        done = run(engine, prompt, SamplingParams(**{**params.__dict__, "seed": int(rng.integers(2**31))}))[1]
        toks = list(done.tokens) + [EOS, EOS]
        counts[toks[0], toks[1] if toks[0] != EOS else EOS] += 1
    ok, why = fits(counts, exact)
    assert ok, why
    assert set(target.readouts[1:]) == set(draft.readouts[1:]) == {readout}  # the path under test (after prefill)
    assert (
        0 < engine_acceptance(engine, prompt, params) < 1
    )  # the pair disagrees sometimes: the test has teeth


def engine_acceptance(engine: Engine, prompt, params) -> float:
    return run(engine, prompt, SamplingParams(**{**params.__dict__, "max_tokens": 200, "seed": 1}))[
        1
    ].stats.acceptance_rate


def test_seed_reproduces_a_stochastic_run() -> None:
    target, draft = FakeModel(), FakeModel(seed=1, noise=1.0)
    engine = Engine(target, draft, draft_len=3)
    params = SamplingParams(temperature=0.9, seed=123, max_tokens=30)
    assert run(engine, params=params)[1].tokens == run(engine, params=params)[1].tokens


def test_eos_ends_generation_and_is_not_output() -> None:
    target = FakeModel(eos_bias=+9)  # EOS is almost always the argmax
    chunks, done = run(Engine(target, FakeModel(seed=2), draft_len=2))
    assert done.finish_reason == "eos" and done.tokens == () and done.stopped_by == "</s>"


def test_stop_string_ends_generation_and_is_cut() -> None:
    target = FakeModel(eos_bias=-9)
    full = "".join(target.piece(t).decode() for t in plain_greedy(PROMPT, 40, target))
    stop = full[10:13]
    first = full.index(stop)
    _, done = run(
        Engine(target, FakeModel(seed=1), draft_len=4),
        params=SamplingParams(temperature=0, max_tokens=40, stop=(stop,)),
    )
    assert done.finish_reason == "stop" and done.stopped_by == stop
    assert done.text == full[:first]


def test_max_tokens_is_exact_even_mid_draft() -> None:
    for n in (1, 2, 5, 7):
        _, done = run(
            Engine(FakeModel(eos_bias=-9), FakeModel(eos_bias=-9), draft_len=4),
            params=SamplingParams(temperature=0, max_tokens=n),
        )
        assert len(done.tokens) == n and done.finish_reason == "length"


def test_context_overflow_is_refused_before_any_work() -> None:
    target = FakeModel(n_ctx=32)
    engine = Engine(target, FakeModel(n_ctx=32), draft_len=4)
    with pytest.raises(ContextOverflowError, match="exceeds the target context of 32"):
        run(engine, prompt=[1] * 20, params=SamplingParams(temperature=0, max_tokens=10))
    assert target.decode_calls == []
    # the engine is still usable
    assert (
        run(engine, prompt=[1, 2], params=SamplingParams(temperature=0, max_tokens=5))[1].stats.generated == 5
    )


def test_cancel_from_another_thread_then_a_correct_second_request() -> None:
    target, draft = FakeModel(eos_bias=-9, n_ctx=4096), FakeModel(seed=1, eos_bias=-9, n_ctx=4096)
    engine = Engine(target, draft, draft_len=3)
    cancel = threading.Event()
    seen = 0
    done = None
    for event in engine.stream(PROMPT, SamplingParams(temperature=0, max_tokens=2000), cancel=cancel):
        seen += 1
        if seen == 3:
            threading.Thread(target=cancel.set).start()
        done = event
    assert done.finish_reason == "cancelled" and 0 < done.stats.generated < 2000
    _, again = run(engine)
    assert list(again.tokens) == plain_greedy(PROMPT, 40, target)


def test_a_second_prompt_with_a_shared_prefix_only_prefills_the_new_tokens() -> None:
    target = FakeModel(eos_bias=-9)
    engine = Engine(target, None, draft_len=0)
    _, first = run(engine)
    follow_up = PROMPT + list(first.tokens) + [4, 4, 4]
    _, second = run(engine, prompt=follow_up)
    assert (
        second.stats.prefilled_tokens == 3
    )  # the EOS-free first reply is already in the KV but its last token


def test_bad_inputs() -> None:
    engine = Engine(FakeModel(), None)
    with pytest.raises(InvalidParameterError, match="empty"):
        run(engine, prompt=[])
    with pytest.raises(InvalidParameterError, match="draft length"):
        engine.set_draft_len(-1)


def test_one_request_at_a_time() -> None:
    engine = Engine(FakeModel(eos_bias=-9), None)
    first = engine.stream(PROMPT, GREEDY)
    next(first)
    with pytest.raises(EdgespecError, match="busy"):
        next(engine.stream(PROMPT, GREEDY))
    first.close()
    assert run(engine)[1].stats.generated == 40


def test_measured_costs_are_cached_for_the_next_engine(tmp_path) -> None:
    from edgespec.drafters.costs import CostCache

    cache = CostCache(tmp_path / "costs.json")
    first_target = FakeModel(eos_bias=-9)
    run(Engine(first_target, FakeModel(seed=1), draft_len="auto", cost_cache=cache))
    assert (tmp_path / "costs.json").is_file()
    second_target = FakeModel(eos_bias=-9)
    run(Engine(second_target, FakeModel(seed=1), draft_len="auto", cost_cache=cache))
    # the first engine measured widths up to max_gamma + 1 before generating; the second reused them
    widest = max(n for n, _ in first_target.decode_calls)
    assert widest == 17 and max(n for n, _ in second_target.decode_calls) < widest
    (tmp_path / "costs.json").write_text("not json")  # a damaged cache means measuring again, not failing
    assert run(Engine(FakeModel(eos_bias=-9), FakeModel(seed=1), cost_cache=cache))[1].stats.generated == 40


def test_costs_are_measured_once_per_kind_of_readout_not_per_top_k() -> None:
    # A server's clients send many top-k values; measuring the decode costs again (~4 s for a 1.5B on a CPU) for each
    # would stall requests for nothing: a decode's cost barely depends on k.
    target = FakeModel(eos_bias=-9)
    engine = Engine(target, FakeModel(seed=1), draft_len="auto")
    widest = []
    for top_k in (4, 5, 6, 0):  # three top-k readouts, then whole rows
        target.decode_calls.clear()
        run(engine, params=SamplingParams(temperature=0.8, top_k=top_k, max_tokens=10, seed=1))
        widest.append(max(n for n, _ in target.decode_calls))
    assert widest[0] == 17 and max(widest[1:3]) < 17  # measured for the first top-k only
    assert widest[3] == 17  # whole rows are another kind of readout: measured again


def test_auto_drafts_long_by_lookup_once_the_output_repeats_and_stays_exact() -> None:
    # The fake's greedy output falls into a 4-token loop after ~16 tokens. Lookup's proposals (checked against
    # every committed token, drafted or not) then keep coming true, and auto drafts many tokens per verify.
    target = FakeModel(eos_bias=-9, n_ctx=512)
    engine = Engine(target, None, draft_len="auto", lookup=True)
    chunks, done = run(engine, params=SamplingParams(temperature=0, max_tokens=300))
    assert list(done.tokens) == plain_greedy(PROMPT, 300, target)
    looped = [c.stats.draft_len for c in chunks[-20:] if c.stats.drafter == "lookup"]
    assert len(looped) >= 15 and np.mean(looped) > 6
    assert done.stats.rounds < 100  # 300 tokens


def test_a_bit_exact_target_never_verifies_more_rows_than_its_kernels_keep_exact() -> None:
    # A bit-exact target on llama.cpp's CPU backend rounds like a single-token decode only below 8 rows: auto (with
    # lookup drafting as long as it can) stays within the limit, and a fixed γ beyond it is refused up front.
    target = FakeModel(eos_bias=-9, n_ctx=512)
    target.bit_exact, target.max_verify_rows = True, 7
    engine = Engine(target, None, draft_len="auto", lookup=True)
    _, done = run(engine, params=SamplingParams(temperature=0, max_tokens=300))
    assert list(done.tokens) == plain_greedy(PROMPT, 300, target)
    widest = max(rows for _, rows in target.decode_calls)
    assert widest == 7  # lookup drafted as far as allowed (the fake's output loops), and no further
    with pytest.raises(InvalidParameterError, match="at most 6 .*bit-exact"):
        Engine(target, None, draft_len=7, lookup=True)
    assert Engine(target, None, draft_len=6, lookup=True).max_gamma == 6


def test_a_fixed_draft_length_needs_a_drafter_and_does_not_outlive_its_request() -> None:
    with pytest.raises(InvalidParameterError, match="needs a drafter"):
        Engine(FakeModel(), None, draft_len=4, lookup=False)
    engine = Engine(FakeModel(n_ctx=256), None, draft_len=40, lookup=True)
    assert engine.headroom == 40
    engine.set_draft_len("auto")  # the server sets each request's own; a wide one must not shrink the next's room
    assert engine.headroom == engine.max_gamma == 16
    run(engine, params=SamplingParams(temperature=0, max_tokens=256 - len(PROMPT) - 16))
