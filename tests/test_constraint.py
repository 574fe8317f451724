"""Constrained output: grammars compile or are refused by their problem, masks fork along a draft, forced tokens are
free drafts, and the constrained output distribution is exactly plain constrained decoding's."""

from __future__ import annotations

import numpy as np
import pytest
from biased_verifiers import accept_if_p_at_least_q, resample_from_p, token_match
from dense import densify
from exact_reference import output_checks, reference_warp
from fakes import EOS, FakeModel
from stat_tools import worst
from test_engine import exact_output_joint

from edgespec.constraint import Constraint, Grammar, Mask
from edgespec.engine import Engine
from edgespec.errors import InvalidParameterError, ModelError
from edgespec.sampling import Candidates, SamplingParams, readout_for
from edgespec.warp import NeedWholeRow, warp_row

MARGIN = 2.0
# On a 26-token fake (token t writes chr(ord("a") + t), token 0 ends the generation) this regex allows, by output
# position: even positions one of b..e (tokens 1..4), odd positions exactly "f" (token 5, forced), and the end only
# after a whole pair. Written out by hand below as the independent reference.
PAIRS = Grammar.regex("(?:[b-e]f)+")
V = 26


def pairs_allowed(out: list[int]) -> set[int]:
    """The reference mask of :data:`PAIRS` after the output ``out`` (tokens)."""
    if len(out) % 2 == 1:
        return {5}
    return {1, 2, 3, 4} | ({EOS} if out else set())


