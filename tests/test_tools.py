"""Tool calls without a model: the family formats, the parser (a botched call is text, never an error), the stream
that holds back what may be a call, and the constraint that makes a call fit the tool's schema."""

from __future__ import annotations

import json

import pytest
from fakes import FakeModel

from edgespec.constraint import Constraint
from edgespec.errors import InvalidParameterError
from edgespec.models.chat_template import render
from edgespec.tools import CallStream, call_grammar, parse_calls, parse_tools, template_format, template_tool_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = parse_tools([WEATHER, {"type": "function", "function": {"name": "noop"}}])
HERMES_TEMPLATE = "{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>{% endif %}"


@pytest.mark.parametrize(
    "text, content, calls",
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', None,
         [("get_weather", {"city": "Oslo"})]),
        ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>', "Let me check.",
         [("get_weather", {"city": "Oslo"}), ("noop", {})]),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', None,
         [("get_weather", {"city": "Oslo"})]),
        ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}', None, [("get_weather", {"city": "Oslo"})]),
    ],
)  # fmt: skip
def test_hermes_calls_are_parsed(text: str, content, calls) -> None:
    got_content, got = parse_calls("hermes", text, TOOLS)
    assert got_content == content and [(c.name, c.arguments) for c in got] == calls


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Oslo.",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>',  # botched JSON
        '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>',  # a tool it was not given
        '```python\nprint("hi")\n```',
        '{"name": "get_weather", "arguments": [1]}',
    ],
)
def test_a_botched_or_absent_call_is_a_plain_reply(text: str) -> None:
    assert parse_calls("hermes", text, TOOLS) is None


def test_llama3_calls_are_one_json_object() -> None:
    _, calls = parse_calls("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', TOOLS)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Rome"})]
    assert parse_calls("llama3", "Rome is warm.", TOOLS) is None


def test_formats_are_read_from_templates() -> None:
    assert template_format(HERMES_TEMPLATE) == "hermes"
    assert template_format('{% if tools %}"parameters": dictionary of argument name{% endif %}') == "llama3"
    assert template_format("{{ messages }}") is None and template_format(None) is None


@pytest.mark.parametrize(
    "tools, words",
    [([], "non-empty"), ([{"type": "function"}], r"tools\[0\]"), ([{"type": "function", "function": {"name": "a b"}}],
     "name"), ([WEATHER, WEATHER], "twice")],
)  # fmt: skip
def test_bad_tools_are_refused(tools, words: str) -> None:
    with pytest.raises(InvalidParameterError, match=words):
        parse_tools(tools)


def test_a_stream_holds_what_may_be_a_call_and_passes_text_on() -> None:
    text = CallStream("hermes", TOOLS)
    assert text.feed("It ") == "It " and text.feed("is sunny.") == "is sunny." and text.finish() == ("", [])
    call = CallStream("hermes", TOOLS)
    pieces = ["<tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}\n</tool_call>']
    assert [call.feed(p) for p in pieces] == ["", "", ""]
    rest, calls = call.finish()
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Oslo"})]
    code = CallStream("hermes", TOOLS)
    assert code.feed("```py") == "" and code.feed("thon\nprint(1)") == "```python\nprint(1)"
    botched = CallStream("hermes", TOOLS)
    assert botched.feed('{"name": ') == "" and botched.finish() == ('{"name": ', [])


def test_assistant_tool_calls_reach_the_template_with_arguments_as_objects() -> None:
    messages = template_tool_calls([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ])  # fmt: skip
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    template = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}"
        "{% endfor %}{{ tools | length }}"
    )
    assert render(messages, template, tools=[WEATHER]) == '{"city": "Oslo"}1'


def test_the_required_call_grammar_admits_only_a_call_that_fits_the_schema() -> None:
    """On a byte-level fake (every byte a token): the constraint accepts a well-formed call and nothing else."""
    model = FakeModel(n_vocab=256)
    model.piece = lambda t: bytes([t])  # type: ignore[method-assign]
    grammar = call_grammar("hermes", TOOLS[:1], special_markers=False)
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    c = Constraint(grammar, model, lambda t: t == 0)
    assert c.valid_prefix(list(good.encode())) == len(good.encode())
    c.commit(list(good.encode()))
    assert c.complete
    for bad in ('<tool_call>\n{"name": "noop"', '<tool_call>\n{"name": "get_weather", "arguments": {"town"', "Sure"):
        c = Constraint(grammar, model, lambda t: t == 0)
        assert c.valid_prefix(list(bad.encode())) < len(bad.encode()), bad
    assert json.loads(good.split("\n")[1])["arguments"] == {"city": "Oslo"}


@pytest.mark.parametrize(
    "pieces",
    [
        ["Let me check.\n<tool", '_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'],
        ["<think>The user wants", " the weather.</think>\n\n<tool_call>\n", '{"name": "get_weather", ',
         '"arguments": {"city": "Oslo"}}\n</tool_call>'],
    ],
)  # fmt: skip
def test_a_call_after_text_streams_the_text_and_then_the_call_as_the_whole_reply_parses(pieces) -> None:
    stream = CallStream("hermes", TOOLS)
    shown = "".join(stream.feed(p) for p in pieces)
    rest, calls = stream.finish()
    whole_content, whole_calls = parse_calls("hermes", "".join(pieces), TOOLS)
    assert "<tool" not in shown + rest and shown.strip() == (whole_content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_text_with_a_lone_angle_bracket_is_not_held_for_ever() -> None:
    stream = CallStream("hermes", TOOLS)
    assert stream.feed("a < b, and ") + stream.feed("<b> is bold") + stream.finish()[0] == "a < b, and <b> is bold"
