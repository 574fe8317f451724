"""The llama.cpp adapter: the only module that imports llama_cpp.

One :class:`Model` is a loaded GGUF with its own context (KV cache) on sequence 0. The engine talks to it in four
verbs: ``tokenize``, ``decode`` (tokens at positions, logits only at the rows asked for), ``truncate`` (drop the
KV from a position on) and ``piece`` (token → bytes). Everything is the low-level C API, so a verify of γ+1
tokens is one ``llama_decode`` whose output buffer holds γ+1 rows, never n_ctx × n_vocab.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from edgespec.errors import ContextOverflowError, ModelError

log = logging.getLogger("edgespec.models.backend")

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


def _init_backend() -> None:
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


def gpu_offload_supported() -> bool:
    """Whether this llama-cpp-python build can offload layers (CUDA, Metal, Vulkan, ...)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def default_threads() -> int:
    # llama.cpp's default is the number of physical cores; os.cpu_count() counts logical ones, and on most
    # machines with SMT the physical count is half.
    n = os.cpu_count() or 2
    return max(1, n // 2) if n > 4 else n


@dataclass(frozen=True)
class VocabInfo:
    n_vocab: int
    vocab_type: int  # llama_vocab_type: 1 SPM, 2 BPE, 3 WPM, ...
    bos: int  # -1 when the model has none
    eos: int
    add_bos: bool


LoadProgress = Callable[[float], None]


class Model:
    """A loaded GGUF model with one KV cache.

    ``n_gpu_layers``: layers to offload (-1 = all, 0 = CPU only; ignored by a CPU-only build).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_batch: int = 512,
        progress: LoadProgress | None = None,
    ) -> None:
        _init_backend()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        self.name = self.path.name
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads or default_threads()
        self._model = None
        self._ctx = None
        self._batch = None

        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = n_gpu_layers
        if progress is not None:
            # Keep the ctypes callback alive as long as the load runs (a collected callback would crash).
            def _on_progress(fraction: float, _user: ctypes.c_void_p) -> bool:
                progress(float(fraction))
                return True

            self._progress_cb = llama_cpp.llama_progress_callback(_on_progress)
            model_params.progress_callback = self._progress_cb
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), model_params)
        if not self._model:
            raise ModelError(
                f"llama.cpp could not load {self.path} (not a GGUF model it supports, or corrupt)"
            )

        ctx_params = llama_cpp.llama_context_default_params()
        self.n_batch = max(1, min(n_batch, n_ctx))
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = self.n_batch
        ctx_params.n_ubatch = self.n_batch
        ctx_params.n_seq_max = 1
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads
        self._ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            self.close()
            raise ModelError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path}")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.vocab = VocabInfo(
            n_vocab=int(llama_cpp.llama_vocab_n_tokens(self._vocab)),
            vocab_type=int(llama_cpp.llama_vocab_type(self._vocab)),
            bos=int(llama_cpp.llama_vocab_bos(self._vocab)),
            eos=int(llama_cpp.llama_vocab_eos(self._vocab)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(self._vocab)),
        )
        self.n_vocab = self.vocab.n_vocab
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._piece_cache: dict[int, bytes] = {}
        # The KV holds exactly these tokens at positions 0..len-1 (the engine's bookkeeping mirrors llama.cpp's).
        self.kv_tokens: list[int] = []
        # Wall time spent inside llama_decode and copying its logits out: what the Python loop cannot speed up.
        self.busy_seconds = 0.0
        self._warm_up()

    def _warm_up(self) -> None:
        # The first decode pays for page faults on the memory-mapped weights and for allocating compute buffers
        # (seconds for a 1 GB model). Pay it while loading, as llama.cpp's own tools do, so the first verify
        # does not look like the cost of decoding and mislead the controller.
        first = self.vocab.bos if self.vocab.bos >= 0 else 0
        self.decode([first], [0])
        self.truncate(0)
        self.busy_seconds = 0.0

    # ----- facts -------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    # ----- text <-> tokens -----------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (may be part of a UTF-8 character). Control tokens render as b""."""
        cached = self._piece_cache.get(token)
        if cached is not None:
            return cached
        n = llama_cpp.llama_token_to_piece(
            self._vocab, token, self._piece_buf, len(self._piece_buf), 0, False
        )
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, big, len(big), 0, False)
            out = big.raw[:n]
        else:
            out = self._piece_buf.raw[:n]
        self._piece_cache[token] = out
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # ----- the KV cache ------------------------------------------------------------------------------------
    def decode(self, tokens: Sequence[int], logits_at: Sequence[int] = (), *, argmax: bool = False) -> np.ndarray:
        """Append ``tokens`` to the KV (at positions ``len(kv_tokens)..``) and return logits rows.

        ``logits_at`` are indices into ``tokens``; the result is ``[len(logits_at), n_vocab]`` float32 (a copy), or
        with ``argmax`` each row's argmax ``[len(logits_at)]``, taken in llama.cpp's buffer: greedy decoding needs
        no more, and a row is 0.6 MB for a 152k-token vocabulary. Long inputs are split into batches of
        ``n_batch``; only the requested rows are computed.
        """
        start = len(self.kv_tokens)
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{self.name}: {start + len(tokens)} tokens do not fit the context of {self.n_ctx}"
            )
        wanted = sorted(set(logits_at))
        if wanted and (wanted[0] < 0 or wanted[-1] >= len(tokens)):
            raise ValueError(f"logits_at {list(logits_at)} must index into the {len(tokens)} tokens decoded")
        rows = np.empty(len(wanted), dtype=np.int64) if argmax else np.empty((len(wanted), self.n_vocab), np.float32)
        batch = self._batch
        t0 = time.perf_counter()
        n_done = 0  # rows filled so far
        for lo in range(0, len(tokens), self.n_batch):
            chunk = tokens[lo : lo + self.n_batch]
            batch.n_tokens = len(chunk)
            n_out = 0
            for j, tok in enumerate(chunk):
                want = n_done + n_out < len(wanted) and wanted[n_done + n_out] == lo + j
                batch.token[j] = tok
                batch.pos[j] = start + lo + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = 0
                batch.logits[j] = want
                n_out += want
            rc = llama_cpp.llama_decode(self._ctx, batch)
            if rc != 0:
                # Leave the KV as it was before this call, so the caller's bookkeeping stays true.
                llama_cpp.llama_memory_seq_rm(self._mem, 0, start, -1)
                raise ModelError(f"{self.name}: llama_decode failed with code {rc}")
            if n_out:
                # The requested rows sit contiguously, in batch order: one copy, not one per row.
                block = np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(n_out * self.n_vocab,))
                block = block.reshape(n_out, self.n_vocab)
                rows[n_done : n_done + n_out] = block.argmax(axis=1) if argmax else block
                n_done += n_out
        self.kv_tokens.extend(tokens)
        self.busy_seconds += time.perf_counter() - t0
        if list(logits_at) != wanted:
            row_of = {i: r for r, i in enumerate(wanted)}
            return rows[[row_of[i] for i in logits_at]]
        return rows

    def truncate(self, n_keep: int) -> None:
        """Roll back: drop the KV at positions >= ``n_keep``."""
        if n_keep < len(self.kv_tokens):
            if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
                # Some memory types (recurrent models) cannot drop a partial sequence: start over.
                llama_cpp.llama_memory_clear(self._mem, True)
                del self.kv_tokens[:]
                return
            del self.kv_tokens[n_keep:]

    def sync(self, tokens: Sequence[int]) -> int:
        """Make the KV hold ``tokens`` exactly, reusing the longest common prefix. Returns tokens decoded."""
        kv = self.kv_tokens
        n = min(len(kv), len(tokens))
        common = 0
        while common < n and kv[common] == tokens[common]:
            common += 1
        self.truncate(common)
        rest = tokens[common:]
        if rest:
            self.decode(rest)
        return len(rest)

    # ----- lifetime ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: llama_cpp may already be gone
            pass

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