# ----- grammars -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "grammar, problem",
    [
        (lambda: Grammar.regex("[b-"), "unclosed character class"),
        (lambda: Grammar.json_schema({"type": "intege"}), "intege"),
        (lambda: Grammar.json_schema("{not json"), "not valid JSON"),
        (lambda: Grammar.json_schema([1, 2]), "object"),
        (lambda: Grammar.gbnf("root ::= missing"), "missing"),
        (lambda: Grammar.lark("start: ("), "lark"),
        (lambda: Grammar("yaml", "x"), "grammar kind"),
        # features llguidance does not implement: refused by name, never a traceback
        (lambda: Grammar.json_schema({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
         "Unimplemented keys"),
        (lambda: Grammar.json_schema({"type": "string", "pattern": "(?<=a)b"}), "look-around"),
        (lambda: Grammar.json_schema({"$ref": "https://example.com/schema.json"}), "example.com"),
        (lambda: Grammar.json_schema({"type": "object", "x-guidance": 5}), "x-guidance"),
    ],
)  # fmt: skip
def test_a_grammar_that_cannot_compile_is_refused_naming_its_problem(grammar, problem: str) -> None:
    with pytest.raises(InvalidParameterError) as e:
        SamplingParams(constraint=grammar())
    assert problem.lower() in str(e.value).lower()


def test_every_grammar_kind_compiles_and_is_hashable() -> None:
    kinds = [
        Grammar.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        Grammar.json_object(),
        Grammar.regex("[0-9]{3}"),
        Grammar.lark('start: "yes" | "no"'),
        Grammar.gbnf('root ::= "yes" | "no"'),
    ]
    for g in kinds:
        params = SamplingParams(constraint=g)
        assert hash(params) == hash(SamplingParams(constraint=g))
    # the same schema, written with other spacing, is one grammar; its properties keep their order (the output's)
    assert Grammar.json_schema('{"b":  1, "a": 2}') == Grammar.json_schema({"b": 1, "a": 2})
    assert Grammar.json_schema({"a": 2, "b": 1}) != Grammar.json_schema({"b": 1, "a": 2})


def test_a_mask_reads_llguidances_bits() -> None:
    bits = bytes([0b00100110, 0, 0b1])  # tokens 1, 2, 5, 16
    mask = Mask(bits)
    assert mask.count == 4 and [t for t in range(30) if mask.allows(t)] == [1, 2, 5, 16]
    assert mask.only() is None and Mask(bytes([0, 0b1000])).only() == 11
    assert np.flatnonzero(mask.dense(20)).tolist() == [1, 2, 5, 16]


# ----- the fork along a draft -----------------------------------------------------------------------------------
def allowed(mask: Mask) -> set[int]:
    return {t for t in range(V) if mask.allows(t)}


def test_masks_fork_along_the_draft_and_only_committed_tokens_advance_the_state() -> None:
    model = FakeModel(n_vocab=V)
    c = Constraint(PAIRS, model, model.is_eog)
    draft = [2, 5, 3, 5]
    for i in range(len(draft) + 1):  # row i is masked by the state after d_1..d_i-1
        assert allowed(c.mask(draft, i)) == pairs_allowed(draft[:i])
    # a rejection at d_3: the round commits d_1, d_2 and a correction, 4
    c.commit([2, 5, 4])
    assert allowed(c.mask([], 0)) == pairs_allowed([2, 5, 4])
    # another draft after it, read out of order: the fork follows
    assert allowed(c.mask([5, 1], 2)) == pairs_allowed([2, 5, 4, 5, 1])
    assert allowed(c.mask([5], 1)) == pairs_allowed([2, 5, 4, 5])
    assert c.forced(5) == [5]  # "f" after "d"; then a choice
    assert c.valid_prefix([5, 1, 5, 5, 2]) == 3
    with pytest.raises(ValueError, match="not allowed"):
        c.mask([1], 1)  # "b" where only "f" may stand
    c.commit([5])
    assert c.complete and allowed(c.mask([], 0)) == pairs_allowed([2, 5, 4, 5])


def test_each_request_gets_a_matcher_of_its_own_though_it_is_built_once_per_model_and_grammar() -> None:
    model = FakeModel(n_vocab=V)
    first = Constraint(PAIRS, model, model.is_eog)
    first.commit([2, 5, 3])
    second = Constraint(PAIRS, model, model.is_eog)  # a copy of the one built for the first request
    assert allowed(second.mask([], 0)) == pairs_allowed([])  # not where the first one stands
    assert allowed(first.mask([], 0)) == pairs_allowed([2, 5, 3])
    assert len(model._constraint_matchers) == 1


def test_a_draft_that_ends_the_output_leaves_the_fork_and_the_state_intact() -> None:
    """An end of generation in a draft: the row after it allows only an end, and the fork never takes it in (the
    constraint engine's rollback does not count it: rolling it back once cost the state a committed token)."""
    model = FakeModel(n_vocab=V)
    c = Constraint(PAIRS, model, model.is_eog)
    c.commit([2, 5])
    draft = [3, 5, EOS, EOS]
    assert allowed(c.mask(draft, 2)) == pairs_allowed([2, 5, 3, 5])
    assert allowed(c.mask(draft, 3)) == {EOS} and allowed(c.mask(draft, 4)) == {EOS}
    assert c.valid_prefix(draft) == 3  # nothing after the end is drafted
    c.commit([3, 5, EOS])
    assert c.complete
    c2 = Constraint(PAIRS, model, model.is_eog)
    c2.commit([2, 5])
    c2.mask(draft, 4)
    c2.commit([3])  # a rejection at d_2: the state is the committed text's, whatever the draft held
    assert allowed(c2.mask([], 0)) == pairs_allowed([2, 5, 3])


def test_a_grammar_this_vocabulary_cannot_serve_fails_the_call_and_the_engine_goes_on() -> None:
    model = FakeModel(n_vocab=V)
    engine = Engine(model, None, draft_len=3, lookup=True)
    params = SamplingParams(temperature=0, max_tokens=5, constraint=Grammar.lark('start: <tool_call> "b"'))
    with pytest.raises(InvalidParameterError, match="special token"):
        engine.stream(PROMPT, params)  # refused before it takes a lane
    assert run(engine, SamplingParams(temperature=0, max_tokens=5)).finish_reason == "length"


def test_a_committed_token_the_constraint_forbids_is_an_error_not_a_silent_drift() -> None:
    model = FakeModel(n_vocab=V)
    c = Constraint(PAIRS, model, model.is_eog)
    with pytest.raises(ModelError, match="not allowed"):
        c.commit([5])


# ----- warping under a mask -------------------------------------------------------------------------------------
def test_masked_candidates_give_the_masked_whole_rows_distribution_or_ask_for_the_row() -> None:
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=0.8, top_k=3, top_p=0.9, min_p=0.05)
    checked = refused = 0
    for _ in range(300):
        logits = (rng.normal(size=V) * 2).astype(np.float32)
        allowed_ids = rng.permutation(V)[: rng.integers(1, 8)]
        bits = np.zeros(V, dtype=bool)
        bits[allowed_ids] = True
        mask = Mask(np.packbits(bits, bitorder="little").tobytes())
        masked = np.where(bits, logits, -np.inf)
        expected = reference_warp(masked, temperature=0.8, top_k=3, top_p=0.9, min_p=0.05)
        whole = densify([warp_row(logits[None, :], 0, params, None, mask)], V)
        np.testing.assert_allclose(whole, expected, atol=1e-12)
        order = np.argsort(-logits)[:8].tolist()  # the raw top-8, as llama.cpp's in-graph top-k returns them
        candidates = Candidates([order], [[float(logits[t]) for t in order]])
        try:
            got = densify([warp_row(candidates, 0, params, None, mask)], V)
        except NeedWholeRow:
            refused += 1
            # refused only when the top-8 holds fewer than 3 allowed tokens and not all of them
            assert len(set(order) & set(allowed_ids.tolist())) < min(3, len(allowed_ids))
            continue
        checked += 1
        np.testing.assert_allclose(got, expected, atol=1e-12)
    assert checked > 50 and refused > 20


