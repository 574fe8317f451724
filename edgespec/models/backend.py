"""A loaded model on llama.cpp, and its sequences (:class:`Slot`).

One :class:`Model` is a loaded GGUF with its own context (KV cache) on sequence 0. The engine talks to it in four
verbs: ``tokenize``, ``decode`` (tokens at positions, scores only at the rows asked for), ``truncate`` (drop the
KV from a position on) and ``piece`` (token → bytes); what a lane asks of it is :class:`~edgespec.models.slot.KVSlot`.
Everything is the low-level C API, so a verify of γ+1 tokens is one ``llama_decode`` whose output buffer holds γ+1
rows, never n_ctx × n_vocab.

What a decode hands back per row is a :class:`~edgespec.sampling.Readout`: whole logits rows, or only what
sampling needs, selected inside llama.cpp's decode graph by a backend sampler chain on the sequence
(:mod:`edgespec.models.readout`: each row's argmax, or its top-k tokens with their logits; with log-probabilities,
also the row's softmax normaliser). A GPU then copies k numbers a row instead of 150k, and the CPU side never
touches a vocabulary-sized array. The chain is swapped only when the readout changes (llama.cpp then re-plans its
compute graph once), which is per request at most.

The llama.cpp layer: this module, with :mod:`~edgespec.models.llama_init` (process setup),
:mod:`~edgespec.models.devices` (devices, threads, offload), :mod:`~edgespec.models.readout` (reading rows out) and
:mod:`~edgespec.models.batch` (the token batch), are the only modules that import llama_cpp. The device functions
are re-exported here, where callers import them.

:class:`Model` and :class:`Slot` stay in this one module, under 600 lines: a slot is a sequence of its model's
context, reads the model's llama.cpp handles, and decodes through the model's one decode path
(:meth:`Model.decode_batch`), and a model on RPC servers chooses its readout by timing that path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from edgespec.errors import ContextOverflowError, ModelError
from edgespec.models import rpc as remote_devices
from edgespec.models.batch import Batch
from edgespec.models.devices import (  # noqa: F401  # re-exported: imported from here by api, cli and tests
    Device,
    Shape,
    amx_kernels,
    auto_gpu_layers,
    auto_layers_beside_servers,
    backend_devices,
    backend_names,
    default_threads,
    gpu_devices,
    gpu_offload_supported,
    model_shape,
    offload_needs,
    system_info,
)
from edgespec.models.llama_init import init_backend
from edgespec.models.llama_thread import runs_on_llama_thread
from edgespec.models.microbatch import decode_passes, fill_gaps
from edgespec.models.offload import describe
from edgespec.models.readout import SequenceSampler, allocate, emulate, finish_candidates, read_rows
from edgespec.models.slot import MAX_ROWS, Part, common_prefix, sync  # noqa: F401  # common_prefix: re-exported
from edgespec.sampling import ARGMAX, LOGITS, Readout, Scores

log = logging.getLogger("edgespec.models.backend")

# ggml-cpu runs K-quant matmuls of 8 rows or more through a tiled kernel (ggml_tiled_min_batch), which rounds
# differently from the per-row dot products of smaller batches: a bit-exact verify stays below it.
BIT_EXACT_MAX_ROWS = 7
GGML_TYPE_BF16 = 30  # enum ggml_type
FILLER_TOKEN = 0  # what a sequence in a gap decodes (and drops): any token will do
READOUT_PROBE_ROWS = 8  # the width of the decodes that time a remote model's two readouts (a verify's order)
READOUT_PROBE_REPEATS = 3


def describe_model(llama_desc: str, n_params: int) -> str:
    """llama.cpp's "arch size quant" with the size from the parameter count. llama.cpp's size is a label for the
    model's layer shape ("1B" for the Qwen2.5 0.5B, "?B" for shapes it does not know), not its size."""
    from edgespec.models.drafts import format_params

    arch, _, rest = llama_desc.partition(" ")
    _, _, quant = rest.partition(" ")
    if n_params <= 0:
        return llama_desc
    return " ".join(part for part in (arch, f"{format_params(n_params)} params", quant) if part)


@dataclass(frozen=True)
class VocabInfo:
    n_vocab: int
    vocab_type: int  # llama_vocab_type: 1 SPM, 2 BPE, 3 WPM, ...
    bos: int  # -1 when the model has none
    eos: int
    add_bos: bool


