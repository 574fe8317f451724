"""The one thread that owns the :class:`~edgespec.api.Runtime`: it loads the models, then runs requests one at a
time, first come first served.

The engine serves one request at a time, and llama.cpp's decodes block, so neither may happen on the event loop.
The loop hands a :class:`Job` over with :meth:`GenerationWorker.submit` and reads its events as they come
(:meth:`Job.events`); a client that goes away calls :meth:`GenerationWorker.cancel`, which takes a waiting job
out of the queue or stops a running one after its current round.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING

from edgespec.errors import EdgespecError
from edgespec.events import Chunk, Event, Finished
from edgespec.server.errors import ApiError
from edgespec.server.request import GenerationRequest
from edgespec.server.settings import RETRY_AFTER_SECONDS

if TYPE_CHECKING:
    from edgespec.api import Runtime

log = logging.getLogger("edgespec.server")


class Status(Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Loaded:
    """The loaded runtime and the server's defaults for what a request may change."""

    runtime: Runtime
    draft_len: int | str
    lookup: bool
    lookup_available: bool  # loaded with a lookup drafter (else no request can turn lookup on)
    created: int  # Unix time the models were ready


@dataclass(frozen=True)
class Outcome:
    """How a request ended, with what only a watcher of every round knows."""

    finished: Finished
    drafters: tuple[str, ...]  # the drafters that drafted in at least one round
    draft_rounds: int  # rounds that verified at least one drafted token
    others: tuple[Finished, ...] = ()  # with n > 1: the other choices, in order

    @property
    def choices(self) -> tuple[Finished, ...]:
        return (self.finished, *self.others)


class Job:
    """One request on its way through the queue: the worker thread writes its events, the event loop reads them."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.cancel_event = threading.Event()
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        self.withdrawn = False  # cancelled while waiting: it never ran
        self._loop = loop
        self._events: asyncio.Queue[Chunk | Outcome | BaseException] = asyncio.Queue()

    @property
    def cancelled(self) -> bool:
        """Stopped because its client went away (not a request that had finished anyway)."""
        return self.withdrawn or (self.outcome is not None and self.outcome.finished.finish_reason == "cancelled")

    def put(self, item: Chunk | Outcome | BaseException) -> None:
        """Hand an event to the event loop (from any thread); nothing happens once the loop is closed."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:
            pass

    async def events(self) -> AsyncIterator[Chunk | Outcome]:
        """The chunks as rounds commit them, then the :class:`Outcome`. An error of the run is raised here."""
        while True:
            item = await self._events.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, Outcome):
                return

    async def result(self) -> Outcome:
        """Wait for the end, skipping the chunks."""
        async for item in self.events():
            if isinstance(item, Outcome):
                return item
        raise RuntimeError("a job's events ended without an outcome")


Observer = Callable[[Job], None]  # told about every job that leaves the server: finished, failed or cancelled


