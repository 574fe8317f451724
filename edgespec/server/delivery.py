"""Getting a job's result to its client, and noticing when the client is gone.

A streamed response is an :class:`~sse_starlette.EventSourceResponse`: it watches for ``http.disconnect`` beside
the stream from the first byte, so a client that leaves while its request still waits is noticed too. A whole
response waits for the job's outcome and for ``http.disconnect`` at once. Either way a client that leaves
cancels its job (:meth:`GenerationWorker.cancel`): a waiting job leaves the queue, a running one stops after
its current round.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from sse_starlette import EventSourceResponse
from starlette.types import Message, Receive

from edgespec.errors import EdgespecError
from edgespec.server.errors import ApiError, from_edgespec_error
from edgespec.server.extension import RoundLog
from edgespec.server.responses import FINISH_REASONS, ResponseShape
from edgespec.server.worker import GenerationWorker, Job, Outcome
from edgespec.tools import CallStream

Extras = Callable[[Outcome], dict]  # the ``timings`` and ``speculation`` of an outcome


def stream_response(
    worker: GenerationWorker, job: Job, shape: ResponseShape, *, include_usage: bool, extras: Extras
) -> EventSourceResponse:
    async def on_disconnect(_message: Message) -> None:
        worker.cancel(job)

    return EventSourceResponse(
        _frames(worker, job, shape, include_usage, extras),
        sep="\n",  # "data: ...\n\n", as OpenAI and llama-server send it
        client_close_handler_callable=on_disconnect,
    )


async def _frames(
    worker: GenerationWorker, job: Job, shape: ResponseShape, include_usage: bool, extras: Extras
) -> AsyncIterator[str]:
    """``data:`` payloads: text chunks, the finishing chunk, the usage chunk if asked for, ``[DONE]``.

    ``timings`` and ``speculation`` ride the last chunk before ``[DONE]``. Every chunk also carries an ``edgespec``
    field (:mod:`.extension`: the text's origins, the rounds). An error after the stream began is a frame of its
    own (``{"error": ...}``), then ``[DONE]``.
    """
    first = True
    log = RoundLog()
    offset = 0  # characters of the output before the chunk (the completions' text_offset)
    request = job.request
    wants_logprobs = request.params.logprobs is not None
    # With tools, the start of the reply is held while it may be a call: calls go out whole, as one delta.
    calls = CallStream(request.tools.format, request.tools.tools) if request.tools is not None else None
    try:
        if request.echo is not None:  # the prompt first, as a chunk of its own (echo with logprobs is not streamed)
            piece = shape.chunk(request.echo, first=True)
            if include_usage:
                piece["usage"] = None
            yield _json(piece)
            first = False
            offset = len(request.echo)
        async for item in job.events():
            if isinstance(item, Outcome):
                reason = FINISH_REASONS[item.finished.finish_reason]
                if calls is not None:
                    text, made = calls.finish()
                    if text:
                        yield _json(_usage_slot(shape.chunk(text, first=first), include_usage))
                        first = False
                    if made:
                        yield _json(_usage_slot(_with_role(shape.tool_calls_chunk(made), first), include_usage))
                        first, reason = False, ("tool_calls" if reason == "stop" else reason)
                last = shape.chunk(None, first=first, finish_reason=reason)
                if include_usage:
                    yield _json({**last, "usage": None})
                    last = shape.usage_chunk(item)
                yield _json({**last, **extras(item), "edgespec": log.finish(item.finished.stats)})
                continue
            log.observe(item)
            text = calls.feed(item.text) if calls is not None else item.text
            if text or item.logprobs:  # a chunk whose text is held back still carries its tokens' logprobs
                piece = shape.chunk(
                    text or None, first=first, logprobs=item.logprobs if wants_logprobs else None, offset=offset
                )
                if wants_logprobs:
                    offset += sum(len(shape.token_text(lp.token)) for lp in item.logprobs)
                if include_usage:
                    piece["usage"] = None
                yield _json({**piece, "edgespec": log.frame(item)})
                first = False
    except Exception as exc:  # noqa: BLE001 - reported to the client in the stream
        yield _json(_as_api_error(exc).body())
    finally:
        worker.cancel(job)  # the client left mid-stream (or the stream ended: then this does nothing)
    yield "[DONE]"


async def result_unless_disconnected(worker: GenerationWorker, job: Job, receive: Receive) -> Outcome | None:
    """The job's outcome, or None once the client disconnected (the job is then cancelled)."""
    result = asyncio.ensure_future(job.result())
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        worker.cancel(job)
        raise
    finally:
        for task in (result, gone):
            task.cancel()
    if result in done:
        return result.result()
    worker.cancel(job)
    return None


async def _disconnected(receive: Receive) -> None:
    # The body was read before the job was queued, so the next message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


def _as_api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EdgespecError):
        return from_edgespec_error(exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")


def _usage_slot(piece: dict, include_usage: bool) -> dict:
    return {**piece, "usage": None} if include_usage else piece


def _with_role(piece: dict, first: bool) -> dict:
    if first:
        piece["choices"][0]["delta"] = {"role": "assistant", **piece["choices"][0]["delta"]}
    return piece


def _json(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