LoadProgress = Callable[[float], None]


def _ascending_within(rows: Sequence[int], n: int) -> bool:
    if len(rows) > MAX_ROWS or rows[0] < 0 or rows[-1] >= n:
        return False
    # One row (every draft step) or a range (every verify) needs no pairwise check.
    return len(rows) == 1 or isinstance(rows, range) or all(a < b for a, b in zip(rows[:-1], rows[1:], strict=True))


class Slot:
    """One sequence of a :class:`Model`'s context: its own KV (positions from 0), its own backend sampler chain.

    A slot speaks the model's verbs for its sequence (``decode``, ``truncate``, ``sync``, ``kv_tokens``); the rest
    (vocabulary, text, limits, ``busy_seconds``) is the model's. Several slots decode together through
    :meth:`Model.decode_batch`.
    """

    def __init__(self, model: Model, seq_id: int) -> None:
        self.model = model
        self.seq_id = seq_id
        self.kv_tokens: list[int] = []
        self._sampler = SequenceSampler(seq_id)  # the sampler chain on this sequence, and its readout

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        return self.model.decode_batch(((self, tokens, rows, readout),))[0]

    def truncate(self, n_keep: int) -> None:
        """Roll back: drop this sequence's KV at positions >= ``n_keep``."""
        if n_keep < len(self.kv_tokens):
            model = self.model
            if not llama_cpp.llama_memory_seq_rm(model._mem, self.seq_id, n_keep, -1):
                # Some memory types (recurrent models) cannot drop a partial sequence: start over.
                llama_cpp.llama_memory_seq_rm(model._mem, self.seq_id, -1, -1)
                del self.kv_tokens[:]
                return
            del self.kv_tokens[n_keep:]

    sync = sync

    def copy_prefix_from(self, source: Slot, n: int) -> None:
        """Make this sequence's KV the first ``n`` cells of ``source``'s: a prompt another sequence already holds is
        not prefilled again. Each sequence has a KV buffer of its own (kv_unified off), and llama.cpp copies only
        whole buffers between them (a partial range is a GGML_ASSERT, a crash): the whole of ``source``'s is
        copied, on the next decode, and this sequence then drops what follows the prefix. That is a memory copy
        of the buffer (~0.1 GB for a 1.5B model's 4096 cells), against seconds of prefill on a CPU."""
        model = self.model
        if source.model is not model or source is self or n > len(source.kv_tokens):
            raise ValueError("copy a prefix another sequence of the same model holds")
        llama_cpp.llama_memory_seq_rm(model._mem, self.seq_id, -1, -1)
        self.kv_tokens = []
        llama_cpp.llama_memory_seq_cp(model._mem, source.seq_id, self.seq_id, -1, -1)
        self.kv_tokens = list(source.kv_tokens)
        self.truncate(n)

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def _check(self, tokens: Sequence[int], rows: Sequence[int], readout: Readout, start: int | None = None) -> None:
        """Refuse a decode that cannot run (context, rows) and install the sampler chain ``readout`` needs."""
        model = self.model
        start = len(self.kv_tokens) if start is None else start
        if start + len(tokens) > model.n_ctx:
            raise ContextOverflowError(
                f"{model.name}: {start + len(tokens)} tokens do not fit the context of {model.n_ctx}"
            )
        if len(rows):
            if not _ascending_within(rows, len(tokens)):
                raise ValueError(
                    f"rows {list(rows)} must be at most {MAX_ROWS} ascending indices into the {len(tokens)} tokens "
                    "decoded"
                )
            if model.whole_rows:
                readout = LOGITS  # and selected from them here (decode)
            # A request's readout is one object: compared once per request. A refused one is emulated (decode).
            if readout is not self._sampler.readout and not (model._refused and readout in model._refused):
                # may find that llama.cpp refuses it: then read whole rows and select here
                self._sampler.use(model._ctx, readout, model._refused, model.name)

    def _release_chain(self) -> None:
        self._sampler.release(self.model._ctx)


# What one sequence adds to a batched decode: (slot, tokens, rows, readout), as for Model.decode.


