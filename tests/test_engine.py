"""The round loop's bookkeeping on a fake backend: exactness, rollback, stops, cancellation, context checks."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from biased_verifiers import (
    accept_if_p_at_least_q,
    bonus_from_the_first_row,
    one_uniform_per_round,
)
from exact_reference import output_checks, reference_penalize, reference_warp
from fakes import EOS, FakeModel
from stat_tools import Check, worst

from edgespec.drafters.suffix_cache import SuffixCache
from edgespec.engine import Engine
from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError
from edgespec.events import Chunk, Finished
from edgespec.penalties import window
from edgespec.sampling import LOGITS, Readout, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=40)
MARGIN = 2.0  # how far past its critical value a biased verifier's worst check must be
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
    _, done = run(engine, params=SamplingParams(temperature=0, max_tokens=12))
    (first_n, first_rows), *rounds = target.decode_calls
    # The first round's verify rides on the prompt's prefill: the prompt's tokens before the pending one get no
    # logits, the pending token and the draft a row each; no decode of its own for the prompt.
    assert first_n - first_rows == len(PROMPT) - 1 and 1 <= first_rows <= 4
    assert all(n == rows for n, rows in rounds)  # γ+1 tokens, γ+1 rows, one call per round
    assert len(target.decode_calls) == done.stats.rounds


# ----- exactness of the whole loop ---------------------------------------------------------------------------------
ENGINE_PATHS = {
    "top_k": (SamplingParams(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05), Readout("top_k", 4)),
    "whole": (SamplingParams(temperature=0.8, top_k=0, top_p=0.9, min_p=0.02), LOGITS),
}
ENGINE_N = 4000  # requests per check: every biased verifier in the controls below fails at this size
ENGINE_PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats, so prompt lookup proposes from the first round on


def exact_output_joint(
    target: FakeModel, prompt: list[int], params: SamplingParams, length: int, allowed=None
) -> np.ndarray:
    """The exact joint of the first ``length`` output tokens, by enumerating every continuation of ``prompt``
    with the reference penalties and warp over the fake's whole logits rows (end-of-generation ends the output: the
    positions after it are counted as EOS). ``allowed(output)``: the tokens a constraint allows after ``output``
    (the others masked before the warp)."""
    joint = np.zeros((target.n_vocab,) * length)
    warps = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
    penalties = dict(
        repeat_penalty=params.repeat_penalty, repeat_last_n=params.repeat_last_n,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        logit_bias=dict(params.logit_bias),
    )  # fmt: skip

    def walk(prefix: tuple[int, ...], mass: float) -> None:
        history = prompt + list(prefix)
        logits = reference_penalize(target.logits_after(history), history, **penalties)
        if allowed is not None:
            ok = sorted(allowed(list(prefix)))
            logits, kept = np.full(logits.shape[0], -np.inf), logits
            logits[ok] = kept[ok]
        probs = reference_warp(logits, **warps)
        for t in np.flatnonzero(probs):
            seq = (*prefix, int(t))
            if t == EOS or len(seq) == length:
                joint[seq + (EOS,) * (length - len(seq))] += mass * probs[t]
            else:
                walk(seq, mass * probs[t])

    walk((), 1.0)
    return joint


class EngineSamples:
    """``n`` requests of ``max_tokens = γ + 1`` through a real :class:`Engine` on fakes, each with its own seed:
    the output tokens (EOS-padded) and the drafted and accepted lengths of every round."""

    def __init__(self, engine: Engine, params: SamplingParams, n: int, length: int) -> None:
        self.outputs = np.full((n, length), EOS, dtype=np.int64)
        self.drafted: dict[int, int] = {}  # γ of a round -> how many rounds drafted that many
        self.accepted_at_full: dict[int, int] = {}  # for rounds that drafted the engine's γ: k -> rounds
        gamma = engine.headroom
        seeds = np.random.default_rng(0).integers(2**31, size=n)
        for r in range(n):
            request = SamplingParams(**{**params.__dict__, "max_tokens": length, "seed": int(seeds[r])})
            chunks, done = run(engine, ENGINE_PROMPT, request)
            self.outputs[r, : len(done.tokens)] = done.tokens
            accepted_before = 0
            for c in chunks:
                self.drafted[c.stats.draft_len] = self.drafted.get(c.stats.draft_len, 0) + 1
                if c.stats.draft_len == gamma:
                    k = c.stats.accepted - accepted_before
                    self.accepted_at_full[k] = self.accepted_at_full.get(k, 0) + 1
                accepted_before = c.stats.accepted


def engine_setup(gamma: int, drafter: str) -> tuple[FakeModel, Engine]:
    target = FakeModel(n_vocab=6, sharp=1.0, eos_bias=-1.0)
    if drafter == "model":
        draft = FakeModel(n_vocab=6, seed=4, noise=1.0, sharp=1.0, eos_bias=-1.0)
        return target, Engine(target, draft, draft_len=gamma, lookup=False)
    if drafter == "cache":
        return target, cache_filled_engine(target, gamma)
    return target, Engine(target, None, draft_len=gamma, lookup=True)


class FrozenCache(SuffixCache):
    """A suffix cache that takes no more entries once frozen: the measured requests draft from what other requests
    wrote, and their own samples (at T=0.8) do not water its counts down below the proposal's floor."""

    frozen = False

    def add(self, scope, tokens) -> int:  # noqa: ANN001
        return 0 if self.frozen else super().add(scope, tokens)


