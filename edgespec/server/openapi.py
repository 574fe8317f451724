"""The OpenAPI document the server publishes at ``/openapi.json``: every route, the request bodies as the server
accepts them (:mod:`.schemas`, the same models that validate them), and every response's status and shape.

Written here rather than derived from the routes: the generation routes parse their own bodies (whatever the
Content-Type, as curl sends them), and FastAPI would otherwise describe statuses the server never sends (422).
The tests check that it lists exactly the app's routes and fuzz the server against it.
"""

from __future__ import annotations

from typing import Any

from edgespec.server.page import ASSET_TYPES, STATIC
from edgespec.server.schemas import ChatCompletionRequest, CompletionRequest

REF = "#/components/schemas/{model}"
JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


INT = {"type": "integer", "minimum": 0}
NUMBER = {"type": "number"}
STRING = {"type": "string"}
FINISH = {"enum": ["stop", "length", "tool_calls"]}
USAGE = _object(
    {"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT,
     "prompt_tokens_details": _object({"cached_tokens": INT}, ("cached_tokens",))},
    ("prompt_tokens", "completion_tokens", "total_tokens"),
)  # fmt: skip
TOOL_CALL = _object(
    {"index": INT, "id": STRING, "type": {"const": "function"},
     "function": _object({"name": STRING, "arguments": STRING}, ("name", "arguments"))},
    ("id", "type", "function"),
)  # fmt: skip
TOKEN_LOGPROB = _object({"token": STRING, "logprob": NUMBER, "bytes": {"type": "array", "items": INT}}, ("token",))
CHAT_LOGPROBS = _object(
    {"content": {"type": "array", "items": {**TOKEN_LOGPROB, "properties": {
        **TOKEN_LOGPROB["properties"], "top_logprobs": {"type": "array", "items": TOKEN_LOGPROB}}}}},
    ("content",),
)  # fmt: skip
TEXT_LOGPROBS = _object(
    {"tokens": {"type": "array", "items": STRING},
     "token_logprobs": {"type": "array", "items": _nullable(NUMBER)},
     "top_logprobs": {"type": "array", "items": _nullable({"type": "object", "additionalProperties": NUMBER})},
     "text_offset": {"type": "array", "items": INT}},
    ("tokens", "token_logprobs", "top_logprobs", "text_offset"),
)  # fmt: skip
HEAD = {"id": STRING, "created": INT, "model": STRING}
EXTRAS = {"timings": {"type": "object"}, "speculation": _object({"active": {"type": "boolean"}}, ("active",))}
EDGESPEC = {"edgespec": _object({"spans": {"type": "array"}, "rounds": {"type": "array"}, "live": {"type": "object"}})}


def _choices(choice: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": choice}


RESPONSES: dict[str, dict[str, Any]] = {
    "Error": _object(
        {"error": _object(
            {"message": STRING, "type": STRING, "param": _nullable(STRING), "code": _nullable(STRING)},
            ("message", "type", "param", "code"),
        )},
        ("error",),
    ),
    "ChatCompletion": _object(
        {**HEAD, "object": {"const": "chat.completion"}, **EXTRAS, "usage": USAGE,
         "choices": _choices(_object(
             {"index": INT, "finish_reason": FINISH, "logprobs": _nullable(CHAT_LOGPROBS),
              "message": _object(
                  {"role": {"const": "assistant"}, "content": _nullable(STRING),
                   "tool_calls": {"type": "array", "items": TOOL_CALL}},
                  ("role", "content"),
              )},
             ("index", "message", "finish_reason"),
         ))},
        ("id", "object", "created", "model", "choices", "usage", "timings", "speculation"),
    ),
    "ChatCompletionChunk": _object(
        {**HEAD, "object": {"const": "chat.completion.chunk"}, **EXTRAS, **EDGESPEC, "usage": _nullable(USAGE),
         "choices": _choices(_object(
             {"index": INT, "finish_reason": _nullable(FINISH), "logprobs": _nullable(CHAT_LOGPROBS),
              "delta": _object({"role": {"const": "assistant"}, "content": _nullable(STRING),
                                "tool_calls": {"type": "array", "items": TOOL_CALL}})},
             ("index", "delta", "finish_reason"),
         ))},
        ("id", "object", "created", "model", "choices"),
    ),
    "Completion": _object(
        {**HEAD, "object": {"const": "text_completion"}, **EXTRAS, **EDGESPEC, "usage": _nullable(USAGE),
         "choices": _choices(_object(
             {"index": INT, "text": STRING, "finish_reason": _nullable(FINISH), "logprobs": _nullable(TEXT_LOGPROBS)},
             ("index", "text", "finish_reason"),
         ))},
        ("id", "object", "created", "model", "choices"),
    ),
    "Model": _object(
        {"id": STRING, "object": {"const": "model"}, "created": INT, "owned_by": STRING,
         "meta": _object({"n_ctx": INT, "target": {"type": "object"}, "draft": _nullable({"type": "object"}),
                          "draft_len": {"type": ["integer", "string"]}, "lookup": {"type": "boolean"},
                          "lookup_available": {"type": "boolean"}})},
        ("id", "object", "created", "owned_by", "meta"),
    ),
    "ModelList": _object({"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}, ("data",)),
    "Health": _object({"status": {"const": "ok"}}, ("status",)),
}  # fmt: skip


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref("Error")}}}


