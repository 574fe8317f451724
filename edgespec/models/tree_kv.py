"""One target decode over a draft tree, and keeping the accepted path (issue #54, step 1).

A chain verify decodes ``[t, d1..dγ]`` after the committed text: ``t`` is the *pending* token (the last committed
token, not yet in the KV, see :mod:`edgespec.generation`), at position ``n_past = len(kv_tokens)``. A tree verify
decodes several candidate continuations at once: ``t`` and every node of the tree, in one ``llama_decode``, a row
each. Each root-to-leaf path gets a sequence id of its own (1..B, a :class:`~edgespec.models.backend.Model` built
with ``tree_sequences=B``); a node belongs to the sequences of all paths through it, ``t`` to all of them. A token
attends to the cells of its sequence at positions up to its own, and a sequence holds exactly the committed prefix,
``t`` and one path, so each node sees its ancestors and never a sibling: the tree's attention mask is llama.cpp's
own sequence mask. Afterwards :func:`keep_path` tags the accepted nodes' cells as sequence 0's and drops every
branch sequence, which frees the cells of the rejected nodes (no KV data moves).

What llama.cpp (the vendored sources of llama-cpp-python 0.3.36) requires, and where it says so:

* A token of several sequences couples them; ``split_equal(sequential=true)``, the split of a per-sequence KV
  (``kv_unified`` off), refuses coupled sequences (src/llama-batch.cpp: "sequential split is not supported when
  there are coupled sequences"); a single stream (kv_unified on) uses ``split_simple`` (src/llama-kv-cache.cpp,
  ``init_batch``). Hence ``Model(tree_sequences=B)`` makes the context unified.
* Coupled sequences must hold the same positions before the batch (``seq_pos_min``/``seq_pos_max`` equal, else
  "coupled ... but have divereged", src/llama-batch.cpp), and a sequence's batch positions must start right after
  its last cell ("Y = X + 1"). So every branch first gets the committed prefix with ``llama_memory_seq_cp(mem, 0,
  b, -1, -1)``: in one stream that only adds the tag ``b`` to the prefix's cells (``llama_kv_cache::seq_cp``).
  (Were no branch given the prefix, all would be equally empty: llama.cpp decodes the tree without the prefix and
  says nothing.)
* The mask reads each token's first sequence id only (``set_input_kq_mask_impl``, ``seq_id[i][0]``; the ids of a
  token are an unordered_set, src/llama-batch.h): any one of a node's sequences gives it the right cells.
* "belongs to incompatible sequence sets" intersects, per sequence, the id sets of its tokens; each set holds the
  sequence itself, so a tree never trips it (nor can anything else, in this version).
* GGML_ASSERTs (a crash, not an error code): more tokens than ``n_batch`` (``llama_context::decode``), more
  outputs than ``n_outputs_max`` or fewer than ``n_seq_max`` of them (``output_reserve``), a sequence id past
  ``n_seq_max`` in ``seq_cp``/``seq_rm``. Every one of them is refused here first, with a ValueError.
* Branch sequences have no backend sampler, so their rows are whole logits; sequence 0 is not in the batch, so a
  sampler chain installed on it (:mod:`edgespec.models.readout`) neither samples nor counts these rows.

Cell order. Attention sums a token's cells in cell order, not position order. A unified pool reuses the lowest
freed cell first (``find_slot`` starts at the head ``seq_rm`` lowers), so had the kept path's cells a rejected
node's cell below them, the next tokens would sit there, below cells of lower positions, and score within
rounding of a chain, not equal to it: measured on SmolLM2 after one such keep, up to ~1 logit with the default F16
cache (CPU flash attention accumulates V in F16 there: ggml-cpu ops.cpp, ``VKQ16``) and ~0.5 after some rounds
with bit_exact's BF16 cache; with flash attention off, 0.0. So the batch lists the tree depth first, first child
first: the first-child path's cells follow the pending token's. :func:`keep_path` tags the accepted nodes that sit
there and decodes the rest of the path again on sequence 0 (one more forward pass, only when the accepted path
leaves the first-child path), so sequence 0 keeps its text in cells 0..n-1 in position order, as a chain decode
leaves it (measured: later rows equal decoding a token at a time, max |Δ| 0.0). A tree decoded and not kept must be
dropped (:func:`drop_tree`) before sequence 0 decodes again, for the same reason.

The batch is a ``llama_batch_init(rows, 0, B)`` of this call's own (a token may carry up to B sequence ids), freed
after it: microseconds, against a forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import llama_cpp
import numpy as np

from edgespec.errors import ModelError
from edgespec.models.backend import Model
from edgespec.models.llama_thread import runs_on_llama_thread
from edgespec.models.readout import read_rows
from edgespec.models.slot import MAX_ROWS
from edgespec.sampling import LOGITS
from edgespec.tree_verify import children_of


def tree_order(parents: Sequence[int]) -> list[int]:
    """The nodes depth first, children in index order (``parents[i]``: node ``i``'s parent, -1 for a child of the
    pending token, always < ``i``): the order of their cells."""
    kids = children_of(parents)  # kids[node + 1]; kids[0]: the pending token's
    order, stack = [], kids[0][::-1]
    while stack:
        order.append(node := stack.pop())
        stack.extend(kids[node + 1][::-1])
    return order


def depths(parents: Sequence[int]) -> list[int]:
    """Each node's depth: 1 for a child of the pending token (``parents[i] < i``)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def tree_paths(parents: Sequence[int]) -> list[list[int]]:
    """Each root-to-leaf path, as node indices from the root, in :func:`tree_order` (path ``k`` is branch sequence
    ``k + 1``); ``[[]]`` for no nodes (the pending token alone)."""
    inner = set(parents)
    paths = []
    for leaf in (i for i in tree_order(parents) if i not in inner):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths or [[]]


