"""GGUF preflight and the metadata-only vocabulary check.

Most cases use small GGUF files written here with gguf.GGUFWriter (milliseconds); the real tiny model and
the Qwen pair check the reader against files llama.cpp actually loads.
"""

from __future__ import annotations

import os
import struct
import time
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgespec.errors import ModelError, ModelNotFoundError, VocabMismatchError
from edgespec.models.gguf import preflight, read_vocab
from edgespec.models.vocab import VOCAB_SIZE_MARGIN, check_vocab_compatible

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
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    if tokenizer == "gpt2":
        writer.add_token_merges(["t o", "to k"])
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
    assert_one_line_error(exc, "corrupt", "'general.name'", "unknown value type 99")


def test_absurd_string_length(good: Path, tmp_path: Path) -> None:
    at = key_offset(good, "general.architecture") + 4  # the value's u64 length
    bad = patched(good, tmp_path / "s.gguf", at, struct.pack("<Q", 1 << 50))
    with pytest.raises(ModelError) as exc:
        preflight(bad)
    assert_one_line_error(exc, "corrupt", "'general.architecture'", "more than the file holds")


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
    assert_one_line_error(exc, "corrupt", "'output_norm.weight'", "9 dimensions")
    with pytest.raises(ModelError) as exc:
        preflight(patched(good, tmp_path / "ty.gguf", at + 4 + 8, struct.pack("<I", 250)))
    assert_one_line_error(exc, "corrupt", "'output_norm.weight'", "unknown type 250")


def test_missing_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "novocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(2048)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_tensor("w", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError) as exc:
        preflight(path)
    assert_one_line_error(exc, "tokenizer.ggml.tokens")


# ---------------------------------------------------------------------------------------------- one file per rule
#
# These files are written byte by byte, so a test can break exactly one rule (gguf.GGUFWriter refuses most of them).

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FORMATS = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q",
            F64: "d"}  # fmt: skip
F32_TYPE, Q4_0_TYPE = 0, 2  # ggml types
TOKENS = ["<unk>", "<s>", "</s>", "a", "b", "ab", "c", "abc"]


def enc_str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def enc_value(vtype: int, value) -> bytes:
    if vtype == STR:
        return enc_str(value)
    if vtype == ARR:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(enc_value(etype, item) for item in items)
    return struct.pack("<" + _FORMATS[vtype], value)


def base_metadata() -> dict:
    """A tiny llama model's metadata: what llama.cpp requires and nothing more."""
    return {
        "general.architecture": (STR, "llama"),
        "llama.context_length": (U32, 2048),
        "llama.embedding_length": (U32, 8),
        "llama.block_count": (U32, 1),
        "llama.attention.head_count": (U32, 2),
        "llama.attention.layer_norm_rms_epsilon": (F32, 1e-5),
        "tokenizer.ggml.model": (STR, "gpt2"),
        "tokenizer.ggml.tokens": (ARR, (STR, TOKENS)),
        "tokenizer.ggml.token_type": (ARR, (I32, [CONTROL] * 3 + [NORMAL] * (len(TOKENS) - 3))),
        "tokenizer.ggml.merges": (ARR, (STR, ["a b", "ab c"])),
        "tokenizer.ggml.bos_token_id": (U32, 1),
        "tokenizer.ggml.eos_token_id": (U32, 2),
    }


def base_tensors() -> list[dict]:
    """name, dims, ggml type and offset (None: packed after the previous one, as writers lay them out)."""
    return [
        {"name": "token_embd.weight", "dims": [8, len(TOKENS)], "type": F32_TYPE, "offset": None},
        {"name": "output_norm.weight", "dims": [8], "type": F32_TYPE, "offset": None},
    ]