def _responses(ok: dict[str, Any], *errors: int) -> dict[str, Any]:
    described = {
        400: "the request is wrong: the error names the field (param)",
        404: "no such model, route or file",
        413: "the body exceeds the server's limit",
        503: "loading, shutting down, or the queue is full (Retry-After)",
    }
    return {"200": ok, **{str(status): _error(described[status]) for status in errors}}


def _json_ok(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref(name)}}}


def _events(chunk: str) -> dict[str, Any]:
    """One server-sent event (Open API 3.1: a text/event-stream ``schema`` describes each event): its data is a
    chunk, an error that came after the stream began, or the last event's ``[DONE]``."""
    data = {
        "type": "string",
        "contentMediaType": JSON,
        "contentSchema": {"anyOf": [_ref(chunk), _ref("Error")]},
    }
    return _object({"data": {"anyOf": [{"const": "[DONE]"}, data]}}, ("data",))


def _generation(body: str, reply: str, chunk: str, summary: str) -> dict[str, Any]:
    ok = {
        "description": f"the {reply}, or with stream: true server-sent events, each data: a {chunk}, then [DONE]",
        "content": {JSON: {"schema": _ref(reply)}, "text/event-stream": {"schema": _events(chunk)}},
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {JSON: {"schema": _ref(body)}}},
            "responses": _responses(ok, 400, 404, 413, 503),
        }
    }


def _get(summary: str, ok: dict[str, Any], *errors: int, parameters: list | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": _responses(ok, *errors)}
    if parameters:
        operation["parameters"] = parameters
    return {"get": operation}


def asset_names() -> list[str]:
    """The files under ``/static/`` (any other name is a 404)."""
    return sorted(p.name for p in STATIC.iterdir() if p.suffix in ASSET_TYPES)


def _path_parameter(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": STRING}]


PATHS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": _generation(
        "ChatCompletionRequest", "ChatCompletion", "ChatCompletionChunk", "a chat reply (the model's chat template)"
    ),
    "/v1/completions": _generation("CompletionRequest", "Completion", "Completion", "a text completion"),
    "/v1/models": _get("the served model", _json_ok("ModelList", "the one model served"), 503),
    "/v1/models/{name}": _get(
        "the served model by its id", _json_ok("Model", "its card"), 404, 503, parameters=_path_parameter("name")
    ),
    "/health": _get("ready to serve (public)", _json_ok("Health", "the models are loaded"), 503),
    "/metrics": _get(
        "Prometheus counters", {"description": "the text format", "content": {"text/plain": {"schema": STRING}}}
    ),
    "/": _get("the chat page (public)", {"description": "the page", "content": {"text/html": {"schema": STRING}}}),
    "/favicon.ico": {"get": {"summary": "no icon (public)", "responses": {"204": {"description": "empty"}}}},
    "/static/{name}": _get(
        "the page's scripts and styles (public)",
        {"description": "the file", "content": {"text/javascript": {"schema": STRING}, "text/css": {"schema": STRING}}},
        404,
        parameters=[{"name": "name", "in": "path", "required": True, "schema": {"enum": asset_names()}}],
    ),
}
PUBLIC = frozenset({"/health", "/", "/favicon.ico", "/static/{name}"})


def request_schemas() -> dict[str, Any]:
    """The request bodies' JSON schemas and the definitions they share, keyed by component name."""
    components: dict[str, Any] = {}
    for model in (ChatCompletionRequest, CompletionRequest):
        schema = model.model_json_schema(ref_template=REF)
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
    return components


def openapi_document(*, key_required: bool) -> dict[str, Any]:
    """The document; with ``key_required`` every route but the public ones declares the key and its 401."""
    paths: dict[str, Any] = {}
    for path, operations in PATHS.items():
        paths[path] = {}
        for method, operation in operations.items():
            operation = {**operation, "responses": dict(operation["responses"])}
            if key_required and path not in PUBLIC:
                operation["security"] = [{"bearer": []}, {"apiKey": []}]
                operation["responses"]["401"] = _error("the API key is missing or wrong")
            paths[path][method] = operation
    components: dict[str, Any] = {"schemas": {**request_schemas(), **RESPONSES}}
    if key_required:
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "edgespec", "version": "1", "description": "OpenAI-compatible API over speculative decoding"},
        "paths": paths,
        "components": components,
    }
