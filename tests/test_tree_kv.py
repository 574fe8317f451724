"""One decode over a draft tree (edgespec.models.tree_kv) on the tiny real model: each node's logits are its path's
as a plain chain, the accepted path is kept and decoding goes on from it, rejected cells are freed, llama.cpp's
limits are refused before it sees them, and the tree's greedy walk emits plain greedy decoding's tokens.

Tolerance: tree rows and chain rows come from the same CPU kernels; they differ only in the batch's shape and in
the masked cells of the pool (which add exactly 0 to an attention sum). Measured on this model: max |Δ| = 0.0.
ATOL = 1e-3 leaves room for a kernel that rounds by batch shape (float32 sums over logits of ~10-20, ~1e-6
relative an operation), while a node that saw a cell it must not see moves its logits by ~15 (measured below).
What follows a keep is compared with a reference built as the tree model's KV was (short batches, or a token at a
time: a long batch rounds differently, ~0.5 here), and equals it only because keep_path leaves sequence 0's cells
in position order (tree_kv, "Cell order"; tagging a side path's cells instead gave ~1 logit off).
"""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from edgespec.models.backend import Model
from edgespec.models.slot import MAX_ROWS
from edgespec.models.tree_kv import decode_tree, drop_tree, keep_path, tree_order, tree_paths
from edgespec.sampling import ARGMAX

pytestmark = pytest.mark.real

ATOL = 1e-3
# On a busy 2-core machine two OpenMP threads wait on each other's barriers: a one-token decode of this model took
# ~390 ms with two threads, ~6 ms with one, measured while other tests ran.
THREADS = 1
BRANCHES = 4
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tree(tiny_model_path):
    model = Model(tiny_model_path, n_threads=THREADS, n_ctx=512, tree_sequences=BRANCHES)
    yield model
    model.close()


@pytest.fixture(scope="module")
def plain(tiny_model_path):
    model = Model(tiny_model_path, n_threads=THREADS, n_ctx=512)
    yield model
    model.close()


def chain(plain: Model, tokens: list[int]) -> np.ndarray:
    """The logits after ``tokens`` decoded as a plain chain from an empty KV."""
    plain.truncate(0)
    row = plain.decode(tokens, [len(tokens) - 1])[0]
    plain.truncate(0)
    return row


def stepwise(plain: Model, n_prompt: int, tokens: list[int]) -> np.ndarray:
    """The logits after ``tokens`` decoded as a round-by-round run builds its KV: the prompt but its last token in
    one batch, then one token a decode. (A long batch rounds differently from a tree's or a step's rows, ~0.5 in
    the logits with this model's F16 flash attention: not what these tests compare.)"""
    plain.truncate(0)
    plain.decode(tokens[: n_prompt - 1])
    for token in tokens[n_prompt - 1 : -1]:
        plain.decode([token])
    row = plain.decode(tokens[-1:], [0])[0]
    plain.truncate(0)
    return row


def top(row: np.ndarray, k: int) -> list[int]:
    return np.argsort(-row)[:k].tolist()


def start(model: Model, text: list[int]) -> int:
    """Commit ``text``: the KV holds all of it but the last token, which is pending (as a round leaves it)."""
    drop_tree(model)  # a tree a test left (not kept) would hold cells below the new ones
    model.truncate(0)
    model.decode(text[:-1])
    return text[-1]


def branches_empty(model: Model) -> bool:
    return all(llama_cpp.llama_memory_seq_pos_max(model._mem, b) == -1 for b in range(1, 1 + model.tree_sequences))


