"""No silent drops: every field of OpenAI's request bodies is honoured, refused by name, or cannot change the output."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from edgespec.server.app import parse_json
from edgespec.server.errors import ApiError, from_validation_error
from edgespec.server.prepare import chat_messages, generation_request, refuse_unsupported
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


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"draft_len": "²"}, "draft_len"),  # a digit to str.isdigit, not to int()
        ({"draft_len": "65"}, "draft_len"),
    ],
)
def test_bad_drafting_fields_are_a_400(fields: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        generation_request(loaded_server(), chat(**fields), (1, 2))
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "tool_calls": [{"function": 5}]},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]},  # no name
        {"role": "assistant", "tool_calls": ["f"]},
    ],
)
def test_malformed_tool_calls_in_the_history_are_refused_by_the_schema(message: dict) -> None:
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate({"messages": [message]})
    assert from_validation_error(err.value).param.startswith("messages[0].tool_calls[0]")


def test_tool_call_arguments_nested_too_deeply_to_parse_are_kept_as_written() -> None:
    deep = "[" * 100_000
    body = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": deep}}]}]}
    )
    assert chat_messages(body)[0]["tool_calls"][0]["function"]["arguments"] == deep


@pytest.mark.parametrize(
    "raw", [b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}', b'{"seed": -Infinity}',
            b'{"prompt": "x", "temperature": 1e999}', b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"],
)  # fmt: skip
def test_what_json_has_no_value_for_is_not_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as err:
        parse_json(raw)
    assert err.value.status == 400 and err.value.code == "json_invalid"


@pytest.mark.parametrize("penalty", [1e-300, 5e-324, 1e-7, 1e7])
def test_a_repeat_penalty_that_would_overflow_a_logit_is_a_400(penalty: float) -> None:
    # 5e-324 divides a logit of 10 into infinity: the sampler would take it for damaged weights (a 500)
    with pytest.raises(ApiError) as err:
        generation_request(loaded_server(), chat(repeat_penalty=penalty), (1, 2))
    assert err.value.status == 400 and err.value.param == "repeat_penalty"
