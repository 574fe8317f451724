"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions``, validated strictly.

Types are checked strictly (``"0.5"`` is not a number, ``1.0`` is not an integer): a client that sends the wrong
type learns it from a 400 instead of getting a guess. Every field of OpenAI's two request bodies is declared: it is
honoured, refused by name when it asks for what edgespec cannot do (:func:`.prepare.refuse_unsupported`), or, when
it cannot change the output (``user``, ``metadata``, ``store``, ...), accepted and ignored. Fields no one defines
are ignored, as OpenAI's clients expect.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from edgespec.engine import MAX_DRAFT_LEN
from edgespec.logprobs import MAX_TOP_LOGPROBS
from edgespec.models.chat_template import ROLES

MAX_CHOICES = 16  # n: more choices than this many sequences would mostly wait for each other
# The repeat penalty divides (or multiplies) a seen token's logit: past this factor either way a logit overflows
# to infinity (1e-308 and less) or the penalty changes nothing more.
MAX_REPEAT_PENALTY = 1e6


def checked_later(schema: dict[str, Any]) -> Any:
    """A bound that :mod:`.prepare` or the sampler checks, with a message of its own (and its own ``param``), stated
    here too so that the published schema says what the server accepts. Keywords that apply to one JSON type
    (``minimum``, ``pattern``) let ``null`` through, as the field's type does."""
    return Field(default=None, json_schema_extra=schema)


def accepted_as(schema: dict[str, Any]) -> WithJsonSchema:
    """The published schema of a field that takes more types than it accepts, so that :mod:`.prepare` can refuse
    the rest by name (a content part that is not text, an OpenAI feature edgespec lacks)."""
    return WithJsonSchema(schema)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


