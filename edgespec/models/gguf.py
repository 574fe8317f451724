"""GGUF preflight: read a file's header and metadata in pure Python before llama.cpp ever sees it.

llama.cpp answers a truncated or mangled file with an abort or a crash inside C; this module turns the same
problems into a one-line :class:`ModelError`. It also checks that a target and a draft share a vocabulary from
metadata alone, so an incompatible pair fails in milliseconds instead of after loading two sets of weights.

Why not ``gguf.GGUFReader``: it builds numpy views for every field and tensor and takes 1.5-7 s on the models
here; this reader walks the same bytes with ``struct`` over an mmap in tens of milliseconds. The ``gguf``
package still supplies the tables (quantization block sizes, file type and token type names).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType, TokenType

from edgespec.errors import ModelError, ModelNotFoundError, VocabMismatchError

__all__ = ["GGUFInfo", "VOCAB_SIZE_MARGIN", "check_vocab_compatible", "preflight", "read_vocab"]

# llama.cpp's speculative example accepts target/draft vocabularies whose sizes differ by at most this much
# (the tail is padding or extra special tokens the draft never proposes).
VOCAB_SIZE_MARGIN = 128

_MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_GGML_MAX_DIMS = 4
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Token types that are text a model can emit as ordinary output; the rest (control, user-defined, unknown,
# unused) are specials that may legitimately differ between siblings.
_PLAIN_TOKEN_TYPES = {int(TokenType.NORMAL), int(TokenType.BYTE)}


class _Corrupt(Exception):
    """Internal: the bytes do not parse. Turned into a ModelError naming the file at the top level."""


class _Truncated(_Corrupt):
    pass


@dataclass(frozen=True)
class _ArrayRef:
    """Where an array value sits in the file, so big arrays (token texts) are read only when needed."""

    offset: int  # first element
    count: int
    etype: int


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
    """A bounds-checked cursor over the mapped file; every read past the end raises _Truncated."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def _take(self, n: int) -> int:
        start = self.pos
        if start + n > self.size:
            raise _Truncated(f"file ends at byte {self.size} inside the metadata")
        self.pos = start + n
        return start

    def u32(self) -> int:
        return _U32.unpack_from(self.buf, self._take(4))[0]

    def u64(self) -> int:
        return _U64.unpack_from(self.buf, self._take(8))[0]

    def raw_string(self) -> bytes:
        n = self.u64()
        if n > self.size:  # no complete file could hold it: mangled, not cut short
            raise _Corrupt(f"a string length of {n} bytes at offset {self.pos - 8} exceeds the whole file")
        start = self._take(n)
        return self.buf[start : start + n]

    def text(self, what: str) -> str:
        raw = self.raw_string()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"{what} is not valid UTF-8") from None

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALARS:
            fmt = "<" + _SCALARS[vtype]
            return struct.unpack_from(fmt, self.buf, self._take(struct.calcsize(fmt)))[0]
        if vtype == _STRING:
            # Values such as a chat template may hold odd bytes; llama.cpp keeps them, so we only replace.
            return self.raw_string().decode("utf-8", errors="replace")
        if vtype == _ARRAY:
            etype = self.u32()
            count = self.u64()
            ref = _ArrayRef(self.pos, count, etype)
            self.skip_array(etype, count, key)
            return ref
        raise _Corrupt(f"key '{key}' has unknown value type {vtype}")

    def skip_array(self, etype: int, count: int, key: str) -> None:
        left = self.size - self.pos
        if etype in _SCALARS:
            width = struct.calcsize(_SCALARS[etype])
            if count * width > self.size:
                raise _Corrupt(f"array '{key}' claims {count} items, more than the file could hold")
            if count * width > left:
                raise _Truncated(f"array '{key}' ({count} items) runs past the end of the file")
            self.pos += count * width
        elif etype == _STRING:
            if count * 8 > self.size:  # each string costs at least its 8-byte length
                raise _Corrupt(f"array '{key}' claims {count} strings, more than the file could hold")
            if count * 8 > left:
                raise _Truncated(f"array '{key}' ({count} strings) runs past the end of the file")
            self.pos = _skip_strings(self.buf, self.pos, count, self.size, key)
        elif etype == _ARRAY:
            for _ in range(count):
                inner_type, inner_count = self.u32(), self.u64()
                self.skip_array(inner_type, inner_count, key)
        else:
            raise _Corrupt(f"array '{key}' has unknown element type {etype}")