class GenerationWorker:
    """Loads the models on its thread, then runs :class:`Job` s from a FIFO queue of at most ``max_queue``, as many
    at once as the runtime was loaded for (``parallel``): a thread per running job, all stepping the same engine,
    so their rounds share the target's decodes."""

    def __init__(self, load: Callable[[], Runtime], *, max_queue: int) -> None:
        self._load = load
        self.max_queue = max_queue
        self.parallel = 1  # known once the runtime is loaded
        self.status = Status.LOADING
        self.load_error: str | None = None
        self.loaded: Loaded | None = None
        self.observers: list[Observer] = []
        self.on_load_failed: Callable[[str], None] | None = None
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="edgespec-generation", daemon=True)

    # ----- what the event loop calls -------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def processing(self) -> int:
        return len(self._running)

    def submit(self, request: GenerationRequest) -> Job:
        """Queue ``request`` behind the running ones; a 503 when the models are not ready or the queue is full."""
        job = Job(request, asyncio.get_running_loop())
        with self._cond:
            self.check_ready()
            if len(self._waiting) + self.processing >= self.parallel + self.max_queue:
                raise ApiError(
                    503,
                    f"the server is busy: {self.processing} request(s) running (--parallel {self.parallel}), "
                    f"{len(self._waiting)} waiting (--max-queue {self.max_queue}); retry later",
                    code="queue_full",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
                )
            self._waiting.append(job)
            self._cond.notify_all()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it still waits, else stop it after its current round."""
        with self._cond:
            withdrawn = job in self._waiting
            if withdrawn:
                self._waiting.remove(job)
                job.withdrawn = True
            else:
                job.cancel_event.set()  # no effect on a job that has finished
        if withdrawn:
            self._notify(job)

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse what waits, stop what runs, let the thread close the models."""
        with self._cond:
            self._stopping = True
            pending = list(self._waiting)
            self._waiting.clear()
            for job in self._running:
                job.cancel_event.set()
            self._cond.notify_all()
        for job in pending:
            job.put(ApiError(503, "the server is shutting down", code="shutting_down"))
        self._thread.join(timeout)

    def check_ready(self) -> None:
        """Raise the 503 that says why no request can be taken now (loading, failed, stopping)."""
        if self._stopping or self.status is Status.STOPPED:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if self.status is Status.LOADING:
            raise ApiError(
                503,
                "the model is loading; retry shortly",
                code="loading",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if self.status is Status.FAILED:
            raise ApiError(503, f"the model failed to load: {self.load_error}", code="load_failed")

    # ----- the thread ----------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            runtime = self._load()
        except Exception as exc:  # noqa: BLE001 - whatever stopped the load is reported, the server says so
            message = str(exc) if isinstance(exc, EdgespecError) else f"{type(exc).__name__}: {exc}"
            with self._cond:
                self.status, self.load_error = Status.FAILED, message
            log.error("loading failed: %s", message)
            if self.on_load_failed is not None:
                self.on_load_failed(message)
            return
        try:
            drafters = runtime.engine.drafters
            self.loaded = Loaded(runtime, runtime.draft_len, runtime.lookup, "lookup" in drafters, int(time.time()))
            self.parallel = runtime.engine.parallel
            runners = [
                threading.Thread(target=self._run_jobs, name=f"edgespec-generation-{i}", daemon=True)
                for i in range(1, self.parallel)
            ]
            with self._cond:
                if not self._stopping:
                    self.status = Status.READY
            for runner in runners:
                runner.start()
            self._run_jobs()
            for runner in runners:
                runner.join()
        finally:
            self.status = Status.STOPPED
            runtime.close()

    def _run_jobs(self) -> None:
        while (job := self._next()) is not None:
            self._execute(job)

    def _next(self) -> Job | None:
        with self._cond:
            while not self._waiting and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            job = self._waiting.popleft()
            self._running.add(job)
            return job

    def _execute(self, job: Job) -> None:
        assert self.loaded is not None
        runtime, request = self.loaded.runtime, job.request
        drafters: set[str] = set()
        draft_rounds = drafted = 0
        try:
            if request.n > 1:
                job.outcome = self._choices(runtime, job)
                job.put(job.outcome)
                return
            # Per-request settings, for this request only (others run beside it).
            events = runtime.stream(
                request.prompt, request.params, cancel=job.cancel_event, draft_len=request.draft_len,
                lookup=request.lookup, cache_prompt=request.cache_prompt, cache_scope=request.cache_scope,
            )  # fmt: skip
            for event in events:
                if isinstance(event, Finished):
                    job.outcome = Outcome(event, tuple(sorted(drafters)), draft_rounds)
                    job.put(job.outcome)
                    continue
                # One chunk per round: a round that raised the drafted count drafted, with stats.drafter.
                if event.stats.drafted > drafted:
                    drafters.add(event.stats.drafter)
                    draft_rounds += 1
                    drafted = event.stats.drafted
                job.put(event)
        except Exception as exc:  # noqa: BLE001 - the request fails, the server goes on
            if not isinstance(exc, EdgespecError):
                log.exception("a request failed")
            job.error = exc
            job.put(exc)
        finally:
            with self._cond:
                self._running.discard(job)
            self._notify(job)

    @staticmethod
    def _choices(runtime: Runtime, job: Job) -> Outcome:
        """``n`` choices for one prompt, each its own request with its own seed (the seed + i when one was sent),
        all stepped together from this thread: after the first has prefilled the prompt, the others copy its KV
        (a non-streamed response: their chunks are not forwarded)."""
        request = job.request
        params = request.params
        todo = list(range(request.n))[::-1]
        running: dict[int, Iterator[Event]] = {}
        results: list[Finished | None] = [None] * request.n
        drafters: set[str] = set()
        draft_rounds = 0
        try:
            while todo or running:
                # As many at once as there are lanes: one thread cannot wait for a lane it holds itself.
                while todo and len(running) < runtime.engine.parallel:
                    i = todo.pop()
                    running[i] = runtime.stream(
                        request.prompt, replace(params, seed=None if params.seed is None else params.seed + i),
                        cancel=job.cancel_event, draft_len=request.draft_len, lookup=request.lookup,
                        cache_prompt=request.cache_prompt, cache_scope=request.cache_scope,
                    )  # fmt: skip
                for i, events in list(running.items()):
                    event = next(events)
                    if isinstance(event, Finished):
                        results[i] = event
                        del running[i]
                    elif event.stats.draft_len and event.stats.rounds:
                        drafters.add(event.stats.drafter)
                        draft_rounds += 1
        finally:
            for events in running.values():
                events.close()  # type: ignore[attr-defined]
        done = [r for r in results if r is not None]
        return Outcome(done[0], tuple(sorted(drafters)), draft_rounds, tuple(done[1:]))

    def _notify(self, job: Job) -> None:
        for observer in self.observers:
            try:
                observer(job)
            except Exception:  # noqa: BLE001 - an observer's bug must not stop the worker
                log.exception("a job observer failed")
