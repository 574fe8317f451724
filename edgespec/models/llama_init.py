"""llama.cpp's process-wide setup, done once before anything else asks llama.cpp for something: its log routed
through Python logging, and its backends initialised."""

from __future__ import annotations

import ctypes
import logging
import os

import llama_cpp

# ggml log levels: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line.
_GGML_LOG_WARN, _GGML_LOG_ERROR, _GGML_LOG_CONT = 3, 4, 5
# llama.cpp's own log, as its own logger: `edgespec -v` shows its warnings and errors, never more by default.
_llama_log = logging.getLogger("llama.cpp")
_last_log_level = logging.DEBUG


@llama_cpp.llama_log_callback
def _forward_llama_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty on stderr (every tensor on load), and a file it refuses gets several lines of errors
    # before edgespec's own one-line message. Route all of it through Python logging so the CLI and the TUI own the
    # terminal: warnings and errors at INFO (shown with -v), the rest at DEBUG.
    global _last_log_level
    if level != _GGML_LOG_CONT:
        _last_log_level = logging.INFO if level in (_GGML_LOG_WARN, _GGML_LOG_ERROR) else logging.DEBUG
    message = text.decode("utf-8", errors="replace").rstrip()
    if message and _llama_log.isEnabledFor(_last_log_level):
        _llama_log.log(_last_log_level, message)


_backend_ready = False


def init_backend() -> None:
    """Set llama.cpp up for this process (idempotent): every caller of llama.cpp calls it first."""
    global _backend_ready
    if not _backend_ready:
        if not os.environ.get("EDGESPEC_LLAMA_LOG"):
            llama_cpp.llama_log_set(_forward_llama_log, ctypes.c_void_p(0))
            # When llama.cpp aborts (a GGML_ASSERT), ggml prints a backtrace, attaching gdb when it finds one,
            # unless this is set when the abort happens (ggml_print_backtrace in ggml.c). A user gets the one-line
            # assertion instead of a debugger session; EDGESPEC_LLAMA_LOG=1 keeps llama.cpp's raw output, backtrace
            # included, for debugging.
            os.environ.setdefault("GGML_NO_BACKTRACE", "1")
        llama_cpp.llama_backend_init()
        _backend_ready = True
