"""How a decode's rows come out of llama.cpp: the backend sampler chain that selects them inside its graph (each
row's argmax, or its top-k candidates with their logits, and with log-probabilities the row's softmax normaliser),
reading them out after the decode, and selecting them here from whole rows where llama.cpp cannot run the chain.

What comes back per row is a :class:`~edgespec.sampling.Readout`'s :data:`~edgespec.sampling.Scores`; which rows are
read and how they are batched is :class:`~edgespec.models.backend.Model`'s.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from edgespec.errors import ModelError
from edgespec.sampling import LOGITS, Candidates, Readout, Scores

# What a row of a top-k readout leaves to be built after the decode: (the part's Candidates, k, llama.cpp's
# pointers to the row's logits and ids, the argmax's probability or None).
Copy = tuple[Candidates, int, Any, Any, float | None]

log = logging.getLogger("edgespec.models.readout")


def allocate(readout: Readout, n_rows: int, n_vocab: int) -> Scores:
    """The empty output a part's ``n_rows`` rows are read into, as ``readout`` hands them back."""
    if readout.kind == "argmax":
        return []
    if readout.kind == "top_k":
        return Candidates([], [], [] if readout.log_norm else None)
    return np.empty((n_rows, n_vocab), dtype=np.float32)


def emulate(readout: Readout, logits: np.ndarray) -> Scores:
    """What ``readout`` would have selected in llama.cpp's graph, from whole logits rows."""
    if readout.kind == "argmax":
        return logits.argmax(axis=1).tolist()
    if readout.kind == "top_k":
        ids = np.argpartition(logits, -readout.k, axis=1)[:, -readout.k :]
        log_z = None
        if readout.log_norm:
            shift = logits.max(axis=1, keepdims=True)
            log_z = (shift[:, 0] + np.log(np.exp(logits - shift).sum(axis=1, dtype=np.float64))).tolist()
        return Candidates(ids.tolist(), np.take_along_axis(logits, ids, axis=1).tolist(), log_z)
    return logits


# ----- the log-normaliser, in llama.cpp's graph ---------------------------------------------------------------
# A log-probability needs its row's softmax normaliser Z, a sum over the whole vocabulary: reading 150k logits a
# row out of llama.cpp to sum them in numpy cost ~5x the rest of the loop (`bench --loop-cost
# --with-penalties-logprobs`). Instead a backend sampler of our own, first in the chain, adds to each row's graph
# the softmax probability of the row's argmax, p_max = exp(max) / Z, handed back as the row's one "probability";
# then log Z = max - log(p_max), with max the best of the top-k candidates read anyway. p_max >= 1/n_vocab never
# underflows, so the float32 result is good to ~1e-7. It is a sampler in ggml only: llama.cpp never calls its CPU
# side when the chain runs in the graph, and a chain llama.cpp refuses is emulated from whole rows (:func:`emulate`).
def _ggml_function(name: str, argtypes: list, restype):
    from llama_cpp._ggml import libggml  # llama.cpp's own ggml (libggml, which loads libggml-base)

    function = getattr(libggml, name)
    function.argtypes, function.restype = argtypes, restype
    return function


_ptr = ctypes.c_void_p
_ggml_reshape_2d = _ggml_function("ggml_reshape_2d", [_ptr, _ptr, ctypes.c_int64, ctypes.c_int64], _ptr)
_ggml_soft_max = _ggml_function("ggml_soft_max", [_ptr, _ptr], _ptr)
_ggml_argmax = _ggml_function("ggml_argmax", [_ptr, _ptr], _ptr)
_ggml_get_rows = _ggml_function("ggml_get_rows", [_ptr, _ptr, _ptr], _ptr)
_ggml_nelements = _ggml_function("ggml_nelements", [_ptr], ctypes.c_int64)


def _log_norm_graph(_smpl, ctx, _graph, data) -> None:
    """backend_apply: ``data.probs`` = the softmax of ``data.logits`` (one row) at its argmax."""
    data = data.contents
    n = _ggml_nelements(data.logits)
    row = _ggml_reshape_2d(ctx, data.logits, n, 1)
    column = _ggml_reshape_2d(ctx, _ggml_soft_max(ctx, row), 1, n)  # get_rows picks rows: one per token
    data.probs = _ggml_get_rows(ctx, column, _ggml_argmax(ctx, row))


_i = llama_cpp
# The name is a static C string: a Python callback typed to return char* would hand out a converted bytes object
# (ctypes warns "memory leak in callback function"), so it returns the buffer's address, typed as a pointer.
_LOG_NORM_NAME = ctypes.create_string_buffer(b"edgespec-log-norm")
_name_address = ctypes.CFUNCTYPE(ctypes.c_void_p, _i.llama_sampler_p_ctypes)(
    lambda _smpl: ctypes.addressof(_LOG_NORM_NAME)
)
# The interface lives as long as the module: llama.cpp keeps a pointer to it in every sampler made from it.
_LOG_NORM_CALLBACKS = (
    ctypes.cast(_name_address, _i.llama_sampler_i_name),
    _i.llama_sampler_i_apply(lambda _smpl, _cur: None),  # required; never called while the chain runs in-graph
    _i.llama_sampler_i_backend_init(lambda _smpl, _buft, _n_max: True),
    _i.llama_sampler_i_backend_apply(_log_norm_graph),
)
_LOG_NORM_IFACE = _i.llama_sampler_i(
    name=_LOG_NORM_CALLBACKS[0],
    apply=_LOG_NORM_CALLBACKS[1],
    backend_init=_LOG_NORM_CALLBACKS[2],
    backend_apply=_LOG_NORM_CALLBACKS[3],
)
del _i