class Model:
    """A loaded GGUF model with one KV cache (``n_seq`` sequences in it, each a :class:`Slot`).

    ``n_gpu_layers``: layers to offload (-1 = all, 0 = CPU only; ignored by a CPU-only build).
    ``bit_exact``: every logit of a verify batch computed exactly as a single-token decode computes it, so that
    greedy speculation is token-identical to plain decoding. llama.cpp's CPU backend picks kernels by batch shape,
    and three of its choices round differently (read in ggml-cpu, measured here on the Qwen 1.5B):
    repacked weights run groups of 4 rows through gemm and the rest through gemv (off: llama.cpp's
    ``--no-repack``); K-quant matmuls switch to a tiled kernel from 8 rows (a verify is kept to
    :attr:`max_verify_rows`); flash attention splits a single query over threads once the KV holds 512 cells,
    for an F16/F32 cache only (the cache is BF16, which no batch shape treats differently). It costs decode speed.
    The GPU backends were not checked.
    ``tree_sequences``: sequence ids 1..tree_sequences reserved for the branches of a draft tree decoded in one batch
    (:mod:`edgespec.models.tree_kv`); only with ``n_seq`` 1. 0 (the default) changes nothing.
    ``rpc``: RPC servers (``host:port``) whose devices take the offloaded layers, before this machine's GPUs
    (:mod:`edgespec.models.rpc`). Without it, a model stays off every RPC server the process has attached, so a
    draft beside a remote target stays local.
    """

    @runs_on_llama_thread  # loaded (and warmed up) on the thread every decode runs on
    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_batch: int = 512,
        bit_exact: bool = False,
        n_seq: int = 1,
        tree_sequences: int = 0,
        rpc: Sequence[str] = (),
        progress: LoadProgress | None = None,
    ) -> None:
        init_backend()
        if n_seq < 1:
            raise ValueError(f"n_seq must be >= 1, got {n_seq}")
        # llama.cpp's output buffer holds max(rows, n_seq_max) rows, a GGML_ASSERT against n_outputs_max (MAX_ROWS)
        if not 0 <= tree_sequences < MAX_ROWS or (tree_sequences and n_seq != 1):
            raise ValueError(f"tree_sequences must be 0..{MAX_ROWS - 1}, and only with n_seq 1 (got {tree_sequences})")
        self.tree_sequences = tree_sequences
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file not found: {self.path}")
        self.name = self.path.name
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads or default_threads()
        self.bit_exact = bit_exact
        self.rpc = tuple(rpc)
        self._model = None
        self._ctx = None
        self._batch = None
        self._refused: set[Readout] = set()  # readouts llama.cpp could not run in its graph (emulated here)
        self.whole_rows = False  # every readout read as whole rows and selected here (see _whole_rows_cheaper)

        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = n_gpu_layers
        devices = remote_devices.model_devices(self.rpc)
        if devices is not None:
            # A NULL-terminated list, alive until the load returns (llama.cpp copies it).
            device_list = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            model_params.devices = ctypes.cast(device_list, ctypes.c_void_p)
        # Repacked weights, unless bit-exact, or unless repacking would put them in llama.cpp's AMX buffers.
        model_params.use_extra_bufts = not bit_exact and not amx_kernels()
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
        # Each sequence gets n_ctx cells of its own (kv_unified off: llama.cpp splits the context evenly), so a
        # request's limit does not depend on what the others hold.
        ctx_params.n_ctx = n_ctx * n_seq
        ctx_params.n_batch = self.n_batch
        ctx_params.n_ubatch = self.n_batch
        ctx_params.n_seq_max = n_seq + tree_sequences
        # A KV buffer per sequence (kv_unified off), although llama.cpp then splits a decode into micro-batches of
        # consecutive sequence ids that each take the same number of tokens from every sequence in it
        # (split_equal): sequences with 1, 1, 1 and 3 rows run as a pass of 4 rows, then one of 2, so a draft
        # beside other requests costs a whole extra forward pass (so does a prompt chunk; a gap in the busy ids is
        # filled with a throw-away token, see _fillers).
        # One pool of cells (kv_unified on) makes every decode one pass, which is faster, but there a seeded request
        # at temperature 1.5 sent twice gave other text the second time
        # (test_n_choices_share_the_prompt_and_each_is_seeded_apart). The likely cause, not confirmed: a
        # sequence's attention runs over the whole pool, so its sums depend on where the others' cells sit.
        # A draft tree (tree_sequences > 0) needs the one pool: a node shared by several branches is a token of several
        # sequences at once ("coupled"), which llama.cpp's per-sequence split refuses (split_equal, sequential).
        ctx_params.kv_unified = tree_sequences > 0
        ctx_params.n_outputs_max = MAX_ROWS
        ctx_params.n_outputs_max_per_seq = MAX_ROWS  # llama.cpp's default, 1, is too few for a verify
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads
        if bit_exact:
            # Flash attention on (without it, batched KQ products round differently), over a BF16 cache: ggml's
            # split-KV path for one query (F16/F32 caches, >= 512 cells) sums in another order than a batch does.
            ctx_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            ctx_params.type_k = ctx_params.type_v = GGML_TYPE_BF16
        self._ctx = llama_cpp.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            self.close()
            raise ModelError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path}")
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx))  # per sequence
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
        self._batch = Batch(self.n_batch)
        self._eog: dict[int, bool] = {}  # is_eog's answers, asked for every token generated
        self._piece_buf = ctypes.create_string_buffer(256)
        self._piece_cache: dict[int, bytes] = {}
        # One slot per sequence; the model itself speaks for slot 0, so single-stream code needs no slot at all.
        self.slots = [Slot(self, i) for i in range(n_seq)]
        # Wall time inside llama_decode and reading its rows out (the C side, where a GPU also synchronises):
        # what the Python loop cannot speed up.
        self.busy_seconds = 0.0
        self._warm_up()

    def _warm_up(self) -> None:
        # The first decode pays for page faults on the memory-mapped weights and for allocating compute buffers
        # (seconds for a 1 GB model). Pay it while loading, as llama.cpp's own tools do, so the first verify
        # does not look like the cost of decoding and mislead the controller.
        first = self.vocab.bos if self.vocab.bos >= 0 else 0
        self.decode([first], [0])
        self.truncate(0)
        if self.rpc:
            self.whole_rows = self._whole_rows_cheaper(first)
        self.busy_seconds = 0.0

    def _whole_rows_cheaper(self, token: int) -> bool:
        """Whether this model, with layers on RPC servers, reads a verify's rows faster as whole logits rows than
        through llama.cpp's in-graph samplers. The in-graph readout fetches each row's result from the server on
        its own, a round trip a row; whole rows come in one transfer of n_vocab floats a row. Which costs less
        depends on the link's latency against its bandwidth, so it is timed on it, alternating."""
        tokens, rows = [token] * READOUT_PROBE_ROWS, range(READOUT_PROBE_ROWS)
        times: tuple[list[float], list[float]] = ([], [])  # in the graph, whole rows
        for _ in range(READOUT_PROBE_REPEATS):
            for seconds, readout in zip(times, (ARGMAX, LOGITS), strict=True):
                t0 = time.perf_counter()
                self.decode(tokens, rows, readout)
                seconds.append(time.perf_counter() - t0)
                self.truncate(0)
        in_graph, whole = (statistics.median(seconds) for seconds in times)
        log.info("%s: %d rows read in llama.cpp's graph %.1f ms, as whole rows %.1f ms", self.name,
                 READOUT_PROBE_ROWS, in_graph * 1e3, whole * 1e3)  # fmt: skip
        return whole < in_graph

    # ----- facts -------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def max_verify_rows(self) -> int:
        """The widest batch whose rows all round exactly as single-token decodes (bit-exact), else :data:`MAX_ROWS`."""
        return BIT_EXACT_MAX_ROWS if self.bit_exact else MAX_ROWS

    @property
    def placement(self) -> str:
        """Where the model runs: "CPU", or the GPU (or RPC server) and how many of its layers are there."""
        n_layer = int(llama_cpp.llama_model_n_layer(self._model))
        if self.rpc:
            return describe(self.n_gpu_layers, n_layer, ", ".join(self.rpc), kind="RPC server")
        devices = gpu_devices() if self.n_gpu_layers != 0 else []
        return describe(self.n_gpu_layers, n_layer, devices[0].name if devices else None)

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    @property
    def n_params(self) -> int:
        return int(llama_cpp.llama_model_n_params(self._model))

    @property
    def description(self) -> str:
        """Architecture, parameters and quantization: "qwen2 630M params Q4_K - Medium" (the Qwen2.5 0.5B)."""
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        return describe_model(buf.value.decode("utf-8", errors="replace"), self.n_params)

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

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

    # ----- the KV cache (sequence 0; other sequences through :attr:`slots`) -----------------------------------
    @property
    def kv_tokens(self) -> list[int]:
        """The tokens sequence 0's KV holds at positions 0..len-1 (the engine's bookkeeping mirrors llama.cpp's)."""
        return self.slots[0].kv_tokens

    @property
    def n_seq(self) -> int:
        return len(self.slots)

    def decode(self, tokens: Sequence[int], rows: Sequence[int] = (), readout: Readout = LOGITS) -> Scores:
        """Append ``tokens`` to sequence 0's KV (at positions ``len(kv_tokens)..``) and score the rows asked for.

        ``rows``: ascending indices into ``tokens`` (at most :data:`MAX_ROWS`); only those rows are computed.
        ``readout`` says what comes back for them (:class:`~edgespec.sampling.Readout`): ``[R, n_vocab]`` logits (a
        copy), ``[R]`` argmax ids, or the top-k :class:`~edgespec.sampling.Candidates`. Long inputs are split
        into batches of ``n_batch``.
        """
        return self.decode_batch(((self.slots[0], tokens, rows, readout),))[0]

    @runs_on_llama_thread
    def decode_batch(self, parts: Sequence[Part]) -> list[Scores]:
        """Several sequences' tokens in one ``llama_decode`` (more when they exceed ``n_batch``): each part is
        ``(slot, tokens, rows, readout)`` as for :meth:`decode`, and gets its own scores back, in order.

        llama.cpp aborts the process (a GGML_ASSERT) on some batches it cannot take, so what it would refuse is
        refused here first: more than :data:`MAX_ROWS` rows in all, a slot of another model, a sequence twice.
        Runs on the llama thread, whichever thread calls (see :mod:`edgespec.models.llama_thread`).
        """
        if self.rpc:
            remote_devices.check_alive()
        n_rows = 0
        seen: set[int] = set()
        for slot, tokens, rows, readout in parts:
            if slot.model is not self or slot.seq_id in seen:
                raise ValueError(f"each part needs its own sequence of {self.name}")
            seen.add(slot.seq_id)
            n_rows += len(rows)
            slot._check(tokens, rows, readout)
        if n_rows > MAX_ROWS:
            raise ValueError(f"{n_rows} rows in one decode: llama.cpp's output buffers hold {MAX_ROWS}")
        # Listed in ascending sequence id: llama.cpp runs a pass per run of consecutive ids in the order the batch
        # lists them (see edgespec.models.microbatch), so one token of sequences 2, 0, 3, 1 would be two passes;
        # with a throw-away token of each sequence in a gap (index None), dropped after the decode.
        fillers = self._fillers({slot.seq_id: len(tokens) for slot, tokens, _, _ in parts})
        listed = sorted([*enumerate(parts), *((None, f) for f in fillers)], key=lambda ip: ip[1][0].seq_id)
        order: list[int | None] = [i for i, _ in listed]
        parts = [part for _, part in listed]
        # A readout llama.cpp refused to run in its graph (or one slower there, whole_rows) is read as whole rows and
        # selected here.
        kinds = [LOGITS if self.whole_rows or readout in self._refused else readout for _, _, _, readout in parts]
        outs = [allocate(kind, len(rows), self.n_vocab) for kind, (_, _, rows, _) in zip(kinds, parts, strict=True)]
        starts = [len(slot.kv_tokens) for slot, _, _, _ in parts]
        busy = 0.0  # inside llama_decode and llama.cpp's readout calls (filling the batch is Python's time)
        wanted: list[tuple[int, int]] = []  # (part, batch position) of each row flagged in the batch being filled
        read = [0] * len(parts)  # rows of each part read so far
        try:
            for n_tokens in self._batch.fill(parts, starts, wanted):
                busy += self._run_batch(n_tokens, wanted, kinds, outs, read)
                wanted.clear()
        except BaseException:
            # Whatever stopped this call (a failed decode, a bad row, Ctrl+C), leave every KV as it was before it,
            # so that kv_tokens stays true and the next request starts clean.
            for (slot, _, _, _), start in zip(parts, starts, strict=True):
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, start, -1)
            raise
        for p, (slot, tokens, _, _), start in zip(order, parts, starts, strict=True):
            if p is not None:
                slot.kv_tokens.extend(tokens)
            elif not llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, start, -1):
                # A memory that cannot drop part of a sequence (recurrent) would keep the filler: start it over.
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
                del slot.kv_tokens[:]
        self.busy_seconds += busy
        scores: list[Scores] = [None] * (len(parts) - len(fillers))  # type: ignore[list-item]  # in given order
        for p, kind, out, (_, _, rows, readout) in zip(order, kinds, outs, parts, strict=True):
            if p is not None:
                scores[p] = emulate(readout, out) if kind is not readout and len(rows) else out
        return scores

    def _fillers(self, tokens_by_seq: dict[int, int]) -> list[Part]:
        """A throw-away token for each sequence in a gap between those in a decode, where that saves llama.cpp
        passes (:func:`~edgespec.models.microbatch.fill_gaps`): at the end of what that sequence's KV holds, which
        has room for it. None bit-exact: a filler widens the batch past the sizes that round as a single step."""
        if self.n_seq < 2 or self.bit_exact:
            return []
        layout = fill_gaps(tokens_by_seq, self.n_batch)
        fillers = [self.slots[s] for s in layout if s not in tokens_by_seq]
        if any(len(slot.kv_tokens) >= self.n_ctx for slot in fillers):
            return []
        return [Part(slot, (FILLER_TOKEN,), (), LOGITS) for slot in fillers]

    def decode_passes(self, tokens_by_seq: Mapping[int, int]) -> list[int]:
        """The token counts of the forward passes llama.cpp runs for one :meth:`decode_batch` that carries
        ``tokens_by_seq[s]`` tokens of sequence ``s`` (see :mod:`edgespec.models.microbatch`)."""
        return decode_passes(
            tokens_by_seq, self.n_batch, per_sequence_kv=self.n_seq > 1, gaps_filled=not self.bit_exact
        )

    def rehearse(self, tokens: Sequence[int], rows: Sequence[int], readout: Readout, start: int) -> None:
        """All that :meth:`decode` does in Python for sequence 0 at ``start``, the checks and filling the batch, but
        the decode itself (:mod:`edgespec.replay` measures the loop's own cost with it)."""
        slot = self.slots[0]
        slot._check(tokens, rows, readout, start)
        wanted: list[tuple[int, int]] = []
        for _ in self._batch.fill(((slot, tokens, rows, readout),), (start,), wanted):
            wanted.clear()

    def _run_batch(
        self, n_tokens: int, wanted: list[tuple[int, int]], kinds: list[Readout], outs: list[Scores], read: list[int]
    ) -> float:
        """Decode the filled batch and read its flagged rows into each part's output; returns the seconds llama.cpp
        took (the top-k lists are built after, on Python's time)."""
        self._batch.c.n_tokens = n_tokens
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(self._ctx, self._batch.c)
        if rc != 0:
            raise ModelError(f"{self.name}: llama_decode failed with code {rc}")
        copies = read_rows(self._ctx, wanted, kinds, outs, read, self.n_vocab, self.name)
        busy = time.perf_counter() - t0
        finish_candidates(copies)  # the top-k lists, built on Python's time
        return busy

    def readout_path(self, readout: Readout) -> str:
        """Where sampling for ``readout`` runs on this model (for the stats)."""
        if readout in self._refused:
            return f"{LOGITS.path} ({readout.kind} not supported in llama.cpp's graph here)"
        if self.whole_rows and readout.kind != LOGITS.kind:
            return f"{LOGITS.path} (faster than {readout.kind} in llama.cpp's graph over RPC, timed at load)"
        return readout.path

    def truncate(self, n_keep: int) -> None:
        """Roll back sequence 0: drop its KV at positions >= ``n_keep``."""
        self.slots[0].truncate(n_keep)

    sync = sync

    # ----- lifetime ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "rpc", ()) and remote_devices.lost():
            # Freeing would ask the lost server to free its buffers and wait for an answer that never comes.
            self._model = self._ctx = self._batch = None
            return
        for slot in getattr(self, "slots", ()):
            slot._release_chain()
        if self._batch is not None:
            self._batch.free()
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