def path_tokens(tokens: list[int], parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


@pytest.fixture(scope="module")
def plausible(plain: Model) -> tuple[list[int], list[int], list[int]]:
    """The prompt and a tree of depth 3 from the model's own top-3: two children of the root, two under the first,
    a third level under both; leaves 3, 4, 5."""
    prompt = plain.tokenize(PROMPT)
    after = top(chain(plain, prompt), 3)
    a0, a1 = after[0], after[2]
    b0, b1 = top(chain(plain, [*prompt, a0]), 2)
    c0 = top(chain(plain, [*prompt, a0, b0]), 3)[1]
    c1 = top(chain(plain, [*prompt, a1]), 1)[0]
    return prompt, [a0, a1, b0, b1, c0, c1], [-1, -1, 0, 0, 2, 1]


def test_tree_paths_are_the_root_to_leaf_paths() -> None:
    assert tree_order([-1, -1, 0, 0, 2, 1]) == [0, 2, 4, 3, 1, 5]  # depth first, first child first
    assert tree_paths([-1, -1, 0, 0, 2, 1]) == [[0, 2, 4], [0, 3], [1, 5]]
    assert tree_paths([]) == [[]]
    with pytest.raises(ValueError):
        tree_paths([-1, 2, -1])  # a parent after its child


def test_each_node_scores_as_its_path_decoded_as_a_chain(tree: Model, plain: Model, plausible) -> None:
    prompt, tokens, parents = plausible
    pending = start(tree, prompt)
    tree.decode([pending], [0], ARGMAX)  # a sampler chain on sequence 0 must not touch the tree's rows
    tree.truncate(len(prompt) - 1)
    logits = decode_tree(tree, pending, tokens, parents)
    assert logits.shape == (1 + len(tokens), tree.n_vocab) and logits.dtype == np.float32
    np.testing.assert_allclose(logits[0], chain(plain, prompt), rtol=0, atol=ATOL)
    for i in range(len(tokens)):
        expected = chain(plain, [*prompt, *path_tokens(tokens, parents, i)])
        np.testing.assert_allclose(logits[1 + i], expected, rtol=0, atol=ATOL, err_msg=f"node {i}")
        assert top(logits[1 + i], 5) == top(expected, 5)
    # What a broken mask would give: node 3 (b1) seeing its sibling node 2 (b0), node 1 (a1) seeing node 0 (a0).
    a0, a1, b0, b1 = tokens[:4]
    for i, leaked in ((3, [a0, b0, b1]), (1, [a0, a1])):
        assert np.abs(logits[1 + i] - chain(plain, [*prompt, *leaked])).max() > 100 * ATOL
    # Sequence 0 is as it was; the branches hold the tree until it is kept.
    assert tree.kv_tokens == prompt[:-1]
    assert llama_cpp.llama_memory_seq_pos_max(tree._mem, 0) == len(prompt) - 2
    assert llama_cpp.llama_memory_seq_pos_max(tree._mem, 1) == len(prompt) - 1 + 3  # path [0, 2, 4]


# (accepted, tokens decoded again): off the first-child path 0, 2, 4 the rest of the path is decoded on sequence 0
@pytest.mark.parametrize("accepted, again", [([0, 2], 0), ([1, 5], 2), ([0, 3], 1), ([0, 2, 4], 0), ([], 0)])
def test_the_kept_path_is_sequence_0_and_decoding_goes_on(
    tree: Model, plain: Model, plausible, accepted, again
) -> None:
    prompt, tokens, parents = plausible
    pending = start(tree, prompt)
    decode_tree(tree, pending, tokens, parents)
    assert keep_path(tree, pending, tokens, parents, accepted) == again
    text = [*prompt, *(tokens[i] for i in accepted)]
    assert tree.kv_tokens == text
    assert llama_cpp.llama_memory_seq_pos_max(tree._mem, 0) == len(text) - 1
    assert branches_empty(tree)
    following = top(chain(plain, text), 2)[1]  # the next token: not one of the tree's
    np.testing.assert_allclose(tree.decode([following], [0])[0], chain(plain, [*text, following]), rtol=0, atol=ATOL)
    with pytest.raises(ValueError):  # the branches are gone: nothing is left to keep
        keep_path(tree, pending, tokens, parents, accepted)


def test_rounds_of_tree_and_keep_free_the_rejected_cells(tiny_model_path, plain: Model) -> None:
    """40 rounds of a 20-node tree, 2 nodes kept each: 720 rejected cells in a pool of 256, which holds them only if
    each keep frees them; a quarter of the kept paths are the first-child path (cells kept), the rest are decoded
    again. The text reached is then scored as decoding it a token at a time scores it."""
    rng = np.random.default_rng(0)
    with Model(tiny_model_path, n_threads=THREADS, n_ctx=256, n_batch=32, tree_sequences=BRANCHES) as model:
        text = model.tokenize(PROMPT)
        n_prompt = len(text)
        pending = start(model, text)
        parents = [i - 1 if i % 5 else -1 for i in range(20)]  # four chains of five from the root
        for _ in range(40):
            tokens = rng.integers(1, model.n_vocab, size=20).tolist()
            decode_tree(model, pending, tokens, parents)
            chain_at = 5 * int(rng.integers(4))  # 0: the first-child path (cells kept), else decoded again
            accepted = [chain_at, chain_at + 1]
            keep_path(model, pending, tokens, parents, accepted)
            text += [tokens[i] for i in accepted]
            pending = int(rng.integers(1, model.n_vocab))
            text.append(pending)
            assert branches_empty(model)
        assert model.kv_tokens == text[:-1] and len(text) == n_prompt + 40 * 3
        expected = stepwise(plain, n_prompt, text)
        np.testing.assert_allclose(model.decode([pending], [0])[0], expected, rtol=0, atol=ATOL)


def test_llama_cpp_limits_are_refused_first_and_the_model_still_works(
    tiny_model_path, tree: Model, plain: Model, plausible
) -> None:
    prompt, tokens, parents = plausible
    pending = start(tree, prompt)
    refused = [
        ([1] * (BRANCHES + 1), [-1] * (BRANCHES + 1)),  # more leaves than branch sequences
        ([1] * MAX_ROWS, [i - 1 for i in range(MAX_ROWS)]),  # 1 + 65 rows: past the output buffer
        ([1, 2], [-1]),  # a parent missing
        ([1, 2], [1, -1]),  # a parent after its child
        ([tree.n_vocab], [-1]),  # not a token
    ]
    for bad_tokens, bad_parents in refused:
        with pytest.raises(ValueError):
            decode_tree(tree, pending, bad_tokens, bad_parents)
    with pytest.raises(ValueError):
        decode_tree(plain, pending, tokens, parents)  # no branch sequences
    with pytest.raises(ValueError):
        keep_path(tree, pending, tokens, parents, [0, 3])  # nothing decoded
    logits = decode_tree(tree, pending, tokens, parents)
    with pytest.raises(ValueError):
        keep_path(tree, pending, tokens, parents, [2])  # not from the root
    with pytest.raises(ValueError):
        keep_path(tree, pending, tokens, parents, [0, 5])  # 5 is not 0's child
    keep_path(tree, pending, tokens, parents, [1, 5])
    assert tree.kv_tokens == [*prompt, tokens[1], tokens[5]] and branches_empty(tree)
    np.testing.assert_allclose(logits[1 + 5], chain(plain, [*prompt, tokens[1], tokens[5]]), rtol=0, atol=ATOL)

    with Model(tiny_model_path, n_threads=THREADS, n_ctx=256, n_batch=16, tree_sequences=2) as small:
        text = small.tokenize(PROMPT)
        pending = start(small, text)
        with pytest.raises(ValueError):
            decode_tree(small, pending, [1] * 16, [i - 1 for i in range(16)])  # 17 rows: past n_batch
        decode_tree(small, pending, [1] * 15, [i - 1 for i in range(15)])
        keep_path(small, pending, [1] * 15, [i - 1 for i in range(15)], [])  # frees the tree's 15 cells
        small.decode([1] * (small.n_ctx - len(text) - 4))
        with pytest.raises(ValueError):
            decode_tree(small, 1, [1, 2, 3, 4], [-1, 0, 1, 2])  # past the context
        logits = decode_tree(small, 1, [1, 2, 3], [-1, 0, -1])  # the last cell
        drop_tree(small)
        n_past = len(small.kv_tokens)
        expected = [small.decode([1, 1, 2], [0, 2])]  # the same as chains on the same KV
        small.truncate(n_past)
        expected.append(small.decode([1, 3], [1]))
        small.truncate(n_past)
        np.testing.assert_allclose(logits[[0, 2, 3]], np.concatenate(expected), rtol=0, atol=ATOL)
    for kwargs in ({"tree_sequences": MAX_ROWS}, {"tree_sequences": 2, "n_seq": 2}, {"tree_sequences": -1}):
        with pytest.raises(ValueError):
            Model(tiny_model_path, n_threads=THREADS, n_ctx=256, **kwargs)


def greedy(plain: Model, prompt: list[int], n: int) -> list[int]:
    plain.truncate(0)
    row = plain.decode(prompt, [len(prompt) - 1])[0]
    out = []
    while len(out) < n:
        out.append(int(row.argmax()))
        row = plain.decode(out[-1:], [0])[0]
    plain.truncate(0)
    return out


def test_the_trees_greedy_walk_emits_plain_greedy_decodings_tokens(tree: Model, plain: Model) -> None:
    """Trees of the right next tokens and wrong ones (the right one sometimes the second child, sometimes absent):
    the walk down the nodes that agree with each row's argmax emits what plain greedy decoding does."""
    prompt = plain.tokenize("Here is a short story about a robot who learns to paint:")
    n = 30
    reference = greedy(plain, prompt, n + 8)
    rng = np.random.default_rng(1)
    pending = start(tree, prompt)
    emitted: list[int] = []
    depths, again = [], []
    while len(emitted) < n:
        ahead = reference[len(emitted) :]

        def guess(d: int, ahead: list[int] = ahead) -> int:
            return ahead[d] if rng.random() < 0.75 else int(rng.integers(1, tree.n_vocab))

        # Two guesses at the root, two under the first, one more under each: depth 3, six nodes.
        first, second = (guess(0), int(rng.integers(1, tree.n_vocab)))[:: 1 if rng.random() < 0.7 else -1]
        tokens = [first, second, guess(1), int(rng.integers(1, tree.n_vocab)), guess(2), guess(1)]
        parents = [-1, -1, 0, 0, 2, 1]
        logits = decode_tree(tree, pending, tokens, parents)
        node, accepted = -1, []
        while True:
            best = int(logits[1 + node].argmax())
            child = next((i for i, p in enumerate(parents) if p == node and tokens[i] == best), None)
            emitted.append(best)
            if child is None:
                break
            accepted.append(child)
            node = child
        again.append(keep_path(tree, pending, tokens, parents, accepted))
        pending = best
        depths.append(len(accepted))
    assert emitted[:n] == reference[:n]
    assert tree.kv_tokens == [*prompt, *emitted[:-1]]
    # The test went through every depth, and through side paths (decoded again) as well as first-child ones.
    assert max(depths) == 3 and min(depths) == 0 and len(depths) < n and max(again) > 0
