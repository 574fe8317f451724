"""One thread for every model load and decode in the process.

llama.cpp's CPU backend runs a decode's graph on an OpenMP team of the thread that calls it (libgomp keeps a team
per calling thread; every operation ends at an ``omp barrier``). A decode called from a thread other than the one
that loaded and first decoded the model ran slower: measured on a 2-core CPU with the Qwen 1.5B, one-token decodes
took 31-33 ms on the loading thread and 38-44 ms on another, in the same process, alternating; with every load and
decode on one thread, whichever thread asked, 30-35 ms (the hand-over costs ~20-40 µs). The engine decodes on
whichever caller's thread steps (see :mod:`edgespec.engine`), the server on its worker, a desktop app on its own
threads: each of them would have paid it. llama.cpp's own server loads and decodes on one thread too.

So :class:`~edgespec.models.backend.Model` loads and decodes through :func:`on_llama_thread` (its ``__init__`` and
``decode_batch`` are :func:`runs_on_llama_thread`): from the llama thread itself the call runs inline, from any other
it runs there while the caller waits.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from functools import wraps
from typing import TypeVar

T = TypeVar("T")

_Call = tuple[Future, Callable[..., object], tuple, dict]

_lock = threading.Lock()
_calls: queue.SimpleQueue[_Call] | None = None  # the llama thread's work, once it has started
_ident: int | None = None  # the llama thread's
_running: set[Future] = set()  # the calls handed to it and not yet answered


def _serve(calls: queue.SimpleQueue[_Call]) -> None:
    while True:
        future, fn, args, kwargs = calls.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001  # raised in the caller's thread
            if not future.done():  # (a call abandoned while it ran is answered already)
                future.set_exception(error)
        else:
            if not future.done():
                future.set_result(result)


def _queue() -> queue.SimpleQueue[_Call]:
    global _calls, _ident
    with _lock:
        if _calls is None:
            _calls = queue.SimpleQueue()
            # A daemon: a thread stuck for good in llama.cpp (see abandon) must not keep the process from exiting.
            thread = threading.Thread(target=_serve, args=(_calls,), name="llama", daemon=True)
            thread.start()
            _ident = thread.ident
        return _calls


def on_llama_thread(fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` run on the llama thread; its result, or its exception raised here."""
    if threading.get_ident() == _ident:
        return fn(*args, **kwargs)
    future: Future[T] = Future()
    calls = _queue()
    with _lock:
        _running.add(future)
    calls.put((future, fn, args, kwargs))
    try:
        return future.result()
    except BaseException:
        # Interrupted while waiting (Ctrl+C): the call goes on over there; let it end before the caller touches
        # the model again (a roll-back of its KV under a running decode).
        wait([future])
        raise
    finally:
        with _lock:
            _running.discard(future)


def abandon(error: BaseException) -> None:
    """The llama thread is stuck for good (in a decode waiting on an RPC server that is gone, see
    :mod:`edgespec.models.rpc`): its callers get ``error``, and later calls run on a new llama thread."""
    global _calls, _ident
    with _lock:
        stuck, _calls, _ident = list(_running), None, None
    for future in stuck:
        if not future.done():
            try:
                future.set_exception(error)
            except Exception:  # noqa: BLE001  # answered in the meantime
                pass


def runs_on_llama_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` made to run through :func:`on_llama_thread` whoever calls it."""

    @wraps(fn)
    def on_thread(*args: object, **kwargs: object) -> T:
        return on_llama_thread(fn, *args, **kwargs)

    return on_thread


def _forget_in_child() -> None:
    """A forked child has no llama thread (only the forking thread survives a fork): it starts its own."""
    global _calls, _ident, _lock, _running
    _calls, _ident, _lock, _running = None, None, threading.Lock(), set()


os.register_at_fork(after_in_child=_forget_in_child)