REFUSED = {"type": "null", "description": "not supported by edgespec: any other value gets a 400 naming the field"}
JSON_SCHEMA = {"type": ["object", "boolean"], "description": "a JSON schema"}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class CalledFunction(_Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; some clients send the object


class ToolCall(_Strict):
    """An assistant's call, as a response gave it (fields beyond these are kept for the chat template)."""

    model_config = ConfigDict(strict=True, extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


PART_SCHEMA = TextPart.model_json_schema()
PART_SCHEMA.pop("title", None)


class ChatMessage(_Strict):
    role: Annotated[str, accepted_as({"enum": [*ROLES, "developer"]})]
    # A string, a list of parts (only text parts are supported), or null (an assistant turn that only called tools).
    content: Annotated[
        str | list[TextPart | dict[str, Any]] | None,
        accepted_as({"anyOf": [{"type": "string"}, {"type": "array", "items": PART_SCHEMA}, {"type": "null"}]}),
    ] = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, as a response gave them
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None


class _Sampling(_Strict):
    """Fields both endpoints share: sampling, stopping, streaming, and edgespec's own ``draft_len``/``lookup``."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)  # 0: only with echo and logprobs (scoring the prompt)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, lt=1)
    seed: int | None = Field(default=None, ge=-1)  # -1: a fresh seed, as llama.cpp reads it
    stop: Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # edgespec's own (the openai client sends them through ``extra_body``): "auto", "off" or γ, also as digits
    draft_len: int | str | None = checked_later(
        {"anyOf": [
            {"type": "integer", "minimum": 0, "maximum": MAX_DRAFT_LEN},
            {"type": "string", "pattern": r"^\s*([Aa][Uu][Tt][Oo]|[Oo][Ff][Ff]|0*([0-9]|[1-5][0-9]|6[0-4]))\s*$"},
            {"type": "null"},
        ]}
    )  # fmt: skip
    lookup: bool | None = None
    # llama-server's: false decodes the whole prompt again instead of reusing the KV a sequence holds of it
    cache_prompt: bool | None = None
    # penalties and bias: OpenAI's, and llama.cpp's repeat penalty and its window
    frequency_penalty: float | None = checked_later({"minimum": -2, "maximum": 2})
    presence_penalty: float | None = checked_later({"minimum": -2, "maximum": 2})
    repeat_penalty: float | None = checked_later({"minimum": 1 / MAX_REPEAT_PENALTY, "maximum": MAX_REPEAT_PENALTY})
    repeat_last_n: int | None = checked_later({"minimum": 0})
    # token ids (below the vocabulary's size, which only the loaded model knows) to biases
    logit_bias: dict[str, float] | None = checked_later(
        {"propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": {"minimum": -100, "maximum": 100}}
    )
    n: int | None = checked_later({"minimum": 1, "maximum": MAX_CHOICES})  # choices (not streamed)
    logprobs: Any = None
    response_format: Annotated[
        Any,
        accepted_as(
            {"anyOf": [
                {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"]},
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "json_schema"},
                        "json_schema": {
                            "type": "object", "properties": {"schema": JSON_SCHEMA}, "required": ["schema"]
                        },
                    },
                    "required": ["type", "json_schema"],
                },
                {"type": "null"},
            ]}
        ),
    ] = None  # fmt: skip
    # defined by OpenAI, no effect on the output: accepted and ignored (README lists them)
    user: str | None = None


TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.\\-]{1,64}$"},
                "description": {},
                "parameters": {"type": "object", "description": "a JSON schema"},
            },
            "required": ["name"],
        },
    },
    "required": ["type", "function"],
}
TOOL_CHOICE_SCHEMA = {
    "anyOf": [
        {"enum": ["none", "auto", "required"]},
        {
            "type": "object",
            "properties": {
                "type": {"const": "function"},
                "function": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
            },
            "required": ["type", "function"],
        },
        {"type": "null"},
    ]
}


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: Annotated[Any, accepted_as({"type": ["boolean", "null"]})] = None
    top_logprobs: int | None = checked_later({"minimum": 0, "maximum": MAX_TOP_LOGPROBS})  # needs logprobs: true
    # The tools' names must be unique; a chat template that takes no tools refuses them (a 400).
    tools: Annotated[Any, accepted_as(_nullable({"type": "array", "items": TOOL_SCHEMA}))] = None
    tool_choice: Annotated[Any, accepted_as(TOOL_CHOICE_SCHEMA)] = None
    # OpenAI's features that edgespec lacks: refused by name unless they ask for nothing
    functions: Annotated[Any, accepted_as({"anyOf": [REFUSED, {"type": "array", "maxItems": 0}]})] = None
    function_call: Annotated[Any, accepted_as({"anyOf": [REFUSED, {"enum": ["none", "auto"]}]})] = None
    audio: Annotated[Any, accepted_as(REFUSED)] = None
    modalities: Annotated[list[str] | None, accepted_as({"anyOf": [REFUSED, {"const": ["text"]}]})] = None
    reasoning_effort: Annotated[str | None, accepted_as(REFUSED)] = None
    verbosity: Annotated[str | None, accepted_as(REFUSED)] = None
    web_search_options: Annotated[Any, accepted_as(REFUSED)] = None
    # no effect on the output: accepted and ignored. `prediction` (predicted outputs) is a hint for speed only.
    metadata: Any = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    prediction: Any = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class CompletionRequest(_Sampling):
    # One prompt: a text, a list holding one text, or token ids (inside the vocabulary, which the model decides);
    # not empty.
    prompt: Annotated[
        str | list[str] | list[int],
        accepted_as({"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        ]}),
    ]  # fmt: skip
    echo: bool | None = None
    # without stream, or without logprobs: a stream scores no prompt
    logprobs: Annotated[
        Any,
        accepted_as(
            {"anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS}, {"const": False}, {"type": "null"}
            ]}
        ),
    ] = None  # fmt: skip
    suffix: Annotated[str | None, accepted_as({"anyOf": [REFUSED, {"const": ""}]})] = None
    best_of: Annotated[int | None, accepted_as({"anyOf": [{"const": 1}, {"type": "null"}]})] = None
