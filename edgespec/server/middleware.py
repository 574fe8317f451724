"""Pure ASGI middleware: the API key and the request body cap.

Not Starlette's ``BaseHTTPMiddleware``: it runs the app in a task of its own and hides ``http.disconnect`` from
it, which breaks the disconnect detection that cancels abandoned requests.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgespec.server.errors import error_body
from edgespec.server.page import is_public
from edgespec.server.settings import key_identity

PUBLIC_PATHS = frozenset({"/health"})  # for load balancers and supervisors, as llama-server has it
KEY_SCOPE = "edgespec.api_key"  # the ASGI scope's entry that names the key a request was let in with (key_identity)


async def send_error(
    send: Send, status: int, message: str, *, code: str, headers: list[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps(error_body(status, message, code=code)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """Every route but :data:`PUBLIC_PATHS` and the chat page (:func:`~edgespec.server.page.is_public`) needs one of
    the keys, as ``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``; the request's ASGI scope then names which
    (:data:`KEY_SCOPE`: its :func:`~edgespec.server.settings.key_identity`).

    The comparison takes the same time whatever the guess, so a key cannot be found a byte at a time.
    """

    def __init__(self, app: ASGIApp, api_keys: Sequence[str]) -> None:
        self.app = app
        self._keys = [key.encode() for key in api_keys]
        self._identities = [key_identity(key) for key in self._keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = self._given_keys(scope)
        if not given:
            await send_error(
                send, 401, "an API key is required: send 'Authorization: Bearer KEY'", code="missing_api_key"
            )
            return
        # Every candidate is compared with every key (no early exit), each in constant time.
        matches = [i for i, key in enumerate(self._keys) if any([hmac.compare_digest(g, key) for g in given])]
        if not matches:
            await send_error(send, 401, "the API key is wrong", code="invalid_api_key")
            return
        scope[KEY_SCOPE] = self._identities[matches[0]]
        await self.app(scope, receive, send)

    @staticmethod
    def _given_keys(scope: Scope) -> list[bytes]:
        """The keys a request offers: the Bearer token and X-Api-Key (a client may send both, one of them a dummy,
        as the openai client does when told to send X-Api-Key)."""
        keys = []
        for name, value in scope["headers"]:  # names arrive lower-cased
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                keys.append(token.strip() if scheme.lower() == b"bearer" else value.strip())
            elif name == b"x-api-key":
                keys.append(value.strip())
        return keys


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with a 413: at once when Content-Length says so, else as soon
    as the bytes received pass it (a chunked upload has no length up front)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"the request body exceeds the server's limit of {self.max_bytes} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, message, code="body_too_large", headers=[(b"connection", b"close")])
            return

        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return msg

        async def tracking_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if started:
                raise
            await send_error(send, 413, message, code="body_too_large", headers=[(b"connection", b"close")])


class _BodyTooLarge(Exception):
    pass
