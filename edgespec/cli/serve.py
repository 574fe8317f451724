"""``edgespec serve``: the loaded models behind an OpenAI-compatible HTTP API (:mod:`edgespec.server`)."""

from __future__ import annotations

import socket
from typing import Any

import click

from edgespec.cli.common import fail, load_runtime, model_options, pick_models, user_errors
from edgespec.drafters.suffix_cache import DEFAULT_MAX_TOKENS
from edgespec.server.settings import ServerSettings, is_loopback


@click.command()
@model_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--alias", help="The model id clients see and send (default: the target's name).")
@click.option(
    "--api-key",
    "api_keys",
    envvar="EDGESPEC_API_KEY",
    multiple=True,
    metavar="KEY",
    help="Require this key (Authorization: Bearer KEY, or X-Api-Key) on every route but /health; repeatable, "
    "each key as good as the others (and, with --suffix-cache key, a scope of its own). Also read from "
    "$EDGESPEC_API_KEY (keys separated by spaces), which keeps them out of the process list.",
)
@click.option(
    "--suffix-cache",
    type=click.Choice(["key", "global", "off"]),
    help="Draft from earlier replies too: 'key', only from replies to requests with the same API key (so that a "
    "reply's speed reveals nothing of another client's); 'global', from every earlier reply; 'off'. "
    "Default: key with --api-key, global without.",
)
@click.option(
    "--suffix-cache-tokens",
    default=DEFAULT_MAX_TOKENS,
    show_default=True,
    type=click.IntRange(min=1),
    help="The most tokens of earlier replies kept (the oldest replies go first; ~140 bytes a token at most).",
)
@click.option(
    "--suffix-cache-path",
    type=click.Path(dir_okay=False),
    help="Keep the suffix cache in this file: read at start, written at shutdown, so that a restarted server "
    "starts warm (a file of another model's vocabulary, or a damaged one, is reported and replaced).",
)
@click.option(
    "--parallel",
    default=4,
    show_default=True,
    type=click.IntRange(1, 16),
    help="Requests generated at once, their rounds sharing each decode (each with --n-ctx of its own context; "
    "fewer when their KV cache does not fit the free memory, said at start). Speculation backs off as they fill "
    "the batch.",
)
@click.option(
    "--max-queue",
    default=8,
    show_default=True,
    type=click.IntRange(min=0),
    help="Requests that may wait for a free slot beyond the --parallel running ones; more get a 503 with "
    "Retry-After.",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Let browser pages from ORIGIN call the API (repeatable; '*' for any). Off by default.",
)
def serve(
    host: str,
    port: int,
    alias: str | None,
    api_keys: tuple[str, ...],
    suffix_cache: str | None,
    suffix_cache_tokens: int,
    suffix_cache_path: str | None,
    parallel: int,
    max_queue: int,
    cors_origins,
    **opts: Any,
):
    """Serve the models over an OpenAI-compatible HTTP API (chat and text completions, streaming).

    Up to --parallel requests run at once, their rounds verified in the same target decode, each with its own
    speculation (which backs off where a fuller batch leaves no spare compute); up to --max-queue more wait in
    order, and a new request takes the slot whose cache shares the longest prefix with its prompt. Responses carry
    llama-server's `timings` and a `speculation` report (drafters used, acceptance, and why speculation did not
    run when it did not). Sampling defaults are llama.cpp's; a request may set draft_len and lookup (the openai
    client's extra_body). Requests also draft from earlier replies (--suffix-cache): only from replies to the same
    API key when keys are required, from every earlier reply when none are.

    \b
    edgespec serve --pair qwen2.5-coder --port 8080
    curl http://127.0.0.1:8080/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
    """
    if any(not key.strip() for key in api_keys):
        fail("--api-key is empty: give a key, or leave the option out to serve without one")
    if not is_loopback(host) and not api_keys:
        fail(f"refusing to listen on {host} without an API key: pass --api-key (or set EDGESPEC_API_KEY)")
    if suffix_cache == "key" and not api_keys:
        fail("--suffix-cache key scopes earlier replies by API key: pass --api-key, or choose global or off")
    with user_errors():
        pick_models(opts["pair"], opts["target"], opts["draft"])  # a bad --pair fails now, not on the load thread
    try:
        listener = _listen(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return

    import uvicorn

    from edgespec.server import create_app

    settings = ServerSettings(
        alias=alias, api_keys=api_keys, max_queue=max_queue, cors_origins=tuple(cors_origins), suffix_cache=suffix_cache
    )
    cache = {
        "suffix_cache": settings.cache_mode,
        "suffix_cache_tokens": suffix_cache_tokens,
        "suffix_cache_path": suffix_cache_path,
    }
    app = create_app(lambda: load_runtime(opts, parallel=parallel, **cache), settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=5))
    worker = app.state.worker
    worker.on_load_failed = lambda _message: setattr(server, "should_exit", True)
    bound_host, bound_port = listener.getsockname()[:2]
    click.echo(f"edgespec: loading the models; the API will be at http://{bound_host}:{bound_port}/v1", err=True)
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:
        pass  # Ctrl+C is how a server stops; uvicorn has shut down cleanly and re-raised it
    if worker.load_error is not None:
        fail(worker.load_error)


def _listen(host: str, port: int) -> socket.socket:
    """A bound socket, so that a port in use is an ``error:`` line before any model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    return sock
