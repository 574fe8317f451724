"""GGUF preflight: read a file's header, metadata and tensor directory in pure Python before llama.cpp sees it.

llama.cpp checks the container format itself, but it trusts much of what the metadata says: a vocabulary with two
tokens of the same text, a layer count of zero or an unknown RoPE scaling type end in a ``GGML_ASSERT`` and an
abort (SIGABRT) that takes the whole process down. This module rejects all of that first, each problem a one-line
:class:`ModelError` that names the file, the field and what is wrong. What it checks:

- the container: every count and length within the bytes left in the file, known value types, no nested arrays,
  unique non-empty keys (llama.cpp's own limits included: 2^30 items, 63-byte tensor names);
- the tensor directory: unique names, 1-4 dimensions each at least 1, element counts and byte sizes that do not
  overflow, known ggml types (and, for the architectures edgespec knows, no integer types where weights belong),
  offsets aligned and packed in file order the way llama.cpp lays them out (so none overlap), and a data section
  that lies inside the file;
- what llama.cpp requires of the metadata (:mod:`edgespec.models.gguf_rules`): the architecture's keys present
  with the types llama.cpp reads, values its asserts need, vocabulary arrays of one length, unique token texts,
  special-token ids inside the vocabulary.

The container and tensor-directory checks stay in this one module (a little over 500 lines): they are one pass over
the file through one bounds-checked reader, and the rules about what the metadata means are already apart.

Whether a target and a draft share a vocabulary is :mod:`edgespec.models.vocab`'s question; this module reads
the token texts it compares (:func:`read_vocab`, :func:`token_array_bytes`).

Why not ``gguf.GGUFReader``: it builds numpy views for every field and tensor, seconds on a model with a large
vocabulary, where walking the same bytes with ``struct`` over an mmap takes milliseconds. The ``gguf`` package
still supplies the tables (quantization block sizes, file type names).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from edgespec.errors import ModelError, ModelNotFoundError
from edgespec.models.gguf_rules import (
    ARRAY,
    STRING,
    Corrupt,
    Meta,
    Truncated,
    check_metadata,
    check_tensor_types,
    show,
)

__all__ = ["GGUFInfo", "preflight", "read_vocab", "token_array_bytes"]

_MAGIC = b"GGUF"
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_SCALARS = {vtype: struct.Struct("<" + fmt) for vtype, fmt in _SCALAR_FORMATS.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Limits of llama.cpp's reader (ggml/src/gguf.cpp, ggml.h): it refuses files beyond them.
_MAX_STRING_BYTES = 1 << 30
_MAX_ARRAY_ITEMS = 1 << 30
_MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME (64) with the terminating NUL
_MAX_DIMS = 4
_INT64_MAX = (1 << 63) - 1
_SIZE_MAX = (1 << 64) - 1
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class _ArrayRef:
    """Where an array value sits in the file, so big arrays (token texts) are read only when needed."""

    offset: int  # first element
    count: int
    etype: int
    end: int  # one past the last element


@dataclass(frozen=True)
class _Tensor:
    name: str
    n_dims: int
    ggml_type: int
    n_elements: int
    offset: int  # from the start of the data section
    n_bytes: int


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str | None
    quantization: str | None
    context_length: int | None
    n_vocab: int
    tokenizer_model: str | None
    bos_id: int | None
    eos_id: int | None
    has_chat_template: bool
    chat_template: str | None
    file_size: int
    tokenizer_pre: str | None = None
    n_tensors: int = 0
    gguf_version: int = 3
    n_params: int = 0  # sum of the tensors' element counts (of this file only, for a split model's part)
    add_bos: bool | None = None  # tokenizer.ggml.add_bos_token; None when the file does not say
    add_eos: bool | None = None  # tokenizer.ggml.add_eos_token
    _tokens: _ArrayRef | None = field(default=None, repr=False, compare=False)
    _token_types: _ArrayRef | None = field(default=None, repr=False, compare=False)

    def label(self) -> str:
        """How messages name this model: its metadata name and file name."""
        return f"'{self.name}' ({self.path.name})" if self.name else f"'{self.path.name}'"

    def facts(self) -> dict[str, Any]:
        """The public fields as plain JSON-able values (for `models info --json`)."""
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "name": self.name,
            "quantization": self.quantization,
            "context_length": self.context_length,
            "n_vocab": self.n_vocab,
            "tokenizer_model": self.tokenizer_model,
            "tokenizer_pre": self.tokenizer_pre,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "has_chat_template": self.has_chat_template,
            "file_size": self.file_size,
            "n_tensors": self.n_tensors,
            "gguf_version": self.gguf_version,
        }


# ---------------------------------------------------------------------------------------------- reading


class _Reader:
    """A bounds-checked cursor over the mapped file: no read goes past ``size``, no length is taken on trust."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    @property
    def left(self) -> int:
        return self.size - self.pos

    def _take(self, n: int, what: str) -> int:
        start = self.pos
        if n > self.size - start:
            raise Truncated(f"{what}: the file ends at byte {self.size}")
        self.pos = start + n
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.buf, self._take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.buf, self._take(8, what))[0]

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"{what} length")
        if n > _MAX_STRING_BYTES or n > self.size:  # no complete file could hold it: mangled, not cut short
            raise Corrupt(f"{what}: a length of {n} bytes (at offset {self.pos - 8}) is more than the file holds")
        start = self._take(n, what)
        return self.buf[start : start + n]

    def scalar(self, vtype: int, what: str) -> Any:
        fmt = _SCALARS[vtype]
        return fmt.unpack_from(self.buf, self._take(fmt.size, what))[0]

    def array(self, what: str, collect_strings: bool) -> tuple[_ArrayRef, list[bytes] | None]:
        """Read an array header and walk its items; the texts of a string array come back when asked for."""
        etype = self.u32(f"{what} element type")
        count = self.u64(f"{what} item count")
        if etype == ARRAY:
            raise Corrupt(f"{what} is an array of arrays, which llama.cpp cannot read")
        if etype not in _SCALARS and etype != STRING:
            raise Corrupt(f"{what} has unknown element type {etype}")
        width = _SCALARS[etype].size if etype in _SCALARS else 8  # a string costs at least its 8-byte length
        if count > _MAX_ARRAY_ITEMS or count * width > self.size:
            raise Corrupt(f"{what} claims {count} items, more than the file could hold")
        if count * width > self.left:
            raise Truncated(f"{what} ({count} items) runs past the end of the file")
        start, texts = self.pos, None
        if etype == STRING:
            self.pos, texts = _walk_strings(self.buf, self.pos, count, self.size, what, collect_strings)
        else:
            self.pos += count * width
        return _ArrayRef(start, count, etype, self.pos), texts