def cache_filled_engine(target: FakeModel, gamma: int) -> Engine:
    """A fixed γ drafting from the suffix cache alone, the cache filled by 200 earlier requests of the prompt at a
    low temperature (so that most positions have a continuation most of them took)."""
    cache = FrozenCache()
    engine = Engine(target, None, draft_len=gamma, lookup=False, suffix_cache=cache, cache_scope="others")
    for seed in range(200):
        run(engine, ENGINE_PROMPT, SamplingParams(temperature=0.2, top_k=4, max_tokens=6, seed=seed))
    cache.frozen = True
    return engine


# The whole loop is ~1 ms a request here (γ=3): a few configurations, so the fast tier stays under a minute. The
# verifier's own tests (test_exactness.py) cover every γ, proposer and path; these prove the engine hands it the right
# rows (each p_i after d_1..d_{i-1}, q_i of the same position, KV rolled back between rounds).
def engine_checks(gamma: int, drafter: str, path: str) -> tuple[FakeModel, EngineSamples, list[Check]]:
    """:data:`ENGINE_N` requests of γ + 1 tokens, and the checks of their outputs against the exact joint."""
    params, _ = ENGINE_PATHS[path]
    target, engine = engine_setup(gamma, drafter)
    samples = EngineSamples(engine, params, ENGINE_N, gamma + 1)
    return target, samples, output_checks(samples.outputs, exact_output_joint(target, ENGINE_PROMPT, params, gamma + 1))


ENGINE_CONFIGS = [(3, "model", "top_k"), (3, "lookup", "top_k"), (3, "cache", "top_k"), (1, "model", "whole")]


@pytest.mark.exactness
@pytest.mark.parametrize("gamma, drafter, path", ENGINE_CONFIGS)
def test_every_output_position_has_the_targets_distribution(gamma: int, drafter: str, path: str) -> None:
    """Whole requests of γ + 1 tokens through the engine (draft, one verify decode, accept, roll back, repeat): each
    position's marginal, each consecutive pair and the first three tokens against the target's exact distribution."""
    target, samples, checks = engine_checks(gamma, drafter, path)
    assert worst(checks).ratio <= 1, checks
    # The path under test, and drafts that reached γ and were both fully accepted and rejected at some position.
    assert set(target.readouts[1:]) == {ENGINE_PATHS[path][1]}
    assert samples.drafted.get(gamma, 0) >= ENGINE_N // 2, samples.drafted
    assert samples.accepted_at_full.get(gamma, 0) > 0 and sum(
        n for k, n in samples.accepted_at_full.items() if k < gamma
    ) > 0, samples.accepted_at_full