def test_a_row_with_one_allowed_token_is_one_hot_on_it_whatever_the_candidates() -> None:
    bits = np.zeros(V, dtype=bool)
    bits[7] = True
    mask = Mask(np.packbits(bits, bitorder="little").tobytes())
    candidates = Candidates([[1, 2, 3]], [[3.0, 2.0, 1.0]])  # 7 is not among them: no need to read the row again
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=3)):
        assert warp_row(candidates, 0, params, None, mask) == ([7], [1.0])


def test_a_constrained_request_reads_more_candidates_than_its_top_k() -> None:
    g = Grammar.regex("[0-9]+")
    assert readout_for(SamplingParams(temperature=0, constraint=g), 151936).k == 33
    assert readout_for(SamplingParams(top_k=40, constraint=g), 151936).k == 72
    assert readout_for(SamplingParams(top_k=0, constraint=g), 151936).kind == "logits"
    assert readout_for(SamplingParams(top_k=40, constraint=g), 50).kind == "logits"


# ----- the engine ---------------------------------------------------------------------------------------------
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def run(engine: Engine, params: SamplingParams):
    events = list(engine.stream(PROMPT, params))
    return events[-1]


def plain_constrained_greedy(model: FakeModel, n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        logits = model.logits_after(PROMPT + out)
        ok = sorted(pairs_allowed(out))
        t = ok[int(np.argmax(logits[ok]))]
        if t == EOS:
            break
        out.append(t)
    return out


@pytest.mark.parametrize("draft_len, lookup", [(0, False), (1, False), (3, False), (3, True), ("auto", True)])
@pytest.mark.parametrize("margin", [2, 32])
def test_greedy_constrained_speculation_equals_plain_constrained_greedy(
    draft_len, lookup: bool, margin: int, monkeypatch
) -> None:
    monkeypatch.setattr("edgespec.sampling.CONSTRAINED_MARGIN", margin)  # 2: many rows read again whole
    # Auto takes a forced token only where its row pays by this machine's measured costs: a fake decode's few
    # microseconds of Python measured a 2-row decode dearer than two 1-row ones in ~2 % of runs (and in a CI run),
    # and then no forced token rode. A fixed sleep per decode, as llama_decode's fixed part on a GPU, makes a wider
    # decode cost little more, so the forced path runs (0 misses in 600 runs beside two busy loops).
    target = FakeModel(n_vocab=V, eos_bias=-3, delay=0.002 if draft_len == "auto" else 0.0)
    draft = None if lookup else FakeModel(n_vocab=V, seed=1, noise=1.0, eos_bias=-3)
    done = run(Engine(target, draft, draft_len=draft_len, lookup=lookup), SamplingParams(temperature=0, max_tokens=30,
               constraint=PAIRS))  # fmt: skip
    expected = plain_constrained_greedy(target, 30)
    assert list(done.tokens) == expected
    assert len(expected) >= 6  # it did not end at once: the comparison has length
    assert (done.stats.rereads > 0) == (margin == 2)  # the path that reads rows again whole ran, or not
    if lookup:  # its drafts end at odd positions: the "f" after them is forced, a free and certain draft
        assert done.stats.forced > 0


N = 4000


def constrained_checks(drafter: str, monkeypatch, repeat_penalty: float = 1.0) -> tuple[list, dict]:
    monkeypatch.setattr("edgespec.sampling.CONSTRAINED_MARGIN", 1)  # top-4 of 26: rows are often read again whole
    params = SamplingParams(
        temperature=0.8, top_k=3, top_p=0.95, min_p=0.05, max_tokens=4, constraint=PAIRS,
        repeat_penalty=repeat_penalty, repeat_last_n=4,
    )  # fmt: skip
    target = FakeModel(n_vocab=V, sharp=1.0, eos_bias=1.0)
    if drafter == "model":
        draft = FakeModel(n_vocab=V, seed=4, noise=1.0, sharp=1.0, eos_bias=1.0)
        engine = Engine(target, draft, draft_len=3, lookup=False)
    else:
        engine = Engine(target, None, draft_len=3, lookup=True)
    outputs = np.full((N, 4), EOS, dtype=np.int64)
    seen = {"forced": 0, "rereads": 0, "drafted": 0}
    seeds = np.random.default_rng(0).integers(2**31, size=N)
    for r in range(N):
        done = run(engine, SamplingParams(**{**params.__dict__, "seed": int(seeds[r])}))
        outputs[r, : len(done.tokens)] = done.tokens
        seen["forced"] += done.stats.forced
        seen["rereads"] += done.stats.rereads
        seen["drafted"] += done.stats.drafted - done.stats.forced
    return output_checks(outputs, exact_output_joint(target, PROMPT, params, 4, pairs_allowed)), seen


@pytest.mark.exactness
@pytest.mark.parametrize("drafter, repeat_penalty", [("model", 1.0), ("lookup", 1.0), ("model", 1.5)])
def test_constrained_output_has_the_targets_constrained_distribution(
    drafter: str, repeat_penalty: float, monkeypatch
) -> None:
    """With a repeat penalty too: rows masked and penalised along the draft, candidates widened by the window."""
    checks, seen = constrained_checks(drafter, monkeypatch, repeat_penalty)
    assert worst(checks).ratio <= 1, checks
    # what ran: forced drafts, rows read again whole, and the drafter's own drafts
    assert seen["forced"] > N // 5 and seen["rereads"] > N // 10 and seen["drafted"] > N // 4, seen


@pytest.mark.exactness
@pytest.mark.parametrize(
    "biased, drafter", [(accept_if_p_at_least_q, "model"), (resample_from_p, "lookup"), (token_match, "lookup")]
)
def test_the_constrained_checks_reject_a_biased_verifier(biased, drafter: str, monkeypatch) -> None:
    monkeypatch.setattr("edgespec.generation.verify_stochastic", biased)
    checks, _ = constrained_checks(drafter, monkeypatch)
    assert worst(checks).ratio > MARGIN, checks


@pytest.mark.exactness
def test_the_constrained_checks_reject_every_row_masked_with_the_committed_state(monkeypatch) -> None:
    """The mistake to guard against: the constraint not forked along the draft (every row of a verify, and every
    step of a draft, masked as its first)."""
    real = Constraint.mask
    monkeypatch.setattr(Constraint, "mask", lambda self, draft, i: real(self, draft, 0))
    try:
        checks, _ = constrained_checks("model", monkeypatch)
    except ModelError:
        return  # a token the constraint forbids was committed: caught as an error
    assert worst(checks).ratio > MARGIN, checks
