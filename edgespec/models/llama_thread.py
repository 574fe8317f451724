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
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import wraps
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_ident: int | None = None  # the llama thread's, once it has started


def _started() -> None:
    global _ident
    _ident = threading.get_ident()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama", initializer=_started)
        return _pool


def on_llama_thread(fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` run on the llama thread; its result, or its exception raised here."""
    if threading.get_ident() == _ident:
        return fn(*args, **kwargs)
    future: Future[T] = _executor().submit(fn, *args, **kwargs)
    try:
        return future.result()
    except BaseException:
        # Interrupted while waiting (Ctrl+C): the call goes on over there; let it end before the caller touches
        # the model again (a roll-back of its KV under a running decode).
        wait([future])
        raise


def runs_on_llama_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` made to run through :func:`on_llama_thread` whoever calls it."""

    @wraps(fn)
    def on_thread(*args: object, **kwargs: object) -> T:
        return on_llama_thread(fn, *args, **kwargs)

    return on_thread


def _forget_in_child() -> None:
    """A forked child has no llama thread (only the forking thread survives a fork): it starts its own."""
    global _pool, _ident, _lock
    _pool, _ident, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