ENGINE_CONTROLS = [
    # "accept iff p >= q" passed the old engine-level test on the top-k path (chi2 7.7 against 42.9)
    (accept_if_p_at_least_q, 1, "model", "top_k"),
    (one_uniform_per_round, 3, "lookup", "top_k"),
    (one_uniform_per_round, 3, "cache", "top_k"),  # the cache filled by other requests: as biased as lookup
    (bonus_from_the_first_row, 1, "model", "whole"),
]


@pytest.mark.exactness
@pytest.mark.parametrize(
    "biased, gamma, drafter, path",
    [pytest.param(*c, id=f"{c[0].__name__}-{c[1]}-{c[2]}-{c[3]}") for c in ENGINE_CONTROLS],
)
def test_the_engine_level_checks_reject_a_biased_verifier(
    biased, gamma: int, drafter: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same checks, sample size and α as the exactness test above, with a biased verifier in the engine."""
    monkeypatch.setattr("edgespec.generation.verify_stochastic", biased)
    _, _, checks = engine_checks(gamma, drafter, path)
    assert worst(checks).ratio > MARGIN, f"{biased.__name__} passed: {checks}"


# Penalties move along the draft: row i of a verify (and q_i) is penalised with the context plus d_1..d_{i-1}. A
# window of 4 tokens slides over the drafts within one round; the widened top-k (3 + 4 of 12) is the path under test.
PENALIZED = {
    "repeat": SamplingParams(temperature=0.8, top_k=3, top_p=0.95, min_p=0.05, repeat_penalty=1.5, repeat_last_n=4),
    "frequency": SamplingParams(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.05, frequency_penalty=1.5, presence_penalty=0.5, repeat_last_n=4
    ),
}


def penalized_checks(penalty: str, drafter: str) -> tuple[FakeModel, EngineSamples, list[Check]]:
    params = PENALIZED[penalty]
    target = FakeModel(sharp=1.0, eos_bias=-1.0)
    if drafter == "model":
        engine = Engine(target, FakeModel(seed=4, noise=1.0, sharp=1.0, eos_bias=-1.0), draft_len=3, lookup=False)
    else:
        engine = Engine(target, None, draft_len=3, lookup=True)
    samples = EngineSamples(engine, params, ENGINE_N, 4)
    return target, samples, output_checks(samples.outputs, exact_output_joint(target, ENGINE_PROMPT, params, 4))


@pytest.mark.exactness
@pytest.mark.parametrize("penalty, drafter", [("repeat", "model"), ("frequency", "lookup")])
def test_penalized_output_has_the_targets_penalized_distribution(penalty: str, drafter: str) -> None:
    target, samples, checks = penalized_checks(penalty, drafter)
    assert worst(checks).ratio <= 1, checks
    assert set(target.readouts[1:]) == {Readout("top_k", 7)}  # top-3 widened by the 4-token window
    assert samples.drafted.get(3, 0) >= ENGINE_N // 2 and samples.accepted_at_full.get(0, 0) > 0


@pytest.mark.exactness
def test_the_penalty_checks_reject_rows_penalised_without_the_drafts_before_them(monkeypatch) -> None:
    """The mistake to guard against: every row of a verify penalised with the committed text only."""
    monkeypatch.setattr("edgespec.generation.windows", lambda ctx, draft, n: [window(ctx, [], n)] * (len(draft) + 1))
    _, _, checks = penalized_checks("repeat", "model")
    assert worst(checks).ratio > MARGIN, checks


@pytest.mark.parametrize("draft_len", [0, 3, "auto"])
def test_greedy_speculation_with_a_repeat_penalty_equals_plain_penalised_greedy(draft_len) -> None:
    target, draft = FakeModel(eos_bias=-9, n_ctx=512), FakeModel(seed=1, noise=1.0, eos_bias=-9, n_ctx=512)
    params = SamplingParams(temperature=0, max_tokens=60, repeat_penalty=1.3, repeat_last_n=16)
    _, done = run(Engine(target, draft, draft_len=draft_len), params=params)
    expected, ctx = [], list(PROMPT)
    for _ in range(60):
        logits = reference_penalize(target.logits_after(ctx), ctx, repeat_penalty=1.3, repeat_last_n=16)
        ctx.append(int(np.argmax(logits)))
        expected.append(ctx[-1])
    assert list(done.tokens) == expected
    assert expected != plain_greedy(PROMPT, 60, target)  # the penalty changed the output: the test has teeth


def test_seed_reproduces_a_stochastic_run() -> None:
    target, draft = FakeModel(), FakeModel(seed=1, noise=1.0)
    engine = Engine(target, draft, draft_len=3)
    params = SamplingParams(temperature=0.9, seed=123, max_tokens=30)
    first = run(engine, params=params)[1].tokens
    assert run(engine, params=params)[1].tokens == first
    # and the seed is what repeats it: any other seed gives another sample (30 tokens at T=0.9 never coincide)
    for other in (124, 7):
        assert run(engine, params=SamplingParams(temperature=0.9, seed=other, max_tokens=30))[1].tokens != first


def test_eos_ends_generation_and_is_not_output() -> None:
    target = FakeModel(eos_bias=+9)  # EOS is almost always the argmax
    chunks, done = run(Engine(target, FakeModel(seed=2), draft_len=2))
    assert done.finish_reason == "eos" and done.tokens == () and done.stopped_by == "</s>"


def test_a_draft_ends_at_an_end_of_generation() -> None:
    """Nothing after an end of generation is ever generated: the draft model stops drafting at one (a step and a
    verify row saved for each token it would have drafted past it), and lookup copies no further than one."""
    from edgespec.drafters.model import ModelDrafter

    params = SamplingParams(temperature=0.0, max_tokens=16)
    ending = ModelDrafter(FakeModel(eos_bias=+9))  # EOS is almost always the argmax
    assert ending.propose([3, 4, 5], 4, params, None).tokens == [EOS]
    going_on = ModelDrafter(FakeModel(eos_bias=-9))
    assert len(going_on.propose([3, 4, 5], 4, params, None).tokens) == 4
    engine = Engine(FakeModel(eos_bias=-9), None, draft_len=8, lookup=True)
    lookup = engine._lanes[0].drafters["lookup"]
    lookup.reset([5, 6, 7, 8, EOS, 9, 10, 11, 12])
    assert lookup.propose([5, 6, 7, 8, EOS, 9, 10, 11, 12, 6, 7], 8).tokens == [8, EOS]


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
    from edgespec.calibrate import CostCache

    cache = CostCache(tmp_path / "costs.json")
    # Decodes that cost what they sleep, so that the live ones bear the cached figures out (see CostCheck).
    first_target = FakeModel(eos_bias=-9, delay=0.002)
    run(Engine(first_target, FakeModel(seed=1, delay=0.001), draft_len="auto", cost_cache=cache))
    assert (tmp_path / "costs.json").is_file()
    second_target = FakeModel(eos_bias=-9, delay=0.002)
    run(Engine(second_target, FakeModel(seed=1, delay=0.001), draft_len="auto", cost_cache=cache))
    # the first engine measured widths up to max_gamma + 1 before generating (right after the prefill); the second
    # began with the cached ones (a busy machine may make it measure again later: see CostCheck)
    first, second = ([n for n, _ in t.decode_calls] for t in (first_target, second_target))
    assert first[1:6] == [1, 1, 1, 2, 2] and max(first) == 17
    assert second[1:6] != [1, 1, 1, 2, 2]
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
    # Decodes that cost what a small model's do (a sleep), so that auto's own Python per round, which it prices,
    # is the small part of a round it is on a real model, not the fake's whole cost.
    target = FakeModel(eos_bias=-9, n_ctx=512, delay=0.002)
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


# ----- the suffix cache ----------------------------------------------------------------------------------------------
CACHED_PROMPT = [3, 5, 7, 9, 11, 13]  # no bigram twice: prompt lookup has nothing to copy at first


def cached_engine(draft_len: int | str = 4, cache: SuffixCache | None = None, **kwargs) -> tuple[FakeModel, Engine]:
    target = FakeModel(n_vocab=40, eos_bias=-9, **kwargs)
    cache = SuffixCache() if cache is None else cache
    return target, Engine(target, None, draft_len=draft_len, lookup=True, suffix_cache=cache, cache_scope="me")


def cache_rounds(chunks: list[Chunk]) -> int:
    return sum(c.stats.drafter == "cache" for c in chunks)


@pytest.mark.parametrize("draft_len", [4, "auto"])
def test_a_request_drafts_from_an_earlier_ones_output_and_stays_exact(draft_len) -> None:
    # Decodes that cost what a small model's do (a sleep), so that auto prices its rounds as on a real model.
    target, engine = cached_engine(draft_len, delay=0.002 if draft_len == "auto" else 0.0)
    params = SamplingParams(temperature=0, max_tokens=30)
    first, done = run(engine, CACHED_PROMPT, params)
    assert cache_rounds(first) == 0 and engine.suffix_cache.tokens == 6 + 30  # the output, led by the (short) prompt
    again, again_done = run(engine, CACHED_PROMPT, params)
    assert list(done.tokens) == list(again_done.tokens) == plain_greedy(CACHED_PROMPT, 30, target)
    assert cache_rounds(again) >= 2 and again_done.stats.rounds <= done.stats.rounds // 3
    assert again_done.stats.accepted == again_done.stats.drafted  # the same text, drafted from the first reply
    s = again_done.stats
    assert s.cache_drafted + s.lookup_drafted == s.drafted and s.cache_accepted + s.lookup_accepted == s.accepted
    assert s.cache_accepted > s.lookup_accepted and done.stats.cache_drafted == 0


def test_a_scope_drafts_only_from_its_own_outputs() -> None:
    _, engine = cached_engine()
    params = SamplingParams(temperature=0, max_tokens=30)
    run(engine, CACHED_PROMPT, params)
    other, _ = run_in(engine, "someone else", params)
    assert cache_rounds(other) == 0
    mine, _ = run_in(engine, "me", params)
    assert cache_rounds(mine) >= 3


def run_in(engine: Engine, scope, params: SamplingParams, prompt=CACHED_PROMPT) -> tuple[list[Chunk], Finished]:
    events = list(engine.stream(prompt, params, cache_scope=scope))
    return events[:-1], events[-1]


def test_a_request_without_a_scope_neither_drafts_from_the_cache_nor_joins_it() -> None:
    _, engine = cached_engine()
    params = SamplingParams(temperature=0, max_tokens=30)
    for _ in range(2):
        chunks, _ = run_in(engine, None, params)
        assert cache_rounds(chunks) == 0
    assert engine.suffix_cache.tokens == 0
    plain = Engine(FakeModel(n_vocab=40, eos_bias=-9), None, draft_len=4, lookup=True)  # no cache at all
    assert plain.suffix_cache is None
    assert cache_rounds(run(plain, CACHED_PROMPT, params)[0] + run(plain, CACHED_PROMPT, params)[0]) == 0


def test_the_engines_cache_stays_within_its_bound() -> None:
    cache = SuffixCache(max_tokens=100)
    _, engine = cached_engine(cache=cache)
    rng = np.random.default_rng(5)
    for _ in range(30):
        prompt = [int(t) for t in rng.integers(1, 40, size=6)]
        run(engine, prompt, SamplingParams(temperature=0, max_tokens=int(rng.integers(5, 40))))
        assert cache.tokens <= 100
    assert 2 <= len(cache) < 30  # the oldest went, whole


@pytest.mark.parametrize("draft_len", [3, 6, "auto"])
def test_greedy_with_a_cache_filled_by_other_requests_is_plain_greedy_within_the_bit_exact_rows(draft_len) -> None:
    """Earlier replies, sampled and greedy, to these prompts and others fill the cache; greedy replies are then token
    for token plain greedy decoding's, drafted in part from the cache, and no verify is wider than a bit-exact
    target's kernels keep exact."""
    target = FakeModel(n_vocab=40, eos_bias=-9, n_ctx=512, delay=0.001 if draft_len == "auto" else 0.0)
    target.bit_exact, target.max_verify_rows = True, 7
    engine = Engine(target, None, draft_len=draft_len, lookup=True, suffix_cache=SuffixCache(), cache_scope="me")
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(1, 40, size=6)] for _ in range(4)]
    for i in range(12):  # other requests: other prompts, and these at T=1
        other = [int(t) for t in rng.integers(1, 40, size=6)]
        run(engine, other if i % 2 else prompts[i % 4], SamplingParams(temperature=1.0, seed=i, max_tokens=40))
    drafted = 0
    for prompt in prompts * 2:
        chunks, done = run(engine, prompt, SamplingParams(temperature=0, max_tokens=60))
        assert list(done.tokens) == plain_greedy(prompt, 60, target)
        drafted += done.stats.cache_drafted
    assert drafted > 0 and max(rows for _, rows in target.decode_calls) <= 7


