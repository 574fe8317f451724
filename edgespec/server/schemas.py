"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions``, validated strictly.

Types are checked strictly (``"0.5"`` is not a number, ``1.0`` is not an integer): a client that sends the wrong
type learns it from a 400 instead of getting a guess. Every field of OpenAI's two request bodies is declared: it is
honoured, refused by name when it asks for what edgespec cannot do (:func:`.prepare.refuse_unsupported`), or, when
it cannot change the output (``user``, ``metadata``, ``store``, ...), accepted and ignored. Fields no one defines
are ignored, as OpenAI's clients expect.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: str
    # A string, a list of parts (only text parts are supported), or null (an assistant turn that only called tools).
    content: str | list[TextPart | dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, as a response gave them
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
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # edgespec's own (the openai client sends them through ``extra_body``)
    draft_len: int | str | None = None
    lookup: bool | None = None
    # llama-server's: false decodes the whole prompt again instead of reusing the KV a sequence holds of it
    cache_prompt: bool | None = None
    # penalties and bias: OpenAI's, and llama.cpp's repeat penalty and its window
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = None  # choices (not streamed)
    logprobs: Any = None
    response_format: Any = None  # text, json_object, json_schema
    # defined by OpenAI, no effect on the output: accepted and ignored (README lists them)
    user: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    # no effect on the output: accepted and ignored. `prediction` (predicted outputs) is a hint for speed only.
    metadata: Any = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    prediction: Any = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
