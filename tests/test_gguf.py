"""GGUF preflight and the metadata-only vocabulary check.

Most cases use small GGUF files written here with gguf.GGUFWriter (milliseconds); the real tiny model and
the Qwen pair check the reader against files llama.cpp actually loads.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgespec.errors import ModelError, ModelNotFoundError, VocabMismatchError
from edgespec.models.gguf import VOCAB_SIZE_MARGIN, check_vocab_compatible, preflight, read_vocab

NORMAL, CONTROL = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)


def write_gguf(
    path: Path,
    *,
    tokens: list[str] | None = None,
    token_types: list[int] | None = None,
    tokenizer: str = "gpt2",
    bos: int = 1,
    eos: int = 2,
    name: str = "synthetic",
    chat_template: str | None = "{% for m in messages %}{{ m.content }}{% endfor %}",
) -> Path:
    """A small but complete GGUF: metadata like a real model's, two F32 tensors."""
    tokens = tokens if tokens is not None else ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(2048)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(
        token_types if token_types is not None else [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    )
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "good.gguf")


def patched(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    blob = bytearray(src.read_bytes())
    blob[offset : offset + len(data)] = data
    dst.write_bytes(bytes(blob))
    return dst


def key_offset(path: Path, key: str) -> int:
    """Offset just past a metadata key's text, where its u32 value type sits."""
    blob = path.read_bytes()
    return blob.index(key.encode()) + len(key)


def assert_one_line_error(exc: pytest.ExceptionInfo[ModelError], *fragments: str) -> None:
    message = str(exc.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


# ---------------------------------------------------------------------------------------------- facts


def test_preflight_reports_the_facts(good: Path) -> None:
    info = preflight(good)
    assert info.architecture == "llama"
    assert info.name == "synthetic"
    assert info.quantization == "F32"
    assert info.context_length == 2048
    assert info.n_vocab == 400
    assert (info.tokenizer_model, info.bos_id, info.eos_id) == ("gpt2", 1, 2)
    assert info.has_chat_template and info.chat_template and "messages" in info.chat_template
    assert info.file_size == good.stat().st_size
    assert info.n_tensors == 2
    texts, types = read_vocab(info)
    assert texts[:4] == [b"<unk>", b"<s>", b"</s>", b"tok0"]
    assert types is not None and types[:4] == [CONTROL, CONTROL, CONTROL, NORMAL]


def test_preflight_without_chat_template(tmp_path: Path) -> None:
    info = preflight(write_gguf(tmp_path / "plain.gguf", chat_template=None))
    assert not info.has_chat_template and info.chat_template is None


# ---------------------------------------------------------------------------------------------- bad files


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelError) as exc:
        preflight(tmp_path / "empty.gguf")
    assert_one_line_error(exc, "empty file")


def test_random_bytes(tmp_path: Path) -> None:
    (tmp_path / "random.gguf").write_bytes(os.urandom(4096))
    with pytest.raises(ModelError) as exc:
        preflight(tmp_path / "random.gguf")
    assert_one_line_error(exc, "not a GGUF file")


def test_wrong_magic(good: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "magic.gguf", 0, b"GGML"))
    assert_one_line_error(exc, "not a GGUF file", "GGML")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        preflight(tmp_path / "nope.gguf")
    with pytest.raises(ModelError) as exc:
        preflight(tmp_path)
    assert_one_line_error(exc, "is a directory")


@pytest.mark.parametrize("keep", [2, 12, 200, 1500, -100, -1])
def test_truncated(good: Path, tmp_path: Path, keep: int) -> None:
    """Cut in the magic, the header counts, the metadata, the token list and the tensor data."""
    blob = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(blob[:keep])
    with pytest.raises(ModelError) as exc:
        preflight(cut)
    assert_one_line_error(exc, "truncated", str(cut))


def test_unknown_value_type(good: Path, tmp_path: Path) -> None:
    bad = patched(good, tmp_path / "t.gguf", key_offset(good, "general.name"), struct.pack("<I", 99))
    with pytest.raises(ModelError) as exc:
        preflight(bad)
    assert_one_line_error(exc, "corrupt", "unknown value type 99")


def test_absurd_string_length(good: Path, tmp_path: Path) -> None:
    at = key_offset(good, "general.architecture") + 4  # the value's u64 length
    bad = patched(good, tmp_path / "s.gguf", at, struct.pack("<Q", 1 << 50))
    with pytest.raises(ModelError) as exc:
        preflight(bad)
    assert_one_line_error(exc, "corrupt", "exceeds the whole file")


def test_absurd_array_count(good: Path, tmp_path: Path) -> None:
    at = key_offset(good, "tokenizer.ggml.tokens") + 8  # after value type and element type: the count
    bad = patched(good, tmp_path / "a.gguf", at, struct.pack("<Q", 1 << 60))
    with pytest.raises(ModelError) as exc:
        preflight(bad)
    assert_one_line_error(exc, "corrupt", "tokenizer.ggml.tokens")


def test_key_not_utf8(good: Path, tmp_path: Path) -> None:
    at = key_offset(good, "general.name") - len("general.name")
    bad = patched(good, tmp_path / "k.gguf", at, b"\xff\xfe")
    with pytest.raises(ModelError) as exc:
        preflight(bad)
    assert_one_line_error(exc, "corrupt", "UTF-8")