def test_a_request_drafts_from_an_output_written_on_another_lane() -> None:
    target = FakeModel(n_vocab=40, eos_bias=-9, n_seq=2)
    engine = Engine(target, None, draft_len=4, lookup=True, parallel=2, suffix_cache=SuffixCache(), cache_scope="me")
    params = SamplingParams(temperature=0, max_tokens=30)
    hold = engine.stream([2, 4, 6, 8], SamplingParams(temperature=0, max_tokens=60))
    next(hold)  # lane 0
    *_, done = engine.stream(CACHED_PROMPT, params)  # lane 1
    for _ in hold:
        pass
    # The fake's next token depends on the last two tokens (and the length's parity): the same reply, after a prompt
    # that shares no prefix with either lane's KV, so it takes the first free lane, 0.
    chunks, again = run_in(engine, "me", params, [1, *CACHED_PROMPT[1:]])
    assert target.kv_tokens[0] == 1 and list(again.tokens) == list(done.tokens)
    assert cache_rounds(chunks) >= 3


class _GraphRebuildingFake(FakeModel):
    """A decode whose width differs from the last one's sleeps ``change`` seconds more, as llama.cpp builds a new
    graph for a batch of another shape."""

    change = 0.004

    def decode(self, tokens, rows=(), readout=LOGITS):  # noqa: ANN001, ANN201
        if len(tokens) != getattr(self, "_last_width", len(tokens)):
            time.sleep(self.change)
        self._last_width = len(tokens)
        return super().decode(tokens, rows, readout)


def test_the_calibration_measures_what_a_change_of_width_adds_and_the_controller_prices_it(tmp_path) -> None:
    from edgespec.calibrate import CostCache

    cache = CostCache(tmp_path / "costs.json")
    target = _GraphRebuildingFake(eos_bias=-9, delay=0.001)
    engine = Engine(target, None, draft_len="auto", lookup=True, cost_cache=cache)
    run(engine, params=SamplingParams(temperature=0, max_tokens=8))
    (costs,) = engine.calibration.costs.values()
    assert 0.002 < costs.switch < 0.02  # the sleep, give or take a busy machine's timing
    assert engine._lanes[0].auto.verify_cost.switch == costs.switch  # what plans price
    assert next(iter(cache.entries())).costs.switch == costs.switch  # and what the next process reads
