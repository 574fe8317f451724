"""``edgespec serve``: an OpenAI-compatible HTTP server, a thin client of :mod:`edgespec.api`.

One loaded :class:`~edgespec.api.Runtime`, owned by one generation worker thread (:mod:`.worker`); requests wait
in FIFO order behind the running one. The asyncio event loop parses, validates and streams, and never waits on
the model. Modules: :mod:`.settings` what the command line decides, :mod:`.schemas` the request bodies,
:mod:`.text_fields` the check of every text a body holds (lone surrogates), :mod:`.openapi` the published
schema at ``/openapi.json``, :mod:`.prepare` a request turned into engine input (:mod:`.request`, what the worker
runs), :mod:`.worker` the generation thread and its queue,
:mod:`.responses` OpenAI's response shapes (plus ``timings`` and ``speculation``), :mod:`.delivery` streaming
and waiting with disconnect detection, :mod:`.extension` the chunks' ``edgespec`` field (each piece of text's
origin, each round), :mod:`.errors` the error body, :mod:`.middleware` the API key and body cap, :mod:`.metrics`
Prometheus counters, :mod:`.page` the chat page at ``/`` (``static/``), :mod:`.app` the routes.
"""

from edgespec.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str):
    # FastAPI and uvicorn load only when a server is made, not with every `edgespec` command.
    if name == "create_app":
        from edgespec.server.app import create_app

        return create_app
    raise AttributeError(name)
