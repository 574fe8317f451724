"""No silent drops: every field of OpenAI's request bodies is honoured, refused by name, or cannot change the output."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgespec.server.errors import ApiError
from edgespec.server.prepare import generation_request, refuse_unsupported
from edgespec.server.schemas import ChatCompletionRequest, CompletionRequest

# The request bodies as OpenAI's API reference defines them (chat completions; legacy completions).
OPENAI_CHAT_FIELDS = {
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
    "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
}  # fmt: skip
OPENAI_COMPLETION_FIELDS = {
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
}  # fmt: skip


@pytest.mark.parametrize(
    "schema, fields", [(ChatCompletionRequest, OPENAI_CHAT_FIELDS), (CompletionRequest, OPENAI_COMPLETION_FIELDS)]
)
def test_every_openai_field_is_declared_so_none_is_silently_dropped(schema, fields) -> None:
    # An undeclared field is ignored by the schema (extra="ignore"): the request would succeed without it.
    assert fields - set(schema.model_fields) == set()


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"audio": {"voice": "alloy", "format": "mp3"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"verbosity": "low"}, "verbosity"),
        ({"web_search_options": {}}, "web_search_options"),
    ],
)
def test_output_changing_fields_edgespec_lacks_are_refused_by_name(fields: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        refuse_unsupported(chat(**fields))
    assert err.value.status == 400 and err.value.param == param and param in str(err.value)


def loaded_server(n_vocab: int = 100) -> SimpleNamespace:
    target = SimpleNamespace(bit_exact=False, n_ctx=4096, n_vocab=n_vocab)
    runtime = SimpleNamespace(
        engine=SimpleNamespace(gamma_limit=16, max_gamma=16, target=target), target=target, draft=None,
        context_size=4096,
    )  # fmt: skip
    return SimpleNamespace(runtime=runtime, draft_len="auto", lookup=True, lookup_available=True)


def test_penalties_and_logit_bias_reach_the_sampler() -> None:
    body = chat(
        frequency_penalty=1.5, presence_penalty=-0.5, repeat_penalty=1.3, repeat_last_n=32,
        logit_bias={"42": 5, "7": -100},
    )  # fmt: skip
    refuse_unsupported(body)
    params = generation_request(loaded_server(), body, (1, 2)).params
    assert (params.frequency_penalty, params.presence_penalty, params.repeat_penalty, params.repeat_last_n) == (
        1.5, -0.5, 1.3, 32,
    )  # fmt: skip
    assert params.logit_bias == ((7, -100.0), (42, 5.0))
    completion = CompletionRequest.model_validate({"prompt": "x", "frequency_penalty": 2.0})
    assert generation_request(loaded_server(), completion, (1, 2)).params.frequency_penalty == 2.0


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"100": 1}}, "logit_bias"),  # outside the vocabulary
        ({"logit_bias": {"²": 1}}, "logit_bias"),  # a digit to str.isdigit, not to int()
        ({"frequency_penalty": 3.0}, None),  # out of OpenAI's range: the message names it
        ({"repeat_penalty": 0.0}, None),
    ],
)
def test_bad_penalties_are_a_400(fields: dict, param) -> None:
    with pytest.raises(ApiError) as err:
        generation_request(loaded_server(), chat(**fields), (1, 2))
    assert err.value.status == 400 and err.value.param == param
    assert next(iter(fields)) in err.value.message


def test_neutral_values_and_output_neutral_fields_are_accepted() -> None:
    # What many clients send by default, and the fields that cannot change the output (listed in the README).
    refuse_unsupported(
        chat(
            modalities=["text"],
            user="u1", metadata={"k": "v"}, store=False, service_tier="auto", parallel_tool_calls=True,
            prediction={"type": "content", "content": "x"}, prompt_cache_key="c", safety_identifier="s",
        )
    )  # fmt: skip
    refuse_unsupported(CompletionRequest.model_validate({"prompt": "x", "user": "u", "logit_bias": {}}))
