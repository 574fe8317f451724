"""The llama.cpp adapter on the tiny real model: logit rows, truncation, prefix reuse, text."""

from __future__ import annotations

import logging
import re

import llama_cpp
import numpy as np
import pytest

from edgespec.errors import ContextOverflowError, ModelError
from edgespec.models.backend import Model
from edgespec.sampling import ARGMAX, LOGITS, Candidates, Readout

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model = Model(tiny_model_path, n_ctx=512, n_batch=8)
    yield model
    model.close()


SENTENCE = "The quick brown fox jumps over the lazy dog and runs"


def every_row(tiny: Model, tokens: list[int]) -> np.ndarray:
    tiny.truncate(0)
    every = tiny.decode(tokens, range(len(tokens)))  # spans two n_batch=8 chunks
    tiny.truncate(0)
    return every


def test_requested_rows_come_back_in_order(tiny: Model) -> None:
    tokens = tiny.tokenize(SENTENCE)
    every = every_row(tiny, tokens)
    picked = tiny.decode(tokens, [2, 5, 9])
    np.testing.assert_allclose(picked, every[[2, 5, 9]], atol=1e-3)
    assert tiny.kv_tokens == tokens


def test_argmax_readout_is_the_argmax_of_the_logits_rows(tiny: Model) -> None:
    tokens = tiny.tokenize(SENTENCE)
    every = every_row(tiny, tokens)
    top = tiny.decode(tokens, [2, 5, 9, 10], ARGMAX)
    assert tiny.readout_path(ARGMAX) == "argmax in llama.cpp"  # sampled in the graph, not emulated
    assert top == every[[2, 5, 9, 10]].argmax(axis=1).tolist()


def test_top_k_readout_is_the_k_best_of_each_row_with_their_logits(tiny: Model) -> None:
    tokens = tiny.tokenize(SENTENCE)
    every = every_row(tiny, tokens)
    rows = [1, 6, 8, 9, 10]  # both n_batch chunks
    got = tiny.decode(tokens, rows, Readout("top_k", 20))
    assert isinstance(got, Candidates) and [len(r) for r in got.ids] == [len(r) for r in got.logits] == [20] * 5
    for r, i in enumerate(rows):
        expected = np.argsort(-every[i])[:20]
        assert set(got.ids[r]) == set(expected.tolist())
        np.testing.assert_allclose(got.logits[r], every[i][got.ids[r]], atol=1e-3)