def _log_norm_sampler():
    """A new sampler of the log-normaliser (a chain frees its samplers; this one owns no state)."""
    return llama_cpp.llama_sampler_init(ctypes.byref(_LOG_NORM_IFACE), None)


def sampler_chain(readout: Readout):
    """A new backend sampler chain that produces ``readout``'s rows in llama.cpp's graph (None for whole logits
    rows). A chain is bound to the graph it is installed in: llama.cpp initialises it once, so every switch builds a
    new one (a chain is a few bytes; switches happen per request at most)."""
    if readout.kind == "logits":
        return None
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if readout.log_norm:  # first: it needs the whole row
        llama_cpp.llama_sampler_chain_add(chain, _log_norm_sampler())
    step = (
        llama_cpp.llama_sampler_init_greedy()
        if readout.kind == "argmax"
        else llama_cpp.llama_sampler_init_top_k(readout.k)
    )
    llama_cpp.llama_sampler_chain_add(chain, step)
    return chain


class SequenceSampler:
    """The backend sampler chain installed on one sequence of a llama.cpp context, and the readout it produces."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        self.chain = None  # the backend sampler chain installed on this sequence, if any
        self.readout = LOGITS  # what llama.cpp's graph hands back for this sequence now

    def use(self, ctx, readout: Readout, refused: set[Readout], name: str) -> None:
        """Install the backend sampler chain that produces ``readout`` (none for whole logits rows) on context
        ``ctx``; a readout llama.cpp cannot run in its graph goes into ``refused``, and whole rows are read."""
        if readout == self.readout:
            self.readout = readout  # the same readout: decodes of this request compare by identity
            return
        chain = sampler_chain(readout)
        installed = llama_cpp.llama_set_sampler(ctx, self.seq_id, chain)
        if self.chain is not None:  # replaced: llama.cpp no longer refers to it
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
        if not installed:
            # This backend cannot run the chain in its graph: read whole rows and select from them here.
            log.warning("%s: llama.cpp cannot sample '%s' in its graph; reading whole logits rows", name, readout)
            refused.add(readout)
            llama_cpp.llama_set_sampler(ctx, self.seq_id, None)
            if chain is not None:
                llama_cpp.llama_sampler_free(chain)
            self.readout = LOGITS
            return
        self.chain = chain
        self.readout = readout

    def release(self, ctx) -> None:
        """Take the chain off the sequence (when ``ctx`` is still there) and free it."""
        if ctx:
            llama_cpp.llama_set_sampler(ctx, self.seq_id, None)
        if self.chain is not None:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None


def read_rows(
    ctx,
    wanted: Sequence[tuple[int, int]],
    kinds: Sequence[Readout],
    outs: Sequence[Scores],
    read: list[int],
    n_vocab: int,
    name: str,
) -> list[Copy]:
    """Read the flagged rows of the batch just decoded in ``ctx`` into each part's output: ``wanted`` lists
    (part, batch position), ``kinds[part]`` says how (as installed), ``read[part]`` counts the part's rows read.
    Only llama.cpp's calls: a top-k row's lists are built by :func:`finish_candidates`, after the decode's time is
    taken."""
    copies: list[Copy] = []
    for p, j in wanted:
        kind, out = kinds[p], outs[p]
        if kind.kind == "argmax":
            sampled = llama_cpp.llama_get_sampled_token_ith(ctx, j)
            if sampled < 0:  # LLAMA_TOKEN_NULL: no sampler ran on this row
                raise ModelError(f"{name}: llama.cpp returned no sampled token for row {j}")
            out.append(sampled)
        elif kind.kind == "top_k":
            n = llama_cpp.llama_get_sampled_logits_count_ith(ctx, j)
            if n != kind.k:
                raise ModelError(f"{name}: llama.cpp returned {n} candidates for a top-{kind.k} row")
            # Slicing these pointers builds the lists in C: no numpy on the hot path (see warp.py).
            p_max = None
            if kind.log_norm:
                if llama_cpp.llama_get_sampled_probs_count_ith(ctx, j) != 1:
                    raise ModelError(f"{name}: llama.cpp returned no log-normaliser for row {j}")
                p_max = llama_cpp.llama_get_sampled_probs_ith(ctx, j)[0]
            copies.append(
                (out, kind.k, llama_cpp.llama_get_sampled_logits_ith(ctx, j),
                 llama_cpp.llama_get_sampled_candidates_ith(ctx, j), p_max)
            )  # fmt: skip
        else:
            row = llama_cpp.llama_get_logits_ith(ctx, j)
            if not row:
                raise ModelError(f"{name}: llama.cpp returned no logits for row {j}")
            ctypes.memmove(out[read[p]].ctypes.data, row, 4 * n_vocab)
        read[p] += 1
    return copies


def finish_candidates(copies: Sequence[Copy]) -> None:
    """Build the top-k rows' lists out of llama.cpp's buffers (the part of reading that runs on Python's time)."""
    for out, k, logits_at, ids_at, p_max in copies:
        logits = logits_at[:k]
        out.logits.append(logits)
        out.ids.append(ids_at[:k])
        if p_max is not None:  # the argmax's probability: log Z = max - log p_max (see _log_norm_graph)
            out.log_z.append(max(logits) - math.log(p_max))