def craft(
    path: Path,
    *,
    change: dict | None = None,
    entries: list[tuple] | None = None,
    tensors: list[dict] | None = None,
    alignment: int = 32,
    data_bytes: int | None = None,
) -> Path:
    """Write a GGUF: the base metadata with ``change`` applied (a None value drops the key), or exactly ``entries``
    as (key, type, value); then the tensor directory and zeroed data (``data_bytes`` of it if given)."""
    if entries is None:
        meta = base_metadata()
        meta.update(change or {})
        entries = [(k, t, v) for k, tv in meta.items() if tv is not None for t, v in [tv]]
    tensors = base_tensors() if tensors is None else tensors
    blob = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(entries)))
    for key, vtype, value in entries:
        blob += enc_str(key) + struct.pack("<I", vtype) + enc_value(vtype, value)
    end = 0
    for t in tensors:
        block, type_size = _type_size(t["type"])
        n_bytes = int(np.prod(t["dims"])) // block * type_size
        offset = end if t["offset"] is None else t["offset"]
        end = -(-(offset + n_bytes) // alignment) * alignment
        name = t["name"].encode() if isinstance(t["name"], str) else t["name"]
        blob += enc_str(name) + struct.pack("<I", len(t["dims"])) + struct.pack(f"<{len(t['dims'])}Q", *t["dims"])
        blob += struct.pack("<IQ", t["type"], offset)
    blob += bytes(-len(blob) % alignment) + bytes(end if data_bytes is None else data_bytes)
    path.write_bytes(bytes(blob))
    return path


def _type_size(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type; an unknown type (testing the rule on it) gets F32's."""
    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except ValueError:
        return 1, 4


def rejection(path: Path) -> str:
    """The one-line message preflight rejects ``path`` with (it must name the file)."""
    with pytest.raises(ModelError) as exc:
        preflight(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message, message
    return message


@pytest.fixture
def crafted(tmp_path: Path):
    return lambda **kw: craft(tmp_path / "crafted.gguf", **kw)


def test_the_handcrafted_base_file_passes(crafted) -> None:
    info = preflight(crafted())
    assert (info.architecture, info.n_vocab, info.n_tensors) == ("llama", len(TOKENS), 2)


# Counts and lengths beyond the bytes left in the file.


def test_a_token_length_of_2_64_is_an_error_not_an_overflow(crafted) -> None:
    """The length of one string inside the token array mangled to 2^64-1 used to raise OverflowError."""
    path = crafted()
    blob = bytearray(path.read_bytes())
    at = blob.index(enc_str("abc"))  # the last token's u64 length
    blob[at : at + 8] = struct.pack("<Q", (1 << 64) - 1)
    path.write_bytes(bytes(blob))
    assert "'tokenizer.ggml.tokens' runs past the end of the file" in rejection(path)


@pytest.mark.parametrize(
    ("needle", "skip", "field"),
    [  # where the u64 is: `skip` bytes into the first occurrence of `needle`
        (enc_str("general.architecture"), 0, "metadata key #0"),  # a key's length
        (enc_str("gpt2"), 0, "'tokenizer.ggml.model'"),  # a string value's length
        (struct.pack("<IQ", STR, 2) + enc_str("a b"), 4, "'tokenizer.ggml.merges'"),  # an array's count
        (enc_str("token_embd.weight"), 0, "tensor #0 name"),
    ],
)
def test_counts_and_lengths_beyond_the_file(crafted, needle: bytes, skip: int, field: str) -> None:
    path = crafted()
    blob = bytearray(path.read_bytes())
    at = blob.index(needle) + skip
    blob[at : at + 8] = struct.pack("<Q", 1 << 40)
    path.write_bytes(bytes(blob))
    message = rejection(path)
    assert field in message and ("more than the file" in message or "claims" in message), message


# Value types.


def test_unknown_element_type(crafted) -> None:
    assert "'tokenizer.ggml.merges' has unknown element type 13" in rejection(
        crafted(change={"tokenizer.ggml.merges": (ARR, (13, []))})
    )


def test_nested_arrays_are_refused(crafted) -> None:
    nested = (ARR, (ARR, [(U32, [1, 2]), (U32, [3])]))
    assert "'general.tags' is an array of arrays" in rejection(crafted(change={"general.tags": nested}))


def test_duplicate_and_empty_keys(crafted) -> None:
    entries = [(k, t, v) for k, (t, v) in base_metadata().items()]
    twice = [*entries, ("llama.block_count", U32, 1)]
    assert "'llama.block_count' appears twice" in rejection(crafted(entries=twice))
    assert "metadata key #12 is empty" in rejection(crafted(entries=[*entries, ("", U32, 1)]))


@pytest.mark.parametrize(("value", "problem"), [((U64, 32), "is a u64"), ((U32, 48), "not a power of two")])
def test_alignment(crafted, value: tuple, problem: str) -> None:
    message = rejection(crafted(change={"general.alignment": value}))
    assert "'general.alignment'" in message and problem in message


# The tensor directory.


def _with(index: int, **changes) -> list[dict]:
    tensors = base_tensors()
    tensors[index].update(changes)
    return tensors


@pytest.mark.parametrize(
    ("tensors", "expected"),
    [
        (_with(1, name="token_embd.weight"), "tensor 'token_embd.weight' appears twice"),
        (_with(1, name="x" * 64), "tensor #1 name is 64 bytes long"),
        (_with(1, dims=[8, 1, 1, 1, 1]), "tensor 'output_norm.weight' has 5 dimensions"),
        (_with(1, dims=[]), "tensor 'output_norm.weight' has 0 dimensions"),
        (_with(1, dims=[8, 0]), "tensor 'output_norm.weight' dimension 1 is 0"),
        (_with(1, dims=[1 << 32, 1 << 32]), "tensor 'output_norm.weight' has 4294967296x4294967296 elements"),
        (_with(1, type=99), "tensor 'output_norm.weight' has unknown type 99"),
        (_with(1, dims=[8], type=Q4_0_TYPE), "tensor 'output_norm.weight' rows have 8 elements, not a multiple"),
        (_with(1, offset=8 * 8 * 4 + 16), "tensor 'output_norm.weight' offset 272 is not a multiple of the alignment"),
        (_with(1, offset=0), "tensor 'output_norm.weight' offset 0 overlaps tensor 'token_embd.weight'"),
        (_with(1, offset=8 * 8 * 4 + 64), "tensor 'output_norm.weight' offset 320 leaves a gap of 64 bytes after"),
        (_with(0, offset=32), "tensor 'token_embd.weight' offset 32 leaves a gap of 32 bytes at the start"),
    ],
)
def test_tensor_directory(crafted, tensors: list[dict], expected: str) -> None:
    message = rejection(crafted(tensors=tensors))
    assert "corrupt GGUF" in message and expected in message, message


@pytest.mark.parametrize(("ggml_type", "name"), [(26, "I32"), (24, "I8")])
def test_integer_weights_in_a_known_architecture(crafted, ggml_type: int, name: str) -> None:
    """I32 has F32's size, so a mangled type code moves no offset; llama.cpp loads it and aborts in its kernels."""
    dims = [8] if ggml_type == 26 else [32]  # 32 bytes either way
    message = rejection(crafted(tensors=_with(1, type=ggml_type, dims=dims)))
    assert f"tensor 'output_norm.weight' has type {name}; a llama model's weights are floats or quantized" in message
    generic = {"general.architecture": (STR, "mamba")}
    generic |= {k.replace("llama.", "mamba."): v for k, v in base_metadata().items() if k.startswith("llama.")}
    generic |= {k: None for k in base_metadata() if k.startswith("llama.")}
    assert preflight(crafted(change=generic, tensors=_with(1, type=ggml_type, dims=dims))).architecture == "mamba"


def test_data_section_inside_the_file(crafted) -> None:
    path = crafted()
    blob = path.read_bytes()
    path.write_bytes(blob[:-40])  # the last tensor's data cut short (it ends the file: 32 bytes, already aligned)
    expected = f"truncated GGUF (file is {len(blob) - 40} bytes but its tensors need {len(blob)}: tensor 'output_norm"
    assert expected in rejection(path)
    huge = _with(1, dims=[1 << 40])  # fits an int64 and an address, not this file
    message = rejection(crafted(tensors=huge, data_bytes=512))
    assert "tensor 'output_norm.weight' (4398046511104 bytes) ends past the end" in message


# What llama.cpp requires of the architecture.


@pytest.mark.parametrize(
    "key",
    [
        "llama.context_length",
        "llama.embedding_length",
        "llama.block_count",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.attention.head_count",
    ],
)
def test_required_architecture_keys(crafted, key: str) -> None:
    assert f"metadata key {key!r} is missing; llama.cpp requires it for llama" in rejection(
        crafted(change={key: None})
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"general.architecture": None}, "'general.architecture' is missing"),
        ({"general.architecture": (U32, 7)}, "'general.architecture' is a u32; llama.cpp reads it as string"),
        ({"llama.block_count": (STR, "30")}, "'llama.block_count' is a string; llama.cpp reads it as u32"),
        ({"llama.context_length": (I32, 2048)}, "'llama.context_length' is an i32; llama.cpp reads it as u32"),
        ({"llama.rope.freq_base": (F64, 1e4)}, "'llama.rope.freq_base' is an f64; llama.cpp reads it as f32"),
        ({"llama.block_count": (U32, 0)}, "'llama.block_count' is 0 (1 to 512 allowed)"),
        ({"llama.block_count": (U32, 513)}, "'llama.block_count' is 513 (1 to 512 allowed)"),
        ({"llama.embedding_length": (U32, 0)}, "'llama.embedding_length' is 0"),
        ({"llama.attention.head_count": (U32, 0)}, "'llama.attention.head_count' is 0"),
        ({"llama.attention.head_count": (ARR, (U32, [2, 2]))}, "has 2 items but the model has 1 layers"),
        ({"llama.attention.head_count": (ARR, (F32, [2.0]))}, "'llama.attention.head_count' is an array of f32"),
        ({"llama.rope.freq_base": (F32, float("nan"))}, "'llama.rope.freq_base' is nan, not a finite number"),
        ({"llama.attention.layer_norm_rms_epsilon": (F32, 0.0)}, "is 0.0, not positive"),
        ({"llama.rope.scaling.type": (STR, "bogus")}, "'llama.rope.scaling.type' is 'bogus'; llama.cpp knows"),
        ({"llama.nextn_predict_layers": (U32, 2)}, "'llama.nextn_predict_layers' is 2, more than the 1 layers"),
        ({"llama.expert_count": (U32, 2000)}, "'llama.expert_count' is 2000 (at most 1024)"),
        ({"llama.expert_used_count": (U32, 2)}, "'llama.expert_used_count' is 2, more than the 0 experts"),
        ({"llama.expert_count": (U32, 8), "llama.expert_used_count": (U32, 0)}, "is 0 with 8 experts"),
        ({"llama.expert_group_count": (U32, 2)}, "'llama.expert_group_count' is 2 in a model without experts"),
    ],
)
def test_architecture_metadata(crafted, change: dict, expected: str) -> None:
    message = rejection(crafted(change=change))
    assert expected in message, message


