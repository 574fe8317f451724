"""The chat page at ``/``: static files shipped in the package (``static/``), no build step, nothing fetched from
elsewhere at run time.

The page and its assets are public (a browser cannot send an API key when it navigates); everything they call is
not. The page learns from a ``<meta>`` tag whether the server wants a key, so it asks for one before its first
request instead of provoking a 401. A strict Content-Security-Policy allows scripts, styles and requests from
this origin only: no inline script, and text from the model is escaped before it becomes HTML.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

from edgespec.server.errors import ApiError

STATIC = Path(__file__).parent / "static"
ASSET_PREFIX = "/static/"
ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def is_public(path: str) -> bool:
    """The page and its assets: served without the API key."""
    return path in ("/", "/favicon.ico") or path.startswith(ASSET_PREFIX)


def install_page(app: FastAPI, *, key_required: bool) -> None:
    """``GET /`` and ``GET /static/NAME``, read once from the package; ``/favicon.ico`` is empty (a browser asks
    for it on its own, and a 401 there would be an error in the console)."""
    index = (STATIC / "index.html").read_text(encoding="utf-8")
    index = index.replace("{{key}}", "required" if key_required else "none").encode()
    assets = {p.name: (p.read_bytes(), ASSET_TYPES[p.suffix]) for p in STATIC.iterdir() if p.suffix in ASSET_TYPES}

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return Response(index, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in assets:
            raise ApiError(404, f"no such file: {ASSET_PREFIX}{name}", code="not_found")
        body, media_type = assets[name]
        return Response(body, media_type=media_type, headers=HEADERS)
