"""The whole loop on real GGUF models: the Qwen2.5-Coder 1.5B/0.5B pair and SmolLM2-135M."""

from __future__ import annotations

import threading
from dataclasses import replace
from functools import cache

import numpy as np
import pytest
from stat_tools import fits

from edgespec.api import Runtime, load
from edgespec.engine import Engine
from edgespec.errors import ContextOverflowError, ModelError, VocabMismatchError
from edgespec.events import Finished
from edgespec.models.backend import Model
from edgespec.sampling import SamplingParams, warp

pytestmark = pytest.mark.real

CODE_PROMPTS = [
    "<|im_start|>user\nWrite a Python function that checks whether a string is a palindrome.<|im_end|>\n"
    "<|im_start|>assistant\n",
    'def merge_sort(items):\n    """Sort a list with merge sort."""\n',
    "<|im_start|>user\nExplain what a hash map is in two sentences.<|im_end|>\n<|im_start|>assistant\n",
]


# An answer that copies most of its input: prompt lookup drafts long runs of it.
EDIT_PROMPT = (
    "<|im_start|>user\nRename the parameter `xs` to `items` everywhere in this function and change nothing else:\n"
    "```python\ndef total(xs):\n    s = 0\n    for x in xs:\n        if x > 0:\n            s += x\n"
    "    return s / len(xs) if xs else 0\n```<|im_end|>\n<|im_start|>assistant\n"
)


def finish(events) -> Finished:
    return [e for e in events if isinstance(e, Finished)][0]


def fresh_logits(model: Model, tokens: list[int]) -> np.ndarray:
    """Next-token logits after ``tokens``, from an empty KV (a fresh prefill)."""
    model.truncate(0)
    return model.decode(tokens, [len(tokens) - 1])[0]


@pytest.mark.slow
def test_greedy_speculation_is_token_identical_to_greedy_target(qwen_pair) -> None:
    target, draft = qwen_pair
    params = SamplingParams(temperature=0, max_tokens=64)
    for prompt in CODE_PROMPTS:
        tokens = target.tokenize(prompt)
        plain = finish(Engine(target, None, draft_len=0, lookup=False).stream(tokens, params)).tokens
        for engine in (
            Engine(target, draft, draft_len=4, lookup=False),
            Engine(target, draft, draft_len="auto"),
        ):
            spec = finish(engine.stream(tokens, params)).tokens
            if spec != plain:
                # Allowed only where batched and single-token logits may order a near-tie differently.
                i = next(i for i, (a, b) in enumerate(zip(spec, plain, strict=False)) if a != b)
                row = np.sort(fresh_logits(target, tokens + list(plain[:i])))
                gap = float(row[-1] - row[-2])
                assert gap < 1e-3, (
                    f"diverged at token {i} where the target's top-2 logits differ by {gap:.4f}"
                )
            assert len(spec) == len(plain)


@pytest.mark.slow
@pytest.mark.parametrize("draft_len", [3, 4, "auto"])
def test_bit_exact_greedy_speculation_is_token_identical_to_plain_decoding(qwen_bit_exact_pair, draft_len) -> None:
    """Loaded bit-exact (no weight repacking), a verify batch computes every logit exactly as a single-token decode
    does: greedy output with any γ equals plain decoding's, with no allowance for near-ties."""
    target, draft = qwen_bit_exact_pair
    params = SamplingParams(temperature=0, max_tokens=128)
    plain_engine = Engine(target, None, draft_len=0, lookup=False)
    spec_engine = Engine(target, draft, draft_len=draft_len)
    plain_rounds = spec_rounds = 0
    for prompt in [*CODE_PROMPTS, EDIT_PROMPT]:
        tokens = target.tokenize(prompt)
        plain = finish(plain_engine.stream(tokens, params))
        spec = finish(spec_engine.stream(tokens, params))
        assert spec.tokens == plain.tokens, f"bit-exact output diverged at γ={draft_len} on {prompt[:40]!r}"
        plain_rounds, spec_rounds = plain_rounds + plain.stats.rounds, spec_rounds + spec.stats.rounds
    # It did speculate: several tokens per verify (auto drafts where its costs say it pays: the code edit's copy)
    assert spec_rounds < 0.9 * plain_rounds, (spec_rounds, plain_rounds)