def _walk_strings(
    buf: mmap.mmap, pos: int, count: int, end: int, what: str, collect: bool
) -> tuple[int, list[bytes] | None]:
    """Step over ``count`` length-prefixed strings (and keep their bytes if ``collect``).

    The hot loop of preflight (Qwen: 151,936 tokens and 151,387 merges), so one unpack per string and no check
    inside the loop: a length that runs past the end leaves ``pos`` beyond ``end`` (or makes the next unpack fail),
    and either is caught once, after the loop.
    """
    unpack = _U64.unpack_from
    texts: list[bytes] | None = None
    try:
        if collect:
            texts = []
            append = texts.append
            for _ in range(count):
                n = unpack(buf, pos)[0]
                pos += 8
                append(buf[pos : pos + n])
                pos += n
        else:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
    except (struct.error, OverflowError):  # an offset past the map, or beyond what an index can hold
        pos = end + 1
    if pos > end:
        raise Truncated(f"{what} runs past the end of the file (a string length in it is wrong, or the file is cut)")
    return pos, texts


def _open_map(path: Path) -> tuple[Any, mmap.mmap | None, int]:
    """Open and map ``path``; errors a user can act on become ModelError here."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the caller together with the map
    except FileNotFoundError:
        raise ModelNotFoundError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ModelError(f"{path} is a directory, not a GGUF file; pass the .gguf file inside it") from None
    except OSError as exc:
        raise ModelError(f"cannot open {path}: {exc.strerror or exc}") from None
    size = os.fstat(handle.fileno()).st_size
    if size == 0:
        handle.close()
        raise ModelError(f"{path}: empty file (0 bytes), not a GGUF model; delete it and download it again")
    try:
        return handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ), size
    except (OSError, ValueError) as exc:
        handle.close()
        raise ModelError(f"cannot map {path}: {exc}") from None


def preflight(path: str | os.PathLike[str]) -> GGUFInfo:
    """Check that ``path`` is a complete, well-formed GGUF model llama.cpp can load, and report what it is.

    Reads only the header, the metadata and the tensor directory (no hashing, no weights). Raises
    :class:`ModelError` (:class:`ModelNotFoundError` for a missing file) with a one-line message naming the file
    and the field at fault; never any other exception.
    """
    path = Path(path)
    handle, buf, size = _open_map(path)
    try:
        return _parse(path, buf, size)
    except Truncated as exc:
        raise ModelError(f"{path}: truncated GGUF ({exc}); delete it and download it again") from None
    except Corrupt as exc:
        raise ModelError(f"{path}: corrupt GGUF ({exc}); delete it and download it again") from None
    except (struct.error, OverflowError, ValueError, IndexError, MemoryError) as exc:
        # Every read above is bounds-checked; this is the net under that promise, so a mangled byte the checks
        # did not foresee still ends in a message, not a traceback.
        raise ModelError(f"{path}: corrupt GGUF (unreadable: {exc}); delete it and download it again") from None
    finally:
        buf.close()
        handle.close()


def _parse(path: Path, buf: mmap.mmap, size: int) -> GGUFInfo:
    r = _Reader(buf, size)
    version, n_tensors, n_kv = _read_header(path, r)
    meta, token_texts = _read_metadata(r, n_kv)
    alignment = _alignment(meta)
    tensors = _read_tensor_infos(r, n_tensors, alignment)
    _check_data_section(r, tensors, alignment)
    check_metadata(meta, token_texts)
    arch = meta.str("general.architecture")
    check_tensor_types(arch, ((t.name, t.ggml_type) for t in tensors))

    tokens = meta.value("tokenizer.ggml.tokens")
    types = meta.value("tokenizer.ggml.token_type")  # checked: absent or one int32 per token
    template = meta.str("tokenizer.chat_template") or None
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=meta.str("general.name"),
        quantization=_quantization(meta.value("general.file_type"), tensors),
        context_length=meta.int(f"{arch}.context_length"),
        n_vocab=tokens.count,
        tokenizer_model=meta.str("tokenizer.ggml.model"),
        bos_id=meta.int("tokenizer.ggml.bos_token_id"),
        eos_id=meta.int("tokenizer.ggml.eos_token_id"),
        has_chat_template=template is not None,
        chat_template=template,
        file_size=size,
        tokenizer_pre=meta.str("tokenizer.ggml.pre"),
        n_tensors=n_tensors,
        gguf_version=version,
        n_params=sum(t.n_elements for t in tensors),
        add_bos=meta.value("tokenizer.ggml.add_bos_token"),  # checked: a bool or absent
        add_eos=meta.value("tokenizer.ggml.add_eos_token"),
        _tokens=tokens,
        _token_types=types,
    )


def _read_header(path: Path, r: _Reader) -> tuple[int, int, int]:
    head = bytes(r.buf[:4])
    if len(head) < 4 and _MAGIC.startswith(head):
        raise Truncated(f"file is only {r.size} bytes")
    if head != _MAGIC:
        raise ModelError(
            f"{path}: not a GGUF file (starts with {head!r}, expected {_MAGIC!r}); pass a .gguf model"
        )
    r.pos = 4
    version = r.u32("header version")
    if version not in (2, 3):
        if _U32.unpack(_U32.pack(version)[::-1])[0] in (2, 3):
            raise ModelError(
                f"{path}: big-endian GGUF is not supported; use a little-endian build of the model"
            )
        raise Corrupt(f"header: unsupported GGUF version {version} (expected 2 or 3)")
    n_tensors = r.u64("header tensor count")
    n_kv = r.u64("header metadata count")
    # A key/value pair or a tensor entry takes at least 12 bytes: absurd counts mean mangled bytes, and
    # rejecting them here avoids a billion-iteration loop.
    if n_kv * 12 > r.left or n_tensors * 12 > r.left:
        raise Corrupt(f"header claims {n_kv} metadata keys and {n_tensors} tensors in a {r.size}-byte file")
    return version, n_tensors, n_kv


def _read_metadata(r: _Reader, n_kv: int) -> tuple[Meta, list[bytes] | None]:
    """Every key/value pair, and the token texts (read while walking them: uniqueness needs them anyway)."""
    values: dict[str, tuple[int, Any]] = {}
    token_texts = None
    for index in range(n_kv):
        raw_key = r.raw_string(f"metadata key #{index}")
        try:
            key = raw_key.decode("utf-8")
        except UnicodeDecodeError:
            raise Corrupt(f"metadata key #{index} is not valid UTF-8: {show(raw_key)}") from None
        if not key:
            raise Corrupt(f"metadata key #{index} is empty")
        if key in values:
            raise Corrupt(f"metadata key {show(key)} appears twice")
        what = f"metadata key {show(key)}"
        vtype = r.u32(f"{what} value type")
        if vtype in _SCALARS:
            value: Any = r.scalar(vtype, what)
        elif vtype == STRING:
            # Values such as a chat template may hold odd bytes; llama.cpp keeps them, so we only replace.
            value = r.raw_string(what).decode("utf-8", errors="replace")
        elif vtype == ARRAY:
            is_vocab = key == "tokenizer.ggml.tokens"
            value, texts = r.array(what, collect_strings=is_vocab)
            if is_vocab:
                token_texts = texts
        else:
            raise Corrupt(f"{what} has unknown value type {vtype}")
        values[key] = (vtype, value)
    return Meta(values), token_texts


def _alignment(meta: Meta) -> int:
    if "general.alignment" not in meta:
        return _DEFAULT_ALIGNMENT
    meta.expect("general.alignment", "u32")
    alignment = meta.value("general.alignment")
    if alignment == 0 or alignment & (alignment - 1):
        raise Corrupt(f"metadata key 'general.alignment' is {alignment}, not a power of two")
    return alignment


def _read_tensor_infos(r: _Reader, n_tensors: int, alignment: int) -> list[_Tensor]:
    tensors: list[_Tensor] = []
    seen: set[bytes] = set()
    for index in range(n_tensors):
        raw = r.raw_string(f"tensor #{index} name")
        name = raw.decode("utf-8", errors="replace")
        what = f"tensor {show(name)}"
        if len(raw) > _MAX_TENSOR_NAME_BYTES:
            raise Corrupt(f"tensor #{index} name is {len(raw)} bytes long; llama.cpp allows {_MAX_TENSOR_NAME_BYTES}")
        if raw in seen:
            raise Corrupt(f"{what} appears twice in the tensor directory")
        seen.add(raw)
        n_dims = r.u32(f"{what} dimension count")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise Corrupt(f"{what} has {n_dims} dimensions (1 to {_MAX_DIMS} allowed)")
        dims = [r.u64(f"{what} dimension {d}") for d in range(n_dims)]
        ggml_type = r.u32(f"{what} type")
        offset = r.u64(f"{what} offset")
        tensors.append(_tensor(what, name, dims, ggml_type, offset))
    _check_offsets(tensors, alignment)
    return tensors


def _tensor(what: str, name: str, dims: list[int], ggml_type: int, offset: int) -> _Tensor:
    n_elements = 1
    for d, extent in enumerate(dims):
        if not 1 <= extent <= _INT64_MAX:
            raise Corrupt(f"{what} dimension {d} is {extent} (must be 1 to 2^63-1)")
        n_elements *= extent
    if n_elements > _INT64_MAX:
        raise Corrupt(f"{what} has {'x'.join(map(str, dims))} elements, more than llama.cpp can count")
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise Corrupt(f"{what} has unknown type {ggml_type}") from None
    if dims[0] % block:
        raise Corrupt(
            f"{what} rows have {dims[0]} elements, not a multiple of the {GGMLQuantizationType(ggml_type).name} "
            f"block size {block}"
        )
    n_bytes = n_elements // block * type_size
    if n_bytes > _SIZE_MAX:
        raise Corrupt(f"{what} would take {n_bytes} bytes, more than an address can hold")
    return _Tensor(name, len(dims), ggml_type, n_elements, offset, n_bytes)


def _check_offsets(tensors: list[_Tensor], alignment: int) -> None:
    """Offsets as llama.cpp lays them out: each tensor starts where the previous one ends, padded to the alignment.

    That rules out overlaps and gaps at once; the messages still say which of the two a bad offset makes.
    """
    expected = 0
    previous: _Tensor | None = None
    for t in tensors:
        what = f"tensor {show(t.name)}"
        if t.offset % alignment:
            raise Corrupt(f"{what} offset {t.offset} is not a multiple of the alignment {alignment}")
        if t.offset < expected:
            other = next((o for o in tensors if o.offset <= t.offset < o.offset + o.n_bytes), previous)
            raise Corrupt(f"{what} offset {t.offset} overlaps tensor {show(other.name)}")
        if t.offset > expected:
            after = f"after tensor {show(previous.name)}" if previous else "at the start of the data"
            raise Corrupt(
                f"{what} offset {t.offset} leaves a gap of {t.offset - expected} bytes {after} "
                "(llama.cpp needs the tensors packed in directory order)"
            )
        expected += -(-t.n_bytes // alignment) * alignment
        previous = t


def _check_data_section(r: _Reader, tensors: list[_Tensor], alignment: int) -> None:
    """The tensors' data, packed after the directory at the next aligned offset, must end inside the file."""
    if not tensors:
        return
    data_start = -(-r.pos // alignment) * alignment
    last = tensors[-1]
    data_end = data_start + last.offset + last.n_bytes
    if data_end > r.size:
        # A download cut short, mostly; a mangled shape of the last tensor reads the same, and the advice holds.
        raise Truncated(
            f"file is {r.size} bytes but its tensors need {data_end}: tensor {show(last.name)} "
            f"({last.n_bytes} bytes) ends past the end"
        )


def _quantization(file_type: Any, tensors: list[_Tensor]) -> str | None:
    """general.file_type names the mix (Q4_K_M); without it, fall back to the commonest matrix type."""
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    # Vectors (norms, biases) stay F32 in every quantization: count the matrices only.
    matrices = Counter(t.ggml_type for t in tensors if t.n_dims >= 2)
    if matrices:
        try:
            return GGMLQuantizationType(matrices.most_common(1)[0][0]).name
        except ValueError:
            return None
    return None


# ---------------------------------------------------------------------------------------------- vocabulary


def read_vocab(info: GGUFInfo) -> tuple[list[bytes], list[int] | None]:
    """Token texts (raw bytes, as llama.cpp keeps them) and token types of a preflighted file."""
    if info._tokens is None:
        raise ModelError(f"{info.path}: no vocabulary recorded; run preflight() on the file first")
    handle, buf, size = _open_map(info.path)
    try:
        if size != info.file_size:
            raise ModelError(f"{info.path} changed since it was checked; run the command again")
        ref = info._tokens
        try:
            _, texts = _walk_strings(buf, ref.offset, ref.count, size, "tokenizer.ggml.tokens", collect=True)
        except Corrupt as exc:
            raise ModelError(f"{info.path}: corrupt GGUF ({exc}); delete it and download it again") from None
        types = None
        ref = info._token_types
        if ref is not None:
            types = list(struct.unpack_from(f"<{ref.count}i", buf, ref.offset))
        return texts or [], types
    finally:
        buf.close()
        handle.close()


def token_array_bytes(info: GGUFInfo) -> bytes:
    """The raw bytes of a preflighted file's token array (lengths and texts), as stored."""
    ref = info._tokens
    if ref is None:
        raise ModelError(f"{info.path}: no vocabulary recorded; run preflight() on the file first")
    try:
        with open(info.path, "rb") as f:
            if os.fstat(f.fileno()).st_size != info.file_size:
                raise ModelError(f"{info.path} changed since it was checked; run the command again")
            f.seek(ref.offset)
            return f.read(ref.end - ref.offset)
    except OSError as exc:
        raise ModelError(f"cannot read {info.path}: {exc.strerror or exc}") from None
