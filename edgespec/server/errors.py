"""Every error leaves the server as OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``.

:class:`ApiError` is what the server's own code raises; :func:`install_error_handlers` maps everything else
(FastAPI's validation errors, Starlette's 404/405, edgespec's errors, anything unexpected) onto the same body,
so no client ever sees FastAPI's 422 shape or a bare traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError, ModelError
from edgespec.server.settings import RETRY_AFTER_SECONDS

log = logging.getLogger("edgespec.server")

# The error "type" per status, as OpenAI and llama-server name them.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An error with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_edgespec_error(exc: EdgespecError) -> ApiError:
    """edgespec's own errors: a bad value or a request that does not fit is the caller's to fix (400), a failing model
    is the server's (500), a busy engine is worth a retry (503)."""
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), param="max_tokens", code="context_length_exceeded")
    if isinstance(exc, ModelError):  # the model failed (a decode, damaged weights): not the client's input
        return ApiError(500, str(exc), code="model_error")
    if not isinstance(exc, InvalidParameterError):  # the engine busy, or another state the client cannot fix
        return ApiError(503, str(exc), code="unavailable", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    return ApiError(400, str(exc), code="invalid_value")


def from_validation_error(exc: ValidationError | RequestValidationError) -> ApiError:
    """Pydantic's list of problems as one 400: the first problem's field is the ``param``."""
    problems = exc.errors()
    first = problems[0] if problems else {}
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return ApiError(400, f"the request body is not valid JSON: {detail}".rstrip(": "), code="json_invalid")
    messages = []
    for problem in problems[:3]:
        where = _field_path(problem.get("loc", ()))
        messages.append(f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg", "invalid"))
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    param = _field_path(first.get("loc", ())) or None
    return ApiError(400, "; ".join(messages) + more, param=param, code="invalid_value")


def _field_path(loc: tuple) -> str:
    """``("body", "messages", 0, "content")`` → ``messages[0].content``; pydantic's union branch tags dropped."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and (
            part in ("str", "int", "float", "bool", "list", "dict") or "[" in part or part.startswith("constrained-")
        ):
            continue  # "list[str]", "str", "constrained-str": which branch of a union failed, not a field
        else:
            path += f".{part}" if path else str(part)
    return path


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_error(exc).response()

    @app.exception_handler(EdgespecError)
    async def _edgespec(_request: Request, exc: EdgespecError) -> JSONResponse:
        return from_edgespec_error(exc).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            error = ApiError(404, f"no route {request.method} {request.url.path}", code="not_found")
        elif exc.status_code == 405:
            error = ApiError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
        else:
            error = ApiError(exc.status_code, str(exc.detail))
        error.headers.update(exc.headers or {})
        return error.response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's outermost middleware sends this, then re-raises so the server logs the traceback.
        log.error("%s %s failed: %r", request.method, request.url.path, exc)
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error").response()