def test_an_architecture_we_do_not_know_needs_only_the_generic_keys(crafted) -> None:
    """Unknown to edgespec, maybe known to llama.cpp: the keys every architecture needs, typed, are enough."""
    generic = {"general.architecture": (STR, "mamba")}
    generic |= {k.replace("llama.", "mamba."): v for k, v in base_metadata().items() if k.startswith("llama.")}
    generic |= {k: None for k in base_metadata() if k.startswith("llama.")}
    generic["mamba.attention.head_count"] = (U32, 0)  # no attention at all: fine for a recurrent model
    del generic["mamba.attention.layer_norm_rms_epsilon"]
    assert preflight(crafted(change=generic)).architecture == "mamba"
    generic["mamba.block_count"] = None
    assert "'mamba.block_count' is missing" in rejection(crafted(change=generic))


# The vocabulary.


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"tokenizer.ggml.model": None}, "'tokenizer.ggml.model' is missing"),
        ({"tokenizer.ggml.tokens": (ARR, (U32, [1, 2]))}, "'tokenizer.ggml.tokens' is missing or not an array of"),
        ({"tokenizer.ggml.tokens": (ARR, (STR, []))}, "'tokenizer.ggml.tokens' is empty"),
        ({"tokenizer.ggml.token_type": (ARR, (I32, [1] * 7))}, "'tokenizer.ggml.token_type' has 7 items for 8"),
        ({"tokenizer.ggml.token_type": (ARR, (U32, [1] * 8))}, "'tokenizer.ggml.token_type' is not an array of i32"),
        ({"tokenizer.ggml.scores": (ARR, (F32, [0.0] * 9))}, "'tokenizer.ggml.scores' has 9 items for 8 tokens"),
        ({"tokenizer.ggml.merges": None}, "'tokenizer.ggml.merges' is missing; a 'gpt2' tokenizer needs it"),
        ({"tokenizer.ggml.merges": (STR, "a b")}, "'tokenizer.ggml.merges' is not an array of strings"),
        ({"tokenizer.ggml.eos_token_id": (U32, 8)}, "'tokenizer.ggml.eos_token_id' is 8, outside the 8-token"),
        ({"tokenizer.ggml.padding_token_id": (U32, 1 << 31)}, "'tokenizer.ggml.padding_token_id' is 2147483648"),
        ({"tokenizer.ggml.bos_token_id": (I32, 1)}, "'tokenizer.ggml.bos_token_id' is an i32; llama.cpp reads it"),
        ({"tokenizer.ggml.add_bos_token": (U8, 1)}, "'tokenizer.ggml.add_bos_token' is a u8; llama.cpp reads it as"),
    ],
)
def test_vocabulary_metadata(crafted, change: dict, expected: str) -> None:
    message = rejection(crafted(change=change))
    assert expected in message, message


