"""The routes: health, models, metrics, chat and text completions. Each is a few lines over the other modules."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware

from edgespec.api import GLOBAL_SCOPE
from edgespec.server.delivery import result_unless_disconnected, stream_response
from edgespec.server.errors import ApiError, from_validation_error, install_error_handlers
from edgespec.server.metrics import CONTENT_TYPE, ServerMetrics
from edgespec.server.middleware import KEY_SCOPE, ApiKeyMiddleware, BodyLimitMiddleware
from edgespec.server.openapi import openapi_document
from edgespec.server.page import install_page
from edgespec.server.prepare import (
    chat_messages,
    check_constraint,
    check_model,
    completion_prompt,
    generation_request,
    prompt_tokens,
    refuse_unsupported,
    tool_use,
)
from edgespec.server.responses import ResponseShape, speculation, timings
from edgespec.server.schemas import ChatCompletionRequest, CompletionRequest
from edgespec.server.settings import ServerSettings
from edgespec.server.text_fields import check_text_fields
from edgespec.server.worker import GenerationWorker, Loaded, Outcome

if TYPE_CHECKING:
    from edgespec.api import Runtime


def create_app(load: Callable[[], Runtime], settings: ServerSettings | None = None) -> FastAPI:
    """The server's ASGI app. ``load`` runs on the generation thread when the app starts (``/health`` answers
    503 until it returns); the runtime it returns is the worker's until the app stops, which closes it."""
    settings = settings or ServerSettings()
    worker = GenerationWorker(load, max_queue=settings.max_queue)
    metrics = ServerMetrics(worker)
    worker.observers.append(metrics.record)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.stop)

    app = FastAPI(title="edgespec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker, app.state.metrics, app.state.settings = worker, metrics, settings
    install_error_handlers(app)
    # Added innermost first: CORS outermost (a 401 must carry its headers too), then the key, then the cap.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=settings.keys)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Api-Key"],
        )

    def ready() -> Loaded:
        worker.check_ready()  # a 503 that says why while loading, after a failed load, or shutting down
        assert worker.loaded is not None
        return worker.loaded

    def cache_scope(request: Request) -> Hashable | None:
        """The suffix cache's scope of a request (see ServerSettings.suffix_cache)."""
        mode = settings.cache_mode
        if mode == "key":
            return request.scope.get(KEY_SCOPE)
        return GLOBAL_SCOPE if mode == "global" else None

    def model_id(loaded: Loaded) -> str:
        return settings.alias or loaded.runtime.target.name

    def model_card(loaded: Loaded) -> dict:
        runtime = loaded.runtime

        def describe(info) -> dict | None:
            if info is None:
                return None
            return {"name": info.name, "description": info.description, "n_ctx": info.n_ctx, "on_gpu": info.on_gpu}

        return {
            "id": model_id(loaded),
            "object": "model",
            "created": loaded.created,
            "owned_by": "edgespec",
            "meta": {
                "n_ctx": runtime.context_size,
                "target": describe(runtime.target),
                "draft": describe(runtime.draft),
                "draft_len": loaded.draft_len,
                "lookup": loaded.lookup,
                "lookup_available": loaded.lookup_available,
            },
        }

    install_page(app, key_required=bool(settings.keys))
    document = openapi_document(key_required=bool(settings.keys))

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict:
        return document

    @app.get("/health")
    async def health() -> dict:
        ready()
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card(ready())]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str) -> dict:
        loaded = ready()
        check_model(name, [model_id(loaded), loaded.runtime.target.name])
        return model_card(loaded)

    async def generate(request: Request, kind: Literal["chat", "text"]) -> Response:
        schema = ChatCompletionRequest if kind == "chat" else CompletionRequest
        body = await parse_body(request, schema)
        refuse_unsupported(body)
        loaded = ready()
        served = model_id(loaded)
        check_model(body.model, [served, loaded.runtime.target.name])
        is_chat = isinstance(body, ChatCompletionRequest)
        tools = tool_use(body, loaded.runtime.engine.target.chat_template) if is_chat else None
        source = chat_messages(body) if is_chat else completion_prompt(body)
        prompt = await run_in_threadpool(prompt_tokens, loaded.runtime, source, tools)
        generation = generation_request(loaded, body, prompt, tools, cache_scope(request))
        await run_in_threadpool(check_constraint, loaded.runtime, generation)
        job = worker.submit(generation)
        shape = ResponseShape(kind, served, piece=loaded.runtime.engine.target.piece)
        draft_model = loaded.runtime.draft.name if loaded.runtime.draft is not None else None

        def extras(outcome: Outcome) -> dict:
            return {
                "timings": timings(outcome.finished.stats),
                "speculation": speculation(outcome, generation, draft_model),
            }

        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return stream_response(worker, job, shape, include_usage=include_usage, extras=extras)
        outcome = await result_unless_disconnected(worker, job, request.receive)
        if outcome is None:
            return Response(status_code=499)  # nginx's "client closed request": only the access log sees it
        wants_logprobs = generation.params.logprobs is not None
        return JSONResponse(
            shape.complete(
                outcome,
                extras(outcome),
                logprobs=wants_logprobs,
                echo=generation.echo,
                prompt=generation.prompt,
                tools=generation.tools,
            )
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "text")

    return app


async def parse_body(request: Request, schema: type[BaseModel]):
    """The JSON body validated against ``schema``, whatever Content-Type was sent (curl -d sends a form type).

    Before any field is read, every string in it is checked for lone surrogates (:mod:`.text_fields`)."""
    data = parse_json(await request.body())
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_value")
    check_text_fields(data)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def parse_json(raw: bytes) -> object:
    """Strict JSON: ``NaN``, ``Infinity`` and numbers too large for a float (``1e999``) are refused, as JSON has
    no such values; nesting too deep for the parser is a 400 too, not a RecursionError."""
    try:
        return json.loads(raw, parse_constant=_not_json, parse_float=_finite_float)
    except (UnicodeDecodeError, json.JSONDecodeError, _NotJson) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="json_invalid") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="json_invalid") from None


class _NotJson(ValueError):
    pass


def _not_json(name: str) -> float:
    raise _NotJson(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"the number {text[:40]} is out of range")
    return value