def _skip_strings(buf: mmap.mmap, pos: int, count: int, end: int, key: str) -> int:
    # The hot loop of preflight (150k tokens + 150k merges for Qwen): keep it to one unpack per string.
    unpack = _U64.unpack_from
    try:
        for _ in range(count):
            pos += 8 + unpack(buf, pos)[0]
    except struct.error:
        raise _Truncated(f"array '{key}' runs past the end of the file") from None
    if pos > end:
        raise _Truncated(f"array '{key}' runs past the end of the file")
    return pos


def _read_strings(buf: mmap.mmap, ref: _ArrayRef, end: int) -> list[bytes]:
    unpack = _U64.unpack_from
    out: list[bytes] = []
    append = out.append
    pos = ref.offset
    try:
        for _ in range(ref.count):
            n = unpack(buf, pos)[0]
            append(buf[pos + 8 : pos + 8 + n])
            pos += 8 + n
    except struct.error:
        raise _Truncated("token texts run past the end of the file") from None
    if pos > end:
        raise _Truncated("token texts run past the end of the file")
    return out


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
    """Check that ``path`` is a complete, well-formed GGUF model and report what it is.

    Reads only the header, the metadata and the tensor directory (no hashing, no weights); checks that every
    tensor's data lies inside the file, which is what catches a truncated download. Raises :class:`ModelError`
    (:class:`ModelNotFoundError` for a missing file) with a one-line message.
    """
    path = Path(path)
    handle, buf, size = _open_map(path)
    try:
        return _parse(path, buf, size)
    except _Truncated as exc:
        raise ModelError(f"{path}: truncated GGUF ({exc}); delete it and download it again") from None
    except _Corrupt as exc:
        raise ModelError(f"{path}: corrupt GGUF ({exc}); delete it and download it again") from None
    finally:
        buf.close()
        handle.close()


def _parse(path: Path, buf: mmap.mmap, size: int) -> GGUFInfo:
    head = bytes(buf[:4])
    if len(head) < 4 and _MAGIC.startswith(head):
        raise _Truncated(f"file is only {size} bytes")
    if head != _MAGIC:
        raise ModelError(
            f"{path}: not a GGUF file (starts with {head!r}, expected {_MAGIC!r}); pass a .gguf model"
        )
    r = _Reader(buf, size)
    r.pos = 4
    version = r.u32()
    if version not in (2, 3):
        if _U32.unpack(_U32.pack(version)[::-1])[0] in (2, 3):
            raise ModelError(
                f"{path}: big-endian GGUF is not supported; use a little-endian build of the model"
            )
        raise _Corrupt(f"unsupported GGUF version {version} (expected 2 or 3)")
    n_tensors, n_kv = r.u64(), r.u64()
    # A key/value pair or a tensor entry takes at least 12 bytes: absurd counts mean mangled bytes, and
    # rejecting them here avoids a billion-iteration loop.
    if n_kv * 12 > size or n_tensors * 12 > size:
        raise _Corrupt(f"header claims {n_kv} metadata keys and {n_tensors} tensors in a {size}-byte file")

    meta: dict[str, Any] = {}
    for index in range(n_kv):
        key = r.text(f"metadata key #{index}")
        meta[key] = r.value(r.u32(), key)

    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment is {alignment!r}, not a power of two")

    data_needed = 0
    n_params = 0
    tensor_types: Counter[int] = Counter()
    for index in range(n_tensors):
        tname = r.text(f"tensor name #{index}")
        n_dims = r.u32()
        if not 1 <= n_dims <= _GGML_MAX_DIMS:
            raise _Corrupt(f"tensor '{tname}' has {n_dims} dimensions")
        dims = [r.u64() for _ in range(n_dims)]
        ttype, offset = r.u32(), r.u64()
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor '{tname}' has unknown type {ttype}") from None
        n_elements = 1
        for d in dims:
            n_elements *= d
        if n_elements % block:
            raise _Corrupt(f"tensor '{tname}' has {n_elements} elements, not a multiple of its block {block}")
        data_needed = max(data_needed, offset + n_elements // block * type_size)
        n_params += n_elements
        if n_dims >= 2:
            tensor_types[ttype] += 1
    data_start = -(-r.pos // alignment) * alignment
    if data_start + data_needed > size:
        raise _Truncated(f"file is {size} bytes but its tensors need {data_start + data_needed}")

    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise _Corrupt("general.architecture is missing")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, _ArrayRef) or tokens.etype != _STRING:
        raise _Corrupt("tokenizer.ggml.tokens is missing, so llama.cpp has no vocabulary for this model")
    types = meta.get("tokenizer.ggml.token_type")
    if not isinstance(types, _ArrayRef) or types.etype not in (4, 5) or types.count != tokens.count:
        types = None  # optional: without it every token counts as plain text
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) and template else None
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=_str(meta.get("general.name")),
        quantization=_quantization(meta.get("general.file_type"), tensor_types),
        context_length=_int(meta.get(f"{arch}.context_length")),
        n_vocab=tokens.count,
        tokenizer_model=_str(meta.get("tokenizer.ggml.model")),
        bos_id=_int(meta.get("tokenizer.ggml.bos_token_id")),
        eos_id=_int(meta.get("tokenizer.ggml.eos_token_id")),
        has_chat_template=template is not None,
        chat_template=template,
        file_size=size,
        tokenizer_pre=_str(meta.get("tokenizer.ggml.pre")),
        n_tensors=n_tensors,
        gguf_version=version,
        n_params=n_params,
        add_bos=(
            meta["tokenizer.ggml.add_bos_token"]
            if isinstance(meta.get("tokenizer.ggml.add_bos_token"), bool)
            else None
        ),
        add_eos=(
            meta["tokenizer.ggml.add_eos_token"]
            if isinstance(meta.get("tokenizer.ggml.add_eos_token"), bool)
            else None
        ),
        _tokens=tokens,
        _token_types=types,
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _quantization(file_type: Any, tensor_types: Counter[int]) -> str | None:
    """general.file_type names the mix (Q4_K_M); without it, fall back to the commonest matrix type."""
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    if tensor_types:
        try:
            return GGMLQuantizationType(tensor_types.most_common(1)[0][0]).name
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
        try:
            texts = _read_strings(buf, info._tokens, size)
        except _Corrupt as exc:
            raise ModelError(f"{info.path}: corrupt GGUF ({exc}); delete it and download it again") from None
        types = None
        ref = info._token_types
        if ref is not None:
            fmt = f"<{ref.count}{'i' if ref.etype == 5 else 'I'}"
            types = list(struct.unpack_from(fmt, buf, ref.offset))
        return texts, types
    finally:
        buf.close()
        handle.close()