@pytest.mark.slow
def test_target_kv_after_rounds_with_rejections_equals_a_fresh_prefill(qwen_pair) -> None:
    target, draft = qwen_pair
    engine = Engine(target, draft, draft_len=4, lookup=False)
    prompt = target.tokenize(CODE_PROMPTS[0])
    done = finish(engine.stream(prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=48)))
    assert done.stats.accepted < done.stats.drafted, "no rejection happened; the test would prove nothing"
    committed = prompt + list(done.tokens)
    assert target.kv_tokens == committed[:-1]
    after_rounds = target.decode([committed[-1]], [0])[0]
    fresh = fresh_logits(target, committed)

    # llama.cpp's quantized kernels round differently for different batch shapes, so even two fresh prefills
    # (one batch vs one token at a time) differ: measured here max |Δ| ~0.5, mean |Δ| ~0.09 on logits of
    # scale ~20. A KV with one token missing or one stale token differs by mean |Δ| ~0.4-0.6. The tolerance is
    # the noise measured in this run, x1.5.
    target.truncate(0)
    for tok in committed[:-1]:
        target.decode([tok])
    one_by_one = target.decode([committed[-1]], [0])[0]
    tolerance = 1.5 * float(np.abs(fresh - one_by_one).mean())
    assert float(np.abs(after_rounds - fresh).mean()) <= tolerance
    assert int(np.argmax(after_rounds)) == int(np.argmax(fresh))
    # and the check has teeth: a KV missing one committed token is far outside that tolerance
    missing_one = fresh_logits(target, committed[:-6] + committed[-5:])
    assert float(np.abs(missing_one - fresh).mean()) > 2 * tolerance


@pytest.mark.slow
def test_stochastic_speculation_samples_the_targets_distribution(
    tiny_model_path, tiny_requantized_path
) -> None:
    """T=1 on SmolLM2 with its Q4_0 requantization as the draft: the first two tokens' joint distribution
    must match the target's own (computed exactly from the target's logits), at ALPHA."""
    target = Model(tiny_model_path, n_ctx=256)
    draft = Model(tiny_requantized_path, n_ctx=256)
    reference = Model(tiny_model_path, n_ctx=256)
    params = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0, max_tokens=2)
    prompt = target.tokenize("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n")
    engine = Engine(target, draft, draft_len=3, lookup=False)

    @cache
    def p_next(prefix: tuple[int, ...]) -> dict[int, float]:
        d = warp(fresh_logits(reference, list(prefix)), params)
        return dict(zip(d.ids.tolist(), d.probs.tolist(), strict=True))

    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    rng = np.random.default_rng(0)
    n = 1500
    for _ in range(n):
        done = finish(
            engine.stream(prompt, SamplingParams(**{**params.__dict__, "seed": int(rng.integers(2**31))}))
        )
        pair = tuple(done.tokens[:2])
        assert len(pair) == 2
        counts[pair] = counts.get(pair, 0) + 1
        drafted += done.stats.drafted
        accepted += done.stats.accepted
    assert 0.3 < accepted / drafted < 0.995, (
        f"acceptance {accepted / drafted:.3f}: the pair must disagree sometimes"
    )

    first = p_next(tuple(prompt))
    cells, probs, observed = [], [], []
    for a, pa in first.items():
        for b, pb in p_next((*prompt, a)).items():
            cells.append((a, b))
            probs.append(pa * pb)
            observed.append(counts.pop((a, b), 0))
    assert not counts, f"tokens outside the target's support were emitted: {counts}"
    ok, why = fits(np.array(observed), np.array(probs))
    assert ok, why
    for m in (target, draft, reference):
        m.close()


def tempered_first(logits: np.ndarray, params: SamplingParams) -> dict[int, float]:
    """A plausible but different definition of the warp: temperature applied before top-p and min-p (as some
    samplers order it). The statistical test below must tell it from the chain's definition."""
    x = logits.astype(np.float64) / params.temperature
    ids = np.argsort(-x)[: params.top_k]
    p = np.exp(x[ids] - x[ids].max())
    p /= p.sum()
    keep = (np.concatenate(([0.0], np.cumsum(p)[:-1])) < params.top_p) & (p >= params.min_p * p.max())
    return dict(zip(ids[keep].tolist(), (p[keep] / p[keep].sum()).tolist(), strict=True))


