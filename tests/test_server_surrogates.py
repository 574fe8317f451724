"""Lone UTF-16 surrogates in request bodies: a 400 that names the field, wherever the text is, never a 500.

JSON may escape half of a surrogate pair on its own (``"\\ud800"``); Python decodes it to text that cannot be
encoded as UTF-8. The server refuses such a body before any field is read (:mod:`edgespec.server.text_fields`),
naming the JSON path of the string in ``param``. Each text field a client can send has a case here, on a live
server of the tiny model, and a hypothesis property runs the same over generated texts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import WAIT, LiveServer, tiny_loader

from edgespec.server import ServerSettings
from edgespec.server.text_fields import find_lone_surrogate

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
USER = {"role": "user", "content": "Hi"}


def tool(name: str = "f", description: str = "", parameters: dict | None = None) -> dict:
    function = {"name": name, "description": description, "parameters": parameters or {"type": "object"}}
    return {"type": "function", "function": function}


def json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}


# (route, the field's JSON path, a valid body with the text in that field)
Body = Callable[[str], dict]
FIELDS: list[tuple[str, str, Body]] = [
    (TEXT, "prompt", lambda t: {"prompt": t}),
    (TEXT, "prompt[0]", lambda t: {"prompt": [t]}),
    (TEXT, "stop", lambda t: {"prompt": "Hi", "stop": t}),
    (CHAT, "messages[0].content", lambda t: {"messages": [{"role": "user", "content": t}]}),
    (CHAT, "messages[1].content[1].text", lambda t: {
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": t}]}]}),
    (CHAT, "messages[0].role", lambda t: {"messages": [{"role": t, "content": "Hi"}]}),
    (CHAT, "messages[0].name", lambda t: {"messages": [{**USER, "name": t}]}),
    (CHAT, "messages[1].tool_calls[0].function.arguments", lambda t: {"messages": [USER, {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": t}}]}]}),
    (CHAT, "stop[1]", lambda t: {"messages": [USER], "stop": ["\n", t]}),
    (CHAT, "tools[0].function.name", lambda t: {"messages": [USER], "tools": [tool(name=t)]}),
    (CHAT, "tools[0].function.description", lambda t: {"messages": [USER], "tools": [tool(description=t)]}),
    (CHAT, "tools[0].function.parameters.properties", lambda t: {  # a key of the tool's schema
        "messages": [USER], "tools": [tool(parameters={"type": "object", "properties": {t: {"type": "string"}}})]}),
    (CHAT, "tool_choice.function.name", lambda t: {
        "messages": [USER], "tools": [tool()], "tool_choice": {"type": "function", "function": {"name": t}}}),
    (CHAT, "response_format.json_schema.schema.enum[0]", lambda t: {
        "messages": [USER], "response_format": json_schema({"enum": [t]})}),
    (TEXT, "response_format.json_schema.schema.properties", lambda t: {
        "prompt": "Hi", "response_format": json_schema({"type": "object", "properties": {t: {}}})}),
    (CHAT, "logit_bias", lambda t: {"messages": [USER], "logit_bias": {t: 1}}),  # a key
    (CHAT, "user", lambda t: {"messages": [USER], "user": t}),
    (TEXT, "model", lambda t: {"prompt": "Hi", "model": t}),
    (CHAT, "metadata.note", lambda t: {"messages": [USER], "metadata": {"note": t}}),
    # the chat page's own request: its settings, streamed
    (CHAT, "messages[2].content", lambda t: {
        "model": "x", "stream": True, "temperature": 0.7, "max_tokens": 8, "draft_len": "auto", "lookup": True,
        "messages": [{"role": "system", "content": "You are brief."}, USER, {"role": "user", "content": t}]}),
]  # fmt: skip
FIELD_IDS = [f"{route.rsplit('/', 1)[1]}:{path}" for route, path, _ in FIELDS]

LONE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


def with_lone_surrogates() -> st.SearchStrategy[str]:
    """Text holding at least one lone surrogate: hypothesis' text has none (category Cs is left out), so no two
    halves here can meet as a pair."""
    plain = st.text(max_size=12)
    return st.tuples(plain, st.lists(st.tuples(LONE, plain), min_size=1, max_size=3)).map(
        lambda t: t[0] + "".join(a + b for a, b in t[1])
    )


@pytest.fixture(scope="module")
def live(tiny_model_path: Path):
    server = LiveServer(tiny_loader(tiny_model_path, draft=False), ServerSettings(max_queue=3)).start()
    yield server
    server.stop()


def post(live: LiveServer, route: str, body: dict) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \udXXX, as a JavaScript or Go client would
    data = json.dumps(body).encode()
    return httpx.post(live.url + route, content=data, headers={"Content-Type": "application/json"}, timeout=WAIT)


def assert_refused(response: httpx.Response, path: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (path, "invalid_value", "invalid_request_error")
    assert path in error["message"] and "surrogate" in error["message"]


@pytest.mark.real
@pytest.mark.parametrize(("route", "path", "body"), FIELDS, ids=FIELD_IDS)
def test_a_lone_surrogate_in_each_text_field_is_a_400_naming_it(live: LiveServer, route, path, body) -> None:
    assert_refused(post(live, route, body("a\ud800b")), path)
    assert_refused(post(live, route, body("\udfff")), path)


@pytest.mark.real
@settings(max_examples=40, deadline=None)
@given(field=st.sampled_from(FIELDS), text=with_lone_surrogates())
def test_generated_texts_with_lone_surrogates_are_refused_by_field(live: LiveServer, field, text) -> None:
    route, path, body = field
    assert_refused(post(live, route, body(text)), path)


@pytest.mark.real
def test_a_surrogate_pair_is_one_character_and_served(live: LiveServer) -> None:
    # "\ud83d\ude00" is U+1F600 escaped as JSON allows: decoded whole, it is text like any other
    data = b'{"prompt": "Smile \\ud83d\\ude00", "max_tokens": 2, "echo": true}'
    response = httpx.post(live.url + TEXT, content=data, timeout=WAIT)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"].startswith("Smile \U0001f600")
    # the server went on serving after every refusal above
    assert post(live, CHAT, {"messages": [USER], "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ({"a": ["x", {"b": "\ud800"}]}, "a[1].b"),
        ({"a": {"\udc00": 1}}, "a"),  # a key is named by its object
        ({"\udc00": 1}, "body"),
        ({"a": "ok", "b": ["\U0001f600", "é"]}, None),
        ({"first": "\ud800", "second": "\ud801"}, "first"),  # the first in the body's order
    ],
)
def test_find_lone_surrogate_names_the_json_path(data: dict, path: str | None) -> None:
    assert find_lone_surrogate(data) == path


def test_find_lone_surrogate_walks_deep_bodies_without_recursion() -> None:
    deep: list = ["\ud800"]
    for _ in range(3000):  # deeper than the interpreter's recursion limit (1000)
        deep = [deep]
    assert find_lone_surrogate({"x": deep}) == "x" + "[0]" * 3001