def check_vocab_compatible(target: GGUFInfo, draft: GGUFInfo) -> None:
    """Raise :class:`VocabMismatchError` unless the draft's token ids mean the same text to the target.

    Same rules as llama.cpp's speculative decoding: same tokenizer model type, same BOS/EOS ids, vocabulary
    sizes within :data:`VOCAB_SIZE_MARGIN`, and identical token texts over the shared id range (specials
    excepted). Works from metadata only, before any weights are loaded.
    """
    t, d = target.label(), draft.label()
    advice = "pick a draft from the target's model family"
    if target.tokenizer_model != draft.tokenizer_model:
        raise VocabMismatchError(
            f"target {t} uses tokenizer '{target.tokenizer_model}' but draft {d} uses "
            f"'{draft.tokenizer_model}'; {advice}"
        )
    for what, a, b in (("BOS", target.bos_id, draft.bos_id), ("EOS", target.eos_id, draft.eos_id)):
        if a != b:
            raise VocabMismatchError(f"target {t} has {what} id {a} but draft {d} has {b}; {advice}")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_SIZE_MARGIN:
        raise VocabMismatchError(
            f"target {t} has {target.n_vocab} tokens but draft {d} has {draft.n_vocab} "
            f"(more than {VOCAB_SIZE_MARGIN} apart); {advice}"
        )
    t_texts, t_types = read_vocab(target)
    d_texts, d_types = read_vocab(draft)
    shared = min(len(t_texts), len(d_texts))
    if t_texts[:shared] == d_texts[:shared]:  # the common case, compared at C speed
        return
    for i in range(shared):
        if t_texts[i] == d_texts[i]:
            continue
        if (t_types and t_types[i] not in _PLAIN_TOKEN_TYPES) or (
            d_types and d_types[i] not in _PLAIN_TOKEN_TYPES
        ):
            continue
        raise VocabMismatchError(
            f"target {t} and draft {d} differ at token {i}: "
            f"{_show(t_texts[i])} vs {_show(d_texts[i])}; {advice}"
        )


def _show(token: bytes) -> str:
    # repr() keeps the message on one line whatever the token holds (newlines, control bytes).
    return repr(token.decode("utf-8", errors="replace"))