@pytest.mark.slow
def test_backend_sampled_speculation_samples_the_targets_warped_distribution(
    tiny_model_path, tiny_requantized_path
) -> None:
    """T=0.8 with top-k 40, top-p 0.95, min-p 0.05: top-k runs inside llama.cpp's decode graph (target and draft),
    the rest in numpy. The joint of the first two tokens must match the target's own distribution under the chain's
    definition, computed from whole logits rows; the same counts must reject a warp that orders temperature first."""
    target = Model(tiny_model_path, n_ctx=256)
    draft = Model(tiny_requantized_path, n_ctx=256)
    reference = Model(tiny_model_path, n_ctx=256)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, max_tokens=2)
    prompt = target.tokenize("<|im_start|>user\nName an animal.<|im_end|>\n<|im_start|>assistant\n")
    engine = Engine(target, draft, draft_len=3, lookup=False)
    eog_ids = {target.token_text(i): i for i in range(target.n_vocab) if target.is_eog(i)}

    @cache
    def logits_after(prefix: tuple[int, ...]) -> np.ndarray:
        return fresh_logits(reference, list(prefix))

    def joint(warp_row) -> dict[tuple[int, int], float]:
        first = warp_row(logits_after(tuple(prompt)))
        return {
            (a, b): pa * pb
            for a, pa in first.items()
            for b, pb in (warp_row(logits_after((*prompt, a))) if not target.is_eog(a) else {a: 1.0}).items()
        }

    def chain_warp(row: np.ndarray) -> dict[int, float]:
        d = warp(row, params)
        real = d.probs[0] > 0
        return dict(zip(d.ids[0][real].tolist(), d.probs[0][real].tolist(), strict=True))

    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    rng = np.random.default_rng(1)
    n = 1500
    for _ in range(n):
        done = finish(
            engine.stream(prompt, SamplingParams(**{**params.__dict__, "seed": int(rng.integers(2**31))}))
        )
        toks = list(done.tokens)
        if done.finish_reason == "eos":  # the end-of-generation token is not output; count it in its own cell
            toks.append(eog_ids[done.stopped_by])
        pair = (toks[0], toks[1] if not target.is_eog(toks[0]) else toks[0])
        counts[pair] = counts.get(pair, 0) + 1
        drafted += done.stats.drafted
        accepted += done.stats.accepted
    assert done.stats.sampling_path == "top-40 in llama.cpp, rest numpy"
    assert 0.3 < accepted / drafted < 0.995, f"acceptance {accepted / drafted:.3f}: the pair must disagree sometimes"

    def fit(expected: dict[tuple[int, int], float]) -> tuple[bool, str]:
        cells = sorted(set(expected) | set(counts))
        return fits(np.array([counts.get(c, 0) for c in cells]), np.array([expected.get(c, 0.0) for c in cells]))

    ok, why = fit(joint(chain_warp))
    assert ok, why
    ok, why = fit(joint(lambda row: tempered_first(row, params)))
    assert not ok, f"the test cannot tell the warp's order apart: {why}"
    for m in (target, draft, reference):
        m.close()


def test_a_seed_reproduces_sampling_on_the_backend_path(tiny_model_path, tiny_requantized_path) -> None:
    runtime = load(tiny_model_path, tiny_requantized_path, n_ctx=512, draft_len=3, lookup=False)
    params = SamplingParams(temperature=0.8, seed=1234, max_tokens=24)
    first = runtime.generate("Once upon a time", params)
    assert first.stats.sampling_path == "top-40 in llama.cpp, rest numpy" and first.stats.drafted > 0
    assert runtime.generate("Once upon a time", params).tokens == first.tokens
    others = {runtime.generate("Once upon a time", replace(params, seed=s)).tokens for s in range(5)}
    assert len(others) > 1  # the seed matters: different seeds, different samples
    runtime.close()


def test_cancel_mid_generation_then_a_correct_second_request(tiny_model_path) -> None:
    runtime = load(tiny_model_path, tiny_model_path, n_ctx=2048, draft_len=3)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    expected = runtime.generate("Once upon a time", greedy).tokens
    events = runtime.stream("The history of the Roman empire", SamplingParams(temperature=0, max_tokens=1500))
    for i, event in enumerate(events):
        if i == 2:
            threading.Timer(0.0, runtime.cancel).start()
        last = event
    assert last.finish_reason == "cancelled"
    assert runtime.generate("Once upon a time", greedy).tokens == expected
    runtime.close()


def test_chat_second_turn_prefills_only_the_new_tokens(tiny_model_path) -> None:
    runtime = load(tiny_model_path, tiny_model_path, n_ctx=2048, draft_len=2)
    params = SamplingParams(temperature=0, max_tokens=16)
    messages = [{"role": "user", "content": "Say hello."}]
    first = runtime.generate(runtime.render_chat(messages), params)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And goodbye?"}]
    full = runtime.render_chat(messages)
    second = finish(runtime.chat(messages, params))
    new_tokens = len(full) - first.stats.prompt_tokens - len(first.tokens)
    # The reply's end-of-turn token was pending (never in the KV), so it is decoded again with the new turn.
    assert second.stats.prefilled_tokens <= new_tokens + 2, (second.stats.prefilled_tokens, new_tokens)
    assert second.stats.prompt_tokens == len(full)
    runtime.close()


def test_missing_model_file(tmp_path) -> None:
    with pytest.raises(ModelError):
        load(tmp_path / "nope.gguf")


def test_non_gguf_file_is_refused_before_llama_cpp(tmp_path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model\n" * 100)
    with pytest.raises(ModelError):
        load(bad)


def test_incompatible_vocabularies_name_both_models(tiny_model_path, qwen_draft_path) -> None:
    with pytest.raises(VocabMismatchError) as err:
        load(qwen_draft_path, tiny_model_path)
    assert qwen_draft_path.name in str(err.value) and tiny_model_path.name in str(err.value)


def test_prompt_longer_than_the_context(tiny_model_path) -> None:
    runtime: Runtime = load(tiny_model_path, n_ctx=256)
    with pytest.raises(ContextOverflowError, match=f"context of {runtime.context_size}"):
        runtime.stream("word " * 1000, SamplingParams(max_tokens=8))  # raises before any decode
    assert runtime.generate("Hi", SamplingParams(temperature=0, max_tokens=4)).stats.generated == 4
    runtime.close()