def test_absurd_header_counts_and_version(good: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "c.gguf", 16, struct.pack("<Q", 1 << 40)))  # kv count
    assert_one_line_error(exc, "corrupt", "metadata keys")
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "v.gguf", 4, struct.pack("<I", 7)))
    assert_one_line_error(exc, "version 7")
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "be.gguf", 4, struct.pack(">I", 3)))
    assert_one_line_error(exc, "big-endian")


def test_bad_tensor_entry(good: Path, tmp_path: Path) -> None:
    blob = good.read_bytes()
    at = blob.index(b"output_norm.weight") + len("output_norm.weight")  # n_dims, dims[1], type, offset
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "d.gguf", at, struct.pack("<I", 9)))
    assert_one_line_error(exc, "corrupt", "9 dimensions")
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "ty.gguf", at + 4 + 8, struct.pack("<I", 250)))
    assert_one_line_error(exc, "corrupt", "unknown type 250")


def test_missing_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "novocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError) as exc:
        preflight(path)
    assert_one_line_error(exc, "tokenizer.ggml.tokens")


# ---------------------------------------------------------------------------------------------- vocabulary


def test_same_vocabulary_is_compatible(tmp_path: Path) -> None:
    check_vocab_compatible(
        preflight(write_gguf(tmp_path / "a.gguf")), preflight(write_gguf(tmp_path / "b.gguf"))
    )


def test_sizes_within_margin_are_compatible(tmp_path: Path) -> None:
    base = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    padded = base + [f"[PAD{i}]" for i in range(VOCAB_SIZE_MARGIN)]
    a = preflight(write_gguf(tmp_path / "a.gguf", tokens=base))
    b = preflight(write_gguf(tmp_path / "b.gguf", tokens=padded))
    check_vocab_compatible(a, b)
    c = preflight(write_gguf(tmp_path / "c.gguf", tokens=[*padded, "one-too-many"]))
    with pytest.raises(VocabMismatchError, match="more than 128 apart"):
        check_vocab_compatible(a, c)


def test_first_differing_token_is_named(tmp_path: Path) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    other = list(tokens)
    other[50], other[300] = "zzz\nnewline", "late"
    a = preflight(write_gguf(tmp_path / "target.gguf", tokens=tokens, name="Target"))
    b = preflight(write_gguf(tmp_path / "draft.gguf", tokens=other, name="Draft"))
    with pytest.raises(VocabMismatchError) as exc:
        check_vocab_compatible(a, b)
    message = str(exc.value)
    assert "\n" not in message
    assert "'Target' (target.gguf)" in message and "'Draft' (draft.gguf)" in message
    assert "token 50" in message and "'tok47'" in message and "zzz\\nnewline" in message


def test_specials_may_differ(tmp_path: Path) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    other = list(tokens)
    other[0] = "<pad>"  # a control token in both files
    check_vocab_compatible(
        preflight(write_gguf(tmp_path / "a.gguf", tokens=tokens)),
        preflight(write_gguf(tmp_path / "b.gguf", tokens=other)),
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [({"tokenizer": "llama"}, "uses tokenizer"), ({"bos": 0}, "BOS id"), ({"eos": 0}, "EOS id")],
)
def test_tokenizer_kind_and_special_ids_must_match(tmp_path: Path, change: dict, expected: str) -> None:
    a = preflight(write_gguf(tmp_path / "a.gguf"))
    b = preflight(write_gguf(tmp_path / "b.gguf", **change))
    with pytest.raises(VocabMismatchError, match=expected):
        check_vocab_compatible(a, b)


# ---------------------------------------------------------------------------------------------- real files


@pytest.mark.real
def test_real_tiny_model(tiny_model_path: Path, tmp_path: Path) -> None:
    start = time.perf_counter()
    info = preflight(tiny_model_path)
    assert time.perf_counter() - start < 0.5
    assert (info.architecture, info.quantization, info.n_vocab) == ("llama", "Q4_1", 49152)
    assert (info.context_length, info.bos_id, info.eos_id) == (8192, 1, 2)
    assert info.has_chat_template
    # The first 8 MB hold the metadata and some of the weights: a download cut short.
    cut = tmp_path / "cut.gguf"
    with open(tiny_model_path, "rb") as src:
        cut.write_bytes(src.read(8 << 20))
    with pytest.raises(ModelError, match="truncated.*tensors need"):
        preflight(cut)


@pytest.mark.real
def test_real_qwen_pair_is_compatible_and_fast(qwen_target_path: Path, qwen_draft_path: Path) -> None:
    start = time.perf_counter()
    target, draft = preflight(qwen_target_path), preflight(qwen_draft_path)
    check_vocab_compatible(target, draft)
    assert time.perf_counter() - start < 1.0
    assert target.n_vocab == draft.n_vocab == 151936
    assert (target.quantization, target.architecture, target.context_length) == ("Q4_K_M", "qwen2", 32768)


@pytest.mark.real
def test_real_qwen_and_smollm_are_incompatible(qwen_target_path: Path, tiny_model_path: Path) -> None:
    with pytest.raises(VocabMismatchError, match="Qwen2.5 Coder 1.5B.*Smollm2"):
        check_vocab_compatible(preflight(qwen_target_path), preflight(tiny_model_path))