def drop_tree(model: Model) -> None:
    """Drop every branch sequence: a tree decoded and not kept. Do it before sequence 0 decodes again: the tree's
    cells held then would leave holes below sequence 0's next cells (see "Cell order" above)."""
    for b in range(1, 1 + model.tree_sequences):
        llama_cpp.llama_memory_seq_rm(model._mem, b, -1, -1)


@runs_on_llama_thread
def decode_tree(model: Model, pending: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
    """Decode ``pending`` (at ``n_past = len(model.kv_tokens)``) and the tree ``tokens``/``parents`` after sequence
    0's committed text in one ``llama_decode``; node ``i`` at depth ``d`` (1 for a child of ``pending``) sits at
    position ``n_past + d``. Returns float32 logits ``[1 + len(tokens), n_vocab]``: ``pending``'s row, then node
    ``i``'s at ``1 + i``. Sequence 0 and ``kv_tokens`` are left as they were; the branches hold the tree until
    :func:`keep_path` (or the next :func:`decode_tree`, which drops them first)."""
    n_branches = model.tree_sequences
    if n_branches < 1:
        raise ValueError(f"{model.name} was loaded without tree_sequences: it cannot decode a tree")
    if len(tokens) != len(parents):
        raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
    paths = tree_paths(parents)
    if len(paths) > n_branches:
        raise ValueError(f"a tree of {len(paths)} leaves: {model.name} has {n_branches} branch sequences")
    n_rows = 1 + len(tokens)
    if n_rows > min(MAX_ROWS, model.n_batch):
        raise ValueError(f"{n_rows} rows: one decode takes {min(MAX_ROWS, model.n_batch)} (output buffer, n_batch)")
    n_past = len(model.kv_tokens)
    if n_past + n_rows > model.n_ctx:  # one cell a row, and every position below n_past + n_rows
        raise ValueError(f"{n_past} committed tokens and {n_rows} of a tree do not fit the context of {model.n_ctx}")
    if any(not 0 <= t < model.n_vocab for t in (pending, *tokens)):
        raise ValueError(f"a token outside the vocabulary of {model.n_vocab}")
    mem = model._mem
    if llama_cpp.llama_memory_seq_pos_max(mem, 0) != n_past - 1:
        raise ValueError(f"sequence 0 does not hold the {n_past} tokens kv_tokens says")

    depth, seqs = depths(parents), [[] for _ in tokens]
    for b, path in enumerate(paths, start=1):
        for i in path:
            seqs[i].append(b)
    order = tree_order(parents)
    slot = {node: 1 + j for j, node in enumerate(order)}  # batch index of each node

    drop_tree(model)
    for b in range(1, 1 + len(paths)):
        llama_cpp.llama_memory_seq_cp(mem, 0, b, -1, -1)  # the committed prefix: tags on its cells, no copy
    batch = llama_cpp.llama_batch_init(n_rows, 0, len(paths))
    try:
        batch.n_tokens = n_rows
        for j, (tok, pos, ids) in enumerate(
            [(pending, n_past, range(1, 1 + len(paths)))] + [(tokens[i], n_past + depth[i], seqs[i]) for i in order]
        ):
            batch.token[j], batch.pos[j], batch.logits[j], batch.n_seq_id[j] = tok, pos, True, len(ids)
            for k, b in enumerate(ids):
                batch.seq_id[j][k] = b
        out = np.empty((n_rows, model.n_vocab), dtype=np.float32)
        wanted = [(0, 0)] + [(0, slot[i]) for i in range(len(tokens))]  # read back in node order
        t0 = time.perf_counter()
        rc = llama_cpp.llama_decode(model._ctx, batch)
        if rc != 0:
            raise ModelError(f"{model.name}: llama_decode of a tree failed with code {rc}")
        read_rows(model._ctx, wanted, [LOGITS], [out], [0], model.n_vocab, model.name)
        model.busy_seconds += time.perf_counter() - t0
    except BaseException:
        drop_tree(model)
        raise
    finally:
        llama_cpp.llama_batch_free(batch)
    return out


@runs_on_llama_thread
def keep_path(
    model: Model, pending: int, tokens: Sequence[int], parents: Sequence[int], accepted: Sequence[int]
) -> int:
    """After :func:`decode_tree` of the same tree: make sequence 0 hold its committed text, ``pending`` and the
    nodes ``accepted`` (indices from the root down, possibly none), and drop every branch sequence, so that the
    rejected nodes' cells are free. ``model.kv_tokens`` grows by ``pending`` and the accepted nodes' tokens.

    The accepted nodes on the tree's first-child path keep their cells; the rest of the path is decoded again on
    sequence 0 (see "Cell order" above). Returns how many tokens that decoded (0 on the first-child path)."""
    for k, i in enumerate(accepted):
        if not 0 <= i < len(parents) or parents[i] != (accepted[k - 1] if k else -1):
            raise ValueError(f"accepted nodes {list(accepted)} are not a path from the root")
    mem, n_past = model._mem, len(model.kv_tokens)
    branch, path = next((b, p) for b, p in enumerate(tree_paths(parents), 1) if p[: len(accepted)] == list(accepted))
    if (
        model.tree_sequences < branch
        or llama_cpp.llama_memory_seq_pos_max(mem, 0) != n_past - 1
        or llama_cpp.llama_memory_seq_pos_max(mem, branch) != n_past + len(path)
    ):
        raise ValueError("keep a path of the tree decode_tree decoded last, before anything else is decoded")
    order = tree_order(parents)
    n_kept = 0  # accepted nodes whose cells follow the pending token's
    while n_kept < len(accepted) and order[n_kept] == accepted[n_kept]:
        n_kept += 1
    llama_cpp.llama_memory_seq_cp(mem, branch, 0, n_past, n_past + 1 + n_kept)  # tags cells, positions [p0, p1)
    drop_tree(model)
    model.kv_tokens.extend([pending, *(tokens[i] for i in accepted[:n_kept])])
    rest = [tokens[i] for i in accepted[n_kept:]]
    if rest:
        model.decode(rest)
    return len(rest)
