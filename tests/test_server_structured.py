"""Structured output and tool calls through `edgespec serve`, with the official openai client on 127.0.0.1: the Qwen
pair (its chat template takes tools, in the Hermes <tool_call> format), four requests at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from test_server import WAIT, LiveServer

from edgespec.server import ServerSettings

pytestmark = [pytest.mark.real, pytest.mark.slow]
ALIAS = "qwen"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "languages": {"type": "array", "items": {"type": "string", "enum": ["python", "go", "rust", "c"]},
                      "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "languages", "address"],
    "additionalProperties": False,
}  # fmt: skip
EXTRACT = [
    {"role": "user", "content": "Extract a profile: Maria Lopez, 34, lives in Lyon (69002), codes in Python and Go."}
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now, in celsius?"}]


@pytest.fixture(scope="module")
def qwen_live(qwen_target_path: Path, qwen_draft_path: Path):
    def load():
        from edgespec.api import load as load_models

        return load_models(
            qwen_target_path, qwen_draft_path, n_ctx=2048, parallel=4, show_fetch_progress=False
        )

    server = LiveServer(load, ServerSettings(alias=ALIAS, max_queue=32)).start()
    yield server
    server.stop()


@pytest.fixture()
def client(qwen_live: LiveServer) -> openai.OpenAI:
    qwen_live.wait_idle()
    return openai.OpenAI(base_url=qwen_live.url + "/v1", api_key="unused", max_retries=0, timeout=4 * WAIT)


def test_twenty_sampled_json_schema_replies_are_all_valid_documents(client: openai.OpenAI) -> None:
    """20 requests at T=0.8, four at a time: every reply parses and validates against the schema."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    replies: list[str] = [""] * 20
    forced: list[int] = [0] * 20
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            r = client.chat.completions.create(
                model=ALIAS, messages=EXTRACT, response_format=fmt, temperature=0.8, seed=i, max_tokens=120
            )
            replies[i] = r.choices[0].message.content or ""
            assert r.choices[0].finish_reason == "stop"
            forced[i] = r.model_extra["speculation"]["forced"]
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(6 * WAIT)
    assert not errors, errors
    for reply in replies:
        jsonschema.validate(json.loads(reply), PERSON)
    assert sum(forced) > 20  # keys and punctuation were forced drafts


def test_json_object_mode_and_a_streamed_schema_reply(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=ALIAS, messages=EXTRACT, response_format={"type": "json_object"}, temperature=0, max_tokens=120
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    whole = client.chat.completions.create(
        model=ALIAS, messages=EXTRACT, response_format=fmt, temperature=0, max_tokens=120
    )
    stream = client.chat.completions.create(
        model=ALIAS, messages=EXTRACT, response_format=fmt, temperature=0, max_tokens=120, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == whole.choices[0].message.content
    jsonschema.validate(json.loads(streamed), PERSON)


@pytest.mark.parametrize("choice", ["required", "auto", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_calls_come_back_parsed_with_valid_arguments(client: openai.OpenAI, choice) -> None:
    r = client.chat.completions.create(
        model=ALIAS, messages=ASK_WEATHER, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=80
    )
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", message
    assert message.tool_calls and message.tool_calls[0].function.name == "get_weather"
    arguments = json.loads(message.tool_calls[0].function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert "paris" in arguments["city"].lower()


def test_streamed_tool_calls_equal_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs = dict(model=ALIAS, messages=ASK_WEATHER, tools=[WEATHER, TIME], tool_choice="required", temperature=0,
                  max_tokens=80, parallel_tool_calls=False)  # fmt: skip
    whole = client.chat.completions.create(**kwargs).choices[0].message
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in whole.tool_calls
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(whole.tool_calls) == 1  # parallel_tool_calls false: one call


def test_a_tool_result_turn_renders_and_the_model_answers_in_text(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=ALIAS, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80
    ).choices[0].message
    call = first.tool_calls[0]
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    r = client.chat.completions.create(
        model=ALIAS, messages=messages, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=60
    )
    assert r.choices[0].finish_reason in ("stop", "length") and "21" in (r.choices[0].message.content or "")


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "intege"}}}},
         "response_format", "intege"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
        ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
         "nope"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format", "both"),
    ],
)  # fmt: skip
def test_bad_schemas_and_tools_are_400s_naming_the_problem_and_the_server_goes_on(
    qwen_live: LiveServer, body: dict, param: str, words: str
) -> None:
    r = httpx.post(
        qwen_live.url + "/v1/chat/completions",
        json={"model": ALIAS, "messages": ASK_WEATHER, "max_tokens": 4, **body},
        timeout=WAIT,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    ok = httpx.post(
        qwen_live.url + "/v1/chat/completions",
        json={"model": ALIAS, "messages": ASK_WEATHER, "max_tokens": 2, "temperature": 0},
        timeout=WAIT,
    )
    assert ok.status_code == 200