@pytest.mark.parametrize(
    ("tokens", "pair"),
    [
        (["<unk>", "<s>", "</s>", "a", "b", "a", "c", "abc"], "tokens 3 and 5 the same text 'a'"),
        # llama.cpp keys its map by the text up to the first NUL: 'ab\0x' is 'ab' to it
        (["<unk>", "<s>", "</s>", "a", "b", "ab", "c", "ab\0x"], "tokens 5 and 7 the same text 'ab'"),
        # and names an empty token [EMPTY_<id>]
        (["<unk>", "<s>", "</s>", "", "[EMPTY_3]", "ab", "c", "abc"], "tokens 3 and 4 the same text '[EMPTY_3]'"),
    ],
)
def test_token_texts_are_unique_as_llama_cpp_sees_them(crafted, tokens: list[str], pair: str) -> None:
    message = rejection(crafted(change={"tokenizer.ggml.tokens": (ARR, (STR, tokens))}))
    assert "'tokenizer.ggml.tokens' gives " + pair in message, message


def test_empty_tokens_are_distinct_to_llama_cpp(crafted) -> None:
    tokens = ["<unk>", "<s>", "</s>", "", "", "ab", "c", "abc"]  # [EMPTY_3] and [EMPTY_4]
    assert preflight(crafted(change={"tokenizer.ggml.tokens": (ARR, (STR, tokens))})).n_vocab == 8


def test_no_single_mutation_escapes_as_another_exception(crafted) -> None:
    """Every byte of a small file set to a few values: preflight answers with a file or a ModelError, nothing else.

    (The fuzz test does this for real models through the whole command; this one covers every offset in a second.)
    """
    blob = crafted().read_bytes()
    path = crafted()
    outcomes: Counter[str] = Counter()
    for at in range(4, len(blob) - 8 * 8 * 4):  # the header, metadata and tensor directory
        for value in (0x00, 0x7F, 0xFF):
            path.write_bytes(blob[:at] + bytes([value]) + blob[at + 1 :])
            try:
                preflight(path)
                outcomes["passed"] += 1
            except ModelError as exc:
                assert "\n" not in str(exc)
                outcomes["rejected"] += 1
    assert outcomes["rejected"] > outcomes["passed"] > 0


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
