"""Log-probabilities of committed tokens: the target's raw softmax at each position, whichever drafter proposed the
token, on fakes (exact rows) and on the tiny model against llama.cpp's own logits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import FakeModel

from edgespec.engine import Engine
from edgespec.events import Chunk, Finished
from edgespec.logprobs import token_logprob
from edgespec.sampling import LOGITS, Readout, SamplingParams

PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # repeats: lookup drafts from the first round


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_a_token_logprob_is_the_log_softmax_with_the_best_alternatives_first() -> None:
    rng = np.random.default_rng(0)
    row = (rng.normal(size=5000) * 4).astype(np.float32)
    item = token_logprob(row, 17, 5)
    reference = log_softmax(row)
    assert item.token == 17 and item.logprob == pytest.approx(reference[17], abs=1e-6)
    assert [t for t, _ in item.top] == list(np.argsort(-reference)[:5])
    assert [lp for _, lp in item.top] == pytest.approx(sorted(reference, reverse=True)[:5], abs=1e-6)
    assert token_logprob(row, 3, 0).top == ()


def check_against_rows(target: FakeModel, finished: Finished, chunks: list[Chunk]) -> None:
    out = list(finished.tokens)
    assert [lp.token for lp in finished.logprobs] == out
    assert [lp for c in chunks for lp in c.logprobs] == list(finished.logprobs)  # streamed as committed
    for i, item in enumerate(finished.logprobs):
        reference = log_softmax(target.logits_after(PROMPT + out[:i]))
        assert item.logprob == pytest.approx(reference[out[i]], abs=1e-6)
        assert [t for t, _ in item.top] == list(np.argsort(-reference, kind="stable")[:3])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("drafter", ["model", "lookup"])
@pytest.mark.parametrize("top_k", [5, 0])
def test_every_committed_token_has_the_targets_raw_logprob_drafted_or_not(
    temperature: float, drafter: str, top_k: int
) -> None:
    target = FakeModel(n_vocab=9, eos_bias=-9)
    draft = FakeModel(n_vocab=9, seed=1, noise=0.5, eos_bias=-9) if drafter == "model" else None
    engine = Engine(target, draft, draft_len=3, lookup=drafter == "lookup")
    params = SamplingParams(temperature=temperature, top_k=top_k, repeat_penalty=1.3, repeat_last_n=3, seed=4,
                            max_tokens=30, logprobs=3)  # fmt: skip
    events = list(engine.stream(PROMPT, params))
    chunks, finished = events[:-1], events[-1]
    assert isinstance(finished, Finished) and finished.stats.accepted > 0  # drafted tokens among them
    # The verifies read candidates (at least the 3 alternatives) with each row's normaliser computed in llama.cpp;
    # without a top-k, sampling at T > 0 reads whole rows, and the normaliser is summed here.
    verifies = [r for r, (_, rows) in zip(target.readouts, target.decode_calls, strict=True) if rows]
    with_candidates = top_k > 0 or temperature == 0
    expected = Readout("top_k", (1 if temperature == 0 else top_k) + 3, log_norm=True) if with_candidates else LOGITS
    assert verifies and all(r == expected for r in verifies)
    check_against_rows(target, finished, chunks)


def test_no_logprobs_unless_asked() -> None:
    target = FakeModel(eos_bias=-9)
    events = list(Engine(target, None, draft_len=0).stream(PROMPT, SamplingParams(temperature=0, max_tokens=5)))
    assert all(e.logprobs == () for e in events)
    with pytest.raises(Exception, match="logprobs"):
        SamplingParams(logprobs=21)


@pytest.mark.real
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_equal_llama_cpp_logits_at_every_position(tiny_model_path: Path, temperature: float) -> None:
    """The tiny model drafting for itself (most tokens are drafted), against the log-softmax of the logits llama.cpp
    computes for the same tokens one decode at a time."""
    from edgespec.models.backend import Model

    with Model(tiny_model_path, n_ctx=512) as target, Model(tiny_model_path, n_ctx=512) as draft:
        prompt = target.tokenize("def fibonacci(n):")
        params = SamplingParams(temperature=temperature, seed=2, max_tokens=24, logprobs=5)
        finished = list(Engine(target, draft, draft_len=3, lookup=False).stream(prompt, params))[-1]
        assert finished.stats.accepted > 0
        out = list(finished.tokens)
        target.truncate(0)
        target.decode(prompt[:-1])
        for i, item in enumerate(finished.logprobs):
            row = target.decode([([*prompt, *out])[len(prompt) - 1 + i]], [0], LOGITS)[0]
            reference = log_softmax(row)
            assert item.logprob == pytest.approx(reference[out[i]], abs=1e-3)
            assert [lp for _, lp in item.top] == sorted((lp for _, lp in item.top), reverse=True)
            assert item.top[0][1] == pytest.approx(reference.max(), abs=1e-3)


def test_prompt_logprobs_score_every_prompt_token_after_the_first() -> None:
    target = FakeModel(n_vocab=9, eos_bias=-9)
    engine = Engine(target, None, draft_len=0)
    list(engine.stream(PROMPT, SamplingParams(temperature=0, max_tokens=3)))  # the lane now holds this prompt
    params = SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=2, logprobs=2)
    events = list(engine.stream(PROMPT, params))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.tokens == () and finished.finish_reason == "length"
    assert finished.stats.prefilled_tokens == len(PROMPT) - 1  # every position scored: no prefix reused
    scored = finished.prompt_logprobs
    assert len(scored) == len(PROMPT) and scored[0] is None
    for i in range(1, len(PROMPT)):
        reference = log_softmax(target.logits_after(PROMPT[:i]))
        assert scored[i].token == PROMPT[i] and scored[i].logprob == pytest.approx(reference[PROMPT[i]], abs=1e-6)
        assert len(scored[i].top) == 2
    with pytest.raises(Exception, match="max_tokens"):
        SamplingParams(max_tokens=0)


def test_a_long_prompt_is_scored_in_chunks_and_then_generates() -> None:
    target = FakeModel(n_vocab=9, eos_bias=-9, n_ctx=512)
    prompt = [1 + i % 8 for i in range(150)]  # three scored chunks of at most 64 rows
    done = list(Engine(target, None, draft_len=0).stream(prompt, SamplingParams(temperature=0, max_tokens=4,
                                                                                prompt_logprobs=0)))[-1]  # fmt: skip
    assert len(done.prompt_logprobs) == 150 and len(done.tokens) == 4
    assert max(rows for _, rows in target.decode_calls) <= 64
    last = log_softmax(target.logits_after(prompt[:149]))[prompt[149]]
    assert done.prompt_logprobs[149].logprob == pytest.approx(last, abs=1e-6)


@pytest.mark.real
def test_prompt_logprobs_equal_llama_cpp_logits(tiny_model_path: Path) -> None:
    """What log-likelihood evaluation reads (echo + logprobs): each prompt token's log-probability given the tokens
    before it, against llama.cpp's logits computed one token at a time."""
    from edgespec.models.backend import Model

    with Model(tiny_model_path, n_ctx=512) as target:
        prompt = target.tokenize("The quick brown fox jumps over the lazy dog.")
        params = SamplingParams(temperature=0, max_tokens=0, prompt_logprobs=3)
        scored = list(Engine(target, None, draft_len=0).stream(prompt, params))[-1].prompt_logprobs
        assert scored[0] is None and len(scored) == len(prompt)
        target.truncate(0)
        for i in range(1, len(prompt)):
            reference = log_softmax(target.decode([prompt[i - 1]], [0], LOGITS)[0])  # the row after prompt[:i]
            assert scored[i].token == prompt[i]
            assert scored[i].logprob == pytest.approx(reference[prompt[i]], abs=1e-3)
            assert scored[i].top[0][1] == pytest.approx(reference.max(), abs=1e-3)