def log_norms(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    return top[:, 0] + np.log(np.exp(x - top).sum(axis=1))


def test_a_log_norm_readout_brings_each_rows_softmax_normaliser_from_the_graph(tiny: Model) -> None:
    # The normaliser over the whole vocabulary, computed in llama.cpp's graph (no whole row read), against the sum
    # over the rows read whole: what every log-probability of a verify is measured from.
    tokens = tiny.tokenize(SENTENCE)
    every = every_row(tiny, tokens)
    rows = [0, 3, 7, 8, 10]  # both n_batch chunks
    readout = Readout("top_k", 4, log_norm=True)
    got = tiny.decode(tokens, rows, readout)
    assert readout not in tiny._refused and tiny.readout_path(readout).endswith("(log-normaliser in llama.cpp)")
    assert isinstance(got, Candidates) and got.log_z is not None and len(got.log_z) == len(rows)
    np.testing.assert_allclose(got.log_z, log_norms(every[rows]), atol=1e-4)
    for r, i in enumerate(rows):  # the candidates are the top-k's, as without the normaliser
        assert set(got.ids[r]) == set(np.argsort(-every[i])[:4].tolist())
    assert tiny.decode(tokens[:1], [0], Readout("top_k", 4)).log_z is None  # only when asked for
    tiny.truncate(0)


def test_a_refused_log_norm_readout_is_emulated_from_whole_rows(tiny: Model) -> None:
    tokens = tiny.tokenize(SENTENCE)
    every = every_row(tiny, tokens)
    readout = Readout("top_k", 3, log_norm=True)
    tiny._refused.add(readout)  # as when llama.cpp cannot run the chain in its graph
    try:
        got = tiny.decode(tokens, [2, 9], readout)
    finally:
        tiny._refused.discard(readout)
        tiny.truncate(0)
    np.testing.assert_allclose(got.log_z, log_norms(every[[2, 9]]), atol=1e-4)


def test_switching_readouts_back_and_forth_keeps_the_kv_and_the_rows(tiny: Model) -> None:
    tokens = tiny.tokenize(SENTENCE)
    every = every_row(tiny, tokens)
    tiny.decode(tokens[:-1])
    for readout in (ARGMAX, Readout("top_k", 5), LOGITS, ARGMAX):
        got = tiny.decode(tokens[-1:], [0], readout)
        tiny.truncate(len(tokens) - 1)
        best = int(np.argmax(every[-1]))
        if readout.kind == "logits":
            assert int(np.argmax(got[0])) == best
        elif readout.kind == "argmax":
            assert int(got[0]) == best
        else:
            assert best in got.ids[0]
    assert tiny.kv_tokens == tokens[:-1]


def test_out_of_range_or_unordered_rows_are_refused(tiny: Model) -> None:
    tiny.truncate(0)
    with pytest.raises(ValueError):
        tiny.decode([1, 2], [2])
    with pytest.raises(ValueError):
        tiny.decode([1, 2, 3], [2, 1])
    assert tiny.kv_tokens == []


def test_truncate_then_redecode_gives_the_same_logits(tiny: Model) -> None:
    tokens = tiny.tokenize("def add(a, b):\n    return")
    tiny.truncate(0)
    first = tiny.decode(tokens, [len(tokens) - 1])[0]
    tiny.decode([11, 12, 13])
    tiny.truncate(len(tokens) - 1)
    again = tiny.decode(tokens[-1:], [0])[0]
    assert int(np.argmax(first)) == int(np.argmax(again))
    np.testing.assert_allclose(first, again, atol=0.05)


def test_sync_reuses_the_common_prefix(tiny: Model) -> None:
    a = tiny.tokenize("One two three four five six")
    tiny.truncate(0)
    assert tiny.sync(a) == len(a)
    b = a[:4] + tiny.tokenize(" seven eight", add_special=False)
    assert tiny.sync(b) == len(b) - 4
    assert tiny.kv_tokens == b


def test_context_overflow_is_an_error_not_a_crash(tiny: Model) -> None:
    tiny.truncate(0)
    with pytest.raises(ContextOverflowError):
        tiny.decode([1] * (tiny.n_ctx + 1))
    assert tiny.kv_tokens == []


def test_text_round_trip_and_pieces(tiny: Model) -> None:
    text = "Grüße, 世界! 🙂"
    tokens = tiny.tokenize(text, add_special=False)
    assert tiny.detokenize(tokens) == text
    assert b"".join(tiny.piece(t) for t in tokens).decode() == text


def test_missing_file_is_a_model_error(tmp_path) -> None:
    with pytest.raises(ModelError, match="not found"):
        Model(tmp_path / "absent.gguf")


def test_an_interrupted_decode_leaves_the_kv_as_it_was(tiny: Model, monkeypatch) -> None:
    # Ctrl+C (or a bad row) after llama_decode succeeded: the KV must not keep cells kv_tokens does not know of.
    prompt = tiny.tokenize("The capital of France is")
    tiny.truncate(0)
    tiny.decode(prompt[:-1])
    expected = tiny.decode(prompt[-1:], [0]).copy()
    tiny.truncate(len(prompt) - 1)

    def interrupted(*_args) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(llama_cpp, "llama_get_logits_ith", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tiny.decode(prompt[-1:], [0])
    monkeypatch.undo()
    assert tiny.kv_tokens == prompt[:-1]
    np.testing.assert_array_equal(tiny.decode(prompt[-1:], [0]), expected)  # at the right position, and it works
    tiny.truncate(0)


@pytest.fixture(scope="module")
def tiny3(tiny_model_path):
    model = Model(tiny_model_path, n_ctx=256, n_batch=16, n_seq=3)
    yield model
    model.close()


def test_sequences_decoded_together_score_as_each_alone(tiny3: Model) -> None:
    # Three prompts in one batched decode (split over n_batch=16), each with its own readout, against each decoded
    # alone on sequence 0: the same rows, whichever sequences share the batch.
    prompts = [tiny3.tokenize(t) for t in ("The capital of France is", "def add(a, b):\n    return", "1, 2, 3,")]
    readouts = [LOGITS, ARGMAX, Readout("top_k", 5, log_norm=True)]
    alone = []
    for prompt, readout in zip(prompts, readouts, strict=True):
        tiny3.truncate(0)
        alone.append(tiny3.decode(prompt, range(len(prompt) - 2, len(prompt)), readout))
    tiny3.truncate(0)
    after = tiny3.decode([*prompts[2], 7], [len(prompts[2])], ARGMAX)
    tiny3.truncate(0)
    for slot in tiny3.slots:
        slot.truncate(0)
    together = tiny3.decode_batch(
        [(slot, p, range(len(p) - 2, len(p)), r) for slot, p, r in zip(tiny3.slots, prompts, readouts, strict=True)]
    )
    assert np.allclose(together[0], alone[0], atol=1e-3)
    assert together[1] == alone[1]
    assert isinstance(together[2], Candidates)
    assert [sorted(ids) for ids in together[2].ids] == [sorted(ids) for ids in alone[2].ids]
    assert together[2].log_z == pytest.approx(alone[2].log_z, abs=1e-3)
    assert [slot.kv_tokens for slot in tiny3.slots] == prompts
    # Each sequence rolls back on its own; the others keep their cells.
    tiny3.slots[1].truncate(2)
    tiny3.slots[0].truncate(0)
    assert tiny3.slots[2].decode([7], [0], ARGMAX) == after
    for slot in tiny3.slots:
        slot.truncate(0)


def test_a_batch_llama_cpp_would_abort_on_is_refused_first(tiny3: Model) -> None:
    slot = tiny3.slots[0]
    slot.truncate(0)
    with pytest.raises(ValueError, match="own sequence"):
        tiny3.decode_batch([(slot, [1], [0], LOGITS), (slot, [2], [0], LOGITS)])
    with pytest.raises(ValueError, match="rows in one decode"):
        tiny3.decode_batch([(s, [1] * 40, range(40), ARGMAX) for s in tiny3.slots[:2]])
    assert [s.kv_tokens for s in tiny3.slots] == [[], [], []]
    with pytest.raises(ContextOverflowError):
        tiny3.decode_batch([(tiny3.slots[1], [1] * (tiny3.n_ctx + 1), (), LOGITS)])
    assert tiny3.n_ctx >= 256  # each sequence has the context asked for, not a third of it


def test_a_sequence_copies_another_ones_prefix_and_continues_as_it_would(tiny3: Model) -> None:
    prompt = tiny3.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
    source, copy, bystander = tiny3.slots
    for slot in tiny3.slots:
        slot.truncate(0)
    bystander.decode(prompt[:5])
    source.decode(prompt)
    copy.copy_prefix_from(source, len(prompt) - 4)  # llama.cpp copies the whole buffer; the rest is dropped
    assert copy.kv_tokens == prompt[:-4] and source.kv_tokens == prompt and bystander.kv_tokens == prompt[:5]
    resumed = copy.decode(prompt[-4:], [3], LOGITS)
    source.truncate(len(prompt) - 4)
    again = source.decode(prompt[-4:], [3], LOGITS)
    assert np.allclose(resumed, again, atol=1e-3)
    with pytest.raises(ValueError, match="prefix"):
        copy.copy_prefix_from(copy, 1)
    for slot in tiny3.slots:
        slot.truncate(0)


def test_llama_cpp_runs_the_forward_passes_decode_passes_predicts(tiny_model_path, monkeypatch, caplog) -> None:
    # llama.cpp logs each micro-batch it cuts a batch into when LLAMA_BATCH_DEBUG is set as its context is made.
    monkeypatch.setenv("LLAMA_BATCH_DEBUG", "1")
    model = Model(tiny_model_path, n_ctx=256, n_batch=16, n_seq=4)
    monkeypatch.delenv("LLAMA_BATCH_DEBUG")
    assert model.decode_passes({0: 1, 2: 1, 3: 1}) == [4]  # what the layouts below check against llama.cpp
    prompt = model.tokenize("The capital of France is")
    try:
        for slot in model.slots:
            slot.decode(prompt)
        layouts = [
            {2: 1, 0: 1, 3: 1, 1: 1},  # given out of order: one pass only because decode_batch lists them by id
            {3: 4, 0: 1, 1: 1, 2: 1},
            {0: 1, 2: 1, 3: 1},  # a gap: a throw-away token of sequence 1 keeps it one pass
            {0: 1, 3: 1},
            {0: 2, 1: 1, 2: 2, 3: 1},
            {1: 9, 0: 9},  # two llama_decode calls of n_batch=16
        ]
        for layout in layouts:
            for slot in model.slots:
                slot.truncate(len(prompt))
            parts = [(model.slots[s], [7] * n, [n - 1], ARGMAX) for s, n in layout.items()]
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="llama.cpp"):
                scores = model.decode_batch(parts)
            passes, added = [], False
            for record in caplog.records:
                message = record.getMessage()
                if "added ubatch to split" in message:
                    added = True
                elif added and (found := re.search(r"n_tokens\s*=\s*(\d+)", message)):
                    passes.append(int(found.group(1)))
                    added = False
            assert passes == model.decode_passes(layout), layout
            # A sequence filled in keeps the KV it had: its next decode goes on where it left off.
            for slot in model.slots:
                assert slot.kv_tokens == prompt + ([7] * layout[slot.seq_id] if slot.seq_id in layout else []), layout
                pos_max = llama_cpp.llama_memory_seq_pos_max(model._mem, slot.seq_id)
                assert pos_max == len(slot.kv_tokens) - 1, layout
            # Each part's rows come back in the order the parts were given, whatever order the batch ran them in.
            for (slot, tokens, rows, _), row in zip(parts, scores, strict=True):
                slot.truncate(len(prompt))
                assert slot.decode(tokens, rows, ARGMAX) == row
    finally:
        model.close()


def test_a_build_with_amx_kernels_loads_weights_without_them_and_says_so_once(
    tiny_model_path, monkeypatch, caplog
) -> None:
    """llama.cpp's AMX kernels crash on a K-quant batch of 2+ tokens (a segfault, seen on a Sapphire Rapids CPU):
    where the build has them, weights load without the extra buffer types that would hold them."""
    from edgespec.models import devices

    seen: list[bool] = []
    load = llama_cpp.llama_model_load_from_file

    def spy(path, params):
        seen.append(bool(params.use_extra_bufts))
        return load(path, params)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", spy)
    monkeypatch.setattr(devices, "_amx_said", False)
    without = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | REPACK = 1 |"
    with_amx = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 |"
    for info in (without, with_amx, with_amx):
        monkeypatch.setattr(devices, "system_info", lambda info=info: info)
        with caplog.at_level(logging.WARNING, logger="edgespec.models.devices"):
            Model(tiny_model_path, n_ctx=64).close()
    assert seen == [True, False, False]
    said = [r for r in caplog.records if "AMX" in r.getMessage()]
    assert len(said) == 1 and "make setup" in said[0].getMessage()
